"""The typed, documented fields every config section is made of: ``F`` (a dataclass field with a
one-line doc), :func:`coerce` (a YAML value to a field's type, or a message naming the key),
:func:`is_section`; and :class:`ConfigError`, which every section's checks raise."""

from __future__ import annotations

import dataclasses
import datetime
import typing
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


def is_section(tp: Any) -> bool:
    """Whether a field of type ``tp`` is a section of its own (a dataclass), not a value."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as a field of type ``tp`` (bool, int, float, str, list, or one of them or None;
    other types pass): YAML's readings made strict (no bool as a number, 1e6 as an int when whole,
    a date as its ISO text), else a ConfigError naming ``key``, what was expected and what came."""

    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{key}: expected {expected}, got {value!r} ({type(value).__name__})")

    options = typing.get_args(tp)
    if len(options) == 2 and type(None) in options:  # ``X | None``: null, or an X
        return None if value is None else coerce(value, next(t for t in options if t is not type(None)), key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if tp is int:
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                v = float(value.replace("_", ""))
            except ValueError:
                raise bad("an integer") from None
            if v.is_integer():
                return int(v)
        raise bad("an integer")
    if tp is float:
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.replace("_", ""))
            except ValueError:
                pass
        raise bad("a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (datetime.date, datetime.datetime)):  # YAML reads 2012-12-31 as a date
            return value.isoformat()
        if isinstance(value, bool):  # YAML 1.1 reads on/off (yes/no) as booleans: agent.compile: off
            return "on" if value else "off"
        raise bad("a string")
    if tp is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        raise bad("a list")
    return value
