"""Bounded reads of run files: every reader of a file another process (or user) may have put in
a run directory or a leaderboard goes through here.

A run file is read only if it is a regular file (a FIFO would block the reader forever, a
device or a link to ``/dev/zero`` would never end) and only up to a size bound known before
anything is allocated: the size a state file's own header declares (:mod:`safeio`), or a fixed
sane bound for JSON and YAML documents (:data:`MAX_JSON_BYTES`, :data:`MAX_YAML_BYTES`). JSON
nested deeper than the parser's stack and YAML whose aliases would expand beyond
:data:`MAX_YAML_NODES` nodes (an "alias bomb") are refused as corrupt, like a truncated file.

Every refusal is a :class:`RunFileError` (a ``ValueError``) whose message names the file, what
was wrong and what to do; a missing file stays ``FileNotFoundError`` and other errors of the
operating system stay ``OSError``, so that callers keep telling "gone" from "bad".
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_JSON_BYTES",
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "RunFileError",
    "loads_json",
    "loads_yaml",
    "open_regular",
    "read_bounded",
    "read_json",
    "read_slice",
    "read_yaml",
]

MAX_JSON_BYTES = 64 << 20  # a sidecar, summary.json, pool.json, a round listing: kilobytes in practice
MAX_YAML_BYTES = 1 << 20  # a job file or a run's config.yaml: a few kilobytes in practice
MAX_YAML_NODES = 10_000  # nodes of a YAML document with its aliases expanded (a job file has hundreds)


class RunFileError(ValueError):
    """A run file that is not a regular file, is larger than its bound, or is corrupt."""


def open_regular(path: str | os.PathLike, what: str = "file") -> int:
    """Open ``path`` for reading if it is a regular file (a link to one is followed); returns the
    descriptor. A FIFO, a socket, a device (a link to ``/dev/zero``) is refused without blocking.
    A directory raises ``IsADirectoryError``, a missing file ``FileNotFoundError``."""
    st = os.stat(path)  # follows links: what an open would reach, checked before opening it
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path}: not a regular file ({_kind(st.st_mode)}), so not a {what}; move it away")
    # O_NONBLOCK: a FIFO swapped in after the stat must not block the open
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RunFileError(f"{path}: not a regular file ({_kind(st.st_mode)}), so not a {what}; move it away")
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def read_bounded(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, refused before reading if it holds more than
    ``limit`` bytes (and never more than ``limit`` bytes read, should it grow meanwhile)."""
    fd = open_regular(path, what)
    try:
        return read_open(fd, path, limit, what)
    finally:
        os.close(fd)


def read_open(fd: int, path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """:func:`read_bounded` on a descriptor :func:`open_regular` gave (the caller closes it)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise RunFileError(
            f"{path}: {size:,} bytes, more than a {what} can be ({limit:,}); it is not one: move it away"
        )
    chunks, n = [], 0
    while n <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - n))
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
    if n > limit:
        raise RunFileError(f"{path}: grew beyond {limit:,} bytes while read, more than a {what} can be")
    return b"".join(chunks)


def read_slice(fd: int, offset: int, n: int) -> bytes:
    """Exactly ``n`` bytes at ``offset`` of an open file, or fewer if the file ends first."""
    chunks, got = [], 0
    while got < n:
        chunk = os.pread(fd, min(1 << 24, n - got), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def loads_json(raw: bytes | str, source: str = "<json>") -> Any:
    """Parse a JSON document; a corrupt one (bad syntax, bad UTF-8, nested deeper than the
    parser's stack) is a :class:`RunFileError` naming ``source``."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RunFileError(f"{source}: JSON nested too deep to be a podracer-hpc file (corrupt or planted)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RunFileError(f"{source}: not valid JSON ({e})") from None


def read_json(path: str | os.PathLike, limit: int = MAX_JSON_BYTES, what: str = "JSON file") -> Any:
    """A JSON file read with :func:`read_bounded` and parsed with :func:`loads_json`."""
    return loads_json(read_bounded(path, limit, what), source=str(path))


def loads_yaml(text: str, source: str = "<yaml>", max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse a YAML document safely (``yaml.SafeLoader``), refusing one whose aliases expand to
    more than ``max_nodes`` nodes (a "billion laughs" alias bomb: a kilobyte that would become
    gigabytes once its aliases are copied out, as a config dump does) or nested too deep.
    ``yaml.YAMLError`` stays what it is (bad syntax); a bomb is a :class:`RunFileError`."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_nodes(node, max_nodes)
        if expanded > max_nodes:
            raise RunFileError(
                f"{source}: its YAML aliases expand to more than {max_nodes:,} nodes (an alias bomb?); "
                "a job file needs no such thing: write the values out"
            )
        return loader.construct_document(node)
    except RecursionError:
        raise RunFileError(f"{source}: YAML nested too deep to be a job file") from None
    finally:
        loader.dispose()


def _expanded_nodes(root: Any, cap: int) -> int:
    """Nodes of the tree ``root`` (a composed YAML node graph, aliases shared) spans once every
    alias is copied out; counting stops past ``cap``. Each distinct node is sized once."""
    import yaml

    size: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        if not children_done:
            if id(node) in entered:  # a node inside itself (``&a [*a]``): endless once copied out
                return cap + 1
            entered.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            kids = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            kids = [x for pair in node.value for x in pair]
        else:
            size[id(node)] = 1
            continue
        if not children_done:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        size[id(node)] = min(cap + 1, 1 + sum(size.get(id(k), 1) for k in kids))
    return size[id(root)]


def read_yaml(path: str | os.PathLike, limit: int = MAX_YAML_BYTES, what: str = "YAML file") -> Any:
    """A YAML file read with :func:`read_bounded` (UTF-8) and parsed with :func:`loads_yaml`."""
    raw = read_bounded(path, limit, what)
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise RunFileError(f"{path}: not a text file (a {what} is UTF-8 YAML)") from None
    return loads_yaml(text, source=str(Path(path)))
