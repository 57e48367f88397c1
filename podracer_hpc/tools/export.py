"""``podracer export``: what a run leaves for other tools (docs/exporting.md).

``podracer export tensorboard RUN_DIR --out DIR`` writes every rank's log (``/train``, ``/eval``,
``/tournament``: h5log.py) as TensorBoard event files, one folder per pod (``DIR/rank<r>/``), so
that TensorBoard reads them and ``wandb sync --sync-tensorboard DIR`` uploads them. Every number
of a row is a scalar ``<group>/<column>`` at global step ``env_steps`` (the pod's own) and wall
time ``created + wall_s`` (TensorBoard's Relative axis then reads training seconds); a tournament
row also gives ``tournament/action_code`` (:data:`ACTION_CODES`), ``tournament/hparams/<name>``
(the pod's hyperparameters after the decision) and a text ``tournament/decision``. Missing values
(NaN, an integer column's -1) are left out, not written as numbers.

``podracer export policy CHECKPOINT --format torchscript|onnx --out FILE`` writes a pod
checkpoint's (or a leaderboard entry's) deterministic policy as one stand-alone file: raw
observations ``[batch, obs_dim]`` (float32) in, the env's action out (``[batch, act_dim]`` float32
in the env's bounds, or ``[batch]`` int64 for a discrete task), the observation normalizer
included: what the pod itself does in an evaluation (``Pod.to_env_action(agent.act_deterministic(
agent.normalize_obs(obs)))``). The file carries a JSON description (``podracer.json``: the
TorchScript archive's extra file, the ONNX model's metadata), which ``podracer backtest`` reads
for a stock-trading policy. Before it is written, the exported policy is run on observations of
the task's env and compared with the pod's own actions (``check`` in the last line).

Both end with one JSON line saying what was written. A missing or foreign path, an unknown
format, or a missing optional package exits 2 with a message.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import io
import json
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from podracer_hpc.docfield import ConfigError
from podracer_hpc.files.kinds import identify, wrong_kind
from podracer_hpc.tools.trust import add_arguments, from_args

__all__ = [
    "ACTION_CODES",
    "ExportError",
    "export_policy",
    "export_tensorboard",
    "main",
    "pod_and_agent",
    "read_metadata",
]

ACTION_CODES = {
    "keep": 0,
    "load_entry": 1,
    "copy_pod": 2,
    "reset": 3,
    "join": 4,
    "draw": 5,
}  # tournament/action_code; else -1
METADATA_KEY = (
    "podracer.json"  # the TorchScript extra file / ONNX metadata key (podracer_hpc/tools/backtest.py's EXPORTED_META)
)
FORMATS = ("torchscript", "onnx")
TOLERANCE = 1e-5  # the exported policy's actions may differ from the pod's by at most this (env units)
POLICY_SOURCES = ("checkpoint", "entry")  # what `export policy` reads (files/kinds.py's words)
CHECK_STEPS = 32  # observations the export is checked on: an episode start and the policy's next steps

# Number columns that are not scalars of their own: the step and the wall time of every event, and
# the start states' seed (an id, not a quantity). String columns (the tournament's action, source
# and hyperparameters) are written in other forms: an action code, hparams/<name>, a sentence.
_NOT_SCALARS = {
    "train": ("env_steps", "wall_s"),
    "eval": ("env_steps", "wall_s", "eval_seed"),
    "tournament": ("env_steps", "wall_s", "eval_seed"),
}
_KEEP_MINUS_ONE = {("tournament", "round")}  # round -1 is the elastic join, not a missing value


class ExportError(RuntimeError):
    """The input cannot be exported; the message says what and what to do."""


def _need(module: str, what: str) -> Any:
    """Import an optional package, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        pkg = module.split(".")[0]
        raise ExportError(
            f"{what} needs the {pkg} package: pip install 'podracer-hpc[export]' (or pip install {pkg})"
        ) from None


