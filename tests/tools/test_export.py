"""`podracer export` (docs/exporting.md): a run's logs as TensorBoard event files, read back with
TensorBoard's own reader and compared with the HDF5 logs; a checkpoint's policy as TorchScript and
ONNX, which acts like the pod (its deterministic action from a raw observation, the normalizer
included) to 1e-5; the training-diagnostics figure; and inputs they must refuse (exit 2, a
message, no traceback)."""

import dataclasses
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, run_cli

from podracer_hpc.files import safeio
from podracer_hpc.files.h5log import read_log
from podracer_hpc.files.records import read_records
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.tools import export

TINY = [
    "total_env_steps=4096",
    "env.num_envs=64",
    "eval.final_episodes=0",
    "eval.interval_env_steps=2048",
    "eval.episodes=4",
    "threads=1",
    "log.progress_interval_s=0",
]
TOURNAMENT = [
    "total_env_steps=8192",
    "env.num_envs=64",
    "agent.rollout_steps=16",
    "eval.episodes=4",
    "eval.interval_env_steps=2048",
    "tournament.interval_env_steps=2048",
    "threads=1",
    "log.progress_interval_s=0",
    "eval.final_episodes=0",
]
# TorchScript is deprecated in torch 2.13 (in favour of torch.export); its files still load
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.*deprecated:DeprecationWarning")
HOPPER = [
    "total_env_steps=2048",
    "env.num_envs=8",
    "agent.rollout_steps=64",
    "agent.num_minibatches=4",
    "agent.update_epochs=2",
    "eval.final_episodes=0",
    "eval.episodes=2",
    "threads=1",
    "log.progress_interval_s=0",
]


