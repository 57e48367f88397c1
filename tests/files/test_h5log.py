"""HDF5 logs: readable while written (SWMR), after a writer died, refused when foreign."""

import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from podracer_hpc.files.h5log import SCHEMA_VERSION, H5Writer, LogError, read_log
from podracer_hpc.files.h5recover import clear_open_flags, lookup3, open_log


def test_rows_roundtrip_and_defaults(tmp_path):
    p = tmp_path / "a.h5"
    with H5Writer(p, {"seed": 3, "config": {"x": 1}}) as w:
        w.append("train", {"update": 1, "env_steps": 10, "loss": 0.5})
        w.append(
            "tournament",
            {
                "round": 0,
                "env_steps": 10,
                "action": "load_entry",
                "source": "e-1",
                "old_hparams": '{"lr": 1}',
                "new_hparams": '{"lr": 2}',
            },
        )
        with pytest.raises(KeyError, match="unknown train columns"):
            w.append("train", {"bogus": 1})
    log = read_log(p)
    assert log["attrs"]["seed"] == 3 and log["attrs"]["config"] == {"x": 1}
    assert log["attrs"]["schema_version"] == SCHEMA_VERSION
    assert log["train"]["loss"][0] == 0.5 and np.isnan(log["train"]["entropy"][0])
    assert log["tournament"]["action"][0] == "load_entry"


