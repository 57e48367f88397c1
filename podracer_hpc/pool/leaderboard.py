"""A leaderboard of agents on the shared filesystem, used at once by many ranks of many jobs.

Layout (``root/entries/``, group-private)::

    <id>.safetensors   the pod state (safeio kind "leaderboard-entry"), written first
    <id>.json          the sidecar: score, env_steps, pod, job, round, hparams, created, sha256
                       of the .safetensors file, caller meta, ``sidecar_sha256``, the digest
                       of all of that, and ``hmac``, that digest keyed (below); written second.
                       Its presence means the entry is complete.
    ../leaderboard.key the leaderboard's secret (made by the first publisher, mode 0o640)

Integrity: what decisions use (the score, env steps, hyperparameters in the sidecar) is covered
twice: the sidecar's own digest (checked by :meth:`list`, so an edited score never ranks), and
the copy of the score and meta inside the tensor file, covered by that file's checksum and
compared with the sidecar on :meth:`load`.

Keyed: a sha256 anyone can recompute, so the sidecar also carries ``hmac``, an HMAC-SHA256 of its
digest (so of all its fields, the tensor file's sha256 among them) with the leaderboard's secret
(``root/leaderboard.key``, readable by the group only: entryfiles.secret). An entry whose HMAC does
not match, or that no secret can check, is refused (:class:`EntryRefused`: "forged or from another
leaderboard") and never ranks or loads; so is a file owned by an outsider (files/owner.py).
Sidecars written before entries were keyed (versions 1 and 2) cannot be told from a forgery:
they are refused unless the reader passes ``accept_unkeyed`` (``podracer evaluate
--accept-unkeyed``; a pod never takes them).

There is no index and no lock: the directory listing is the leaderboard. Entries are immutable
(written once under a fresh id, never overwritten). Every write goes to a hidden temporary name,
is fsynced, then linked/renamed into place, so a reader never sees half a file. :meth:`prune`
deletes a sidecar before its tensors, so an entry disappears from :meth:`list` first; a reader
that loses that race gets :class:`EntryGone` and tries the next candidate
(:meth:`load_best_available`). A checksum mismatch or a foreign file raises :class:`EntryCorrupt`
and nothing is loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from podracer_hpc.files import safeio
from podracer_hpc.files.bounded import MAX_JSON_BYTES, RunFileError, loads_json, read_json
from podracer_hpc.files.owner import ForeignFile, check_owner, group_of, read_owned
from podracer_hpc.pool.entry import Entry
from podracer_hpc.pool.entryfiles import (
    LeaderboardWarning,
    SecretError,
    count_op,
    fs_ops,
    make_private_dir,
    secret,
    unlink_if_there,
    warn,
    write_new,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ENTRY_KIND",
    "EntryCorrupt",
    "EntryGone",
    "EntryRefused",
    "InvalidEntryId",
    "Leaderboard",
    "LeaderboardWarning",
    "fs_ops",
    "make_entry_id",
    "plan_prune",
    "validate_entry_id",
]

ENTRY_KIND = "leaderboard-entry"  # safeio kind of the tensor files
SIDECAR_FORMAT = "podracer-hpc-leaderboard"  # "format" field of the JSON sidecars
SIDECAR_VERSION = 3
SIDECAR_VERSIONS_READ = (1, 2, 3)  # version 1: no sidecar_sha256; before 3: no hmac (accept_unkeyed only)
KEYED_VERSION = 3  # the first sidecar version with an hmac
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,199}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_OURS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*-[0-9a-f]{12}$")  # ids that make_entry_id generates


class InvalidEntryId(ValueError):
    """An entry id that could escape the directory or is not one we write."""


class EntryGone(LookupError):
    """The entry does not exist (any more): it was pruned, or never completed."""


class EntryCorrupt(safeio.StateFileError):
    """The entry exists but is corrupt or foreign; nothing was loaded."""


class EntryRefused(EntryCorrupt):
    """The entry is not trusted (a keyed checksum that does not match or cannot be checked, an
    unkeyed entry of an older version, a file owned by an outsider); nothing was loaded and the
    files are left as they are."""


def validate_entry_id(entry_id: Any) -> str:
    """Return ``entry_id`` if it is a safe id (letters, digits, ``_``, ``-``; no dots or slashes)."""
    if not isinstance(entry_id, str) or not _ID_RE.fullmatch(entry_id):
        raise InvalidEntryId(
            f"invalid leaderboard entry id {entry_id!r}: expected 1-200 of [A-Za-z0-9_-], "
            "starting with a letter or digit (no dots, no slashes)"
        )
    return entry_id


def sanitize(s: Any, maxlen: int = 64) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(s))[:maxlen] or "x"


def make_entry_id(job: Any = "local", pod: Any = 0, round: Any = 0, digest: str = "") -> str:
    """An id ``<job>-<pod>-<round>-<12 hex>``: random (unique across writers on any host), or
    the first 12 hex digits of ``digest`` (the same content gets the same id)."""
    suffix = digest[:12] if digest else uuid.uuid4().hex[:12]
    eid = f"{sanitize(job)}-{sanitize(pod, 16)}-{sanitize(round, 16)}-{suffix}"
    if not eid[0].isalnum():
        eid = "e" + eid
    return validate_entry_id(eid)


class Leaderboard:
    """The leaderboard directory ``root/entries``; cheap to construct on every rank."""

    def __init__(
        self,
        root: str | os.PathLike,
        entries: str = "entries",
        cache: bool = False,
        create: bool = True,
        accept_unkeyed: bool = False,
        allow_foreign: bool = False,
        secret_of: "Leaderboard | None" = None,
        read_only: bool = False,
    ):
        """``cache``: keep the sidecars this object has read (entries are immutable, so a long-lived
        reader, a pod, reads each one once; :meth:`load` still checks everything). ``create``:
        make the directories (False: a reader of a directory that may not exist yet, at no cost).
        ``accept_unkeyed``: read entries written before entries were keyed (their plain checksums
        only); ``allow_foreign``: read files owned by outsiders (files/owner.py). Both are the
        tools' explicit overrides; a pod takes neither. ``secret_of``: a board of the same root
        whose secret this one uses (a population's buckets read it once).
        ``read_only``: a reader that never writes (``podracer status``, ``evaluate``): nothing is
        created, a corrupt entry is refused but not quarantined (the directory may be another
        user's, or read-only)."""
        self.root = Path(root)
        self.read_only = read_only
        create = create and not read_only
        self._cache: dict[str, Entry] | None = {} if cache else None
        self._refused: set[str] = set()  # entries this object refused once (not read, nor warned about, again)
        self._key: bytes | None = None
        self._secret_of = secret_of
        self.accept_unkeyed, self.allow_foreign = accept_unkeyed, allow_foreign
        self.entries_dir = self.root / entries  # "entries"; a population bucket's is deeper (:class:`Population`)
        parts = Path(entries).parts
        for d in (self.root, *(self.root.joinpath(*parts[: i + 1]) for i in range(len(parts)))) if create else ():
            make_private_dir(d)
        self.gid = group_of(self.root)  # the leaderboard's group: who may write it (files/owner.py)

    def secret(self, create: bool = False) -> bytes | None:
        """The leaderboard's HMAC key (entryfiles.secret), read once; ``create``: make it if missing."""
        if self._key is None:
            if self._secret_of is not None:
                self._key = self._secret_of.secret(create)
            else:
                self._key = secret(self.root, self.gid, create, self.allow_foreign)
        return self._key

    # ------------------------------------------------------------------ paths

    def tensors_path(self, entry_id: str) -> Path:
        return self.entries_dir / f"{validate_entry_id(entry_id)}.safetensors"

    def sidecar_path(self, entry_id: str) -> Path:
        return self.entries_dir / f"{validate_entry_id(entry_id)}.json"

    # ------------------------------------------------------------------ write

    def publish(
        self,
        tensors: dict[str, torch.Tensor],
        score: float,
        meta: dict[str, Any] | None = None,
        content_id: bool = False,
    ) -> str:
        """Write a new immutable entry and return its id.

        ``meta`` must be JSON-serializable; its keys ``job``, ``pod`` (or ``rank``), ``round``,
        ``env_steps`` and ``hparams`` become fields of :class:`Entry`. ``score`` must be
        finite (a NaN pod is never published). ``content_id``: derive the id from the content, so
        that publishing the same agent again (a round redone after a kill) returns the entry
        already there instead of adding a copy.
        """
        meta = dict(meta or {})
        if not _is_finite_number(score):
            raise ValueError(f"leaderboard score must be a finite number, got {score!r}")
        score = float(score)
        pod = meta.get("pod", meta.get("rank"))
        digest = _content_digest(tensors, score, meta) if content_id else ""
        entry_id = make_entry_id(meta.get("job", "local"), pod if pod is not None else 0, meta.get("round", 0), digest)
        file_meta = {"entry_id": entry_id, "score": score, "meta": meta}
        blob = safeio.dumps(tensors, file_meta, kind=ENTRY_KIND)  # raises on non-JSON meta
        sha = hashlib.sha256(blob).hexdigest()
        sidecar = {
            "format": SIDECAR_FORMAT,
            "version": SIDECAR_VERSION,
            "id": entry_id,
            "score": score,
            "env_steps": _int_or_none(meta.get("env_steps")),
            "pod": _int_or_none(pod),
            "job": None if meta.get("job") is None else str(meta["job"]),
            "round": _int_or_none(meta.get("round")),
            "hparams": meta.get("hparams") or {},
            "created": time.time(),
            "host": socket.gethostname(),
            "sha256": sha,
            "bytes": len(blob),
            "meta": meta,
        }
        if digest:
            sidecar["content_sha256"] = digest
        sidecar["sidecar_sha256"] = _sidecar_digest(sidecar)
        sidecar["hmac"] = _keyed(self.secret(create=True), sidecar["sidecar_sha256"])  # (the digest covers the rest)
        side = json.dumps(sidecar, sort_keys=True, allow_nan=False).encode()
        # Tensors first, then the sidecar: the sidecar's presence means the entry is complete
        # (its directory fsync makes both names durable). The same content published again (a
        # round redone after a kill) finds its entry there: the link fails, nothing is read first.
        try:
            write_new(self.tensors_path(entry_id), blob, sync_dir=False)
        except FileExistsError:
            if not content_id:
                raise
            if self._same_entry_exists(entry_id, digest):
                return entry_id
            unlink_if_there(self.tensors_path(entry_id))  # half an entry (no sidecar): write it whole
            write_new(self.tensors_path(entry_id), blob, sync_dir=False)
        try:
            write_new(self.sidecar_path(entry_id), side)
        except FileExistsError:
            # a sidecar of the same content whose tensors had gone (pruned as an orphan): it names
            # the old bytes' checksum, so it is replaced by this one
            if not content_id or not self._same_content(entry_id, digest):
                unlink_if_there(self.tensors_path(entry_id))
                raise
            unlink_if_there(self.sidecar_path(entry_id))
            write_new(self.sidecar_path(entry_id), side)
        except BaseException:
            unlink_if_there(self.tensors_path(entry_id))
            raise
        # A publisher that stalled between the two writes for longer than a pruner's
        # ``stale_after_s`` may have had its tensors removed as an orphan: put them back, so that
        # an id this method returns always names a whole entry.
        # (Both files gone means a pruner ranked the entry out, which is allowed.)
        count_op("stat")
        if not self.tensors_path(entry_id).exists() and self.sidecar_path(entry_id).exists():
            try:
                write_new(self.tensors_path(entry_id), blob)
            except FileExistsError:
                pass  # a pruner restored them at the same moment (same bytes)
        return entry_id

    def _same_content(self, entry_id: str, digest: str) -> bool:
        """Whether the sidecar of ``entry_id`` describes this content (False if absent or unreadable)."""
        count_op("open")
        try:
            side = read_json(self.sidecar_path(entry_id), what="leaderboard sidecar")
            return side.get("content_sha256") == digest
        except (OSError, ValueError, AttributeError):
            return False

    def _same_entry_exists(self, entry_id: str, digest: str) -> bool:
        """Whether ``entry_id`` (whose tensors exist) is a whole entry of this content; raises if
        its sidecar describes other content. A missing sidecar means half an entry (False)."""
        count_op("stat")
        if not self.sidecar_path(entry_id).exists():
            return False
        if not self._same_content(entry_id, digest):
            raise FileExistsError(
                f"{self.sidecar_path(entry_id)} already exists with other content; leaderboard entries are immutable"
            )
        return True

    # ------------------------------------------------------------------ read

    def list(self, max_new: int | None = None, rng: Any = None) -> list[Entry]:
        """Complete entries with a finite score, best first (ties by id).

        Reads only the sidecars (with ``cache``, only those it has not read before). Unreadable,
        foreign or malformed ``.json`` files are skipped with a :class:`LeaderboardWarning`;
        entries that vanish while listing are skipped silently. ``max_new``: read at most this
        many sidecars not read before, drawn at random (``rng``: a numpy Generator) when there are
        more, as after a burst of publications by many asynchronous pods: the others are read by a
        later listing or pruned by another pod, and a listing's cost stays bounded.
        """
        count_op("scandir")
        try:
            names = [e.name for e in os.scandir(self.entries_dir)]
        except FileNotFoundError:
            return []
        stems = []
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            stem = name[: -len(".json")]
            if not _ID_RE.fullmatch(stem):
                warn(f"{self.entries_dir / name}: not a leaderboard entry name; skipped")
                continue
            stems.append(stem)
        cache = self._cache if self._cache is not None else {}
        known = {s: cache[s] for s in stems if s in cache}
        new = sorted(s for s in stems if s not in known and s not in self._refused)
        if max_new is not None and len(new) > max_new:
            pick = (rng if rng is not None else np.random.default_rng()).choice(len(new), size=max_new, replace=False)
            new = [new[i] for i in sorted(pick.tolist())]
        for stem in new:
            try:
                known[stem] = self._read_sidecar(stem)
            except EntryGone:
                continue  # pruned while we were listing
            except EntryRefused as e:
                self._refused.add(stem)
                warn(f"{e}; skipped")
                continue
            except EntryCorrupt as e:
                warn(f"{e}; skipped")
                continue
        if self._cache is not None:
            self._cache = known  # entries gone from the directory leave the cache
        out = [e for e in known.values() if math.isfinite(e.score)]  # a NaN score is never a candidate
        out.sort(key=lambda e: (-e.score, e.id))
        return out

    def candidates(self, top_k: int | None = None) -> list[Entry]:
        """The entries a rule may draw: :meth:`list`, optionally only the top ``top_k``."""
        entries = self.list()
        return entries if top_k is None else entries[:top_k]

    def info(self, entry_id: str) -> Entry:
        """The sidecar of one entry; :class:`EntryGone` if absent, :class:`EntryCorrupt` if bad."""
        return self._read_sidecar(validate_entry_id(entry_id))

    def _read_sidecar(self, entry_id: str) -> Entry:
        """Parse and check a sidecar (its score is NaN if the file's is not a finite number)."""
        path = self.sidecar_path(entry_id)
        count_op("open")
        try:
            raw = read_owned(path, self.gid, MAX_JSON_BYTES, self.allow_foreign, "leaderboard sidecar")
            d = loads_json(raw, str(path))  # a regular file of a sane size, nested as JSON allows
        except FileNotFoundError:
            raise EntryGone(f"leaderboard entry {entry_id} is gone (pruned?): {path} does not exist") from None
        except ForeignFile as e:
            raise EntryRefused(f"leaderboard entry {entry_id}: {e}") from None
        except OSError as e:
            raise EntryCorrupt(f"leaderboard entry {entry_id}: cannot read {path} ({e})") from None
        except RunFileError as e:
            raise EntryCorrupt(f"leaderboard entry {entry_id}: {e}") from None
        if not isinstance(d, dict) or d.get("format") != SIDECAR_FORMAT:
            raise EntryCorrupt(f"{path}: not a podracer-hpc leaderboard sidecar (foreign file)")
        if d.get("version") not in SIDECAR_VERSIONS_READ:
            raise EntryCorrupt(
                f"{path}: sidecar version {d.get('version')!r}, this code reads "
                f"{', '.join(map(str, SIDECAR_VERSIONS_READ))}"
            )
        digest = None
        if d.get("version", 1) >= 2:
            try:
                digest = _sidecar_digest(d)
            except (TypeError, ValueError):
                pass
            ok = digest is not None and d.get("sidecar_sha256") == digest
            if not ok:
                self.quarantine(entry_id)
                raise EntryCorrupt(
                    f"leaderboard entry {entry_id}: sidecar checksum mismatch: {path} was edited "
                    "after it was written (its score, steps or hyperparameters cannot be trusted); "
                    f"{self.quarantined}, nothing was loaded"
                )
        self._check_keyed(entry_id, path, d, digest)
        if d.get("id") != entry_id:
            raise EntryCorrupt(f"{path}: sidecar names entry {d.get('id')!r}, not {entry_id!r} (renamed file?)")
        if not isinstance(d.get("sha256"), str) or not _SHA_RE.fullmatch(d["sha256"]):
            raise EntryCorrupt(f"{path}: sidecar has no valid sha256")
        try:
            return Entry(
                id=entry_id,
                score=float(d["score"]) if _is_finite_number(d.get("score")) else math.nan,
                env_steps=_int_or_none(d.get("env_steps")),
                pod=_int_or_none(d.get("pod")),
                job=None if d.get("job") is None else str(d["job"]),
                round=_int_or_none(d.get("round")),
                hparams=dict(d.get("hparams") or {}),
                created=float(d.get("created") or 0.0),
                sha256=d["sha256"],
                meta=dict(d.get("meta") or {}),
            )
        except (TypeError, ValueError) as e:
            raise EntryCorrupt(f"{path}: malformed sidecar ({e})") from None

    def _check_keyed(self, entry_id: str, path: Path, d: dict[str, Any], digest: str | None) -> None:
        """Raise :class:`EntryRefused` unless the sidecar's HMAC (of ``digest``, its checked
        :func:`_sidecar_digest`) matches this leaderboard's secret (an unkeyed sidecar of an older
        version passes only with ``accept_unkeyed``)."""
        if d.get("version", 1) < KEYED_VERSION:
            if self.accept_unkeyed:
                return
            raise EntryRefused(
                f"leaderboard entry {entry_id}: written before entries were keyed (sidecar version "
                f"{d.get('version', 1)}, no hmac): it cannot be told from a forgery, so it is refused. If you "
                "know who wrote it: podracer evaluate/export/backtest --accept-unkeyed (a pod never takes it)"
            )
        try:
            key = self.secret()
        except SecretError as e:
            raise EntryRefused(f"leaderboard entry {entry_id}: cannot be checked: {e}") from None
        if key is None:
            raise EntryRefused(
                f"leaderboard entry {entry_id}: cannot be checked: the leaderboard has no secret "
                f"({self.root / 'leaderboard.key'} is missing); forged or from another leaderboard"
            )
        ok = digest is not None and hmac.compare_digest(str(d.get("hmac", "")), _keyed(key, digest))
        if not ok:
            raise EntryRefused(
                f"leaderboard entry {entry_id}: its keyed checksum (hmac) does not match this leaderboard's "
                f"secret: forged or from another leaderboard; nothing was loaded ({path} left as it is)"
            )

    def load(self, entry_id: str, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Load an entry's tensors and the meta its publisher passed, after verifying the file.

        Raises :class:`InvalidEntryId` for an unsafe id, :class:`EntryGone` if the entry (or
        its tensors) no longer exists, :class:`EntryCorrupt` on a checksum mismatch or a
        foreign file. Never unpickles.
        """
        validate_entry_id(entry_id)
        info = self._read_sidecar(entry_id)
        expected = info.sha256
        path = self.tensors_path(entry_id)
        count_op("open")
        if not os.path.lexists(path):
            raise EntryGone(f"leaderboard entry {entry_id} is gone (pruned?): {path} does not exist")
        try:
            if not self.allow_foreign:
                check_owner(path, self.gid)
            blob = safeio.read_state_bytes(path)  # a regular file of the size its header declares, or nothing read
        except FileNotFoundError:
            raise EntryGone(f"leaderboard entry {entry_id} is gone (pruned?): {path} does not exist") from None
        except ForeignFile as e:
            raise EntryRefused(f"leaderboard entry {entry_id}: {e}") from None
        except safeio.StateFileError as e:
            if not os.path.lexists(path):
                raise EntryGone(f"leaderboard entry {entry_id} is gone (pruned?): {path} does not exist") from None
            self.quarantine(entry_id)
            raise EntryCorrupt(f"leaderboard entry {entry_id}: {e}") from None
        actual = hashlib.sha256(blob).hexdigest()
        if actual != expected:
            self.quarantine(entry_id)
            raise EntryCorrupt(
                f"leaderboard entry {entry_id}: checksum mismatch ({path} has sha256 {actual[:12]}..., "
                f"its sidecar says {expected[:12]}...): the file is corrupt or was replaced. Nothing was loaded; "
                "delete both files of this entry."
            )
        try:
            tensors, file_meta, _ = safeio.loads(blob, kind=ENTRY_KIND, source=str(path), device=device)
        except EntryCorrupt:
            self.quarantine(entry_id)
            raise
        except safeio.StateFileError as e:
            self.quarantine(entry_id)
            raise EntryCorrupt(f"leaderboard entry {entry_id}: {e}") from None
        if file_meta.get("entry_id") != entry_id:
            self.quarantine(entry_id)
            raise EntryCorrupt(
                f"leaderboard entry {entry_id}: {path} holds entry {file_meta.get('entry_id')!r} (swapped files?)"
            )
        inner = dict(file_meta.get("meta") or {})
        mismatch = [
            name
            for name, listed, actual in (
                ("score", info.score, file_meta.get("score")),
                ("env_steps", info.env_steps, _int_or_none(inner.get("env_steps"))),
                ("hparams", info.hparams, dict(inner.get("hparams") or {})),
            )
            if listed != actual
        ]
        if mismatch:
            self.quarantine(entry_id)
            raise EntryCorrupt(
                f"leaderboard entry {entry_id}: its sidecar's {', '.join(mismatch)} differ from the checksummed copy "
                f"in {path} (the sidecar was edited): {self.quarantined}, nothing was loaded"
            )
        return tensors, inner

    @property
    def quarantined(self) -> str:
        """What happened to a corrupt entry this reader found (for its messages)."""
        return "left in place (a read-only reader)" if self.read_only else "quarantined"

    def quarantine(self, entry_id: str) -> None:
        """Take a corrupt entry out of the listing for every reader and every later round.

        The sidecar is renamed to ``.<id>.json.corrupt`` (kept as evidence): ``list`` skips
        hidden names, so a corrupt entry with a high score can no longer win every draw; its
        tensors become an orphan that ``prune`` deletes once stale.
        """
        validate_entry_id(entry_id)
        if self.read_only:
            return
        count_op("rename")
        try:
            os.replace(self.sidecar_path(entry_id), self.entries_dir / f".{entry_id}.json.corrupt")
            warn(f"leaderboard entry {entry_id} is corrupt: quarantined as .{entry_id}.json.corrupt")
        except FileNotFoundError:
            pass  # another reader quarantined it first

    def load_best_available(
        self,
        candidates: Iterable[Entry | str],
        device: str | torch.device = "cpu",
        skip_corrupt: bool = True,
    ) -> tuple[str, dict[str, torch.Tensor], dict[str, Any]]:
        """Load the first candidate (an entry, or its id) that still exists; returns ``(entry_id, tensors, meta)``.

        Entries that are gone are skipped; corrupt ones too (with a warning) unless
        ``skip_corrupt`` is False. Raises :class:`EntryGone` if none could be loaded.
        """
        tried: list[str] = []
        for c in candidates:
            eid = c.id if isinstance(c, Entry) else c
            tried.append(str(eid))
            try:
                tensors, meta = self.load(eid, device=device)
                return eid, tensors, meta
            except EntryGone:
                continue
            except EntryCorrupt as e:
                if not skip_corrupt:
                    raise
                warn(f"{e}; trying the next candidate")
        raise EntryGone(f"none of the {len(tried)} candidate entries could be loaded: {tried[:8]}")

    # ------------------------------------------------------------------ prune

    def prune(
        self,
        top_k: int,
        stale_after_s: float = 900.0,
        keep: Iterable[str] = (),
        listing: list[Entry] | None = None,
        group: Callable[[Entry], str] | None = None,
    ) -> list[str]:
        """Keep the ``top_k`` best entries (and those in ``keep``); delete the others (sidecar
        first, then tensors). ``group``: keep the ``top_k`` best of each group instead (a mixed
        pool keeps the best agents of every kind, not only of the strongest).

        Idempotent and safe with concurrent pruners, publishers and readers. Also deletes hidden
        temporary files and orphan tensor files (no sidecar) older than ``stale_after_s``
        seconds (left by writers that died; :meth:`sweep`). Foreign files are left alone.
        ``listing``: a :meth:`list` the caller just made (saves reading every sidecar again;
        entries published since are kept until a later prune). Returns the ids it deleted.
        """
        ranked = listing if listing is not None else self.list()
        removed = plan_prune(ranked, top_k, keep, group)
        self.remove(removed)
        self.sweep(stale_after_s)
        return removed

    def remove(self, entry_ids: Iterable[str]) -> None:
        """Delete entries (sidecar first, so an entry leaves :meth:`list` before its tensors go);
        entries already gone are no error. A collective round spreads this: each pod removes its own."""
        for eid in entry_ids:
            unlink_if_there(self.sidecar_path(eid))
            unlink_if_there(self.tensors_path(eid))

    def sweep(self, stale_after_s: float = 900.0) -> None:
        """Delete hidden temporary files and orphan tensor files (no sidecar) older than
        ``stale_after_s`` seconds: what writers that died left. One listing of the directory."""
        now = time.time()
        count_op("scandir")
        try:
            names = [(x.name, x) for x in os.scandir(self.entries_dir)]
        except FileNotFoundError:
            return
        sidecars = {name for name, _ in names if name.endswith(".json")}
        for name, de in names:
            is_tmp = name.startswith(".") and name.endswith((".tmp", ".orphan"))
            stem = name[: -len(".safetensors")] if name.endswith(".safetensors") else None
            # tensors whose sidecar is in the same listing are whole: no stat (a prune's cost stays
            # that of its listing, not one call per entry)
            is_orphan = stem is not None and f"{stem}.json" not in sidecars and _OURS_RE.fullmatch(stem) is not None
            if not (is_tmp or is_orphan):
                continue
            count_op("stat")
            try:
                if now - de.stat(follow_symlinks=False).st_mtime < stale_after_s:
                    continue
                if is_orphan and (self.entries_dir / f"{stem}.json").exists():
                    continue
            except FileNotFoundError:
                continue
            if is_orphan:
                self._remove_orphan(stem)
            else:
                unlink_if_there(self.entries_dir / name)

    def _remove_orphan(self, stem: str) -> None:
        """Delete tensors without a sidecar, unless their (stalled) publisher completes meanwhile:
        move them to a hidden name, look for the sidecar again, and put them back if it came."""
        src = self.entries_dir / f"{stem}.safetensors"
        hidden = self.entries_dir / f".{stem}.safetensors.{uuid.uuid4().hex[:8]}.orphan"
        count_op("rename", 2)
        try:
            os.rename(src, hidden)
        except FileNotFoundError:
            return
        if (self.entries_dir / f"{stem}.json").exists():
            try:
                os.link(hidden, src)
            except FileExistsError:
                pass  # the publisher wrote them again itself
        unlink_if_there(hidden)


def plan_prune(
    ranked: Iterable[Entry], top_k: int, keep: Iterable[str] = (), group: Callable[[Entry], str] | None = None
) -> list[str]:
    """The ids a prune deletes: all but the ``top_k`` best of each ``group`` (one group by
    default) and ``keep``. Pure: every rank of a collective round computes the same plan."""
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    keep = set(keep)
    place: dict[str, int] = {}
    out = []
    for e in sorted(ranked, key=lambda e: (-e.score, e.id)):
        g = group(e) if group is not None else ""
        place[g] = place.get(g, 0) + 1
        if place[g] > top_k and e.id not in keep:
            out.append(e.id)
    return out


def _sidecar_digest(d: dict[str, Any]) -> str:
    """sha256 of a sidecar's fields other than the digest and the hmac (canonical JSON)."""
    body = {k: v for k, v in d.items() if k not in ("sidecar_sha256", "hmac")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, allow_nan=False).encode()).hexdigest()


def _keyed(key: bytes, digest: str) -> str:
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def _sidecar_hmac(key: bytes | None, d: dict[str, Any]) -> str:
    """HMAC-SHA256 with the leaderboard's secret of the sidecar's digest (:func:`_sidecar_digest`,
    which covers every other field): a reader checks both with one canonical JSON of the sidecar."""
    if key is None:
        raise SecretError("no leaderboard secret to sign with")
    return _keyed(key, _sidecar_digest(d))


def _content_digest(tensors: dict[str, torch.Tensor], score: float, meta: dict[str, Any]) -> str:
    """sha256 of an entry's content (tensors, score, meta), independent of time and host."""
    import torch  # here: listing a leaderboard (podracer status) needs no torch

    h = hashlib.sha256(json.dumps({"score": score, "meta": meta}, sort_keys=True).encode())
    for k in sorted(tensors):
        v = tensors[k].detach().to("cpu").contiguous()
        h.update(f"{k}|{v.dtype}|{tuple(v.shape)}|".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()


def _is_finite_number(x: Any) -> bool:
    if isinstance(x, (bool, str, bytes)) or x is None:
        return False
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _int_or_none(x: Any) -> int | None:
    try:
        return None if x is None else int(x)
    except (TypeError, ValueError):
        return None