def _sets(sets):
    return sum((["--set", s] for s in sets), [])


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def refused(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(job)``: the run directory of a quick ``podracer train`` of ``jobs/<job>.yaml`` (made once)."""
    runs: dict[str, object] = {}

    def get(job: str, sets=TINY):
        if job not in runs:
            d = tmp_path_factory.mktemp(f"export-{job}") / "run"
            r = run_cli("train", f"jobs/{job}.yaml", "--run-dir", str(d), "--quiet", *_sets(sets))
            assert r.returncode == 0, r.stderr
            runs[job] = d
        return runs[job]

    return get


@pytest.fixture(scope="module")
def tournament_run(tmp_path_factory):
    """A quickstart tournament: 2 pods under a real mpiexec where there is one, else 1 pod."""
    from podracer_hpc.launch import LaunchError, find_mpiexec

    d = tmp_path_factory.mktemp("export-tb") / "run"
    cli = [
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(d),
        "--quiet",
        *_sets(TOURNAMENT),
    ]
    try:
        cmd = [find_mpiexec(), "-n", "2", *cli]
    except LaunchError:
        cmd = cli
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return d


# --------------------------------------------------------------------------------------
# TensorBoard
# --------------------------------------------------------------------------------------
def _accumulator(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def test_tensorboard_events_hold_every_rank_log_row(tournament_run, tmp_path):
    pytest.importorskip("tensorboard", reason="podracer export tensorboard needs tensorboard (the export extra)")
    out = tmp_path / "tb"
    r = run_cli("export", "tensorboard", str(tournament_run), "--out", str(out))
    assert r.returncode == 0, r.stderr
    said = last_json(r.stdout)
    logs = RunDir(tournament_run).pod_logs()
    assert said["ranks"] == sorted(logs) and len(said["files"]) == len(logs)
    rows = {g: 0 for g in ("train", "eval", "tournament")}
    scalars = {g: 0 for g in rows}
    for rank, path in logs.items():
        log = read_log(path)
        ea = _accumulator(out / f"rank{rank}")
        tags = ea.Tags()["scalars"]
        t0 = None
        for group, cols in (
            (
                "train",
                [
                    "loss",
                    "approx_kl",
                    "clipfrac",
                    "entropy",
                    "explained_variance",
                    "learning_rate",
                    "return_mean",
                    "value_loss",
                    "steps_per_s",
                ],
            ),
            ("eval", ["return_mean", "return_std", "return_se", "return_min", "episodes"]),
            ("tournament", ["fitness", "fitness_se", "tournament_s", "fs_ops", "round"]),
        ):
            g = log[group]
            assert len(g["env_steps"]) > 0, group  # the run logged every group
            rows[group] += len(g["env_steps"])
            for c in cols:
                finite = np.isfinite(g[c].astype(float))
                got = ea.Scalars(f"{group}/{c}") if f"{group}/{c}" in tags else []
                # every finite value, at its env steps, as float32 (TensorBoard's simple_value)
                assert [e.step for e in got] == g["env_steps"][finite].tolist(), (group, c)
                assert [e.value for e in got] == [float(np.float32(v)) for v in g[c][finite]], (group, c)
                if got:
                    t0 = got[0].wall_time - float(g["wall_s"][finite][0]) if t0 is None else t0
                    assert np.allclose([e.wall_time - t0 for e in got], g["wall_s"][finite], atol=1e-3)
            scalars[group] += sum(len(ea.Scalars(t)) for t in tags if t.startswith(group + "/"))
        assert not np.isfinite(log["train"]["return_mean"]).all()  # some updates ended no episode: left out
        # the tournament's decisions: an action code, the hyperparameters after it, a sentence
        recs = read_records(log["tournament"])
        codes = ea.Scalars("tournament/action_code")
        assert [e.value for e in codes] == [float(export.ACTION_CODES[x.action]) for x in recs]
        lr = ea.Scalars("tournament/hparams/learning_rate")
        assert [e.value for e in lr] == [float(np.float32(x.new_hparams["learning_rate"])) for x in recs]
        texts = ea.Tensors("tournament/decision")
        decisions = [t.tensor_proto.string_val[0].decode().split(":")[0] for t in texts]
        assert decisions == [f"round {x.round}" for x in recs]
        # the file's events in one step order across the groups, as wandb sync needs it
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        (file,) = (out / f"rank{rank}").glob("*tfevents*")
        steps = [e.step for e in EventFileLoader(str(file)).Load() if e.HasField("summary")]
        assert steps == sorted(steps) and len(steps) == sum(len(log[g]["env_steps"]) for g in rows)
    assert said["scalars"] == scalars and said["texts"] == rows["tournament"]
    assert said["events"] == sum(rows.values())


def test_tensorboard_refuses_what_it_cannot_export(tournament_run, tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="podracer export tensorboard needs tensorboard (the export extra)")
    (tmp_path / "file.h5").write_bytes(b"not a run")
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "nope")], "no such run directory"),
        ([str(tmp_path / "file.h5")], "is a file podracer-hpc did not write; pass a run directory"),
        ([str(tmp_path / "empty")], "holds no logs/"),
        ([str(tournament_run), "--out", str(tournament_run / "logs" / "tb")], "choose another folder"),
    ]
    for args, needle in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "tb")]
        assert export.main(["tensorboard", *args]) == 2, args
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    # a second export into the same folder would double every curve: refused, unless --overwrite
    out = tmp_path / "twice"
    assert export.main(["tensorboard", str(tournament_run), "--out", str(out)]) == 0
    first = last_json(capsys.readouterr().out)
    assert export.main(["tensorboard", str(tournament_run), "--out", str(out)]) == 2
    assert "already holds event files" in capsys.readouterr().err
    assert export.main(["tensorboard", str(tournament_run), "--out", str(out), "--overwrite"]) == 0
    again = last_json(capsys.readouterr().out)
    assert len(again["files"]) == len(first["files"]) and again["scalars"] == first["scalars"]
    assert sorted(p.name for p in (out / "rank0").iterdir()) == [
        p.split("/")[-1] for p in again["files"] if "/rank0/" in p
    ]
    # a damaged log: its reader's message
    bad = tmp_path / "badrun"
    (bad / "logs").mkdir(parents=True)
    (bad / "logs" / "x_rank0.h5").write_bytes(b"\x00" * 64)
    assert export.main(["tensorboard", str(bad), "--out", str(tmp_path / "tb2")]) == 2
    err = capsys.readouterr().err
    assert "not a readable HDF5 log" in err and "Traceback" not in err


# --------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------
def reference(checkpoint, num_envs=64, steps=20):
    """The pod's own acting, built here by hand: (raw observations of real states, the pod's
    deterministic env actions for them, the agent). States come from the agent's own sampled
    (exploring) policy, so they are states a pod meets, and varied."""
    from podracer_hpc.config import Config, from_dict
    from podracer_hpc.pod import Pod

    tensors, meta, _ = safeio.load(checkpoint, "pod-state")
    cfg = from_dict(Config, meta["config"])
    cfg = dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=num_envs),
        device="cpu",
        eval=dataclasses.replace(cfg.eval, episodes=1),
    )
    pod = Pod(cfg)
    agent = pod.agent_from(tensors, meta)
    gen = torch.Generator().manual_seed(7)
    obs, seen = pod.env.reset(11), []
    with torch.no_grad():
        for _ in range(steps):
            seen.append(obs)
            action, _ = agent.act(agent.normalize_obs(obs, update=False), gen)
            obs = pod.env.step(pod.to_env_action(action))[0]
        obs = torch.cat(seen).to(torch.float32)
        want = pod.to_env_action(agent.act_deterministic(agent.normalize_obs(obs, update=False)))
    return obs, want, agent


def assert_acts_like(got, want, discrete: bool) -> None:
    got = torch.as_tensor(np.asarray(got))
    assert got.shape == want.shape, (got.shape, want.shape)
    if discrete:
        assert got.dtype == torch.int64 and torch.equal(got, want)
    else:
        assert got.dtype == torch.float32
        assert float((got - want).abs().max()) <= 1e-5


def check_exported(path, fmt, obs, want, discrete):
    """Run the exported file on ``obs`` (and on one observation) with its own runtime."""
    if fmt == "torchscript":
        module = torch.jit.load(str(path))
        with torch.no_grad():
            assert_acts_like(module(obs), want, discrete)
            assert_acts_like(module(obs[:1]), want[:1], discrete)
            assert_acts_like(module(obs.double()), want, discrete)  # cast inside
    else:
        ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install onnxruntime)")
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in s.get_inputs()] == ["obs"] and [o.name for o in s.get_outputs()] == ["action"]
        assert_acts_like(s.run(None, {"obs": obs.numpy()})[0], want, discrete)
        assert_acts_like(s.run(None, {"obs": obs[:1].numpy()})[0], want[:1], discrete)
    meta = export.read_metadata(path)
    assert meta["kind"] == "exported-policy" and meta["format"] == fmt and meta["discrete"] == discrete
    assert meta["obs_dim"] == obs.shape[1]
    return meta


def _needs(fmt):
    if fmt == "onnx":
        pytest.importorskip("onnx", reason="--format onnx needs onnx (the export extra)")


@pytest.mark.parametrize("job", ["pendulum", "cartpole"])
@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_the_exported_policy_acts_like_the_pod(trained, job, fmt, tmp_path, capsys):
    _needs(fmt)
    ck = trained(job) / "checkpoints" / "rank0.safetensors"
    out = tmp_path / f"policy.{'pt' if fmt == 'torchscript' else 'onnx'}"
    assert export.main(["policy", str(ck), "--format", fmt, "--out", str(out)]) == 0, capsys.readouterr().err
    said = last_json(capsys.readouterr().out)
    assert said["policy"] == str(out) and out.is_file() and said["bytes"] == out.stat().st_size
    assert said["task"] == job and said["discrete"] == (job == "cartpole")
    if said["check"]["max_abs_diff"] is not None:
        assert said["check"]["max_abs_diff"] <= 1e-5
    obs, want, agent = reference(ck)
    meta = check_exported(out, fmt, obs, want, job == "cartpole")
    assert meta["task"] == job and meta["source"] == str(ck)
    if job == "pendulum":
        assert meta["action_low"] == [-2.0] and meta["action_high"] == [2.0]
        assert want.abs().max() > 1.0  # the env's units (torque in [-2, 2]), not the policy's [-1, 1]
    # the normalizer is part of it: the actor on the raw observations acts otherwise
    assert agent.obs_rms.mean.abs().max() > 1e-3
    with torch.no_grad():
        raw = agent.act_deterministic(obs)
    if job == "cartpole":
        assert not torch.equal(raw, want)
    else:
        assert (raw.clamp(-1, 1) * 2 - want).abs().max() > 1e-3


def test_the_cli_writes_a_policy_and_says_so(trained, tmp_path):
    ck = trained("pendulum") / "checkpoints" / "rank0.safetensors"
    out = tmp_path / "deep" / "er" / "pendulum.pt"
    r = run_cli("export", "policy", str(ck), "--format", "torchscript", "--out", str(out))
    assert r.returncode == 0, r.stderr
    said = last_json(r.stdout)
    assert said["policy"] == str(out) and said["format"] == "torchscript" and said["check"]["max_abs_diff"] == 0.0
    assert "acts like the pod" in r.stderr
    assert not list(out.parent.glob(".*.tmp"))


def test_a_leaderboard_entry_exports_too(tournament_run, tmp_path, capsys):
    """An entry (its tensors or its JSON sidecar) is an agent like a checkpoint's."""
    from podracer_hpc.pool.leaderboard import Leaderboard

    board = Leaderboard(tournament_run / "leaderboard")
    entry = board.list()[0]
    tensors, meta = board.load(entry.id)
    ck = tmp_path / "as-checkpoint.safetensors"  # the same agent as a pod-state file, for the reference
    safeio.save(ck, tensors, meta, "pod-state")
    obs, want, _ = reference(ck)
    for path in (board.tensors_path(entry.id), board.tensors_path(entry.id).with_suffix(".json")):
        out = tmp_path / f"{path.suffix[1:]}.pt"
        assert export.main(["policy", str(path), "--out", str(out)]) == 0, capsys.readouterr().err
        assert last_json(capsys.readouterr().out)["source"] == str(path)
        check_exported(out, "torchscript", obs, want, False)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_a_mujoco_policy_acts_like_the_pod(trained, fmt, tmp_path, capsys):
    pytest.importorskip("gymnasium.envs.mujoco", reason="MuJoCo tasks need gymnasium[mujoco]")
    _needs(fmt)
    ck = trained("hopper", HOPPER) / "checkpoints" / "rank0.safetensors"
    out = tmp_path / f"hopper.{fmt}"
    assert export.main(["policy", str(ck), "--format", fmt, "--out", str(out)]) == 0, capsys.readouterr().err
    obs, want, _ = reference(ck, num_envs=8, steps=16)
    meta = check_exported(out, fmt, obs, want, False)
    assert meta["task"] == "hopper" and meta["act_dim"] == 3


