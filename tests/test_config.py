"""Configuration: defaults, job files, dotted overrides, errors that name the fix (podracer_hpc/config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from podracer_hpc.agents.settings import PPOConfig
from podracer_hpc.config import (
    Config,
    EnvConfig,
    EvalConfig,
    LogConfig,
    describe,
    env_config_class,
    from_dict,
    load_config,
    parse_overrides,
    to_dict,
    validate,
)
from podracer_hpc.docfield import ConfigError
from podracer_hpc.envs import TASKS
from podracer_hpc.envs.mujoco_tasks import MujocoOptions
from podracer_hpc.trading.task import TradingOptions

REPO = Path(__file__).resolve().parents[1]

JOB_YAML = """\
# a job like those in jobs/
seed: 7
total_env_steps: 2_000_000
env:
  name: cartpole
  num_envs: 64
agent:
  learning_rate: 1e-3        # YAML 1.1 reads this as a string: must still become a float
  rollout_steps: 16
  num_minibatches: 8
  gamma: 0.98
  hidden_sizes: [32, 32]
  activation: relu
  anneal_lr: false
eval:
  episodes: 5
"""


def write(tmp_path: Path, text: str, name: str = "myjob.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def leaf_keys(obj: object = None, prefix: str = "") -> list[str]:
    """Every dotted leaf key, found independently of config.describe (by walking a default Config:
    the env section's task options come from the task registry)."""
    obj = Config() if obj is None else obj
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += leaf_keys(value, prefix + f.name + ".")
        else:
            out.append(prefix + f.name)
    return out


def error_of(path=None, overrides=None) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(path, overrides)
    return str(ei.value)


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------
def test_defaults_load_and_validate():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.env == EnvConfig() and cfg.agent == PPOConfig() and cfg.eval == EvalConfig() and cfg.log == LogConfig()
    assert cfg.name == cfg.env.name == "pendulum"  # no job file: the run is named after the task
    assert cfg.agent.hidden_sizes == [64, 64]
    assert validate(Config()) is not None


def test_default_lists_are_not_shared_between_instances():
    a, b = Config(), Config()
    a.agent.hidden_sizes.append(3)
    assert b.agent.hidden_sizes == [64, 64]
    assert PPOConfig().hidden_sizes == [64, 64]


def test_job_file_loads(tmp_path):
    cfg = load_config(write(tmp_path, JOB_YAML))
    assert cfg.name == "myjob"  # the job file's stem
    assert cfg.seed == 7 and cfg.total_env_steps == 2_000_000
    assert cfg.env.name == "cartpole" and cfg.env.num_envs == 64
    assert cfg.agent.learning_rate == 1e-3 and isinstance(cfg.agent.learning_rate, float)
    assert cfg.agent.hidden_sizes == [32, 32] and cfg.agent.activation == "relu"
    assert cfg.agent.anneal_lr is False
    assert cfg.eval.episodes == 5
    # untouched keys keep their defaults
    assert cfg.agent.clip_coef == PPOConfig().clip_coef and cfg.log == LogConfig()


def test_job_file_explicit_name_wins(tmp_path):
    cfg = load_config(write(tmp_path, "name: custom\n"))
    assert cfg.name == "custom"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "agent:\n"])
def test_empty_job_file_or_empty_section_gives_defaults(tmp_path, text):
    cfg = load_config(write(tmp_path, text, "empty.yaml"))
    assert cfg.name == "empty"
    assert cfg.agent == PPOConfig() and cfg.env == EnvConfig()


