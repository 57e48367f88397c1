"""Hostile files: what others can put in a run directory or a leaderboard never runs and is never taken.

- a factory named by a checkpoint's or an entry's stored config (``env.jax.factory:
  subprocess:run`` with shell kwargs that would create a marker file) is never imported nor
  called by ``evaluate``, ``export policy`` or ``backtest`` unless the user passes
  ``--trust-config`` or the same setting in ``--config JOB.yaml`` (exit 2 and a message
  otherwise): the marker is never created;
- checkpoints and entries owned by an outsider are refused (``--allow-foreign-files`` to load them);
- an entry forged without the leaderboard's secret (a consistent plain sha256), or one from
  another leaderboard, is refused; the secret file is group-private;
- a fresh pod that joins the leaderboard refuses hyperparameters outside the declared space and an
  agent that does not beat its own fresh one on the same start states.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from helpers import REPO, run_cli

from podracer_hpc.files import safeio
from podracer_hpc.files.h5log import read_log
from podracer_hpc.pool import leaderboard as lb_mod
from podracer_hpc.pool.entryfiles import KEY_FILE, LeaderboardWarning, SecretError
from podracer_hpc.pool.leaderboard import EntryRefused, Leaderboard

SETS = ["env.num_envs=8", "eval.episodes=4", "threads=1"]
STRANGER = 54321  # a uid and gid no account has


@pytest.fixture(scope="module")
def states():
    """A real pod's checkpoint state and entry state (one quickstart pod, untrained)."""
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod

    torch.manual_seed(0)
    pod = Pod(load_config(REPO / "jobs" / "quickstart.yaml", SETS), rank=0, device="cpu")
    return pod.state_tensors(), pod.agent_tensors()


def with_env(meta: dict, env: dict) -> dict:
    m = copy.deepcopy(meta)
    m["config"]["env"].update(env)
    return m


def hostile_env(marker: Path) -> dict:
    """The issue's planted config: a JAX 'factory' that runs a shell command."""
    return {"name": "jax", "jax": {"factory": "subprocess:run", "kwargs": {"args": f"touch {marker}", "shell": True}}}


def plant_checkpoint(run: Path, state: tuple, env: dict | None = None) -> Path:
    tensors, meta = state
    ck = run / "checkpoints" / "rank0.safetensors"
    ck.parent.mkdir(parents=True, exist_ok=True)
    safeio.save(ck, tensors, with_env(meta, env) if env else meta, "pod-state")
    return ck


def plant_entry(root: Path, state: tuple, env: dict | None = None, score: float = 1.0, **meta_changes) -> Path:
    """An entry published by a group member (who holds the leaderboard's secret)."""
    tensors, meta = state
    m = with_env(meta, env) if env else copy.deepcopy(meta)
    m.update({"job": "planted", "pod": 0, "round": 0, **meta_changes})
    board = Leaderboard(root)
    return board.tensors_path(board.publish(tensors, score, m))