def test_the_legacy_onnx_exporter_too(trained, tmp_path, capsys):
    _needs("onnx")
    ck = trained("cartpole") / "checkpoints" / "rank0.safetensors"
    out = tmp_path / "legacy.onnx"
    assert export.main(["policy", str(ck), "--format", "onnx", "--onnx-exporter", "legacy", "--out", str(out)]) == 0
    assert last_json(capsys.readouterr().out)["onnx_exporter"] == "legacy"
    obs, want, _ = reference(ck)
    assert check_exported(out, "onnx", obs, want, True)["onnx_exporter"] == "legacy"


def test_a_per_asset_stock_trading_policy_exports_and_backtests_alike(tmp_path, capsys):
    """The per-asset network (stock trading): the export acts like the pod, and `podracer
    backtest` of the exported file gives the checkpoint's own backtest."""
    from podracer_hpc.config import load_config
    from podracer_hpc.pod import Pod
    from podracer_hpc.tools.backtest import backtest

    cfg = load_config(
        None,
        [
            "env.name=stock_trading",
            "env.num_envs=8",
            "agent.hidden_sizes=[8]",
            "eval.episodes=1",
            "env.max_episode_steps=8",
            "agent.rollout_steps=4",
            "agent.num_minibatches=2",
            "agent.network=per_asset",
            "env.trading.actions=weights",
            "total_env_steps=96",
            "env.trading.synthetic_stocks=6",
            "eval.interval_env_steps=0",
        ],
    )
    pod = Pod(cfg)
    for _ in range(3):
        pod.train_iteration()
    ck = tmp_path / "rank0.safetensors"
    pod.save(ck)
    out = tmp_path / "trading.pt"
    assert export.main(["policy", str(ck), "--out", str(out)]) == 0, capsys.readouterr().err
    obs, want, _ = reference(ck, num_envs=8, steps=8)
    meta = check_exported(out, "torchscript", obs, want, False)
    assert meta["task"] == "stock_trading" and len(meta["tickers"]) == 6
    mine = backtest(str(out), None, "2015-06-01", "2015-08-31", synthetic={"stocks": 6})
    theirs = backtest(str(ck), None, "2015-06-01", "2015-08-31", synthetic={"stocks": 6})
    assert mine["agent"] == pytest.approx(theirs["agent"], rel=1e-6, abs=1e-9)


