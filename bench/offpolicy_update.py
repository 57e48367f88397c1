"""The off-policy gradient update, before and after the batched twin critics, side by side.

SAC's and TD3's ``agent.update`` as of a git revision (``--old-ref``: the update with two
``nn.Sequential`` critics, ``Optimizer.step`` and one replay draw per step; its sources loaded
from git, only their module names changed) against the checkout's (the critics as one
``baddbmm`` ensemble, ``torch.autograd.grad`` into fused Adam, one ``_foreach_lerp_`` for the
targets, one replay draw for all the steps of a call), eager, one torch thread. Both run
``--per`` updates a call on the same replay ring (Pendulum's dims, or HalfCheetah's for the
256x256 rows, 3-step returns), in alternating blocks (old, new, old, ...) so that the machine's
load hits both; the table gives each one's median block in ms per update.

    PYTHONPATH=$PWD python bench/offpolicy_update.py [--old-ref 4afdd0a] [--blocks 7] [--block-s 1]

Prints a table and, last, one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _timing import alternate_blocks, medians, module_at  # noqa: E402  (bench/_timing.py)

from podracer_hpc.agents.replay import ReplayBuffer  # noqa: E402
from podracer_hpc.agents.sac import SACAgent  # noqa: E402
from podracer_hpc.agents.settings import SACConfig, TD3Config  # noqa: E402
from podracer_hpc.agents.td3 import TD3Agent  # noqa: E402

CASES = [  # (algo, hidden, obs_dim, act_dim, batch, updates a call, job it stands for)
    ("sac", 64, 3, 1, 128, 16, "pendulum_sac"),
    ("td3", 64, 3, 1, 128, 16, "pendulum_td3"),
    ("sac", 256, 17, 6, 256, 4, "halfcheetah_sac"),
    ("td3", 256, 17, 6, 256, 4, "halfcheetah_td3"),
]


def old_agents(ref: str) -> dict[str, type]:
    """``{"sac": SACAgent, "td3": TD3Agent}`` of revision ``ref`` (agents/compiled, offpolicy, sac, td3 from
    git, as modules ``podracer_hpc.agents._old_*``; the rest of the package is the checkout's)."""
    # each old module imports its own revision's compiled and offpolicy (their helpers changed since)
    old = {
        "from .compiled import": "from ._old_compiled import",
        "from .offpolicy import": "from ._old_offpolicy import",
    }
    mods = {name: module_at(ref, name, old) for name in ("compiled", "offpolicy", "sac", "td3")}
    return {"sac": mods["sac"].SACAgent, "td3": mods["td3"].TD3Agent}


def make_case(cls: type, algo: str, hidden: int, obs_dim: int, act_dim: int, batch: int, per: int):
    """A function doing ``per`` updates of a fresh agent of ``cls`` on a filled ring."""
    torch.manual_seed(0)
    cfg = (SACConfig if algo == "sac" else TD3Config)(hidden_sizes=[hidden, hidden], batch_size=batch, n_step=3)
    agent = cls(obs_dim, act_dim, cfg)
    buf = ReplayBuffer(64 * 256, 64, obs_dim, act_dim, "cpu", n_step=3, gamma=cfg.gamma)
    g = torch.Generator().manual_seed(0)
    for _ in range(256):
        buf.add(
            torch.randn(64, obs_dim, generator=g),
            torch.rand(64, act_dim, generator=g) * 2 - 1,
            torch.randn(64, generator=g),
            torch.randn(64, obs_dim, generator=g),
            torch.rand(64, generator=g) < 0.01,
            torch.rand(64, generator=g) < 0.005,
        )

    def run() -> None:
        agent.update(buf, g, per)

    return run


def time_blocks(runs: dict[str, tuple], blocks: int, seconds: float) -> dict[str, float]:
    """Median ms per update of each variant over alternating blocks of about ``seconds`` each."""
    for run, _ in runs.values():
        run()
        run()  # warm up (the first Adam step builds its state)
    return medians(alternate_blocks(runs, blocks, seconds))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-ref", default="4afdd0a", help="the git revision of the update to compare with")
    ap.add_argument("--blocks", type=int, default=7, help="alternating timing blocks per variant")
    ap.add_argument("--block-s", type=float, default=1.0, help="seconds per timing block")
    ap.add_argument("--only", nargs="*", help="jobs (pendulum_sac, halfcheetah_td3, ...) to time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    old = old_agents(args.old_ref)
    new = {"sac": SACAgent, "td3": TD3Agent}
    load = os.getloadavg()[0]
    rows = []
    for algo, hidden, od, ad, batch, per, job in CASES:
        if args.only and job not in args.only:
            continue
        runs = {
            v: (make_case(cls[algo], algo, hidden, od, ad, batch, per), per) for v, cls in (("old", old), ("new", new))
        }
        res = time_blocks(runs, args.blocks, args.block_s)
        rows.append(
            {
                "job": job,
                "algo": algo,
                "hidden": hidden,
                "batch": batch,
                "updates_a_call": per,
                "old_ms": res["old"],
                "new_ms": res["new"],
                "speedup": res["old"] / res["new"],
            }
        )
    print(
        f"ms per gradient update, eager, one thread, old = {args.old_ref}, load average {load:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end"
    )
    print(f"{'job':16} {'algo':4} {'net':>8} {'batch':>5} {'per call':>8} {'old ms':>8} {'new ms':>8} {'speedup':>8}")
    for r in rows:
        print(
            f"{r['job']:16} {r['algo']:4} {r['hidden']:>4}x{r['hidden']:<3} {r['batch']:5} {r['updates_a_call']:8} "
            f"{r['old_ms']:8.3f} {r['new_ms']:8.3f} {r['speedup']:7.2f}x"
        )
    print(
        json.dumps(
            {
                "bench": "offpolicy_update",
                "old_ref": args.old_ref,
                "threads": 1,
                "load_start": load,
                "rows": rows,
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
