"""The container image's pip requirements, one a line, from pyproject.toml (one source of truth).

    python3 container/requirements.py [TORCH] [EXTRAS]

TORCH: the torch requirement, default ``torch==2.13.0``; ``""`` leaves torch to the base image
(an NGC image's own CUDA build). EXTRAS: the project's optional extras, comma-separated, default
``mujoco,warp,mpi-wheel``. ``gymnasium[mujoco]`` is always added. Used twice by ``make container``:
on the host to fill the wheel cache (build/container/wheels), and inside the build to install from
it. Needs Python >= 3.11 (tomllib), as the project does.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
DEFAULT_TORCH = "torch==2.13.0"
DEFAULT_EXTRAS = "mujoco,warp,mpi-wheel"


def requirements(torch: str = DEFAULT_TORCH, extras: str = DEFAULT_EXTRAS, pyproject: Path = PYPROJECT) -> list[str]:
    """The requirement lines: ``torch`` (if not empty), the project's dependencies (torch's own
    line dropped when ``torch`` is empty), each extra's, then ``gymnasium[mujoco]``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    lines = [torch] if torch else []
    lines += [r for r in project["dependencies"] if torch or not r.replace(" ", "").startswith("torch")]
    for name in filter(None, (e.strip() for e in extras.split(","))):
        if name not in optional:
            raise SystemExit(f"requirements.py: no extra {name!r} in {pyproject} (there are: {', '.join(optional)})")
        lines += optional[name]
    lines.append("gymnasium[mujoco]>=1.0")
    return lines


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * 2
    print("\n".join(requirements(DEFAULT_TORCH if args[0] is None else args[0], args[1] or DEFAULT_EXTRAS)))