def test_reader_sees_rows_while_the_writer_runs(tmp_path):
    """A separate process appends and flushes; this process reads the growing file."""
    p = tmp_path / "live.h5"
    code = textwrap.dedent(f"""
        import time, sys
        from podracer_hpc.files.h5log import H5Writer
        w = H5Writer({str(p)!r}, {{"seed": 0}}, flush_interval_s=0)
        for i in range(1, 1000):
            w.append("train", {{"update": i, "env_steps": i * 100}})
            if i == 5:
                print("ready", flush=True)
            time.sleep(0.02)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        n1 = len(read_log(p)["train"]["update"])
        time.sleep(0.5)
        n2 = len(read_log(p)["train"]["update"])
        assert 5 <= n1 < n2, (n1, n2)
        assert proc.poll() is None  # still writing
    finally:
        proc.kill()
        proc.wait()


def test_log_of_a_killed_writer_is_readable_up_to_its_last_flush(tmp_path):
    p = tmp_path / "dead.h5"
    code = textwrap.dedent(f"""
        import os, signal
        from podracer_hpc.files.h5log import H5Writer
        w = H5Writer({str(p)!r}, {{"seed": 0}}, flush_interval_s=1e9)
        for i in range(7):
            w.append("eval", {{"update": i, "env_steps": i, "return_mean": -i}})
        w.flush()
        w.append("eval", {{"update": 99, "env_steps": 99}})  # never flushed
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    r = subprocess.run([sys.executable, "-c", code])
    assert r.returncode == -signal.SIGKILL
    log = read_log(p)
    assert list(log["eval"]["update"][:7]) == list(range(7))
    assert len(log["eval"]["update"]) in (7, 8)


def test_unknown_schema_version_is_refused(tmp_path):
    p = tmp_path / "old.h5"
    with h5py.File(p, "w") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(LogError, match="schema version 99"):
        read_log(p)
    with pytest.raises(LogError, match="schema version 99"):
        H5Writer(p, {})
    q = tmp_path / "junk.h5"
    q.write_bytes(b"not hdf5")
    with pytest.raises(LogError, match="not a readable HDF5 log"):
        read_log(q)
    with pytest.raises(LogError, match="no such log"):
        read_log(tmp_path / "missing.h5")


def test_a_log_left_open_by_a_killed_writer_is_recovered_and_continued(tmp_path):
    """HDF5 refuses to reopen it for writing ('file is already open for write/SWMR write'):
    the writer rebuilds it from what was flushed, says so, keeps the original, and appends on."""
    p = tmp_path / "dead.h5"
    code = textwrap.dedent(f"""
        import os, signal
        from podracer_hpc.files.h5log import H5Writer
        w = H5Writer({str(p)!r}, {{"seed": 5, "config": {{"a": [1, 2]}}}}, flush_interval_s=1e9)
        for i in range(1, 6):
            w.append("train", {{"update": i, "env_steps": 100 * i, "loss": 0.5}})
        w.append("tournament", {{"round": 0, "env_steps": 500, "action": "keep", "source": "pod1"}})
        w.flush()
        w.append("train", {{"update": 6, "env_steps": 600}})  # never flushed
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
    with pytest.raises(OSError):
        h5py.File(p, "a")  # what the chaos run hit
    with pytest.raises(LogError, match="h5recover.open_log rebuilds it"):
        H5Writer(p, {"seed": 5})  # the writer alone does not rebuild a log (h5recover does)
    said = []
    with open_log(p, {"seed": 5}, say=said.append) as w:
        assert w.truncate_after(400) == 2  # rows 5 and the round at 500
        w.append("train", {"update": 5, "env_steps": 500})
    assert len(said) == 1 and "left open by a killed writer: recovered" in said[0]
    assert (tmp_path / "dead.h5.unclean").exists()
    log = read_log(p)
    assert list(log["train"]["update"]) == [1, 2, 3, 4, 5] and list(log["train"]["loss"][:4]) == [0.5] * 4
    assert len(log["tournament"]["round"]) == 0
    assert log["attrs"]["seed"] == 5 and log["attrs"]["config"] == {"a": [1, 2]}


def test_truncate_to_a_checkpoints_rows_is_exact_where_env_steps_tie(tmp_path):
    """A checkpoint taken at a round's env steps, before the round was held, then the round's rows
    (same env steps), then a kill: the resume must drop the round's rows (truncate_after kept them,
    and the redone round was logged twice)."""
    p = tmp_path / "r.h5"
    with H5Writer(p, {}) as w:
        for i in range(1, 5):
            w.append("train", {"update": i, "env_steps": 100 * i})
        saved = w.rows()  # the checkpoint at 400 env steps: round 0 due, not held
        assert saved == {"train": 4, "eval": 0, "tournament": 0}
        w.append("eval", {"update": 4, "env_steps": 400, "return_mean": -1.0})
        w.append("tournament", {"round": 0, "env_steps": 400, "action": "keep"})
    with H5Writer(p, {}) as w:
        assert w.truncate_after(400) == 0  # env steps cannot tell these rows from the checkpoint's
        assert w.truncate_to(saved) == 2
        assert w.rows() == saved
        assert w.truncate_to({"train": 10}) == 0  # rows the log does not have: nothing to drop


@pytest.mark.parametrize(
    "data, initval, expected",
    [
        (b"", 0, 0xDEADBEEF),
        (b"", 0xDEADBEEF, 0xBD5B7DDE),  # lookup3.c's own test vectors
        (b"Four score and seven years ago", 0, 0x17770551),
        (b"Four score and seven years ago", 1, 0xCD628161),
    ],
)
def test_lookup3_matches_the_published_vectors(data, initval, expected):
    assert lookup3(data, initval) == expected


@pytest.mark.parametrize("rows", [0, 3])
def test_lookup3_matches_the_checksum_hdf5_wrote(tmp_path, rows):
    p = tmp_path / "a.h5"
    with H5Writer(p, {"seed": 1}) as w:
        for i in range(rows):
            w.append("train", {"update": i, "env_steps": i})
    block = p.read_bytes()[:48]  # superblock v3 with 8-byte addresses: 44 bytes, then the checksum
    assert block[8] == 3 and lookup3(block[:44]) == int.from_bytes(block[44:48], "little")
    assert clear_open_flags(p) is False  # closed cleanly: nothing to clear, nothing changed
    assert p.read_bytes()[:48] == block


def test_a_log_killed_while_it_was_reopened_is_recovered_and_continued(tmp_path):
    """Killed between reopening its log for writing and switching to SWMR (a requeue's KILL that
    lands while a rank resumes): the file is marked plainly "open for write", which no reader,
    SWMR or not, gets past. The next start clears the flags on a copy, recovers what the
    earlier starts flushed, keeps the original, and continues (the Slurm chaos test hit it)."""
    p = tmp_path / "dead.h5"
    with H5Writer(p, {"seed": 5}) as w:
        for i in range(1, 4):
            w.append("train", {"update": i, "env_steps": 100 * i, "loss": 0.25})
    code = textwrap.dedent(f"""
        import os, signal, h5py
        f = h5py.File({str(p)!r}, "a", libver="latest")  # what H5Writer does before swmr_mode
        f.attrs["rank"] = 0
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -signal.SIGKILL
    for swmr in (True, False):
        with pytest.raises(OSError, match="open for"):
            h5py.File(p, "r", libver="latest", swmr=swmr)  # what the requeued rank hit
    said = []
    with open_log(p, {"seed": 5}, say=said.append) as w:
        w.append("train", {"update": 4, "env_steps": 400})
    assert len(said) == 1 and "recovered 3 rows" in said[0], said
    assert (tmp_path / "dead.h5.unclean").exists() and not list(tmp_path.glob(".*tmp"))
    log = read_log(p)
    assert list(log["train"]["update"]) == [1, 2, 3, 4] and list(log["train"]["loss"][:3]) == [0.25] * 3


def test_truncate_to_nothing_and_unsorted_logs(tmp_path):
    p = tmp_path / "a.h5"
    with H5Writer(p, {}) as w:
        for u in (1, 2, 3, 1, 2):  # a log written by an older version after a restart
            w.append("train", {"update": u, "env_steps": 10 * u})
        assert w.truncate_after(20) == 3  # everything after the first row beyond 20
        assert list(w.f["train"]["update"][...]) == [1, 2]
        assert w.truncate_after(-1) == 2
    assert len(read_log(p)["train"]["update"]) == 0


def test_unreadable_log_is_refused_untouched(tmp_path):
    q = tmp_path / "junk.h5"
    q.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)
    with pytest.raises(LogError, match="cannot be continued"):
        open_log(q, {})
    assert q.read_bytes() == b"\x89HDF\r\n\x1a\n" + b"\x00" * 64