def assert_refused(r, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, (n, r.stderr)


# --------------------------------------------------------------------------- code named by a file


@pytest.mark.parametrize(
    "tool, what",
    [
        ("evaluate", "checkpoint"),
        ("evaluate", "run"),
        ("evaluate", "entry"),
        ("export", "checkpoint"),
        ("export", "entry"),
        ("backtest", "checkpoint"),
        ("backtest", "entry"),
    ],
)
def test_a_stored_factory_never_runs_without_consent(tmp_path, states, tool, what):
    marker = tmp_path / "marker"
    run = tmp_path / "run"
    if what == "entry":
        path = plant_entry(run / "leaderboard", states[1], hostile_env(marker))
    else:
        path = plant_checkpoint(run, states[0], hostile_env(marker))
    target = run if what == "run" else path
    args = {
        "evaluate": ["evaluate", str(target), "--episodes", "2"],
        "export": ["export", "policy", str(target), "--out", str(tmp_path / "p.pt")],
        "backtest": ["backtest", str(target), "--plot", ""],
    }[tool]
    r = run_cli(*args)
    assert not marker.exists(), "the stored factory ran"
    if tool == "backtest":  # a backtest builds only the trading env: the task is refused before anything
        assert_refused(r, "not stock_trading")
    else:
        assert_refused(r, "subprocess:run", "--trust-config", "--config JOB.yaml", "Nothing was run")
    assert not (tmp_path / "p.pt").exists()


@pytest.mark.parametrize("tool", ["evaluate", "export"])
def test_with_trust_config_the_stored_factory_runs(tmp_path, states, tool):
    marker = tmp_path / "marker"
    ck = plant_checkpoint(tmp_path / "run", states[0], hostile_env(marker))
    args = {
        "evaluate": ["evaluate", str(ck), "--episodes", "2"],
        "export": ["export", "policy", str(ck), "--out", str(tmp_path / "p.pt")],
    }[tool]
    r = run_cli(*args, "--trust-config")
    assert marker.exists(), r.stderr  # the user said so: it ran (and is no env: a clear error after)
    assert_refused(r, "cannot build its task's env")


def test_a_factory_the_users_own_config_names_runs_and_another_does_not(tmp_path, states):
    factory = "podracer_hpc.envs.jax_pendulum:make"
    ck = plant_checkpoint(tmp_path / "run", states[0], {"name": "jax", "jax": {"factory": factory}})
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"env: {{name: jax, jax: {{factory: '{factory}'}}}}\n")
    other = tmp_path / "other.yaml"
    other.write_text("env: {name: pendulum}\n")
    assert_refused(run_cli("evaluate", str(ck), "--episodes", "2"), factory, "--trust-config")
    assert_refused(run_cli("evaluate", str(ck), "--episodes", "2", "--config", str(other)), "your --config names none")
    r = run_cli("evaluate", str(ck), "--episodes", "2", "--config", str(mine))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["results"][0]["task"] == "jax"


def test_a_plain_gymnasium_id_names_no_code_but_a_module_id_does():
    from podracer_hpc.config import EnvConfig
    from podracer_hpc.envs.gym_task import GymnasiumOptions
    from podracer_hpc.envs.registry import code_named

    assert code_named(EnvConfig(name="gymnasium", gymnasium=GymnasiumOptions(id="Acrobot-v1"))) == {}
    named = code_named(EnvConfig(name="gymnasium", gymnasium=GymnasiumOptions(id="evil:Env-v0")))
    assert named == {"env.gymnasium.id": "evil:Env-v0", "env.gymnasium.kwargs": {}}
    assert code_named(EnvConfig(name="pendulum")) == {}


# --------------------------------------------------------------------------- files of outsiders

needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a file to another user needs root")


@needs_root
def test_a_checkpoint_owned_by_an_outsider_is_refused(tmp_path, states):
    ck = plant_checkpoint(tmp_path / "run", states[0])
    os.chown(ck, STRANGER, STRANGER)
    for args in (["evaluate", str(ck)], ["evaluate", str(tmp_path / "run")]):
        assert_refused(run_cli(*args, "--episodes", "2"), f"owned by user {STRANGER}", "--allow-foreign-files")
    assert_refused(run_cli("export", "policy", str(ck), "--out", str(tmp_path / "p.pt")), "--allow-foreign-files")
    assert_refused(run_cli("backtest", str(ck), "--plot", ""), "--allow-foreign-files")
    r = run_cli("evaluate", str(ck), "--episodes", "2", "--allow-foreign-files")
    assert r.returncode == 0, r.stderr


@needs_root
def test_the_runs_group_may_write_unless_the_directory_is_open_to_all(tmp_path, states):
    import pwd

    nobody = pwd.getpwnam("nobody")
    run = tmp_path / "run"
    ck = plant_checkpoint(run, states[0])
    os.chown(run, 0, nobody.pw_gid)  # the run's group: nobody's
    os.chown(ck, STRANGER, nobody.pw_gid)  # a stranger, but the file has the run's group
    assert run_cli("evaluate", str(ck), "--episodes", "2").returncode == 0  # only the group could create it
    ck.parent.chmod(0o777)  # ...unless anyone may create files there (a setgid directory gives them the group)
    assert_refused(run_cli("evaluate", str(ck), "--episodes", "2"), "writable by all users")
    os.chown(ck, nobody.pw_uid, nobody.pw_gid)  # a member of the run's group (its primary group)
    assert run_cli("evaluate", str(ck), "--episodes", "2").returncode == 0


