"""``podracer evaluate PATH``: agents side by side on the same start states, with their error.

PATH is a pod checkpoint (``checkpoints/rank<r>.safetensors``, or its ``.prev``), a leaderboard
entry (``entries/<id>.safetensors`` or its ``.json``), or a run directory (then every rank's
checkpoint and the run leaderboard's top entries). Every agent plays ``--episodes`` deterministic
episodes from the start states of ``--seed`` (fitness.py: episode i starts where the task puts
seed and index i, whoever plays), so the differences between rows are the agents', not the
start states' luck. A row: episodes, mean, std, standard error, 95% t-interval; the last line is
JSON: ``{"results": [{"agent", "path", "task", "return_mean", "return_std", "return_se",
"ci95", "episodes", "seed"}, ...]}``.

The run's own verdict (summary.json's ``best_return``, the return to report: docs/training.md,
"Which return to report") is this with ``--episodes`` its ``final_episodes`` and ``--seed`` its
``final_eval_seed``; ``peak_return`` and ``final_return`` are periodic evaluations on other start
states and are not comparable with a row here. Stock trading is judged on a backtest
window instead: ``podracer backtest``. A foreign, damaged or unknown file exits 2 with a message;
in a run directory it is skipped with a warning. ``--max-steps`` (default 10,000) cuts every
episode after that many env steps, with a note when an agent's stored ``env.max_episode_steps``
is longer (a stored 10,000,000 would hold an evaluation for hours).

The env is built from the task registry and the agent's stored config; an option of it that names
code (``env.jax.factory``, ...) is used only when it equals that of ``--config JOB.yaml`` or with
``--trust-config``; files owned by outsiders and unkeyed entries are refused unless
``--allow-foreign-files`` / ``--accept-unkeyed`` (tools/trust.py, docs/security.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podracer_hpc.config import MAX_EPISODE_STEPS, Config, from_dict
from podracer_hpc.docfield import ConfigError
from podracer_hpc.files.kinds import identify, wrong_kind
from podracer_hpc.tools.trust import Trust, UntrustedConfig, add_arguments, from_args

__all__ = ["Agent", "EvaluateError", "find_agents", "main"]

DEFAULT_SEED = 20261201  # a set no run uses for training or rounds (those derive theirs from fitness.eval_seed)
EVALUATES = ("checkpoint", "entry", "run")  # what PATH may be (files/kinds.py's words)
DEFAULT_MAX_STEPS = 10_000  # env steps an evaluation's episodes take at most (--max-steps); tasks end far sooner


class EvaluateError(RuntimeError):
    """PATH holds nothing that can be evaluated; the message says what and what to do."""


@dataclass
class Agent:
    """One agent to evaluate: where it came from and what it is."""

    label: str
    path: Path
    tensors: dict
    meta: dict


def load_file(path: Path, trust: Trust = Trust()) -> Agent:
    """A checkpoint or a leaderboard entry file (its .safetensors or its .json sidecar)."""
    from podracer_hpc.files import safeio
    from podracer_hpc.files.owner import check_owner, group_of
    from podracer_hpc.pool.leaderboard import EntryCorrupt, EntryGone, InvalidEntryId, Leaderboard

    found = identify(path)
    wrong = wrong_kind(found, ("checkpoint", "entry"))
    if wrong:  # a config, a log, a summary: said what it is, never read as a state file
        raise EvaluateError(wrong)
    if found.kind == "entry" and path.parent.name == "entries":  # through its leaderboard: keyed checksum
        board = Leaderboard(
            path.parent.parent,
            read_only=True,
            accept_unkeyed=trust.accept_unkeyed,
            allow_foreign=trust.allow_foreign,
        )
        eid = path.name.split(".", 1)[0]
        try:
            tensors, meta = board.load(eid)
        except (EntryGone, EntryCorrupt, InvalidEntryId) as e:
            raise EvaluateError(str(e)) from None
        return Agent(f"entry {eid}", path, tensors, meta)
    try:
        if not trust.allow_foreign:  # the run's group: the run directory's (a checkpoint's grandparent)
            check_owner(path, group_of(path.parent.parent if path.parent.name == "checkpoints" else path.parent))
        tensors, meta, _ = safeio.load(path, "pod-state")
    except safeio.StateFileError as e:
        raise EvaluateError(
            f"{e} (podracer evaluate reads pod checkpoints, leaderboard entries and run directories)"
        ) from None
    return Agent(f"rank {meta.get('rank', '?')} checkpoint", path, tensors, meta)


def find_agents(path: Path, top: int, skipped: list[str] | None = None, trust: Trust = Trust()) -> list[Agent]:
    """The agents PATH names (see the module doc); raises EvaluateError when there are none.
    Reads only: nothing in the run directory or the leaderboard is created or renamed. A run
    directory's agents that cannot be loaded are left out, each with why in ``skipped``."""
    import warnings

    from podracer_hpc.files.rundir import RunDir
    from podracer_hpc.pool.leaderboard import Leaderboard

    found = identify(path)
    if found.kind != "directory":  # an empty or unrelated directory: said below, with what it holds
        wrong = wrong_kind(found, EVALUATES)
        if wrong:
            raise EvaluateError(wrong)
    if not path.is_dir():
        return [load_file(path, trust)]
    skipped = [] if skipped is None else skipped
    run = RunDir(path)
    agents = []
    board = Leaderboard(
        run.leaderboard(_shared_leaderboard(run.config)),
        read_only=True,
        accept_unkeyed=trust.accept_unkeyed,
        allow_foreign=trust.allow_foreign,
    )
    with warnings.catch_warnings(record=True) as seen:  # a listing's skipped files: reported below
        warnings.simplefilter("always")
        listed = board.list()[: max(top, 0)]
    skipped += [str(w.message) for w in seen]
    for p in [run.checkpoint_path(r) for r in run.checkpoint_pods() if run.checkpoint_path(r).exists()] + [
        board.tensors_path(e.id) for e in listed
    ]:
        try:
            agents.append(load_file(p, trust))
        except EvaluateError as e:
            skipped.append(str(e))
    if not agents and skipped:
        raise EvaluateError(f"{path}: none of its {len(skipped)} agent file(s) could be read: {'; '.join(skipped)}")
    if not agents:
        why = f" ({len(skipped)} could not be read: {skipped[0]})" if skipped else ""
        raise EvaluateError(
            f"{path}: holds no checkpoints/rank*.safetensors and no leaderboard entries that load{why}; give a "
            "run directory, a checkpoint or a leaderboard entry"
        )
    return agents


