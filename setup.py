"""Build step of the wheel: pyproject.toml says everything else. What podracer-hpc ships beside its
code (jobs/, slurm_templates/, baselines/) goes into the wheel as podracer_hpc/_shipped/, where
podracer_hpc/files/shipped.py finds it once installed (a checkout uses its own folders)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

FOLDERS = ("jobs", "slurm_templates", "baselines")  # as podracer_hpc/files/shipped.py's FOLDERS


class BuildWithShipped(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        for name in FOLDERS:
            dest = Path(self.build_lib) / "podracer_hpc" / "_shipped" / name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(here / name, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".venv*"))


setup(cmdclass={"build_py": BuildWithShipped})