def test_a_schema_1_log_is_read_typed_and_continued(tmp_path):
    """Logs written before the typed source columns: read through records.read_records (the one
    place that parses the old 'source' strings), and continued (upgraded in place to the current version)."""
    from podracer_hpc.files.records import RoundRecord, Source, read_records

    p = tmp_path / "v1.h5"
    legacy = ["", "pod1", "rejected:j-0-1-0123456789ab", "local-2-3-0123456789ab"]
    with H5Writer(p, {}) as w:
        for i, s in enumerate(legacy):
            w.append(
                "tournament",
                {
                    "round": i,
                    "env_steps": 10 * i,
                    "action": "keep",
                    "source": s,
                    "old_hparams": "{}",
                    "new_hparams": '{"learning_rate": 0.1}',
                },
            )
    with h5py.File(p, "a") as f:  # what a version-1 writer left: no typed columns
        for name in ("source_kind", "source_id", "source_rejected"):
            del f["tournament"][name]
        f.attrs["schema_version"] = 1
    recs = read_records(read_log(p)["tournament"])
    assert [r.source for r in recs] == [
        Source(),
        Source("pod", "1"),
        Source("entry", "j-0-1-0123456789ab", True),
        Source("entry", "local-2-3-0123456789ab"),
    ]
    assert recs[3].source.pod == 2 and recs[0].new_hparams == {"learning_rate": 0.1}
    with H5Writer(p, {}) as w:
        w.append(
            "tournament",
            RoundRecord(4, 40, 1.0, -5.0, "copy_pod", Source("entry", "x-3-4-0123456789ab"), {}, {}, 0.1).to_row(),
        )
    log = read_log(p)
    assert log["attrs"]["schema_version"] == SCHEMA_VERSION  # upgraded in place (to 3: the comparison columns too)
    recs = read_records(log["tournament"])
    assert len(recs) == 5 and recs[1].source == Source("pod", "1") and recs[4].source.pod == 3
    assert recs[4].action == "copy_pod" and recs[4].fitness == -5.0
