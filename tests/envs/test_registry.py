"""The task registry (podracer_hpc/envs/registry.py): each task owns its settings (options, checks,
env builder), the config finds them there, and a new task is one file plus one line (tests/tiny_task.py,
docs/adding-a-task.md)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from podracer_hpc.config import Config, EnvConfig, describe, env_config_class, from_dict, load_config, to_dict, validate
from podracer_hpc.docfield import ConfigError, F
from podracer_hpc.envs import TASKS, build_env, registry
from podracer_hpc.envs.gym_task import GymnasiumOptions
from podracer_hpc.envs.jax_task import JaxOptions
from podracer_hpc.envs.mujoco_tasks import MujocoOptions
from podracer_hpc.envs.registry import Task
from podracer_hpc.trading.env import StockTradingEnv
from podracer_hpc.trading.task import TradingOptions

REPO = Path(__file__).resolve().parents[2]
BUILTIN = [
    "pendulum",
    "cartpole",
    "stock_trading",
    "halfcheetah",
    "hopper",
    "walker2d",
    "ant",
    "humanoid",
    "gymnasium",
    "jax",
]


def test_config_imports_no_torch_and_modules_import_in_any_order():
    """In a fresh interpreter: the config is cheap to import (no torch, no task module), and the
    modules that used to need a set import order (trading.env before envs, mujoco_warp before
    mujoco) import first and work."""
    code = (
        "import sys\n"
        "import podracer_hpc.config\n"
        "assert 'torch' not in sys.modules and 'podracer_hpc.envs' not in sys.modules, sorted(sys.modules)\n"
        "import podracer_hpc.trading.env\n"
        "import podracer_hpc.envs.mujoco_warp\n"
        "from podracer_hpc.config import load_config, to_dict\n"
        "cfg = load_config('jobs/trading_quickstart.yaml', ['env.num_envs=4'])\n"
        "from podracer_hpc.envs import build_env\n"
        "print(build_env(cfg.env, 2).num_stocks, list(to_dict(cfg)['env']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "30" and "'trading', 'mujoco', 'gymnasium', 'jax']" in r.stdout


# --------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------
def test_builtin_tasks_and_their_sections():
    assert registry.names()[: len(BUILTIN)] == BUILTIN
    assert registry.sections() == {
        "trading": TradingOptions,
        "mujoco": MujocoOptions,
        "gymnasium": GymnasiumOptions,
        "jax": JaxOptions,
    }
    assert registry.get("stock_trading").section == "trading" and TASKS["stock_trading"] is StockTradingEnv
    assert all(
        registry.get(n).options is MujocoOptions for n in ("halfcheetah", "hopper", "walker2d", "ant", "humanoid")
    )
    assert registry.get("pendulum").options is None and "pendulum" in TASKS and len(TASKS) >= len(BUILTIN)
    for cls in registry.sections().values():
        registry.check(cls())  # the defaults are valid


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'doom'; known tasks: .*cartpole.*stock_trading"):
        registry.get("doom")


@dataclasses.dataclass
class _Opts:
    size: int = F(3, "a size")


@dataclasses.dataclass
class _Undocumented:
    size: int = 3


@pytest.mark.parametrize(
    "task, fragment",
    [
        (Task("pendulum", build=dict), "already registered"),
        (Task("bad name", build=dict), "lower-case letters"),
        (Task("x_task", build=dict, options=_Opts), "options and section go together"),
        (Task("x_task", build=dict, options=_Opts, section="trading"), "belongs to TradingOptions"),
        (Task("x_task", build=dict, options=_Undocumented, section="x"), "F(default, 'a one-line doc')"),
        (Task("x_task", build=dict, options=dict, section="x"), "must be a dataclass"),
    ],
)
def test_register_refuses_ambiguous_tasks(task, fragment):
    registry.names()  # the built-in tasks are in
    with pytest.raises(ValueError) as ei:
        registry.register(task)
    assert fragment in str(ei.value)
    assert registry.get("pendulum").build is not dict and "x_task" not in registry.names()


# --------------------------------------------------------------------------------------
# The config finds the task options in the registry
# --------------------------------------------------------------------------------------
def test_env_section_is_the_dict_checkpoints_stored_before_the_registry():
    """Checkpoints store to_dict(cfg) and resume compares it: the env section keeps its shape,
    keys and defaults (the fixture was written by the config before the registry)."""
    old = json.loads((REPO / "tests/golden/config/env_sections_v1.json").read_text())
    # options added since, each at the default that gives the old behaviour (resume compares with
    # the defaults filled in, rank/resume.py's config_changes); sections of tasks added since
    added = {"trading": {"actions": "shares"}}
    new_sections = {
        "gymnasium": {"id": "", "kwargs": {}, "vectorization": "sync"},
        "jax": {"factory": "", "kwargs": {}, "obs_key": "state"},
    }

    def without_added(env: dict) -> dict:
        return {
            k: ({kk: vv for kk, vv in v.items() if kk not in added.get(k, {})} if isinstance(v, dict) else v)
            for k, v in env.items()
            if k not in new_sections
        }

    now = to_dict(Config())["env"]
    assert without_added(now) == old["default"]
    assert all(now[sec][k] == v for sec, kv in added.items() for k, v in kv.items())
    assert all(now[sec] == v for sec, v in new_sections.items())
    assert (
        without_added(to_dict(load_config(REPO / "jobs/trading_quickstart.yaml"))["env"]) == old["trading_quickstart"]
    )
    cfg = from_dict(Config, {"env": old["hopper_envpool"]})
    assert without_added(to_dict(cfg)["env"]) == old["hopper_envpool"] and cfg.env.mujoco == MujocoOptions("envpool", 2)
    assert list(to_dict(cfg)["env"]) == [*old["default"], *new_sections]  # the same order (YAML dumps of run configs)


def test_env_config_is_the_class_with_the_sections():
    env = EnvConfig(name="cartpole", num_envs=8)
    assert type(env) is env_config_class() and isinstance(env, EnvConfig)
    assert env.trading == TradingOptions() and env.mujoco == MujocoOptions()
    cfg = load_config(None, ["env.trading.cost=0.002", "env.mujoco.backend=gymnasium"])
    assert (
        cfg.env.trading.cost == 0.002
        and cfg.env == Config(env=EnvConfig(trading=TradingOptions(cost=0.002), mujoco=MujocoOptions("gymnasium"))).env
    )
    assert pickle.loads(pickle.dumps(cfg)) == cfg and copy.deepcopy(cfg) == cfg
    assert dataclasses.replace(cfg.env, num_envs=3).trading.cost == 0.002


def test_every_task_option_is_listed_with_its_doc_and_default():
    rows = {k: (doc, default) for k, doc, default in describe()}
    for section, cls in registry.sections().items():
        for name, _, default, doc in registry.option_rows(cls):
            assert rows[f"env.{section}.{name}"] == (doc, default)
    assert rows["env.trading.cost"][1] == 0.001 and rows["env.mujoco.backend"][1] == "auto"
    assert all(n in rows["env.name"][0] for n in BUILTIN)  # env.name's doc lists the registered tasks


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["env.name=stock_trading", "env.trading.cost=2"], "env.trading.cost: must be in [0, 1)"),
        (["env.trading.max_shares=0"], "env.trading.max_shares: must be >= 1"),
        (["env.trading.initial_cash=-5"], "env.trading.initial_cash: must be a finite amount > 0"),
        (["env.trading.synthetic_structure=trend"], "env.trading.synthetic_structure: must be one of none, momentum"),
        (["env.trading.turbulence_window=-1"], "env.trading.turbulence_window: must be >= 0"),
        (["env.mujoco.backend=bullet"], "env.mujoco.backend: must be one of auto, envpool, gymnasium, warp"),
        (["env.mujoco.num_threads=-1"], "env.mujoco.num_threads: must be >= 0"),
        (["env.trading.cost=cheap"], "env.trading.cost: expected a number"),
        (["env.trading.cots=0.1"], "unknown config key 'env.trading.cots'. Did you mean 'env.trading.cost'?"),
        (["env.trade.cost=0.1"], "unknown config key 'env.trade'. Did you mean 'env.trading'?"),
    ],
)
def test_bad_task_options_fail_in_load_config_naming_the_key(overrides, fragment):
    with pytest.raises(ConfigError) as ei:
        load_config(None, overrides)
    assert fragment in str(ei.value)


def test_programmatic_configs_are_checked_by_validate_and_by_build_env():
    cfg = Config()
    cfg.env.name, cfg.env.trading.cost = "stock_trading", 2.0
    with pytest.raises(ConfigError, match=r"env\.trading\.cost: must be in \[0, 1\)"):
        validate(cfg)
    with pytest.raises(ValueError, match=r"env\.trading\.cost: must be in \[0, 1\)"):
        build_env(cfg.env, 2)


def test_build_env_passes_the_section_to_the_env():
    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.max_episode_steps=9",
            "env.trading.cost=0.002",
            "env.trading.max_shares=7",
            "env.trading.synthetic_stocks=3",
            "env.trading.synthetic_days=300",
        ],
    )
    env = build_env(cfg.env, 4, "cpu", seed=1)
    assert isinstance(env, StockTradingEnv) and env.num_envs == 4 and env.max_episode_steps == 9
    assert (env.cost, env.max_shares, env.num_stocks) == (0.002, 7, 3)
    hopper = build_env(load_config(None, ["env.name=hopper", "env.mujoco.backend=gymnasium"]).env, 2)
    assert hopper.backend == "gymnasium" and hopper.num_envs == 2
    hopper.close()


def test_submit_dry_run_refuses_a_bad_trading_cost_before_queueing(cli, tmp_path):
    r = cli(
        "submit",
        "jobs/trading_quickstart.yaml",
        "--executor",
        "local",
        "--dry-run",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "env.trading.cost=2",
    )
    assert r.returncode == 2, r.stderr
    assert "env.trading.cost: must be in [0, 1)" in r.stderr and "got 2.0" in r.stderr
    assert not (tmp_path / "run").exists()


def test_the_docs_name_every_task_option():
    docs = {
        "trading": REPO / "docs/trading.md",
        "mujoco": REPO / "docs/mujoco.md",
        "gymnasium": REPO / "docs/gymnasium.md",
        "jax": REPO / "docs/jax.md",
    }
    assert set(docs) == set(registry.sections())
    for section, path in docs.items():
        text = path.read_text()
        for name, *_ in registry.option_rows(registry.sections()[section]):
            assert f"env.{section}.{name}" in text, (path.name, name)


# --------------------------------------------------------------------------------------
# A new task: one file (tests/tiny_task.py) plus one line
# --------------------------------------------------------------------------------------
@pytest.fixture
def reach_task(monkeypatch):
    """The one line of docs/adding-a-task.md: the task module's path in TASK_MODULES."""
    monkeypatch.setattr(registry, "TASK_MODULES", [*registry.TASK_MODULES, "tiny_task"])
    yield
    registry.unregister("reach")
    sys.modules.pop("tiny_task", None)


