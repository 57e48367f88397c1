"""``F``: a dataclass field with a one-line doc, shared by every config section; and
:class:`ConfigError`, which every section's checks raise (config.py re-exports it)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A job file or an override is wrong; the message says what and how to fix it."""


def F(default: Any, doc: str) -> Any:
    """A dataclass field with a one-line doc (shown in error messages and `podracer config`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc})
    if isinstance(default, type) and dataclasses.is_dataclass(default):
        return field(default_factory=default, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})
