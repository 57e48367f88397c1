"""The modules of this folder are the package's ``podracer_hpc.report`` under the names a checkout's
scripts and notebooks know; :func:`alias` makes one so (``python -m analysis.X`` runs its main)."""

import importlib
import sys


def alias(name: str, module: str) -> None:
    """Make the module called ``name`` be ``podracer_hpc.report.<module>``."""
    real = importlib.import_module(f"podracer_hpc.report.{module}")
    if name == "__main__":
        sys.exit(real.main())
    sys.modules[name] = real