# --------------------------------------------------------------------------------------
# TensorBoard
# --------------------------------------------------------------------------------------
def _scalar_columns(group: str) -> list[str]:
    import numpy as np

    from podracer_hpc.files.h5log import GROUPS

    return [c for c, dt in GROUPS[group].items() if dt in (np.float64, np.int64) and c not in _NOT_SCALARS[group]]


def _number(group: str, col: str, v: Any) -> float | None:
    """A log cell as a scalar, or None for a missing value (NaN, inf, an integer column's -1)."""
    import numpy as np

    x = float(v)
    if not math.isfinite(x):
        return None
    if isinstance(v, (int, np.integer)) and x == -1 and (group, col) not in _KEEP_MINUS_ONE:
        return None
    return x


def _decision_text(rec: Any) -> str:
    """One tournament record in words (the text summary ``tournament/decision``)."""
    s = f"round {rec.round}: {rec.action}"
    if rec.source.kind:
        s += f" from {rec.source.kind} {rec.source.id}"
    if rec.source.rejected:
        s += " (rejected: the pod kept its own agent)"
    if math.isfinite(rec.fitness):
        se = rec.compared.fitness_se
        s += f"; fitness {rec.fitness:.6g}" + (f" ± {se:.3g}" if math.isfinite(se) else "")
    if rec.new_hparams and rec.new_hparams != rec.old_hparams:
        s += "; hyperparameters " + json.dumps(rec.new_hparams, sort_keys=True)
    return s


def _rank_events(
    log: dict[str, Any], t0: float
) -> tuple[list[tuple[int, int, int, float, list]], dict[str, int], int, int]:
    """The events of one rank's log: (step, group order, row, wall time, summary values), with
    scalar counts by group, text summaries and skipped missing values."""
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    from podracer_hpc.files.records import read_records

    text_meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    events: list[tuple[int, int, int, float, list]] = []
    counts = {g: 0 for g in _NOT_SCALARS}
    texts = skipped = 0
    for order, group in enumerate(_NOT_SCALARS):
        cols = log.get(group) or {}
        n = len(cols.get("env_steps", ()))
        names = [c for c in _scalar_columns(group) if c in cols]
        records = read_records(cols) if group == "tournament" and n else []
        for i in range(n):
            values = []
            for c in names:
                x = _number(group, c, cols[c][i])
                if x is None:
                    skipped += 1
                    continue
                values.append(summary_pb2.Summary.Value(tag=f"{group}/{c}", simple_value=x))
            if records:
                rec = records[i]
                values.append(
                    summary_pb2.Summary.Value(
                        tag="tournament/action_code", simple_value=float(ACTION_CODES.get(rec.action, -1))
                    )
                )
                for name, v in sorted(rec.new_hparams.items()):
                    if math.isfinite(v):
                        values.append(summary_pb2.Summary.Value(tag=f"tournament/hparams/{name}", simple_value=v))
                tensor = tensor_pb2.TensorProto(
                    dtype=types_pb2.DT_STRING,
                    string_val=[_decision_text(rec).encode()],
                    tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
                )
                values.append(summary_pb2.Summary.Value(tag="tournament/decision", metadata=text_meta, tensor=tensor))
                texts += 1
            counts[group] += sum(1 for v in values if v.HasField("simple_value"))
            wall = float(cols["wall_s"][i]) if "wall_s" in cols else math.nan
            events.append((int(cols["env_steps"][i]), order, i, t0 + (wall if math.isfinite(wall) else 0.0), values))
    events.sort(key=lambda e: (e[0], e[1], e[2]))  # one global step order across the groups (wandb needs it)
    return events, counts, texts, skipped