def _shared_leaderboard(config_yaml: Path) -> str:
    """The run's ``tournament.leaderboard_dir`` (its config.yaml), "" for the run's own."""
    import yaml

    from podracer_hpc.files.bounded import read_yaml

    try:
        d = read_yaml(config_yaml, what="run config") or {}
    except (OSError, ValueError, yaml.YAMLError):
        return ""
    return str((d.get("tournament") or {}).get("leaderboard_dir") or "") if isinstance(d, dict) else ""


def config_of(agent: Agent, episodes: int, max_steps: int = 0, trust: Trust = Trust()) -> Config:
    """The config an agent is evaluated with: its own, on one training env and the CPU, with
    ``episodes`` evaluation episodes cut after ``max_steps`` env steps (0: as stored); raises
    EvaluateError when it does not fit, or names code the user did not (:class:`Trust`)."""
    d = agent.meta.get("config")
    if not isinstance(d, dict):
        raise EvaluateError(f"{agent.path}: records no config; not a podracer-hpc agent")
    try:
        cfg = from_dict(Config, d)
        trust.check_config(cfg, agent.path)
    except (ConfigError, ValueError) as e:
        if isinstance(e, UntrustedConfig):
            raise EvaluateError(str(e)) from None
        raise EvaluateError(f"{agent.path}: its config does not fit this podracer-hpc ({e})") from None
    if cfg.env.name == "stock_trading":
        raise EvaluateError(
            f"{agent.path}: a stock-trading agent is judged on a backtest window, not on episodes from "
            f"start states: podracer backtest {agent.path}"
        )
    steps = cfg.env.max_episode_steps
    if max_steps and steps > max_steps:  # a stored 10,000,000 must not hold `evaluate` for hours
        print(
            f"  note: {agent.label}: its config says env.max_episode_steps {steps:,}; its episodes are cut "
            f"after {max_steps:,} steps (--max-steps)",
            file=sys.stderr,
            flush=True,
        )
        steps = max_steps
    # one training env is enough (it is never stepped); the evaluation gets its own, of `episodes`
    return dataclasses.replace(
        cfg,
        env=dataclasses.replace(cfg.env, num_envs=1, max_episode_steps=steps),
        eval=dataclasses.replace(cfg.eval, episodes=episodes),
        device="cpu",
    )


