"""Pool scale and stragglers: 1 to 64 ranks, collective and asynchronous rounds, with and without
slow pods. Tiny pods (Pendulum, 16 envs, [16, 16] networks), oversubscribed on this machine.

    python bench/pool_scale.py                          # ranks 1 4 16 64, both modes, with and without
    python bench/pool_scale.py --ranks 4 16 --factor 3  # stragglers: 1 rank in 8 runs 3x slower
    python bench/pool_scale.py --out runs/pool-scale    # keep the runs; run again to skip what is measured

Measured from the rank logs of each run (nothing is timed from outside):

- pool steps/s: the sum over pods of each pod's env steps / its wall time from its first to its
  last update (rounds, evaluations and waits included);
- fast pods: the mean of that rate over the pods that are not slowed, relative to the same run
  without stragglers (the target: >= 90% in async mode);
- round s: mean seconds of a pod's round (the meeting, i.e. waiting for the others in collective
  mode, the collectives, leaderboard reads and writes);
- fs ops/round: mean leaderboard filesystem operations of one pod in one round;
- outside training: the pods' mean share of wall time spent in rounds (the target at 64 ranks:
  under 5%); not-in-updates adds evaluations, checkpoints and logging.

Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.records import read_records  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402
from podracer_hpc.launch import find_mpiexec  # noqa: E402

UPDATES, PER_ROUND = 48, 8  # each pod: 48 updates of 16 envs x 16 steps, a round every 8 updates


def sets(mode: str) -> list[str]:
    batch = 16 * 16
    return [
        "env.num_envs=16",
        "agent.rollout_steps=16",
        "agent.num_minibatches=2",
        "agent.update_epochs=2",
        "agent.hidden_sizes=[16, 16]",
        f"total_env_steps={UPDATES * batch}",
        "tournament.mode=elegantrl",
        f"tournament.interval_env_steps={PER_ROUND * batch}",
        f"eval.interval_env_steps={PER_ROUND * batch}",
        "eval.episodes=2",
        "env.max_episode_steps=50",
        f"tournament.sync={mode}",
        "threads=1",
        "log.progress_interval_s=0",
        "log.checkpoint_interval_s=0",
    ]


def slow_ranks(n: int, stragglers: bool) -> list[int]:
    """1 rank in 8 (at least one) when stragglers are asked for; the last ranks, spread over nodes."""
    return list(range(n - max(1, n // 8), n)) if stragglers and n > 1 else []


def run(n: int, mode: str, stragglers: bool, factor: float, out: Path, timeout: float) -> dict:
    d = out / f"n{n}-{mode}-{'slow' if stragglers else 'even'}"
    if d.exists():  # a run that died before its row was kept: start it again, not resume it
        shutil.rmtree(d)
    slow = slow_ranks(n, stragglers)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PODRACER_INJECT_SLOW": ",".join(f"{r}:{factor}" for r in slow)}
    env.pop("PODRACER_COMM", None)
    cmd = [
        find_mpiexec(),
        "-n",
        str(n),
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(d),
        "--quiet",
        *sum((["--set", s] for s in sets(mode)), []),
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{n} ranks, {mode}: exit {r.returncode}\n{r.stderr[-3000:]}")
    rates, round_s, ops, outside, not_updates = [], [], [], [], []
    for k in range(n):
        log = read_log(RunDir(d, "quickstart").log(k))
        tr = log["train"]
        wall = float(tr["wall_s"][-1])
        span = wall - float(tr["wall_s"][0]) + float(256 / tr["steps_per_s"][0])
        rates.append((int(tr["env_steps"][-1])) / span)
        recs = [x for x in read_records(log["tournament"]) if x.round >= 0]
        round_s += [x.tournament_s for x in recs]
        ops += [x.fs_ops for x in recs if x.fs_ops >= 0]
        outside.append(sum(x.tournament_s for x in recs) / wall)
        not_updates.append(1 - sum(256 / float(s) for s in tr["steps_per_s"]) / wall)
    fast = [x for k, x in enumerate(rates) if k not in slow]
    return {
        "ranks": n,
        "mode": mode,
        "stragglers": len(slow),
        "pool_sps": sum(rates),
        "fast_sps": statistics.mean(fast),
        "round_s": statistics.mean(round_s) if round_s else math.nan,
        "fs_ops_per_round": statistics.mean(ops) if ops else math.nan,
        "outside": statistics.mean(outside),
        "not_in_updates": statistics.mean(not_updates),
        "job_s": time.perf_counter() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--modes", nargs="+", default=["collective", "async"], choices=["collective", "async"])
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower a straggler's updates are")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="", help="keep the run directories here")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="podracer-pool-scale-"))
    out.mkdir(parents=True, exist_ok=True)
    # each measured run is kept in <out>/rows.jsonl as it ends: rerunning with the same --out skips
    # the runs already measured there (a 64-rank run is minutes; a bench killed at 64 keeps 1-16)
    done_file = out / "rows.jsonl"
    done = {}
    if done_file.exists():
        for line in done_file.read_text().splitlines():
            r = json.loads(line)
            done[(r["ranks"], r["mode"], r["stragglers"] > 0, r["factor"])] = r

    def measured(n: int, mode: str, stragglers: bool) -> dict:
        key = (n, mode, stragglers, args.factor)
        if key not in done:
            print(f"# {n} ranks, {mode}, {'1 in 8 slowed' if stragglers else 'even'} ...", file=sys.stderr, flush=True)
            done[key] = {**run(n, mode, stragglers, args.factor, out, args.timeout), "factor": args.factor}
            with done_file.open("a") as f:
                f.write(json.dumps(done[key]) + "\n")
        return done[key]

    print(f"# run directories and rows.jsonl in {out}", file=sys.stderr, flush=True)
    rows = []
    for n in args.ranks:
        for mode in args.modes:
            even = measured(n, mode, False)
            rows.append({**even, "fast_vs_even": 1.0})
            if n > 1:
                slow = measured(n, mode, True)
                rows.append({**slow, "fast_vs_even": slow["fast_sps"] / even["fast_sps"]})
    head = (
        "ranks",
        "mode",
        "slowed",
        "pool steps/s",
        "fast pods steps/s",
        "fast vs even",
        "round s",
        "fs ops/round",
        "outside training",
        "not in updates",
        "job s",
    )
    table = [
        (
            r["ranks"],
            r["mode"],
            r["stragglers"],
            f"{r['pool_sps']:,.0f}",
            f"{r['fast_sps']:,.0f}",
            f"{r['fast_vs_even']:.0%}",
            f"{r['round_s']:.3f}",
            f"{r['fs_ops_per_round']:.0f}",
            f"{r['outside']:.1%}",
            f"{r['not_in_updates']:.1%}",
            f"{r['job_s']:.0f}",
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    print(" | ".join(str(h).ljust(w) for h, w in zip(head, widths)))
    print("-|-".join("-" * w for w in widths))
    for t in table:
        print(" | ".join(str(x).ljust(w) for x, w in zip(t, widths)))
    print(
        json.dumps(
            {
                "bench": "pool_scale",
                "factor": args.factor,
                "updates_per_pod": UPDATES,
                "updates_per_round": PER_ROUND,
                "rows": rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