def export_tensorboard(run_dir: str | os.PathLike, out: str | os.PathLike, overwrite: bool = False) -> dict[str, Any]:
    """Write every rank log of ``run_dir`` as event files under ``out/rank<r>/``; returns what was
    written (the last line of the command)."""
    from podracer_hpc.files.h5log import LogError, read_log
    from podracer_hpc.files.rundir import RunDir

    _need("tensorboard", "podracer export tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run_dir, out = Path(run_dir), Path(out)
    if not run_dir.exists():
        raise ExportError(f"{run_dir}: no such run directory")
    found = identify(run_dir)  # a file or a run's folder: what it is, and the run directory to give instead
    wrong = wrong_kind(found, ("run",)) if found.kind != "directory" else None
    if wrong:
        raise ExportError(wrong)
    logs = RunDir(run_dir).pod_logs()
    if not logs:
        raise ExportError(
            f"{run_dir}: holds no logs/<name>_rank<r>.h5; not a run directory, or one that has not started"
        )
    inside = [run_dir.resolve(), *(run_dir.resolve() / d for d in ("logs", "checkpoints"))]
    if any(q == out.resolve() or q in out.resolve().parents for q in inside[1:]) or out.resolve() == inside[0]:
        raise ExportError(
            f"--out {out}: the run directory itself or its logs or checkpoints; choose another folder "
            f"(e.g. {run_dir / 'tensorboard'})"
        )
    try:  # TensorBoard's writer encodes its paths as UTF-8: a name that is not would end in a traceback
        os.fsencode(out.resolve()).decode("utf-8")
    except UnicodeDecodeError:
        raise ExportError(
            f"--out {ascii(str(out))}: a path that is not UTF-8, which TensorBoard cannot write to; "
            "choose a folder whose name is UTF-8"
        ) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"--out {out}: cannot be created ({e.strerror}); choose a folder you can write to") from None
    try:
        read = {r: read_log(p) for r, p in logs.items()}
    except LogError as e:
        raise ExportError(str(e)) from None
    stale = {r: sorted((out / f"rank{r}").glob("*tfevents*")) for r in read}
    if any(stale.values()) and not overwrite:
        first = next(p for ps in stale.values() for p in ps)
        raise ExportError(
            f"{first.parent}: already holds event files ({first.name}); TensorBoard would show both. "
            "Choose another --out or pass --overwrite"
        )
    created = [
        float(lg["attrs"]["created"]) for lg in read.values() if isinstance(lg["attrs"].get("created"), (int, float))
    ]
    t0 = min(created) if created else 0.0
    files: list[str] = []
    totals = {g: 0 for g in _NOT_SCALARS}
    texts = skipped = n_events = 0
    for r, log in read.items():
        d = out / f"rank{r}"
        events, counts, t, s = _rank_events(log, t0)
        try:  # a read-only, full or vanished --out: one line, not the writer's traceback
            d.mkdir(parents=True, exist_ok=True)
            for p in stale[r]:
                p.unlink()
            writer = EventFileWriter(str(d), max_queue_size=1024, flush_secs=3600)
            for step, _, _, wall, values in events:
                writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary_pb2.Summary(value=values)))
            writer.close()
        except OSError as e:
            raise ExportError(
                f"--out {out}: cannot write {d} ({e.strerror or e}); choose a folder you can write to"
            ) from None
        files += [str(p) for p in sorted(d.glob("*tfevents*"))]
        for g in totals:
            totals[g] += counts[g]
        texts, skipped, n_events = texts + t, skipped + s, n_events + len(events)
    return {
        "tensorboard": str(out),
        "run_dir": str(run_dir),
        "ranks": sorted(read),
        "files": files,
        "events": n_events,
        "scalars": totals,
        "texts": texts,
        "missing_values_left_out": skipped,
    }