def test_what_cannot_be_exported_exits_2_with_a_message(trained, tmp_path, capsys):
    ck = trained("pendulum") / "checkpoints" / "rank0.safetensors"
    (tmp_path / "x.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    tensors, meta, _ = safeio.load(ck, "pod-state")
    meta["config"]["agent"]["hidden_sizes"] = [7]  # a network this pod would not build
    safeio.save(tmp_path / "changed.safetensors", tensors, meta, "pod-state")
    (tmp_path / "dir").mkdir()
    cases = [
        ([str(tmp_path / "nope.safetensors")], "no such file"),
        ([str(tmp_path / "x.safetensors")], "not one written by podracer-hpc"),
        ([str(tmp_path / "changed.safetensors")], "does not fit this pod"),
        ([str(ck.parent.parent)], "is a run directory; pass a checkpoint"),
        ([str(ck), "--out", str(tmp_path / "dir")], "is a directory; give a file name"),
        ([str(ck), "--out", str(ck)], "is the checkpoint itself"),
    ]
    for args, needle in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "p.pt")]
        assert export.main(["policy", *args]) == 2, args
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, (needle, err)
        assert "podracer evaluate" not in err
    assert not (tmp_path / "p.pt").exists()
    refused(
        run_cli("export", "policy", str(ck), "--format", "tflite", "--out", str(tmp_path / "p")),
        "invalid choice: 'tflite'",
    )
    refused(run_cli("export", "nonsense"), "invalid choice")


