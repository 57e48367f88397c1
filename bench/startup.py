"""Start-up vs training clock: Pendulum's first update and time to -250, this checkout next to another.

    .venv/bin/python bench/startup.py [--base /work/main] [--runs 2] [--target -250]

Runs ``podracer train jobs/pendulum_fast.yaml --set eval.interval_env_steps=10240`` (the
bench/vs_rllib.py podracer side: 500k env steps of learning-rate schedule, stopped after
``--updates`` updates, 20 = 40,960 env steps, past -250 at 30,720) alternately from this checkout (``new``) and
from ``--base`` (``base``: another checkout of podracer-hpc with its own code, e.g. the main
branch), ``--runs`` times each, and reads each run's log: the training clock at the end of the
first update, at the first evaluation and at the first evaluation >= ``--target``, and the
process wall time. Then, in fresh processes of each checkout, ``python -X importtime`` of the
first ``torch.optim.Adam`` (what torch._dynamo costs) and the seconds it takes.

Prints a table, then one JSON line (medians per checkout and the ratios base/new).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.files.live import find_pod_logs  # noqa: E402

ADAM = (
    "import time, torch; p = [torch.zeros(3, requires_grad=True)]; t = time.perf_counter(); "
    "torch.optim.Adam(p, lr=1e-3, eps=1e-5, fused=True); print('ADAM_S', time.perf_counter() - t)"
)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that makes a subprocess import podracer_hpc from ``tree``."""
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


def train_once(tree: Path, run_dir: Path, target: float, timeout: float, updates: int) -> dict:
    """One podracer training run from ``tree``; its clock readings from rank 0's log."""
    cmd = [
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/pendulum_fast.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        "eval.interval_env_steps=10240",
        "--set",
        "total_env_steps=500000",
        "--stop-after-updates",
        str(updates),
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree, env=tree_env(tree), capture_output=True, text=True, timeout=timeout)
    process_s = time.perf_counter() - t0
    if r.returncode not in (0, 75):  # 75: stopped after --updates, with its checkpoint
        return {"error": r.stderr[-500:], "rc": r.returncode}
    log = read_log(find_pod_logs(run_dir)[0])
    tr, ev = log["train"], log["eval"]
    rets = [float(x) for x in ev["return_mean"]]
    hit = next((i for i, x in enumerate(rets) if x >= target), None)
    return {
        "first_update_s": float(tr["wall_s"][0]),
        "update_s": float(tr["wall_s"][2] - tr["wall_s"][1]),
        "first_eval_s": float(ev["wall_s"][0]),
        "first_eval_steps": int(ev["env_steps"][0]),
        "target_s": None if hit is None else float(ev["wall_s"][hit]),
        "target_steps": None if hit is None else int(ev["env_steps"][hit]),
        "process_s": process_s,
    }


def adam_import(tree: Path) -> dict:
    """Seconds of the first Adam of a fresh process, and torch._dynamo's cumulative import time."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", ADAM],
        cwd=tree,
        env=tree_env(tree),
        capture_output=True,
        text=True,
        timeout=300,
    )
    cum = {
        m.group(2).strip(): int(m.group(1)) for m in re.finditer(r"import time:\s+\d+ \|\s+(\d+) \|\s*(\S+)", r.stderr)
    }
    adam = float(re.search(r"ADAM_S (\S+)", r.stdout).group(1))
    return {
        "adam_s": adam,
        "dynamo_import_s": cum.get("torch._dynamo", 0) / 1e6,
        "torch_import_s": cum.get("torch", 0) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="/work/main", help="the other checkout (its podracer_hpc is imported from there)")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--target", type=float, default=-250.0)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument(
        "--updates", type=int, default=20, help="stop each run after this many updates (2,048 env steps each)"
    )
    args = p.parse_args(argv)
    base = Path(args.base).resolve()
    bad = (
        "--runs must be >= 1"
        if args.runs < 1
        else "--updates must be >= 3"
        if args.updates < 3
        else None
        if (base / "podracer_hpc").is_dir()
        else f"no podracer_hpc in {base}"
    )
    if bad:
        print(f"bench/startup.py: {bad}", file=sys.stderr)
        return 2
    trees = {"base": base, "new": ROOT}
    runs: dict[str, list[dict]] = {k: [] for k in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for name, tree in trees.items():  # alternating: load from other work hits both alike
                runs[name].append(train_once(tree, Path(tmp) / f"{name}{i}", args.target, args.timeout, args.updates))
    imports = {name: adam_import(tree) for name, tree in trees.items()}

    keys = ["first_update_s", "update_s", "first_eval_s", "target_s", "target_steps", "process_s"]
    med: dict[str, dict] = {}
    print(
        f"Pendulum-v1 (jobs/pendulum_fast.yaml), training clock in s; {args.runs} runs each, alternating; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'checkout':<9}{'run':>4}{'1st update':>12}{'update':>9}{'1st eval':>10}{'to target':>11}{'env steps':>11}"
        f"{'process':>9}"
    )
    for name in trees:
        for i, r in enumerate(runs[name]):
            if "error" in r:
                print(f"{name:<9}{i:>4}  failed (rc {r['rc']}): {r['error'][-200:]}")
                continue
            tgt = "-" if r["target_s"] is None else f"{r['target_s']:.2f}"
            print(
                f"{name:<9}{i:>4}{r['first_update_s']:>12.2f}{r['update_s']:>9.3f}{r['first_eval_s']:>10.2f}{tgt:>11}"
                f"{r['target_steps'] or 0:>11,}{r['process_s']:>9.1f}"
            )
        ok = [r for r in runs[name] if "error" not in r]
        med[name] = {k: statistics.median([r[k] for r in ok if r[k] is not None] or [float("nan")]) for k in keys}
    print(
        f"{'checkout':<9}{'first Adam s':>14}{'torch._dynamo import s':>24}{'torch import s':>16}  (fresh process, "
        "-X importtime)"
    )
    for name, r in imports.items():
        print(f"{name:<9}{r['adam_s']:>14.2f}{r['dynamo_import_s']:>24.2f}{r['torch_import_s']:>16.2f}")
    ratio = {
        k: med["base"][k] / med["new"][k]
        for k in ("first_update_s", "first_eval_s", "target_s")
        if med["new"][k] and med["new"][k] == med["new"][k]
    }
    print("base/new: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    print(
        json.dumps(
            {
                "bench": "startup",
                "base": str(base),
                "runs": runs,
                "median": med,
                "imports": imports,
                "ratio_base_over_new": ratio,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