# --------------------------------------------------------------------------------------
# Policies
# --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _exported_policy_class() -> type:
    import torch

    class ExportedPolicy(torch.nn.Module):
        """A pod's deterministic policy as one module: raw observations ``[B, obs_dim]`` in, the
        env's actions out (``[B, act_dim]`` float32 in the env's bounds, or ``[B]`` int64).

        The agent's own pieces, copied: its observation normalizer (``RunningMeanStd.normalize``
        with ``agent.clip_obs``, when ``agent.norm_obs``), its actor network (PPO: ``dist_params``,
        then ``mode``: the Gaussian's mean or the argmax; SAC/TD3: ``deterministic_policy()``), then the pod's map to
        the env's units (the
        clip to [-1, 1] and the affine map to ``[action_low, action_high]``). The critic is left out.
        """

        def __init__(self, agent: Any, discrete: bool, action_low: Any = None, action_high: Any = None):
            super().__init__()
            if hasattr(agent, "deterministic_policy"):  # SAC, TD3: the agent's evaluation policy, copied
                self.actor = agent.deterministic_policy().cpu().eval()
                self.net = None
            else:  # PPO
                net = copy.deepcopy(agent.net).cpu().eval()
                for name in ("critic", "critic_enc", "critic_head"):  # the value network plays no part in acting
                    if hasattr(net, name):
                        delattr(net, name)
                self.net, self.actor = net, None
            self.obs_rms = copy.deepcopy(agent.obs_rms).cpu()
            self.norm_obs = bool(agent.cfg.norm_obs)
            self.clip_obs = float(agent.cfg.clip_obs)
            self.discrete = bool(discrete)
            if not self.discrete:  # as Pod.__init__: float32 bounds, their centre and half-width
                lo = torch.as_tensor(action_low, dtype=torch.float32)
                hi = torch.as_tensor(action_high, dtype=torch.float32)
                self.register_buffer("act_center", (hi + lo) / 2)
                self.register_buffer("act_half", (hi - lo) / 2)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            x = obs.to(torch.float32)
            if self.norm_obs:
                x = self.obs_rms.normalize(x, self.clip_obs)
            action = self.actor(x) if self.actor is not None else self.net.mode(self.net.dist_params(x))
            if self.discrete:
                return action
            return self.act_center + self.act_half * action.clamp(-1.0, 1.0)

    return ExportedPolicy


def __getattr__(name: str) -> Any:  # ExportedPolicy without importing torch on `import podracer_hpc.tools.export`
    if name == "ExportedPolicy":
        return _exported_policy_class()
    raise AttributeError(name)


def _evaluate_message(e: Exception) -> str:
    """evaluate.py's loading message, less its hint about what `podracer evaluate` reads."""
    return str(e).split(" (podracer evaluate reads")[0]


def pod_and_agent(path: str | os.PathLike, trust: Any = None) -> tuple[Any, Any, dict[str, Any]]:
    """(a one-env CPU pod of the agent's own config, the agent, its meta) for a pod checkpoint or a
    leaderboard entry, loaded as ``podracer evaluate`` loads it (evaluate.py), with what the user
    allowed (``trust``: tools/trust.py; None: nothing beyond the defaults)."""
    import torch

    from podracer_hpc.config import Config, from_dict
    from podracer_hpc.docfield import ConfigError
    from podracer_hpc.files.safeio import StateFileError
    from podracer_hpc.pod import Pod
    from podracer_hpc.tools.evaluate import EvaluateError, config_of, load_file
    from podracer_hpc.tools.trust import Trust, UntrustedConfig

    trust = trust if trust is not None else Trust()
    path = Path(path)
    if not path.exists():
        raise ExportError(f"{path}: no such file")
    wrong = wrong_kind(identify(path), POLICY_SOURCES)  # a config, a log, a run directory: said, never read as one
    if wrong:
        raise ExportError(wrong)
    try:
        loaded = load_file(path, trust)
        d = loaded.meta.get("config")
        if isinstance(d, dict) and (d.get("env") or {}).get("name") == "stock_trading":
            try:  # evaluate refuses these (they are judged on a backtest); a policy of them exports all the same
                cfg = from_dict(Config, d)
                trust.check_config(cfg, path)
            except UntrustedConfig as e:
                raise ExportError(str(e)) from None
            except ConfigError as e:
                raise ExportError(f"{path}: its config does not fit this podracer-hpc ({e})") from None
            cfg = dataclasses.replace(
                cfg,
                env=dataclasses.replace(cfg.env, num_envs=1),
                eval=dataclasses.replace(cfg.eval, episodes=1),
                device="cpu",
            )
        else:
            cfg = config_of(loaded, 1, trust=trust)
    except EvaluateError as e:
        raise ExportError(_evaluate_message(e)) from None
    try:
        with torch.random.fork_rng(devices=[]):  # Pod seeds the global RNG: leave the caller's as it was
            pod = Pod(cfg, rank=0, device="cpu")
        agent = pod.agent_from(loaded.tensors, loaded.meta, source=str(path))
    except (StateFileError, MemoryError) as e:
        raise ExportError(str(e)) from None
    except (ValueError, OSError, ImportError, TypeError, AttributeError) as e:  # the env cannot be built here
        raise ExportError(
            f"{path}: cannot build its task's env ({cfg.env.name}) to read the action bounds: {e}"
        ) from None
    agent.eval()
    return pod, agent, loaded.meta