def test_a_new_task_is_one_file_plus_one_line(reach_task, tmp_path):
    from podracer_hpc.pod import Pod
    from podracer_hpc.rank.program import train

    assert registry.names()[-1] == "reach" and registry.sections()["reach"].__name__ == "ReachOptions"
    rows = {k: (doc, default) for k, doc, default in describe()}
    assert rows["env.reach.target"] == ("position to reach, in [-1, 1]", 0.5) and "reach" in rows["env.name"][0]
    with pytest.raises(ConfigError, match=r"env\.reach\.target: must be in \[-1, 1\], got 3\.0"):
        load_config(None, ["env.name=reach", "env.reach.target=3"])

    cfg = load_config(
        None,
        [
            "env.name=reach",
            "env.reach.target=-0.6",
            "env.num_envs=64",
            "agent.rollout_steps=20",
            "agent.num_minibatches=4",
            "agent.hidden_sizes=[32, 32]",
            "agent.learning_rate=3e-3",
            "total_env_steps=25600",
            "eval.interval_env_steps=12800",
            "eval.episodes=16",
            "tournament.mode=none",
            "threads=1",
            "log.progress_interval_s=0",
        ],
    )
    assert to_dict(cfg)["env"]["reach"] == {"target": -0.6, "speed": 0.2}
    assert {"trading", "mujoco"} <= set(to_dict(cfg)["env"])  # the other sections stay
    fresh = Pod(cfg)
    assert fresh.env.target == -0.6 and fresh.eval_env.num_envs == 16  # the section reached both envs
    before = float(fresh.evaluate(0).mean())

    result = train(cfg, tmp_path / "run", quiet=True)  # the real rank program: 20 updates, 2 evaluations
    assert result.complete and result.summary["task"] == "reach" and result.summary["env_steps"] == 25600
    after = result.summary["final_return"]
    # it learned to walk to the target: standing still returns about -15.6 (20 x the mean distance),
    # walking straight there about -1.5; measured -15.5 -> -2.0
    assert before < -10 and after > -5, (before, after)
