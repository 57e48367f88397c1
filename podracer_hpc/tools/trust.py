"""What a user allows ``podracer evaluate``, ``export policy`` and ``backtest`` to do with the files
they read (docs/security.md).

A checkpoint or an entry records the config it was trained with, and the tools build the agent's
env from it. Most of a config is data, but some task options name code to import and call (the
``jax`` task's ``env.jax.factory`` and its kwargs, a gymnasium id ``module:Env-v0``: each task
declares them, envs/registry.py ``Task.names_code``). Such a value stored in a file is used only
when the user named it: it equals the one of a job file they pass (``--config JOB.yaml``), or
they pass ``--trust-config``. Otherwise the tool exits 2 naming the stored value. Files owned by
outsiders (files/owner.py) and leaderboard entries written before entries were keyed
(pool/leaderboard.py) are refused unless ``--allow-foreign-files`` / ``--accept-unkeyed``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from podracer_hpc.config import Config, load_config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.envs.registry import code_named
from podracer_hpc.files.owner import ALLOW_FLAG

__all__ = ["Trust", "UntrustedConfig", "add_arguments", "from_args"]


class UntrustedConfig(ValueError):
    """A stored config names code the user did not name; the message says how to allow it."""


@dataclass(frozen=True)
class Trust:
    """What the user allowed (the tools' flags)."""

    config: Config | None = None  # the job file the user passed (--config): its code-naming options are theirs
    trust_config: bool = False  # --trust-config: any code a stored config names may run
    allow_foreign: bool = False  # --allow-foreign-files: load files owned by outsiders
    accept_unkeyed: bool = False  # --accept-unkeyed: leaderboard entries written before entries were keyed

    def check_config(self, cfg: Config, source: Any) -> None:
        """Raise :class:`UntrustedConfig` if ``cfg`` (read from ``source``) names code the user did not."""
        stored = code_named(cfg.env)
        if not stored or self.trust_config:
            return
        if self.config is not None and self.config.env.name == cfg.env.name and code_named(self.config.env) == stored:
            return
        named = _listed(stored)
        theirs = (
            "" if self.config is None else f" (your --config names {_listed(code_named(self.config.env)) or 'none'})"
        )
        raise UntrustedConfig(
            f"{source}: its stored config names code to import and run: {named}{theirs}. Nothing was run. "
            "If that is your own job, pass its file: --config JOB.yaml (the same settings are then yours); "
            f"if you trust whoever wrote {source}: --trust-config"
        )


def _listed(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in values.items())


def add_arguments(p: argparse.ArgumentParser, unkeyed: bool = True) -> None:
    """The trust flags of a tool that reads checkpoints or entries."""
    p.add_argument(
        "--config",
        metavar="JOB.yaml",
        default=None,
        help="the job file the agent was trained with: code its stored config names (env.jax.factory, "
        "a gymnasium module:id) runs only if it equals this file's",
    )
    p.add_argument(
        "--trust-config",
        action="store_true",
        help="run whatever code the stored config names (only for files whose writer you trust)",
    )
    p.add_argument(
        ALLOW_FLAG,
        dest="allow_foreign_files",
        action="store_true",
        help="load checkpoints and entries owned by neither you nor a member of the run's group",
    )
    if unkeyed:
        p.add_argument(
            "--accept-unkeyed",
            action="store_true",
            help="read leaderboard entries written before entries were keyed (no hmac; they cannot be "
            "told from forgeries)",
        )


def from_args(args: argparse.Namespace) -> Trust:
    """The :class:`Trust` of parsed flags (:func:`add_arguments`); raises ConfigError for a bad --config."""
    cfg = None
    if args.config:
        try:
            cfg = load_config(args.config)
        except ConfigError as e:
            raise ConfigError(f"--config {args.config}: {e}") from None
    return Trust(
        cfg, bool(args.trust_config), bool(args.allow_foreign_files), bool(getattr(args, "accept_unkeyed", False))
    )
