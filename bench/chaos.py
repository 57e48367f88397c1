"""Chaos: random signals and kills on a 2-rank tournament, then the same command until it is done.

Each trial starts the job (``mpiexec -n 2 podracer train jobs/quickstart.yaml``, small), hits it
with one to three random events at random moments (SIGKILL of one rank, SIGKILL of the whole
job, SIGKILL while a checkpoint is being written, SIGUSR2 to one rank only, SIGUSR2 to every
rank, SIGTERM to mpiexec, SIGUSR2 to one rank the moment it can catch it, i.e. right after a
resume, so that the other stops by the notice some updates later, and SIGUSR2 to the process
group of the README's ``podracer mpirun -n 2 ...``, and SIGUSR2 to a straggler, a rank whose
updates take 4x as long in that start, so the other rank is likely waiting at a round when the
notice comes), re-running the same command after each, and then lets it finish.
It checks the resume invariants against an uninterrupted run of the same job:

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

from podracer_hpc.files import safeio  # noqa: E402
from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402
from podracer_hpc.launch import find_mpiexec  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from helpers import rank_pids  # noqa: E402  (the tests' own: a run's rank processes, from /proc)

SETS = [
    "total_env_steps=32768",
    "env.num_envs=64",
    "agent.rollout_steps=16",
    "eval.episodes=4",
    "eval.interval_env_steps=4096",
    "tournament.interval_env_steps=2048",
    "threads=1",
    "log.progress_interval_s=0",
    "log.checkpoint_interval_s=0.5",
]
EVENTS = (
    "kill-rank",
    "kill-job",
    "kill-in-checkpoint",
    "usr2-rank",
    "usr2-all",
    "term-mpiexec",
    "usr2-rank-at-start",
    "usr2-mpirun-group",
    "usr2-straggler",
)
STRAGGLER = 1  # usr2-straggler: this rank's updates take 4x as long in that start, and it gets the signal
RANKS = 2


def command(run_dir: Path, relay: bool = False) -> list[str]:
    """The bare mpiexec command, or (``relay``) the README's ``podracer mpirun`` in front of it."""
    launcher = [sys.executable, "-m", "podracer_hpc.cli", "mpirun"] if relay else [find_mpiexec()]
    return [
        *launcher,
        "-n",
        str(RANKS),
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *sum((["--set", s] for s in SETS), []),
    ]


def env(**extra: str) -> dict:
    e = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    e.pop("PODRACER_COMM", None)
    return e


def start(run_dir: Path, relay: bool = False, straggler: bool = False) -> subprocess.Popen:
    e = env(PODRACER_INJECT_SLOW=f"{STRAGGLER}:4") if straggler else env()
    return subprocess.Popen(
        command(run_dir, relay),
        cwd=REPO,
        env=e,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The pid of one rank of a run (PMI_RANK in its environment)."""
    for pid in rank_pids(run_dir):
        try:
            if f"PMI_RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            pass
    return None


def catches_usr2(pid: int) -> bool:
    """Whether the process has its SIGUSR2 handler installed yet (its SigCgt mask)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1)
    except OSError:
        pass
    return False


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
    if event == "usr2-rank-at-start":  # as soon as both ranks catch USR2: one of them, at once
        end = time.monotonic() + 60
        while time.monotonic() < end and p.poll() is None:
            pids = rank_pids(run_dir)
            if len(pids) == RANKS and all(catches_usr2(q) for q in pids):
                os.kill(rng.choice(pids), signal.SIGUSR2)
                return True
            time.sleep(0.001)
        return False
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
        elif event == "usr2-mpirun-group":  # a wrapper's "signal the job" (started with relay=True)
            os.killpg(p.pid, signal.SIGUSR2)
        elif event == "usr2-straggler":  # (started with straggler=True)
            pid = rank_pid(run_dir, STRAGGLER)
            if pid is None:
                return False
            os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        return False
    return True


def stopped_at_a_round(run_dir: Path) -> int:
    """Ranks whose checkpoint holds a round they reached but did not hold (another rank stopped at
    its meeting): the case a resume must hold before training on."""
    n = 0
    for r in range(RANKS):
        try:
            _, meta, _ = safeio.load(RunDir(run_dir).checkpoint_path(r), "pod-state")
        except (OSError, safeio.StateFileError):
            continue
        n += meta.get("pending_round") is not None
    return n