@pytest.mark.parametrize("job", sorted((REPO / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_repository_job_files_load(job):
    cfg = load_config(job)
    assert cfg.name == job.stem
    assert cfg.env.name in TASKS


def test_to_dict_from_dict_round_trip(tmp_path):
    cfg = load_config(write(tmp_path, JOB_YAML))
    d = to_dict(cfg)
    assert d["agent"]["learning_rate"] == 1e-3 and d["env"]["name"] == "cartpole"
    assert from_dict(Config, d) == cfg


# --------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------
def test_overrides_parse_types():
    cfg = load_config(
        None,
        [
            "total_env_steps=3e6",  # an int field from a YAML string in e-notation
            "agent.learning_rate=1e-3",
            "agent.gamma=0.97",
            "agent.vf_coef=1",  # int -> float
            "agent.anneal_lr=false",
            "agent.norm_obs=true",
            "agent.hidden_sizes=[128, 64, 32]",
            "env.num_envs=2_048",
            "env.name=cartpole",
            "device=cpu",
            "name=a=b",  # only the first '=' splits
        ],
    )
    assert cfg.total_env_steps == 3_000_000 and type(cfg.total_env_steps) is int
    assert cfg.agent.learning_rate == 1e-3 and type(cfg.agent.learning_rate) is float
    assert cfg.agent.gamma == 0.97
    assert cfg.agent.vf_coef == 1.0 and type(cfg.agent.vf_coef) is float
    assert cfg.agent.anneal_lr is False and cfg.agent.norm_obs is True
    assert cfg.agent.hidden_sizes == [128, 64, 32]
    assert cfg.env.num_envs == 2048 and cfg.env.name == "cartpole"
    assert cfg.device == "cpu" and cfg.name == "a=b"


def test_int_field_from_integral_float_string_and_float():
    cfg = load_config(None, ["seed=1.0e1", "env.num_envs=64.0"])
    assert cfg.seed == 10 and type(cfg.seed) is int
    assert cfg.env.num_envs == 64 and type(cfg.env.num_envs) is int


def test_override_beats_job_file(tmp_path):
    cfg = load_config(write(tmp_path, JOB_YAML), ["agent.gamma=0.9", "env.num_envs=32", "seed=1"])
    assert cfg.agent.gamma == 0.9 and cfg.env.num_envs == 32 and cfg.seed == 1
    assert cfg.agent.activation == "relu"  # the rest of the file stays


def test_override_into_empty_section(tmp_path):
    cfg = load_config(write(tmp_path, "agent:\n"), ["agent.gamma=0.9"])
    assert cfg.agent.gamma == 0.9


def test_parse_overrides_values_are_yaml():
    assert parse_overrides(["a=1", "b.c=[1, 2]", "d=true", "e=", "f=x y"]) == [
        ("a", 1),
        ("b.c", [1, 2]),
        ("d", True),
        ("e", ""),
        ("f", "x y"),
    ]
    assert parse_overrides(None) == []


# --------------------------------------------------------------------------------------
# Unknown keys
# --------------------------------------------------------------------------------------
def test_unknown_top_level_key_names_it_and_lists_valid_keys(tmp_path):
    msg = error_of(write(tmp_path, "sede: 3\n"))
    assert "'sede'" in msg
    assert "Did you mean 'seed'?" in msg
    for key in ("seed", "total_env_steps", "device", "env", "agent", "eval", "log"):
        assert f"  {key} (" in msg, key
    assert "(section)" in msg


def test_unknown_nested_key_names_it_and_lists_section_keys(tmp_path):
    msg = error_of(write(tmp_path, "agent:\n  lr: 0.001\n"))
    assert "'agent.lr'" in msg
    for f in dataclasses.fields(PPOConfig):
        assert f"agent.{f.name}" in msg, f.name
    # the docs come with the keys
    assert PPOConfig.__dataclass_fields__["learning_rate"].metadata["doc"] in msg


def test_near_miss_override_suggests_the_right_key():
    msg = error_of(None, ["agent.learning_rat=1e-3"])
    assert "'agent.learning_rat'" in msg
    assert "Did you mean 'agent.learning_rate'?" in msg
    assert "agent.learning_rate (float)" in msg


def test_misspelled_section_suggests_the_section():
    msg = error_of(None, ["agnet.gamma=0.9"])
    assert "'agnet'" in msg and "Did you mean 'agent'?" in msg


def test_no_suggestion_for_far_miss():
    msg = error_of(None, ["zzzzzz=1"])
    assert "Did you mean" not in msg and "'zzzzzz'" in msg


# --------------------------------------------------------------------------------------
# Wrong types
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "override,key",
    [
        ("seed=true", "seed"),  # bool is not an int
        ("env.num_envs=2.5", "env.num_envs"),
        ("env.num_envs=many", "env.num_envs"),
        ("agent.gamma=abc", "agent.gamma"),  # string for float
        ("agent.learning_rate=false", "agent.learning_rate"),  # bool is not a number
        ("agent.anneal_lr=1", "agent.anneal_lr"),  # int is not a bool
        ("agent.anneal_lr=maybe", "agent.anneal_lr"),
        ("agent.hidden_sizes=64", "agent.hidden_sizes"),
        ("env.name=3", "env.name"),
        ("agent.gamma=[0.9]", "agent.gamma"),
    ],
)
def test_wrong_types_raise_naming_the_key(override, key):
    msg = error_of(None, [override])
    assert msg.startswith(f"{key}: expected"), msg
    assert override.split("=", 1)[1].strip("[]").lower() in msg.lower()  # the offending value is shown


def test_section_given_a_value():
    msg = error_of(None, ["agent=3"])
    assert "agent" in msg and "mapping" in msg


def test_override_through_a_value(tmp_path):
    msg = error_of(write(tmp_path, "seed: 3\n"), ["seed.x=1"])
    assert "'seed' is a value" in msg
    msg = error_of(None, ["seed.x=1"])  # not in the file: still refused, naming the key
    assert msg.startswith("seed: expected an integer")


def test_configerror_is_a_valueerror():
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------------------
# Invalid values
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides,key,fragment",
    [
        (["env.num_envs=0"], "env.num_envs", "got 0"),
        (["env.num_envs=-4"], "env.num_envs", "got -4"),
        (["agent.gamma=1.5"], "agent.gamma", "(0, 1]"),
        (["agent.gamma=0"], "agent.gamma", "(0, 1]"),
        (["agent.gamma=.nan"], "agent.gamma", "nan"),
        (["agent.gae_lambda=-0.1"], "agent.gae_lambda", "[0, 1]"),
        (["env.num_envs=10", "agent.rollout_steps=32", "agent.num_minibatches=7"], "agent.num_minibatches", "320"),
        (["agent.num_minibatches=0"], "agent.num_minibatches", "got 0"),
        (["env.num_envs=2", "agent.rollout_steps=2", "agent.num_minibatches=8"], "agent.num_minibatches", "= 4"),
        (["env.name=doom"], "env.name", "doom"),
        (["device=gpu"], "device", "'gpu'"),
        (["device=cuda:"], "device", "expected a string"),  # YAML reads 'cuda:' as a mapping
        (["device='cuda:'"], "device", "cuda:N"),
        (["device=cuda:x"], "device", "cuda:N"),
        (["device=cuda:-1"], "device", "cuda:N"),
        (["agent.learning_rate=0"], "agent.learning_rate", "> 0"),
        (["agent.clip_coef=-0.2"], "agent.clip_coef", "> 0"),
        (["agent.hidden_sizes=[]"], "agent.hidden_sizes", "1 to 16 integers"),
        (["agent.hidden_sizes=[64, 0]"], "agent.hidden_sizes", "[1, 65,536]"),
        (["agent.hidden_sizes=[64, true]"], "agent.hidden_sizes", "[1, 65,536]"),
        (["agent.activation=gelu"], "agent.activation", "tanh"),
        (["total_env_steps=0"], "total_env_steps", "[1,"),
        (["seed=-1"], "seed", "[0, 2**31)"),
        (["eval.episodes=0"], "eval.episodes", "[1,"),
        (["env.max_episode_steps=-1"], "env.max_episode_steps", "[0,"),
        # sizes that are typos, not runs (the chaos run's raw allocator tracebacks)
        (["env.num_envs=1e12"], "env.num_envs", "1,000,000,000,000"),
        (["agent.hidden_sizes=[1e9]"], "agent.hidden_sizes", "[1, 65,536]"),
        (["eval.episodes=1e10"], "eval.episodes", "1,048,576"),
        (["agent.rollout_steps=1e9"], "agent.rollout_steps", "65,536"),
        (["env.num_envs=65536", "agent.rollout_steps=65536"], "agent.rollout_steps", "lower either"),
        (["env.max_episode_steps=1e12"], "env.max_episode_steps", "10,000,000"),
        (["log.checkpoint_interval_s=-5"], "log.checkpoint_interval_s", ">= 0"),
        (["tournament.mode=pbt", "tournament.reserve=-1"], "tournament", "tournament.reserve must be >= 0"),
        (["tournament.mode=elegantrl", "tournament.reserve=2"], "tournament", "tournament.reserve keeps pods"),
        (["tournament.mode=none", "tournament.reserve=1"], "tournament", "tournament.reserve keeps pods"),
        (["eval.stop_at_return=high"], "eval.stop_at_return", "'high'"),
        (["eval.stop_at_return=.nan"], "eval.stop_at_return", "nan"),
        (["eval.stop_at_return=true"], "eval.stop_at_return", "True"),
    ],
)
def test_invalid_values_raise_naming_the_key(overrides, key, fragment):
    msg = error_of(None, overrides)
    assert msg.startswith(f"{key}:"), msg
    assert fragment in msg, msg


@pytest.mark.parametrize("value,want", [("-180", -180), ("null", None), ("1e3", 1000.0)])
def test_a_target_return_is_a_number_or_null(value, want):
    assert load_config(None, [f"eval.stop_at_return={value}"]).eval.stop_at_return == want


def test_unknown_env_name_lists_known_tasks():
    msg = error_of(None, ["env.name=doom"])
    for name in TASKS:
        assert name in msg


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7"])
def test_valid_devices(device):
    assert load_config(None, [f"device={device}"]).device == device


def test_minibatches_dividing_the_batch_are_accepted():
    cfg = load_config(None, ["env.num_envs=10", "agent.rollout_steps=32", "agent.num_minibatches=320"])
    assert cfg.agent.num_minibatches == 320


def test_validate_checks_programmatic_configs_too():
    cfg = Config()
    cfg.agent.gamma = 2.0
    with pytest.raises(ConfigError, match="agent.gamma"):
        validate(cfg)


# --------------------------------------------------------------------------------------
# Files and override syntax
# --------------------------------------------------------------------------------------
def test_missing_job_file(tmp_path):
    msg = error_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in msg and "not found" in msg


def test_job_path_is_a_directory(tmp_path):
    msg = error_of(tmp_path)
    assert "not found" in msg


@pytest.mark.parametrize("text", ["agent: [unclosed\n", "a: b: c\n", "env:\n  name: x\n bad-indent: 1\n"])
def test_malformed_yaml(tmp_path, text):
    p = write(tmp_path, text, "broken.yaml")
    msg = error_of(p)
    assert "broken.yaml" in msg and "not valid YAML" in msg


@pytest.mark.parametrize("text", ["- 1\n- 2\n", "just a string\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    msg = error_of(write(tmp_path, text, "flat.yaml"))
    assert "mapping" in msg


def test_override_without_equals():
    msg = error_of(None, ["agent.learning_rate"])
    assert "KEY=VALUE" in msg and "agent.learning_rate" in msg


def test_override_with_empty_key():
    msg = error_of(None, ["=3"])
    assert "empty key" in msg


def test_override_with_invalid_yaml_value():
    msg = error_of(None, ["agent.hidden_sizes=[1, 2"])
    assert "not valid YAML" in msg


# --------------------------------------------------------------------------------------
# Documentation of every field
# --------------------------------------------------------------------------------------
def all_dataclasses(obj: object = None) -> list[type]:
    obj = Config() if obj is None else obj
    out = [type(obj)]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += all_dataclasses(value)
    return out


def test_every_dataclass_field_has_a_one_line_doc():
    classes = all_dataclasses()
    assert {env_config_class(), TradingOptions, MujocoOptions, PPOConfig, EvalConfig, LogConfig, Config} <= set(classes)
    for cls in classes:
        for f in dataclasses.fields(cls):
            doc = f.metadata.get("doc", "")
            assert isinstance(doc, str) and doc.strip(), f"{cls.__name__}.{f.name} has no doc"
            assert "\n" not in doc, f"{cls.__name__}.{f.name}: doc is not one line"


def test_describe_lists_every_field_with_doc_and_default():
    rows = describe()
    keys = [k for k, _, _ in rows]
    assert keys == leaf_keys()
    assert len(keys) == len(set(keys))
    defaults = to_dict(Config())
    for key, doc, default in rows:
        assert doc.strip(), key
        node = defaults
        for part in key.split("."):
            node = node[part]
        assert default == node, key
    assert "agent.learning_rate" in keys and "env.num_envs" in keys and "log.checkpoint_interval_s" in keys


# --- hostile job files and settings ------------------------------------------------------


def _bomb(levels: int, width: int) -> str:
    """A YAML alias bomb under a key a job file may hold: ``width ** (levels + 1)`` nodes expanded."""
    lines = ["population: []", "x0: &x0 [" + ",".join(["1"] * width) + "]"]
    lines += [f"x{i}: &x{i} [" + ",".join([f"*x{i - 1}"] * width) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_a_job_file_alias_bomb_is_refused_within_seconds(tmp_path):
    import time

    p = tmp_path / "bomb.yaml"
    p.write_text(_bomb(9, 10))
    assert p.stat().st_size < 1024
    t = time.monotonic()
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(p)
    assert time.monotonic() - t < 5


def test_a_small_bomb_cannot_become_a_large_config(tmp_path):
    """392 bytes once became a 2.2 MB config.yaml: what expands beyond MAX_YAML_NODES is refused."""
    p = tmp_path / "small.yaml"
    p.write_text(_bomb(4, 9))  # 9**5 = 59,049 nodes from a few hundred bytes
    assert p.stat().st_size < 400
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(p)


def test_an_oversized_or_non_regular_job_file_is_refused(tmp_path):
    import os

    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "#" * (2 << 20))
    with pytest.raises(ConfigError, match="more than a job file can be"):
        load_config(big)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="FIFO"):
        load_config(fifo)


def test_an_alias_bomb_in_an_override_is_refused():
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(None, ["population=" + _bomb(9, 10).replace("\n", "\n")[len("population: []\n") :].strip()])


def test_a_tournament_interval_below_one_batch_is_refused():
    sets = ["tournament.mode=elegantrl", "env.num_envs=64", "agent.rollout_steps=16"]
    with pytest.raises(
        ConfigError, match=r"tournament.interval_env_steps: must be at least one update's env steps.*1,024"
    ):
        load_config(None, [*sets, "tournament.interval_env_steps=1000"])
    assert load_config(None, [*sets, "tournament.interval_env_steps=1024"]).tournament.interval_env_steps == 1024
    assert load_config(None, ["tournament.mode=none", "tournament.interval_env_steps=1"])  # no rounds: no check


@pytest.mark.parametrize("value", ["1e308", "604801", "-2", ".inf"])
def test_min_interval_s_out_of_range_is_a_config_error_not_an_overflow(value):
    with pytest.raises(ConfigError, match="tournament.min_interval_s must be in"):
        load_config(None, [f"tournament.min_interval_s={value}"])