def evaluate(
    agent: Agent, episodes: int, seed: int, device: str, max_steps: int = DEFAULT_MAX_STEPS, trust: Trust = Trust()
) -> dict[str, Any]:
    """One agent's row: its episodes on the start states of ``seed``, each cut after ``max_steps``."""
    from podracer_hpc.files.safeio import StateFileError
    from podracer_hpc.pod import Pod
    from podracer_hpc.pool.fitness import Fitness

    cfg = config_of(agent, episodes, max_steps, trust)
    try:
        pod = Pod(cfg, rank=0, device=device)
        policy = pod.agent_from(agent.tensors, agent.meta, source=str(agent.path))
    except (StateFileError, MemoryError) as e:
        raise EvaluateError(str(e)) from None
    except (ValueError, OSError, ImportError, TypeError, AttributeError) as e:  # the env cannot be built here
        raise EvaluateError(f"{agent.path}: cannot build its task's env ({cfg.env.name}): {e}") from None
    fit = Fitness(tuple(pod.evaluate(seed, agent=policy).cpu().tolist()), seed)
    r = list(fit.returns)
    std = math.sqrt(sum((x - fit.mean) ** 2 for x in r) / len(r)) if r else math.nan
    lo, hi = fit.ci95()
    return {
        "agent": agent.label,
        "path": str(agent.path),
        "task": cfg.env.name,
        "return_mean": fit.mean,
        "return_std": std,
        "return_se": fit.se,
        "ci95": [lo, hi],
        "episodes": fit.episodes,
        "seed": seed,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'agent':<36} {'task':<12} {'episodes':>8} {'mean':>10} {'std':>9} {'s.e.':>8}  95% interval"
    lines = [head, "-" * len(head)]
    for r in rows:
        lo, hi = r["ci95"]
        lines.append(
            f"{r['agent'][:36]:<36} {r['task'][:12]:<12} {r['episodes']:>8} {r['return_mean']:>10.1f} "
            f"{r['return_std']:>9.1f} {r['return_se']:>8.2f}  [{lo:.1f}, {hi:.1f}]"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="podracer evaluate",
        description=__doc__.split("\n\n")[0],
        epilog="A run's summary.json best_return (the return to report) is the best rank checkpoint's mean with "
        "--episodes its final_episodes and --seed its final_eval_seed.",
    )
    p.add_argument("path", help="a checkpoint, a leaderboard entry, or a run directory")
    p.add_argument("--episodes", type=int, default=100, help="episodes per agent (default 100)")
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"the start states: every agent plays the same ones (default {DEFAULT_SEED}; a run's verdict: "
        "its summary's final_eval_seed)",
    )
    p.add_argument(
        "--top", type=int, default=4, help="a run directory: also its leaderboard's best N entries (default 4)"
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument(
        "--max-steps",
        type=int,
        default=DEFAULT_MAX_STEPS,
        metavar="N",
        help=f"cut every episode after N env steps (default {DEFAULT_MAX_STEPS:,}; a note says when an agent's "
        "env.max_episode_steps is longer): an evaluation steps its episodes together, N times at most",
    )
    add_arguments(p)
    args = p.parse_args(argv)
    if not 1 <= args.max_steps <= MAX_EPISODE_STEPS:
        print(
            f"podracer evaluate: error: --max-steps must be in [1, {MAX_EPISODE_STEPS:,}], got {args.max_steps}",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.episodes <= 2**20:
        print(f"podracer evaluate: error: --episodes must be in [1, 1048576], got {args.episodes}", file=sys.stderr)
        return 2
    if not 0 <= args.seed < 2**31:
        print(f"podracer evaluate: error: --seed must be in [0, 2**31), got {args.seed}", file=sys.stderr)
        return 2
    skipped: list[str] = []
    try:
        trust = from_args(args)
        agents = find_agents(Path(args.path), args.top, skipped, trust)
        for s in skipped:
            print(f"podracer evaluate: skipped: {s}", file=sys.stderr, flush=True)
        print(
            f"{len(agents)} agent(s) from {args.path}: {args.episodes} episodes each on the start states of seed "
            f"{args.seed}",
            file=sys.stderr,
            flush=True,
        )
        rows = []
        for a in agents:
            try:
                rows.append(evaluate(a, args.episodes, args.seed, args.device, args.max_steps, trust))
            except (EvaluateError, ConfigError) as e:
                if len(agents) == 1:
                    raise
                skipped.append(str(e))  # a run directory's bad agent: the others are still evaluated
                print(f"podracer evaluate: skipped: {e}", file=sys.stderr, flush=True)
                continue
            print(f"  {a.label}: {rows[-1]['return_mean']:.1f}", file=sys.stderr, flush=True)
        if not rows:
            raise EvaluateError(f"{args.path}: none of its {len(agents)} agent(s) could be evaluated")
    except (EvaluateError, ConfigError) as e:
        print(f"podracer evaluate: error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    print(json.dumps({"results": [_json_safe(r) for r in rows], "skipped": skipped}), flush=True)
    return 0


def _json_safe(x: Any) -> Any:
    """NaN (an interval of one episode) as null: the last line stays strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x
