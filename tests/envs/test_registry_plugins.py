"""Tasks from other packages (podracer_hpc/envs/registry.py, entry-point group ``podracer_hpc.tasks``):
a pip-installed package registers its task without editing podracer (tests/fixtures/podracer_demo_tasks),
and a plugin that fails to load is reported without breaking the other tasks.

Everything runs in subprocesses whose sys.path holds a temporary install directory: nothing is
downloaded (pip installs the fixture with --no-index --no-build-isolation) and the test
environment's own packages stay as they were."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from podracer_hpc.envs import registry

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "podracer_demo_tasks"


def run(args: list[str], path: list[Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` with ``path`` (then the checkout) on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PODRACER_COMM",)}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, path), str(REPO)])
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fixture package pip-installed into a directory of its own (built from a copy: pip's
    in-tree build would leave build/ and egg-info in the checkout)."""
    work = tmp_path_factory.mktemp("plugin")
    src = shutil.copytree(FIXTURE, work / "src")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(work / "site"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((work / "site").glob("podracer_demo_tasks-0.1.0.dist-info/entry_points.txt"))
    return work / "site"


def test_an_installed_package_adds_its_task_with_its_options(installed, tmp_path):
    code = (
        "from podracer_hpc.envs import registry\n"
        "from podracer_hpc.config import load_config, describe\n"
        "print(registry.names()[-1], list(registry.sections())[-1])\n"
        "rows = {k: d for k, d, _ in describe()}\n"
        "print(rows['env.steer.wind'])\n"
        "print('steer' in rows['env.name'])\n"
    )
    r = run(["-c", code], [installed], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "steer steer",
        "drift per step, in [-0.2, 0.2] (the action can push 0.2 back)",
        "True",
    ]
    assert "steer" not in registry.names()  # this process: nothing installed, nothing registered


def test_podracer_trains_the_plugin_task_and_checks_its_options(installed, tmp_path):
    job = tmp_path / "steer.yaml"  # a job file of the plugin's task, as a user writes one
    job.write_text(
        "total_env_steps: 2048\nthreads: 1\nenv: {name: steer, num_envs: 32, steer: {wind: -0.15}}\n"
        "agent: {rollout_steps: 16}\neval: {interval_env_steps: 1024, episodes: 4, final_episodes: 4}\n"
    )
    common = ["-m", "podracer_hpc.cli", "train", str(job), "--quiet"]
    r = run([*common, "--run-dir", str(tmp_path / "bad"), "--set", "env.steer.wind=0.5"], [installed], tmp_path)
    assert r.returncode == 2 and "env.steer.wind: must be in [-0.2, 0.2], got 0.5" in r.stderr, r.stderr
    r = run([*common, "--run-dir", str(tmp_path / "run")], [installed], tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["task"] == "steer" and summary["env_steps"] == 2048
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "steer:\n    wind: -0.15" in config


def _dist(site: Path, name: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A hand-written installed distribution: its module files and a dist-info with entry points."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[podracer_hpc.tasks]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    )
    for mod, text in modules.items():
        (site / f"{mod}.py").write_text(text)


def test_a_broken_plugin_is_reported_and_the_others_still_load(tmp_path):
    """Entry points may also name a Task, or a function returning Tasks; one that raises or takes a
    built-in name is skipped, said on stderr, and named when its task is asked for."""
    site = tmp_path / "site"
    task = (
        "from podracer_hpc.envs.pendulum import Pendulum\nfrom podracer_hpc.envs.registry import Task\n"
        "def tasks():\n    return [Task('pendulum_b', build=Pendulum, doc='a second pendulum')]\n"
        "clash = Task('pendulum', build=dict)\n"
    )
    _dist(site, "good_plugin", {"by_function": "good_tasks:tasks"}, {"good_tasks": task})
    _dist(
        site,
        "bad_plugin",
        {"needs_a_package": "bad_tasks", "clashes": "good_tasks:clash"},
        {"bad_tasks": "import no_such_simulator\n"},
    )
    code = (
        "from podracer_hpc.envs import registry, make_env\n"
        "print(registry.names()[-1], make_env('pendulum_b', 2).num_envs)\n"
        "try:\n    registry.get('bad_task')\nexcept ValueError as e:\n    print(e)\n"
    )
    r = run(["-c", code], [site], tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "pendulum_b 2"
    assert (
        "unknown task 'bad_task'" in second
        and "task plugin 'needs_a_package' did not load: bad_tasks (package "
        "bad_plugin): ModuleNotFoundError: No module named 'no_such_simulator'"
        in second
    )
    assert "task 'pendulum' is already registered" in second  # the clash, reported too
    assert r.stderr.count("did not load; its tasks are missing") == 2
    r = run(["-m", "podracer_hpc.cli", "config"], [site], tmp_path)
    assert r.returncode == 0 and "env.name" in r.stdout and "pendulum_b" in r.stdout, r.stderr