@needs_root
def test_an_entry_owned_by_an_outsider_is_refused_by_every_reader(tmp_path, states):
    root = tmp_path / "board"
    good = plant_entry(root, states[1], score=1.0)
    planted = plant_entry(root, states[1], score=1e6, round=1)
    for p in (planted, planted.with_suffix(".json")):
        os.chown(p, STRANGER, STRANGER)
    (root / "entries").chmod(0o2777)  # a world-writable leaderboard_dir (only warned about)
    board = Leaderboard(root)
    with pytest.warns(LeaderboardWarning, match=f"owned by user {STRANGER}"):
        assert [e.id for e in board.list()] == [good.stem]
    with pytest.raises(EntryRefused, match="--allow-foreign-files"):
        board.load(planted.stem)
    assert_refused(run_cli("evaluate", str(planted), "--episodes", "2"), "--allow-foreign-files")
    assert Leaderboard(root, allow_foreign=True).load(planted.stem)[0]


# --------------------------------------------------------------------------- forged entries


def forge_without_the_secret(path: Path, **changes) -> None:
    """What a writer without the secret can do: edit the sidecar and make every plain checksum match."""
    import hashlib

    side = path.with_suffix(".json")
    d = json.loads(side.read_text())
    d.update(changes)
    d["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    d["sidecar_sha256"] = lb_mod._sidecar_digest(d)
    side.write_text(json.dumps(d))


def test_a_forged_entry_with_consistent_plain_checksums_is_refused(tmp_path, states):
    root = tmp_path / "board"
    honest = plant_entry(root, states[1], score=1.0)
    forged = plant_entry(root, states[1], score=2.0, round=1)
    forge_without_the_secret(forged, score=1e9)
    board = Leaderboard(root)
    with pytest.warns(LeaderboardWarning, match="forged or from another leaderboard"):
        assert [e.id for e in board.list()] == [honest.stem]
    with pytest.raises(EntryRefused, match="forged or from another leaderboard"):
        board.load(forged.stem)
    assert_refused(run_cli("evaluate", str(forged), "--episodes", "2"), "forged or from another leaderboard")
    # an unkeyed (older-version) sidecar of the same forgery: refused unless asked for, and then
    # its score is still checked against the copy inside the checksummed tensor file
    d = json.loads(forged.with_suffix(".json").read_text())
    d.pop("hmac")
    d["version"] = 2
    d["sidecar_sha256"] = lb_mod._sidecar_digest(d)
    forged.with_suffix(".json").write_text(json.dumps(d))
    assert_refused(run_cli("evaluate", str(forged), "--episodes", "2"), "--accept-unkeyed")
    assert_refused(run_cli("evaluate", str(forged), "--episodes", "2", "--accept-unkeyed"), "score differ")


def test_an_entry_from_another_leaderboard_is_refused(tmp_path, states):
    a, b = tmp_path / "a", tmp_path / "b"
    entry = plant_entry(a, states[1])
    plant_entry(b, states[1], round=7)  # b has a secret of its own
    for p in (entry, entry.with_suffix(".json")):
        (b / "entries" / p.name).write_bytes(p.read_bytes())
    with pytest.raises(EntryRefused, match="forged or from another leaderboard"):
        Leaderboard(b).load(entry.stem)
    assert Leaderboard(a).load(entry.stem)[0]


def test_the_secret_is_group_private_and_refused_when_exposed(tmp_path, states):
    root = tmp_path / "board"
    entry = plant_entry(root, states[1])
    key = root / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o640
    key.chmod(0o644)
    board = Leaderboard(root)
    with pytest.raises(SecretError, match="open to all users"):
        board.secret()
    with pytest.raises(EntryRefused, match="open to all users"):
        board.load(entry.stem)
    key.chmod(0o640)
    key.write_text("0" * 10)
    with pytest.raises(EntryRefused, match="not a leaderboard secret"):
        Leaderboard(root).load(entry.stem)
    key.unlink()
    with pytest.raises(EntryRefused, match="has no secret"):
        Leaderboard(root, create=False).load(entry.stem)


# --------------------------------------------------------------------------- a fresh pod's join


def test_a_joining_pod_refuses_bad_hyperparameters_and_an_agent_that_does_not_beat_its_own(tmp_path, states):
    """The issue's forgeries, signed by an insider: high scores with learning_rate 1000 or an
    entropy coefficient of 50, and an agent no better than the pod's own (a fresh one's weights,
    a score of 1e5 claimed). The pod checks the hyperparameters against the declared space and
    evaluates the agent on the same start states before taking it: it takes none and trains on
    from its own agent. (An agent that does beat a fresh one is taken, whatever it claims: zeroed
    weights do, on Pendulum.)"""
    root = tmp_path / "board"
    tensors, meta = states[1]
    hp = dict(meta["hparams"], learning_rate=1000.0)
    lr = plant_entry(root, (tensors, {**meta, "hparams": hp}), score=1e6)
    same = plant_entry(root, (tensors, meta), score=1e5, round=1)  # the pod's own fresh agent, a score claimed
    ent = plant_entry(root, (tensors, {**meta, "hparams": dict(meta["hparams"], ent_coef=50.0)}), score=1e4)
    run = tmp_path / "run"
    r = run_cli(
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run),
        "--quiet",
        *sum(
            (
                ["--set", s]
                for s in (
                    *SETS,
                    "env.num_envs=64",
                    "total_env_steps=1024",
                    f"tournament.leaderboard_dir={root}",
                )
            ),
            [],
        ),
    )
    assert r.returncode == 0, r.stderr
    assert "joined from" not in r.stderr, r.stderr
    assert f"skipping leaderboard entry {lr.stem}: " in r.stderr and "learning_rate = 1000" in r.stderr
    assert f"{ent.stem}" in r.stderr and "ent_coef = 50 is outside its range [0, 0.02]" in r.stderr
    assert f"skipping leaderboard entry {same.stem}: it does not beat a fresh agent" in r.stderr, r.stderr
    assert "+0 +- 0" in r.stderr  # evaluated on the same start states: no better at all
    tensors, m, _ = safeio.load(run / "checkpoints" / "rank0.safetensors", "pod-state")
    assert m["hparams"]["learning_rate"] == 0.001  # the job's own
    t = read_log(run / "logs" / "quickstart_rank0.h5")["tournament"]
    assert -1 not in list(t["round"])  # no join row


def test_hyperparameters_a_pod_may_take():
    from podracer_hpc.config import TournamentConfig
    from podracer_hpc.pool.hparams import check_hparams, declared_space

    space = declared_space(TournamentConfig(mode="elegantrl"), "ppo", own={"learning_rate": 0.05})
    assert space["learning_rate"].high == 0.05 and space["learning_rate"].low == 1e-5  # widened to the pod's own
    assert check_hparams({"learning_rate": 0.01, "vf_coef": 0.5}, space) == []
    bad = check_hparams(
        {"learning_rate": 1000, "ent_coef": float("nan"), "clip_coef": True, "actor_lr": 1e-3, "vf_coef": float("inf")},
        space,
    )
    assert bad == [
        "'actor_lr' is not a hyperparameter of a ppo agent",
        "clip_coef = True is not a finite number",
        "ent_coef = nan is not a finite number",
        "learning_rate = 1000 is outside its range [1e-05, 0.05]",
        "vf_coef = inf is not a finite number",
    ]
    sac = declared_space(TournamentConfig(mode="pbt", hparam_space={"actor_lr": [1e-4, 1e-3]}), "sac")
    assert set(sac) == {"actor_lr"} and check_hparams({"actor_lr": 2e-3}, sac, "sac")
