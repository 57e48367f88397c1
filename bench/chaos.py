"""Chaos: random signals and kills on a 2-rank tournament, then the same command until it is done.

Each trial starts the job (``mpiexec -n 2 podracer train jobs/quickstart.yaml``, small), hits it
with one to three random events at random moments (SIGKILL of one rank, SIGKILL of the whole
job, SIGKILL while a checkpoint is being written, SIGUSR2 to one rank only, SIGUSR2 to every
rank, SIGTERM to mpiexec), re-running the same command after each, and then lets it finish.
It checks the invariants of issue 11 against an uninterrupted run of the same job:

- no hang: every start ends within its timeout;
- no crash code: a start ends 0 (done), 75 (stopped, checkpointed) or by the kill itself;
- nothing lost or doubled: each rank's log holds every update and every round exactly once;
- bit-equal: both pods' final checkpoints equal the uninterrupted run's, tensor for tensor.

    python bench/chaos.py --trials 8 --seed 0

Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from podracer_hpc import safeio  # noqa: E402
from podracer_hpc.h5log import read_log  # noqa: E402
from podracer_hpc.launch import find_mpiexec  # noqa: E402
from podracer_hpc.rundir import RunDir  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from helpers import rank_pids  # noqa: E402  (the tests' own: a run's rank processes, from /proc)

SETS = ["total_env_steps=32768", "env.num_envs=64", "agent.rollout_steps=16", "eval.episodes=4",
        "eval.interval_env_steps=4096", "tournament.interval_env_steps=4096", "threads=1",
        "log.progress_interval_s=0", "log.checkpoint_interval_s=0.5"]
EVENTS = ("kill-rank", "kill-job", "kill-in-checkpoint", "usr2-rank", "usr2-all", "term-mpiexec")
RANKS = 2


def command(run_dir: Path) -> list[str]:
    return [find_mpiexec(), "-n", str(RANKS), sys.executable, "-m", "podracer_hpc.cli", "train",
            "jobs/quickstart.yaml", "--run-dir", str(run_dir), "--quiet", *sum((["--set", s] for s in SETS), [])]


def env() -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1"}
    e.pop("PODRACER_COMM", None)
    return e


def start(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(command(run_dir), cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(p: subprocess.Popen, timeout: float) -> tuple[int | None, str]:
    """Wait for a start to end; None means it hung (then it is killed)."""
    try:
        _, err = p.communicate(timeout=timeout)
        return p.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        return None, err


def hit(event: str, p: subprocess.Popen, run_dir: Path, rng: random.Random) -> bool:
    """Deliver one event to a running start; False if the run had ended first."""
    pids = rank_pids(run_dir)
    if p.poll() is not None or len(pids) < RANKS:
        return False
    if event == "kill-in-checkpoint":  # wait for a checkpoint being written, then kill its writer
        ck = RunDir(run_dir).checkpoints_dir
        end = time.monotonic() + 20
        while time.monotonic() < end and p.poll() is None:
            tmp = [x for x in ck.glob(".rank*.tmp")] if ck.exists() else []
            if tmp:
                os.killpg(p.pid, signal.SIGKILL)
                return True
            time.sleep(0.0005)
        return False
    try:
        if event == "kill-rank":
            os.kill(rng.choice(pids), signal.SIGKILL)
        elif event == "kill-job":
            os.killpg(p.pid, signal.SIGKILL)
        elif event == "usr2-rank":
            os.kill(rng.choice(pids), signal.SIGUSR2)
        elif event == "usr2-all":
            for pid in pids:
                os.kill(pid, signal.SIGUSR2)
        elif event == "term-mpiexec":
            p.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True


def check(run_dir: Path, ref: Path) -> tuple[int, int, bool]:
    """(duplicated or missing rows, missing rounds, bit-equal to the reference) over both ranks."""
    bad_rows, lost_rounds, equal = 0, 0, True
    for r in range(RANKS):
        log = read_log(RunDir(run_dir, "quickstart").log(r))
        ref_log = read_log(RunDir(ref, "quickstart").log(r))
        u = list(log["train"]["update"])
        bad_rows += sum(1 for a, b in zip(u, range(1, len(u) + 1)) if a != b) + abs(len(u) - len(ref_log["train"]["update"]))
        rounds = [x for x in log["tournament"]["round"] if x >= 0]
        want = [x for x in ref_log["tournament"]["round"] if x >= 0]
        lost_rounds += len(set(want) - set(rounds)) + (len(rounds) - len(set(rounds)))
        ta, ma, _ = safeio.load(RunDir(run_dir).checkpoint(r), "pod-state")
        tb, mb, _ = safeio.load(RunDir(ref).checkpoint(r), "pod-state")
        equal &= ma["updates"] == mb["updates"] and set(ta) == set(tb) and all(
            ta[k].shape == tb[k].shape and bool((ta[k] == tb[k]).all()) for k in ta)
    return bad_rows, lost_rounds, equal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-events", type=int, default=3, help="events per trial (1..N, random)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds a start may take before it counts as a hang")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="podracer-chaos-"))
    ref = root / "reference"
    t0 = time.perf_counter()
    code, err = finish(start(ref), args.timeout)
    ref_s = time.perf_counter() - t0
    if code != 0:
        print(f"the uninterrupted reference run failed (exit {code}):\n{err}", file=sys.stderr)
        return 1
    rows, totals = [], {"trials": 0, "events": 0, "starts": 0, "hangs": 0, "crash_codes": 0, "bad_rows": 0,
                        "lost_rounds": 0, "bit_equal": 0}
    for trial in range(args.trials):
        run_dir = root / f"trial{trial}"
        events = [rng.choice(EVENTS) for _ in range(rng.randint(1, args.max_events))]
        delivered, starts, hangs, crashes, codes = [], 0, 0, 0, []
        for ev in events:
            p = start(run_dir)
            starts += 1
            time.sleep(rng.uniform(0.2, 1.1) * ref_s * 0.8)
            ok = hit(ev, p, run_dir, rng)
            code, err = finish(p, args.timeout)
            codes.append(code)
            if ok:
                delivered.append(ev)
            hangs += code is None
            killed = ev.startswith("kill")
            if code is not None and code not in (0, 75) and not (ok and killed):
                crashes += 1
                print(f"trial {trial}: {ev} -> exit {code}\n{err[-2000:]}", file=sys.stderr)
            if code == 0:
                break
        while codes[-1] != 0 and starts < len(events) + 3:
            code, err = finish(start(run_dir), args.timeout)
            starts += 1
            codes.append(code)
            hangs += code is None
            if code not in (0, 75, None):
                crashes += 1
                print(f"trial {trial}: rerun -> exit {code}\n{err[-2000:]}", file=sys.stderr)
        done = codes[-1] == 0
        bad_rows, lost, equal = check(run_dir, ref) if done else (-1, -1, False)
        rows.append((trial, ", ".join(delivered) or "(ended first)", starts, " ".join(str(c) for c in codes), hangs,
                     crashes, bad_rows, lost, "yes" if equal else "NO"))
        totals["trials"] += 1
        totals["events"] += len(delivered)
        totals["starts"] += starts
        totals["hangs"] += hangs
        totals["crash_codes"] += crashes
        totals["bad_rows"] += max(bad_rows, 0) + (0 if done else 1)
        totals["lost_rounds"] += max(lost, 0)
        totals["bit_equal"] += bool(equal)
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    head = ("trial", "events delivered", "starts", "exit codes", "hangs", "crash codes", "bad log rows",
            "lost rounds", "bit-equal")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    print(f"reference run {ref_s:.1f} s; run directories in {root}" if args.keep else f"reference run {ref_s:.1f} s")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"bench": "chaos", "ranks": RANKS, **totals, "seed": args.seed}))
    ok = totals["hangs"] == totals["crash_codes"] == totals["bad_rows"] == totals["lost_rounds"] == 0
    return 0 if ok and totals["bit_equal"] == totals["trials"] else 1


if __name__ == "__main__":
    sys.exit(main())