def test_podracer_lists_export():
    r = run_cli("--help")
    assert r.returncode == 0 and "export" in r.stdout
    r = run_cli("export", "--help")
    assert r.returncode == 0 and "tensorboard" in r.stdout and "policy" in r.stdout


# --------------------------------------------------------------------------------------
# The training-diagnostics figure
# --------------------------------------------------------------------------------------
def test_the_diagnostics_figure_has_one_line_per_pod_in_each_panel(tournament_run, tmp_path):
    from analysis.aggregate import load_run
    from analysis.diagnostics import DIAGNOSTICS, main, training_diagnostics
    from analysis.plots import text_overlaps

    pods = len(RunDir(tournament_run).pod_logs())
    run = load_run(tournament_run)
    fig = training_diagnostics(run)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [t for _, t in DIAGNOSTICS]
    for ax, (col, _) in zip(panels, DIAGNOSTICS):
        assert len(ax.lines) == pods, col
        assert [ln.get_label() for ln in ax.lines] == [f"pod {r}" for r in sorted(run.logs)]
        for r, ln in zip(sorted(run.logs), ax.lines):  # the log's own numbers, at its env steps
            assert np.array_equal(ln.get_xdata(), run.logs[r]["train"]["env_steps"].astype(float))
            assert np.array_equal(ln.get_ydata(), run.logs[r]["train"][col].astype(float), equal_nan=True)
    assert text_overlaps(fig) == []
    out = tmp_path / "figs" / "diagnostics.png"
    assert main([str(tournament_run), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert main([str(tmp_path / "not-a-run"), "--out", str(tmp_path / "x.png")]) == 2


def test_train_scalars_stay_finite_or_are_left_out(tournament_run, tmp_path):
    """NaN (an update in which no episode ended) is never written as a number."""
    pytest.importorskip("tensorboard", reason="podracer export tensorboard needs tensorboard (the export extra)")
    said = export.export_tensorboard(tournament_run, tmp_path / "tb")
    assert said["missing_values_left_out"] > 0
    ea = _accumulator(tmp_path / "tb" / "rank0")
    assert all(math.isfinite(e.value) for t in ea.Tags()["scalars"] for e in ea.Scalars(t))


def _small_run(root) -> str:
    """A run directory named with a byte that is not UTF-8, holding one rank log of two rows."""
    import os

    from podracer_hpc.files.h5log import H5Writer

    d = os.fsdecode(os.fsencode(os.path.join(str(root), "run")) + b"\xff")
    with H5Writer(os.path.join(d, "logs", "x_rank0.h5"), {"config": {"name": "x"}, "created": 1.0}) as w:
        for i in (1, 2):
            w.append("train", {"update": i, "env_steps": 10 * i, "wall_s": float(i), "return_mean": 2.0})
    return d


@pytest.mark.parametrize("where", ["not utf-8", "under a file", "in /proc", "fine"])
def test_tensorboard_with_an_odd_run_name_or_an_unwritable_out(tmp_path, where):
    """A run directory whose name is not UTF-8 exports; an --out that is not UTF-8 or cannot be
    written exits 2 with a message, never the event writer's traceback."""
    import os

    pytest.importorskip("tensorboard", reason="podracer export tensorboard needs tensorboard (the export extra)")
    run = _small_run(tmp_path)
    (tmp_path / "afile").write_text("")
    out = {
        "not utf-8": os.fsdecode(os.fsencode(str(tmp_path / "out")) + b"\xfe"),
        "under a file": str(tmp_path / "afile" / "out"),
        "in /proc": "/proc/self/podracer-out",
        "fine": str(tmp_path / "tb"),
    }[where]
    r = run_cli("export", "tensorboard", run, "--out", out, timeout=120)
    if where == "fine":
        assert r.returncode == 0, r.stderr
        assert last_json(r.stdout)["events"] == 2 and list((tmp_path / "tb" / "rank0").glob("*tfevents*"))
    else:
        refused(r, "not UTF-8" if where == "not utf-8" else "choose a folder you can write to")