def check(run_dir: Path, ref: Path) -> tuple[int, int, bool]:
    """(duplicated or missing rows, missing rounds, bit-equal to the reference) over both ranks."""
    bad_rows, lost_rounds, equal = 0, 0, True
    for r in range(RANKS):
        log = read_log(RunDir(run_dir, "quickstart").log(r))
        ref_log = read_log(RunDir(ref, "quickstart").log(r))
        u = list(log["train"]["update"])
        bad_rows += sum(1 for a, b in zip(u, range(1, len(u) + 1)) if a != b) + abs(
            len(u) - len(ref_log["train"]["update"])
        )
        rounds = [x for x in log["tournament"]["round"] if x >= 0]
        want = [x for x in ref_log["tournament"]["round"] if x >= 0]
        lost_rounds += len(set(want) - set(rounds)) + (len(rounds) - len(set(rounds)))
        ta, ma, _ = safeio.load(RunDir(run_dir).checkpoint_path(r), "pod-state")
        tb, mb, _ = safeio.load(RunDir(ref).checkpoint_path(r), "pod-state")
        equal &= (
            ma["updates"] == mb["updates"]
            and set(ta) == set(tb)
            and all(ta[k].shape == tb[k].shape and bool((ta[k] == tb[k]).all()) for k in ta)
        )
    return bad_rows, lost_rounds, equal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-events", type=int, default=3, help="events per trial (1..N, random)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds a start may take before it counts as a hang")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument(
        "--events",
        default=",".join(EVENTS),
        help=f"comma-separated events to draw from (default: all of {', '.join(EVENTS)})",
    )
    args = ap.parse_args()
    pool = [e for e in args.events.split(",") if e]
    unknown = sorted(set(pool) - set(EVENTS))
    if unknown or not pool:
        print(
            f"chaos: error: unknown events {unknown or '(none given)'}; choose from {', '.join(EVENTS)}",
            file=sys.stderr,
        )
        return 2
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="podracer-chaos-"))
    ref = root / "reference"
    t0 = time.perf_counter()
    code, err = finish(start(ref), args.timeout)
    ref_s = time.perf_counter() - t0
    if code != 0:
        print(f"the uninterrupted reference run failed (exit {code}):\n{err}", file=sys.stderr)
        return 1
    rows, totals = (
        [],
        {
            "trials": 0,
            "events": 0,
            "starts": 0,
            "stopped_at_a_round": 0,
            "hangs": 0,
            "crash_codes": 0,
            "bad_rows": 0,
            "lost_rounds": 0,
            "bit_equal": 0,
        },
    )
    for trial in range(args.trials):
        run_dir = root / f"trial{trial}"
        events = [rng.choice(pool) for _ in range(rng.randint(1, args.max_events))]
        delivered, starts, hangs, crashes, codes, at_round = [], 0, 0, 0, [], 0
        for ev in events:
            p = start(run_dir, relay=ev == "usr2-mpirun-group", straggler=ev == "usr2-straggler")
            starts += 1
            if ev != "usr2-rank-at-start":
                time.sleep(rng.uniform(0.2, 1.1) * ref_s * 0.8)
            ok = hit(ev, p, run_dir, rng)
            code, err = finish(p, args.timeout)
            codes.append(code)
            if ok:
                delivered.append(ev)
            at_round += stopped_at_a_round(run_dir)
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
        rows.append(
            (
                trial,
                ", ".join(delivered) or "(ended first)",
                starts,
                " ".join(str(c) for c in codes),
                at_round,
                hangs,
                crashes,
                bad_rows,
                lost,
                "yes" if equal else "NO",
            )
        )
        totals["stopped_at_a_round"] += at_round
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
    head = (
        "trial",
        "events delivered",
        "starts",
        "exit codes",
        "ranks stopped at a round",
        "hangs",
        "crash codes",
        "bad log rows",
        "lost rounds",
        "bit-equal",
    )
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