def pod_actions(pod: Any, agent: Any, obs: Any) -> Any:
    """The pod's own deterministic env actions for raw observations (Pod.evaluate's step)."""
    import torch

    with torch.no_grad():
        return pod.to_env_action(agent.act_deterministic(agent.normalize_obs(obs, update=False)))


def sample_observations(pod: Any, agent: Any, steps: int = CHECK_STEPS) -> Any:
    """Observations of the pod's env: a start state and the states the policy then reaches."""
    import torch

    with torch.no_grad():
        obs = pod.env.reset(pod.seed)
        out = [obs]
        for _ in range(steps - 1):
            obs = pod.env.step(pod_actions(pod, agent, obs))[0]
            out.append(obs)
    return torch.cat(out).to(torch.float32)


def _description(pod: Any, meta: dict[str, Any], path: Path, fmt: str, discrete: bool) -> dict[str, Any]:
    import torch

    from podracer_hpc import __version__

    env = pod.env
    d: dict[str, Any] = {
        "kind": "exported-policy",
        "system": "podracer-hpc",
        "format": fmt,
        "task": pod.cfg.env.name,
        "obs_dim": int(env.obs_dim),
        "act_dim": int(env.act_dim),
        "discrete": discrete,
        "num_actions": int(getattr(env, "num_actions", 0) or 0),
        "input": "raw observations, float32, shape [batch, obs_dim] (the normalizer is inside)",
        "output": (
            "the env's action index, int64, shape [batch]"
            if discrete
            else "the env's action, float32, shape [batch, act_dim], within [action_low, action_high]"
        ),
        "source": str(path),
        "rank": meta.get("rank"),
        "env_steps": meta.get("env_steps"),
        "config": meta.get("config"),
        "versions": {"podracer_hpc": __version__, "torch": torch.__version__},
    }
    if not discrete:
        d["action_low"] = torch.as_tensor(env.action_low, dtype=torch.float32).expand(env.act_dim).tolist()
        d["action_high"] = torch.as_tensor(env.action_high, dtype=torch.float32).expand(env.act_dim).tolist()
    if pod.cfg.env.name == "stock_trading":  # podracer backtest trades these stocks, in this order
        from podracer_hpc.trading.env import tickers_from_state

        d["tickers"] = tickers_from_state(pod.env.state_dict())
    return d


def _max_diff(a: Any, b: Any) -> float:
    import torch

    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        return math.inf
    return float((a.to(torch.float64) - b.to(torch.float64)).abs().max()) if a.numel() else 0.0


def _torchscript(module: Any, obs: Any, tmp: Path, description: dict[str, Any]) -> Any:
    """Write the traced module; returns its actions on ``obs``, read back from the file."""
    import torch

    with torch.no_grad(), warnings.catch_warnings():
        # torch 2.13 marks TorchScript deprecated (in favour of torch.export); its files still load everywhere
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, obs[:2], check_inputs=[(obs,), (obs[:1],)])
        torch.jit.save(traced, str(tmp), _extra_files={METADATA_KEY: json.dumps(description)})
        return torch.jit.load(str(tmp))(obs)


