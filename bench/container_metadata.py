"""Filesystem metadata calls of one rank's start, outside vs inside the container image.

    python bench/container_metadata.py [--image build/container/podracer] [--repeat 3]

Opt-in (needs `make container` and strace; not in bench/run_all.sh or CI). Each side runs
``python -c "import podracer_hpc.rank.program"`` (what every rank imports before its first step: torch,
numpy, h5py, mpi4py, the package) under ``strace -f`` with the file-name syscalls (%file:
openat, stat family, access, readlink, ...) plus getdents64, and counts them:

- outside: this checkout on PYTHONPATH and this interpreter's venv, as a rank does on a cluster
  where both live on the shared filesystem; "on the checkout/venv" are the calls whose path is
  under them (each one a metadata round trip to the parallel filesystem's servers there);
- inside: ``ch-run IMAGE -- python3 -c ...``: the same import from the image (ch-run's own set-up
  counted too). Every path is inside the image, which a site mounts node-locally (enroot/pyxis:
  a squashfs on the node; Charliecloud: a squashfs or a directory), so the parallel filesystem
  sees none of these calls, only the image's one file.

Prints a table, then a JSON line.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = "import podracer_hpc.rank.program"
CALL = re.compile(r'^\d+\s+(\w+)\((?:[^"]*?)"([^"]*)"')


def count(cmd: list[str], env: dict[str, str], prefixes: tuple[str, ...]) -> dict[str, float]:
    """Run ``cmd`` under strace; the file-name calls in all, those under ``prefixes``, failed ones, seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "strace.log"
        t0 = time.perf_counter()
        subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=%file,getdents64", "-o", str(log), *cmd],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        seconds = time.perf_counter() - t0
        total = under = failed = 0
        for line in log.read_text(errors="replace").splitlines():
            m = CALL.match(line)
            if not m and " getdents64(" not in line:
                continue
            total += 1
            failed += " = -1 " in line
            if m and m.group(2).startswith(prefixes):
                under += 1
    return {"calls": total, "on_shared": under, "failed": failed, "seconds": seconds}


def main() -> int:
    """Measure both sides ``--repeat`` times (the medians), print the table and the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--image", type=Path, default=REPO / "build" / "container" / "podracer")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if shutil.which("strace") is None or shutil.which("ch-run") is None:
        print("container_metadata: needs strace and ch-run (apt-get install strace charliecloud)", file=sys.stderr)
        return 2
    if not (args.image / "usr" / "bin" / "python3").exists():
        print(f"container_metadata: no image directory {args.image}: run `make container` first", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": str(REPO), "USER": os.environ.get("USER", "root"), "OMP_NUM_THREADS": "1"}
    shared = (str(REPO), sys.prefix, os.path.realpath(sys.prefix))
    inside_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    sides = {
        "outside (checkout + venv)": ([sys.executable, "-c", CODE], env),
        "inside (ch-run image)": (["ch-run", str(args.image), "--", "python3", "-c", CODE], inside_env),
    }
    rows = {}
    for name, (cmd, side_env) in sides.items():
        runs = [count(cmd, side_env, shared) for _ in range(args.repeat)]
        rows[name] = {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}
    print(f"{'side':<28} {'calls':>7} {'on checkout/venv':>17} {'failed':>7} {'seconds':>8}")
    for name, r in rows.items():
        print(f"{name:<28} {r['calls']:>7} {r['on_shared']:>17} {r['failed']:>7} {r['seconds']:>8.2f}")
    out, ins = rows["outside (checkout + venv)"], rows["inside (ch-run image)"]
    for ranks in (512,):
        print(
            f"{ranks} ranks: {int(out['on_shared']) * ranks:,} metadata calls on the shared filesystem "
            f"outside, {int(ins['on_shared']) * ranks:,} inside"
        )
    print(
        json.dumps({"bench": "container_metadata", "code": CODE, "repeat": args.repeat, "outside": out, "inside": ins})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
