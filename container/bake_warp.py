"""Bake MuJoCo Warp's kernels for the shipped models into the image (build arg WARP_KERNELS=1).

    python3 container/bake_warp.py DIR [--tasks halfcheetah,hopper,walker2d,ant,humanoid] [--archs 80,90,100]

Warp compiles a module's kernels on first use and caches them by content hash (69 s for the
MuJoCo Warp kernels on an H200, at every container start when the cache is not kept). Here, at
image build time and without a GPU, each task's env is built and stepped on Warp's CPU device
(which loads every module the step uses, and caches the CPU kernels), then every loaded module
is compiled ahead of time for the CUDA architectures ``--archs`` (``wp.compile_aot_module``:
NVRTC, no GPU needed; 80 A100, 90 H100/H200, 100 B200) into DIR, Warp's cache layout. At run
time each pod seeds its node-local cache from DIR (podracer_hpc/cluster/caches.py node_caches),
so Warp finds the kernels by hash instead of compiling them. A Warp or MuJoCo Warp upgrade
changes the hashes: bake again. Prints one JSON line (modules, archs, seconds, MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TASKS = "halfcheetah,hopper,walker2d,ant,humanoid"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--tasks", default=TASKS)
    p.add_argument("--archs", default=os.environ.get("WARP_ARCHS", "80,90,100"))
    args = p.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    os.environ["WARP_CACHE_PATH"] = str(args.dir)
    t0 = time.perf_counter()
    import torch
    import warp as wp

    wp.config.quiet = True
    wp.init()
    from podracer_hpc.envs.mujoco_warp import WarpMujoco

    for task in filter(None, args.tasks.split(",")):
        env = WarpMujoco(task, num_envs=2, device="cpu")
        env.reset(seed=0)
        env.step(torch.zeros(2, env.act_dim))
        env.close()
    archs = [int(a) for a in args.archs.split(",") if a.strip()]
    from warp._src.context import user_modules  # Warp 1.19's registry of loaded modules (pinned in pyproject)

    modules = [m for m in list(user_modules.values()) if m.execs]  # those the steps loaded
    compiled = 0
    for m in modules:
        wp.compile_aot_module(m, arch=archs)
        compiled += 1
    mib = sum(f.stat().st_size for f in args.dir.rglob("*") if f.is_file()) / 2**20
    line = {"modules": compiled, "archs": archs, "seconds": round(time.perf_counter() - t0, 1), "mib": round(mib, 1)}
    print(json.dumps(line))
    return 0 if compiled or not archs else 1


if __name__ == "__main__":
    sys.exit(main())