def _onnx(module: Any, obs: Any, tmp: Path, description: dict[str, Any], exporter: str) -> tuple[Any, str]:
    """Write the ONNX model; returns (its actions on ``obs`` by onnxruntime, or None without it; exporter used)."""
    import importlib.util

    import torch

    onnx = _need("onnx", "podracer export policy --format onnx")
    if exporter == "auto":
        exporter = "dynamo" if importlib.util.find_spec("onnxscript") else "legacy"
    if exporter == "dynamo":
        _need("onnxscript", "--onnx-exporter dynamo")
    example = obs[:2]
    kw: dict[str, Any] = {"input_names": ["obs"], "output_names": ["action"]}
    # the exporters print progress on stdout, log and warn about their own deprecations: stdout keeps the JSON line
    quiet = logging.getLogger("torch.onnx")  # e.g. "torchvision is not installed. Skipping torchvision::nms"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(
                    module,
                    (example,),
                    dynamo=True,
                    external_data=False,
                    verbose=False,
                    dynamic_shapes={"obs": {0: torch.export.Dim("batch")}},
                    **kw,
                )
                model = program.model_proto
            else:
                buf = io.BytesIO()
                torch.onnx.export(
                    module,
                    (example,),
                    buf,
                    dynamo=False,
                    dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
                    **kw,
                )
                model = onnx.load_from_string(buf.getvalue())
    except Exception as e:  # noqa: BLE001  (the exporters raise many kinds; the user gets the one line)
        other = "legacy" if exporter == "dynamo" else "dynamo"
        first = (str(e).splitlines() or [""])[0]
        raise ExportError(
            f"torch's {exporter} ONNX exporter failed ({type(e).__name__}: {first}); try "
            f"--onnx-exporter {other}, or --format torchscript"
        ) from None
    finally:
        quiet.setLevel(level)
    description = {**description, "onnx_exporter": exporter}
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(description)})
    onnx.save(model, str(tmp))
    try:
        import onnxruntime
    except ImportError:
        return None, exporter
    session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    return session.run(None, {"obs": obs.numpy()})[0], exporter


