"""What podracer-hpc ships beside its code: the job files (``jobs/``), the sbatch templates
(``slurm_templates/``) and the RLlib baseline (``baselines/``). In a checkout they are its top-level
folders; an installed wheel carries a copy in ``podracer_hpc/_shipped/`` (setup.py's build step),
so ``podracer submit jobs/quickstart.yaml`` and ``podracer study jobs/studies/...`` work from any
directory. A path the user gives that exists is always theirs: the shipped copy is the fallback.

No heavy imports: config.py reads job files through it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FOLDERS", "find", "root"]

FOLDERS = ("jobs", "slurm_templates", "baselines")
_PKG = Path(__file__).resolve().parents[1]  # podracer_hpc/


def root() -> Path:
    """The folder that holds ``jobs/``, ``slurm_templates/`` and ``baselines/``: the checkout this
    package lives in, else the wheel's ``_shipped/`` copy."""
    checkout = _PKG.parent
    if (checkout / "jobs").is_dir() and (checkout / "pyproject.toml").is_file():
        return checkout
    return _PKG / "_shipped"


def find(path: str | Path) -> Path | None:
    """A relative path such as ``jobs/quickstart.yaml`` that does not exist where it was given, in
    what podracer-hpc ships (None if it is not there either, or names none of its folders)."""
    p = Path(path)
    if p.is_absolute() or not p.parts or p.parts[0] not in FOLDERS:
        return None
    shipped = root() / p
    return shipped if shipped.exists() else None
