"""Shared-filesystem load of a tournament: filesystem calls on the leaderboard (and the run's
round listings) per pod and round, counted with strace, for this tree and an earlier revision.

    python bench/leaderboard_fsops.py                       # this tree vs a2903f1 (before issue 11)
    python bench/leaderboard_fsops.py --pods 4 --compare HEAD~5

Each version runs the same small quickstart tournament under ``strace -f -y`` (every process,
file descriptors shown as paths); the calls that name a path under the leaderboard or the run's
``rounds/`` folder are counted by kind: metadata calls (open/create, stat, getdents, link,
rename, unlink, chmod, mkdir) and fsyncs. A shared filesystem's metadata server pays for each.
Prints a table, then one line of JSON. Needs strace (apt-get install strace).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CALLS = ("openat", "stat", "newfstatat", "statx", "lstat", "access", "faccessat", "faccessat2", "getdents64",
         "link", "linkat", "rename", "renameat", "renameat2", "unlink", "unlinkat", "mkdir", "mkdirat", "chmod",
         "fchmod", "fchmodat", "fsync", "fdatasync")
META = set(CALLS) - {"fsync", "fdatasync"}
LINE = re.compile(r"^\d+\s+(?P<call>[a-z0-9_]+)\((?P<args>.*)")


def run(tree: Path, pods: int, rounds: int, out: Path) -> dict:
    run_dir = out / "run"
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    batch = 64 * 16
    sets = ["env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=2", "threads=1", "log.progress_interval_s=0",
            f"total_env_steps={rounds * 2 * batch}", f"tournament.interval_env_steps={2 * batch}",
            f"eval.interval_env_steps={2 * batch}", "tournament.top_k=4"]
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.txt"
    cmd = ["strace", "-f", "-y", "-qq", "-e", f"trace={','.join(CALLS)}", "-o", str(trace),
           mpiexec, "-n", str(pods), sys.executable, "-m", "podracer_hpc.cli", "train", "jobs/quickstart.yaml",
           "--run-dir", str(run_dir), "--quiet", *sum((["--set", s] for s in sets), [])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)}
    env.pop("PODRACER_COMM", None)
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"{tree}: exit {r.returncode}\n{r.stderr[-3000:]}")
    marks = (str(run_dir / "leaderboard"), str(run_dir / "rounds"))
    counts: Counter = Counter()
    for line in trace.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m or not any(x in m["args"] for x in marks):
            continue
        counts["fsync" if m["call"] in ("fsync", "fdatasync") else "metadata"] += 1
        counts[m["call"]] += 1
    n = pods * rounds
    return {"metadata": counts["metadata"] / n, "fsync": counts["fsync"] / n,
            "by_call": {k: round(v / n, 2) for k, v in sorted(counts.items()) if k not in ("metadata", "fsync")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--compare", default="a2903f1", help="an earlier revision to measure beside this tree ('' = none)")
    args = ap.parse_args()
    if not shutil.which("strace"):
        print("needs strace: apt-get install strace", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="podracer-fsops-"))
    rows = {}
    try:
        if args.compare:
            old = work / "old-tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(old), args.compare],
                           check=True, capture_output=True)
            rows[f"{args.compare} (before)"] = run(old, args.pods, args.rounds, work / "old")
        rows["this tree"] = run(REPO, args.pods, args.rounds, work / "new")
    finally:
        if args.compare:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "old-tree")],
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"leaderboard filesystem calls per pod and round ({args.pods} pods, {args.rounds} rounds, strace)")
    print(f"{'version':<22} | {'metadata':>8} | {'fsync':>6} | by call")
    for name, r in rows.items():
        calls = ", ".join(f"{k} {v:g}" for k, v in r["by_call"].items())
        print(f"{name:<22} | {r['metadata']:>8.1f} | {r['fsync']:>6.1f} | {calls}")
    print(json.dumps({"bench": "leaderboard_fsops", "pods": args.pods, "rounds": args.rounds, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