def export_policy(
    checkpoint: str | os.PathLike, fmt: str, out: str | os.PathLike, onnx_exporter: str = "auto", trust: Any = None
) -> dict[str, Any]:
    """Write the deterministic policy of ``checkpoint`` to ``out`` as ``fmt``; returns what was written
    (``trust``: what the user allowed, tools/trust.py)."""
    import torch

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: one of {', '.join(FORMATS)}")
    checkpoint, out = Path(checkpoint), Path(out)
    if out.is_dir():
        name = "policy.pt" if fmt == "torchscript" else "policy.onnx"
        raise ExportError(f"--out {out}: is a directory; give a file name (e.g. {out / name})")
    if out.exists() and checkpoint.exists() and out.resolve() == checkpoint.resolve():
        raise ExportError(f"--out {out}: is the checkpoint itself; give another file name")
    pod, agent, meta = pod_and_agent(checkpoint, trust)
    discrete = bool(pod.env.discrete)
    module = _exported_policy_class()(
        agent, discrete, getattr(pod.env, "action_low", None), getattr(pod.env, "action_high", None)
    ).eval()
    obs = sample_observations(pod, agent)
    want = pod_actions(pod, agent, obs)
    with torch.no_grad():
        mine = module(obs)
    if _max_diff(mine, want) > TOLERANCE:  # the wrapper itself, before any exporter
        raise ExportError(
            f"{checkpoint}: the policy module differs from the pod's actions by {_max_diff(mine, want):.3g}"
        )
    description = _description(pod, meta, checkpoint, fmt, discrete)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    checked: dict[str, Any] = {"observations": int(obs.shape[0]), "tolerance": TOLERANCE}
    try:
        if fmt == "torchscript":
            got, runner = _torchscript(module, obs, tmp, description), "torch.jit.load"
        else:
            got, exporter = _onnx(module, obs, tmp, description, onnx_exporter)
            runner = "onnxruntime"
            description["onnx_exporter"] = exporter
        if got is None:
            checked.update(max_abs_diff=None, by="not run: onnxruntime is not installed (pip install onnxruntime)")
        else:
            diff = _max_diff(got, want)
            checked.update(max_abs_diff=diff, by=runner)
            if not diff <= TOLERANCE:
                raise ExportError(
                    f"the exported policy ({fmt}) acts unlike the pod: its actions differ by {diff:.3g} "
                    f"> {TOLERANCE} on {obs.shape[0]} observations; nothing was written"
                )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    result = {
        "policy": str(out),
        "format": fmt,
        "task": description["task"],
        "source": str(checkpoint),
        "obs_dim": description["obs_dim"],
        "act_dim": description["act_dim"],
        "discrete": discrete,
        "bytes": out.stat().st_size,
        "check": checked,
    }
    if fmt == "onnx":
        result["onnx_exporter"] = description["onnx_exporter"]
    return result


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON description an exported policy file carries (TorchScript or ONNX)."""
    import zipfile

    path = Path(path)
    if zipfile.is_zipfile(path):
        import torch

        extra = {METADATA_KEY: ""}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.load(str(path), _extra_files=extra)
        return json.loads(extra[METADATA_KEY] or "{}")
    onnx = _need("onnx", "reading an ONNX policy")
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return json.loads(props.get(METADATA_KEY, "{}"))


# --------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podracer export", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser(
        "tensorboard",
        help="every rank's /train, /eval and /tournament as TensorBoard event files "
        "(DIR/rank<r>/); wandb sync --sync-tensorboard DIR uploads them",
    )
    t.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (podracer train --run-dir)")
    t.add_argument("--out", required=True, metavar="DIR", help="where the event files go: DIR/rank<r>/")
    t.add_argument("--overwrite", action="store_true", help="replace event files already in DIR/rank<r>/")
    q = sub.add_parser(
        "policy",
        help="a checkpoint's deterministic policy, normalizer included, as one TorchScript "
        "or ONNX file: raw observations [batch, obs_dim] in, env actions out",
    )
    q.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a pod checkpoint (<run>/checkpoints/rank<r>.safetensors) or a leaderboard entry",
    )
    q.add_argument("--format", choices=FORMATS, default="torchscript", help="torchscript (default) or onnx")
    q.add_argument("--out", required=True, metavar="FILE", help="the file to write (e.g. policy.pt, policy.onnx)")
    q.add_argument(
        "--onnx-exporter",
        choices=("auto", "dynamo", "legacy"),
        default="auto",
        help="torch's exporter for --format onnx: dynamo (torch.export; needs onnxscript), legacy (the "
        "TorchScript-based one, deprecated since torch 2.9), auto (default): dynamo when onnxscript "
        "is installed",
    )
    add_arguments(q)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.what == "tensorboard":
            result = export_tensorboard(args.run_dir, args.out, overwrite=args.overwrite)
            print(
                f"{result['events']} events of {len(result['ranks'])} pod(s) in {args.out}: "
                + ", ".join(f"{n} {g} scalars" for g, n in result["scalars"].items()),
                file=sys.stderr,
            )
        else:
            result = export_policy(args.checkpoint, args.format, args.out, args.onnx_exporter, from_args(args))
            c = result["check"]
            said = (
                f"acts like the pod to {c['max_abs_diff']:.2g} on {c['observations']} observations"
                if c["max_abs_diff"] is not None
                else c["by"]
            )
            print(f"{result['task']} policy ({result['format']}) in {args.out}: {said}", file=sys.stderr)
    except (ExportError, ConfigError) as e:
        print(f"podracer export {args.what}: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0
