"""files/h5recover.py on logs a full disk damaged: a log shorter than its superblock says (a write
the disk refused) is recovered without hanging, keeping every row it can read and saying which
were lost; HDF5 write errors are OSErrors with HDF5's errno (the advice a full disk needs)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from podracer_hpc.files.h5log import H5Writer, LogError, LogWriteError, read_log, write_error
from podracer_hpc.files.h5recover import open_log, salvage, stored_eof


def _log(p: Path, rows: int = 1500) -> None:
    with H5Writer(p, {"seed": 3, "config": {"a": 1}}, flush_interval_s=1e9) as w:
        for i in range(1, rows + 1):
            w.append("train", {"update": i, "env_steps": 10 * i, "loss": 0.5})
            if i % 100 == 0:
                w.append("eval", {"update": i, "env_steps": 10 * i, "return_mean": -i})
            if i % 50 == 0:
                w.flush()


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.97])
def test_a_log_cut_short_is_recovered_within_seconds_keeping_what_it_can(tmp_path, keep):
    """The end of the file is gone, as when the disk refused the last writes: an SWMR reader would
    retry for minutes; recovery keeps the readable prefix, says what was lost, and the run appends on."""
    p = tmp_path / "x_rank0.h5"
    _log(p)
    eof = stored_eof(p)
    assert eof == p.stat().st_size
    os.truncate(p, int(eof * keep))
    said: list[str] = []
    t = time.monotonic()
    with open_log(p, {"seed": 3}, say=said.append) as w:
        kept = w.rows()["train"]
        w.append("train", {"update": kept + 1, "env_steps": 10 * (kept + 1)})
    assert time.monotonic() - t < 20
    log = read_log(p)
    upd = list(log["train"]["update"])
    assert 0 < kept < 1500 and upd == list(range(1, kept + 2))  # a prefix, in order, then the new row
    assert list(log["train"]["loss"][:kept]) == [0.5] * kept and list(log["train"]["env_steps"][:kept]) == [
        10 * u for u in range(1, kept + 1)
    ]  # no zeros read from the padded end
    assert len(said) == 1 and f"/train rows {kept + 1}-1500 lost, after update {kept}" in said[0], said
    assert (tmp_path / "x_rank0.h5.unclean").stat().st_size == int(eof * keep)  # the original, untouched
    assert not list(tmp_path.glob(".*tmp"))
    assert log["attrs"]["config"] == {"a": 1}


def test_salvage_of_an_intact_log_loses_nothing(tmp_path):
    p = tmp_path / "ok.h5"
    _log(p, rows=300)
    log, lost = salvage(p)
    assert lost["train"] == (300, 300) and lost["eval"] == (3, 3) and lost["tournament"] == (0, 0)
    assert list(log["eval"]["return_mean"]) == [-100, -200, -300]


def test_a_log_with_nothing_readable_is_refused_untouched(tmp_path):
    p = tmp_path / "junk.h5"
    p.write_bytes(b"\x89HDF\r\n\x1a\n\x02" + b"\x00" * 100)
    with pytest.raises(LogError, match="cannot be continued"):
        open_log(p, {})
    assert p.read_bytes() == b"\x89HDF\r\n\x1a\n\x02" + b"\x00" * 100


def test_hdf5_error_texts_become_oserrors_with_their_errno(tmp_path):
    e = write_error(tmp_path / "l.h5", RuntimeError("Can't write (file write failed: errno = 28, ...)"), "x")
    assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.filename == str(tmp_path / "l.h5")
    e = write_error(tmp_path / "l.h5", OSError("[Errno 122] Disk quota exceeded"), "x")
    assert e.errno == errno.EDQUOT
    e = write_error(tmp_path / "l.h5", RuntimeError("Can't decrement id ref count"), "x")
    assert e.errno == errno.ENOSPC and "HDF5 could not write" in e.strerror  # no errno: a full disk's advice


def test_a_write_past_a_file_size_limit_is_a_log_write_error(tmp_path):
    """A real refused write (RLIMIT_FSIZE, no root needed): append raises LogWriteError, never
    h5py's RuntimeError, and the log recovers afterwards."""
    p = tmp_path / "lim.h5"
    code = textwrap.dedent(f"""
        import resource, signal
        from podracer_hpc.files.h5log import H5Writer, LogWriteError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        w = H5Writer({str(p)!r}, {{"seed": 1}}, flush_interval_s=0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))
        try:
            for i in range(1, 100_000):
                w.append("train", {{"update": i, "env_steps": i}}, flush=True)
        except LogWriteError as e:
            print("refused", e.errno, i, flush=True)
        try:
            w.close()
        except LogWriteError:
            pass
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.stdout.startswith("refused 27 "), (r.stdout, r.stderr[-3000:])  # EFBIG
    assert "Traceback" not in r.stderr
    said: list[str] = []
    with open_log(p, {"seed": 1}, say=said.append) as w:
        n = w.rows()["train"]
    assert n > 0 and list(read_log(p)["train"]["update"]) == list(range(1, n + 1))


def test_log_write_error_is_an_oserror():
    assert issubclass(LogWriteError, OSError)


def test_a_fifo_in_place_of_a_log_is_refused_at_once(tmp_path):
    """HDF5 would open a FIFO and wait for a writer forever (status, recovery, a resumed rank)."""
    p = tmp_path / "x_rank0.h5"
    os.mkfifo(p)
    t = time.monotonic()
    with pytest.raises(LogError, match="not a regular file"):
        read_log(p)
    with pytest.raises(LogError, match="not a regular file"):
        open_log(p, {})
    assert time.monotonic() - t < 5
