"""PBT rescue: 4 pods started at a learning rate far too small (3e-6), the quickstart budget (500k
env steps a pod), a round every 25k env steps (20 rounds). Does PBT end better than independent pods?

    python bench/pbt_rescue.py                   # seeds 0-2: pbt (only the learning rate declared), none
    python bench/pbt_rescue.py --modes pbt pbt-default-space pbt-no-ready none --seeds 0
    python bench/pbt_rescue.py --held-out --modes pbt   # the ten seeds below, written before their runs
    python bench/pbt_rescue.py --held-out-2 --modes pbt # the second ten, after the ready rule changed

Each system runs ``mpiexec -n 4 podracer train jobs/quickstart.yaml`` with the same settings but
the tournament's. ``pbt``: ``tournament.hparam_space={learning_rate: [1e-6, 1e-2, log]}`` (issue
24's scenario); ``pbt-default-space``: the default PPO space; ``pbt-no-ready``: ``ready_rounds=0``.
Reported per run, from its summary: the best pod by the run's verdict (every pod evaluated once
more on one common set of 100 episodes, eval.final_episodes) with its 95% interval, the pool's
mean on the same set (podracer evaluate with the summary's seed), the copies and the learning
rates the pods ended with; then PBT's best minus the independent best per seed. Prints a table,
then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _pool import print_table, train_pool  # noqa: E402  (bench/_pool.py)

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.records import read_records  # noqa: E402
from podracer_hpc.files.rundir import RunDir  # noqa: E402

COMMON = [
    "agent.learning_rate=3e-6",
    "tournament.interval_env_steps=25000",
    "eval.interval_env_steps=100000",
    "threads=1",
    "log.progress_interval_s=0",
]
LR_ONLY = "tournament.hparam_space={learning_rate: [1.0e-6, 1.0e-2, true]}"
SYSTEMS = {
    "pbt": ["tournament.mode=pbt", LR_ONLY],
    "pbt-default-space": ["tournament.mode=pbt"],  # learning_rate, ent_coef, clip_coef, gae_lambda
    "pbt-no-ready": ["tournament.mode=pbt", LR_ONLY, "tournament.ready_rounds=0"],
    "pbt-job-start": ["tournament.mode=pbt", LR_ONLY, "tournament.initial_hparams=job"],  # every pod at 3e-6
    "none": ["tournament.mode=none"],
}
PODS = 4
# Out of sample: written here before any run of them, and not seeds a default was tuned on
# (ready_rounds was chosen on seeds 0-5). A run is rescued when its best pod, on the verdict's
# common start states, ends at or above RESCUED_AT (independent pods at this learning rate end
# near -1,200, and the quickstart's own settings near -200).
HELD_OUT_SEEDS = [101, 202, 303, 404, 505, 606, 707, 808, 909, 1010]
# The first set showed the start's early rounds overwriting good draws (seeds 101, 606), and the
# ready rule changed on it; so a second set, written before any run of it, checks the change.
HELD_OUT_SEEDS_2 = [1111, 1212, 1313, 1414, 1515, 1616, 1717, 1818, 1919, 2020]
RESCUED_AT = -400.0


def run(system: str, seed: int, out: Path, extra: list[str]) -> dict:
    d = out / f"{system}-s{seed}"
    summary, pods, wall = train_pool(
        d, PODS, [*COMMON, *SYSTEMS[system], f"seed={seed}", *extra], what=f"{system} seed {seed}"
    )
    lrs, copies = [], 0
    for k in range(PODS):
        recs = read_records(read_log(RunDir(d, "quickstart").log(k))["tournament"])
        copies += sum(x.action in ("copy_pod", "load_entry") for x in recs)
        lrs.append(recs[-1].new_hparams.get("learning_rate", 3e-6) if recs else 3e-6)
    return {
        "system": system,
        "seed": seed,
        "best": summary["best_return"],
        "ci95": summary["best_return_ci95"],
        "mean": statistics.mean(pods),
        "pods": pods,
        "final_lrs": lrs,
        "copies": copies,
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--held-out", action="store_true", help=f"the seeds written before their runs: {HELD_OUT_SEEDS}")
    ap.add_argument("--held-out-2", action="store_true", help=f"the second such set: {HELD_OUT_SEEDS_2}")
    ap.add_argument("--modes", nargs="+", default=["pbt", "none"], choices=list(SYSTEMS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another override for every run")
    ap.add_argument("--out", default="", help="keep the run directories here (default: a temporary folder)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="podracer-pbt-rescue-"))
    seeds = HELD_OUT_SEEDS_2 if args.held_out_2 else HELD_OUT_SEEDS if args.held_out else args.seeds
    rows = [run(m, s, out, args.set) for s in seeds for m in args.modes]
    head = (
        "system",
        "seed",
        "best pod (verdict)",
        "95% interval",
        "pool mean",
        "copies",
        f"rescued (>= {RESCUED_AT:.0f})",
        "final learning rates",
        "wall s",
    )
    table = [
        (
            r["system"],
            r["seed"],
            f"{r['best']:.1f}",
            f"[{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}]",
            f"{r['mean']:.1f}",
            r["copies"],
            "yes" if r["best"] >= RESCUED_AT else "no",
            " ".join(f"{x:.1e}" for x in r["final_lrs"]),
            f"{r['wall_s']:.0f}",
        )
        for r in rows
    ]
    print_table(head, table)
    by = {m: [r for r in rows if r["system"] == m] for m in args.modes}
    summary = {
        m: {
            "best_mean": statistics.mean(r["best"] for r in v),
            "pod_mean": statistics.mean(r["mean"] for r in v),
            "rescued": sum(r["best"] >= RESCUED_AT for r in v),
            "runs": len(v),
        }
        for m, v in by.items()
        if v
    }
    gain = {}
    if "pbt" in by and "none" in by:
        gain = {
            "pbt_minus_none_best": [a["best"] - b["best"] for a, b in zip(by["pbt"], by["none"])],
            "pbt_minus_none_mean": [a["mean"] - b["mean"] for a, b in zip(by["pbt"], by["none"])],
        }
    print(json.dumps({"bench": "pbt_rescue", "pods": PODS, "seeds": seeds, "systems": summary, **gain}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
