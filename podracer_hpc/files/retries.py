"""The run's record of retries: one JSON row per resubmission of a part (``retries.jsonl``).

``podracer submit --wait --retries K`` and ``podracer resume RUN_DIR --retries K`` append a row
each time they resubmit a part that failed, hung or was ended by the system: when, which part,
the old and the new job id, why, the nodes excluded, and the how-manieth retry of the part it
is. ``podracer status`` shows them; the next watcher counts them (K bounds a part's retries over
every watcher). Rows are appended with one ``write`` of a whole line (O_APPEND): a reader sees
whole rows, and a torn last line (a crash mid-write) is skipped.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from podracer_hpc.files.rundir import RunDir

__all__ = ["append_retry", "read_retries", "retries_of"]

FIELDS = ("part", "old_job", "new_job", "reason", "excluded", "attempt")


def append_retry(
    rundir: RunDir, part: int, old_job: str, new_job: str, reason: str, excluded: list[str], attempt: int
) -> dict[str, Any]:
    """Append one retry row (``attempt``: this part's retry number, from 1); returns it."""
    row = {
        "t": round(time.time(), 3),
        "part": part,
        "old_job": old_job,
        "new_job": new_job,
        "reason": reason,
        "excluded": sorted(excluded),
        "attempt": attempt,
    }
    rundir.root.mkdir(parents=True, exist_ok=True)
    fd = os.open(rundir.retries_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)
    return row


def read_retries(rundir: RunDir) -> list[dict[str, Any]]:
    """Every whole retry row, oldest first (none: an empty list)."""
    try:
        text = rundir.retries_file.read_text(errors="replace")
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(row, dict) and isinstance(row.get("part"), int) and all(k in row for k in FIELDS):
            rows.append(row)
    return rows


def retries_of(rows: list[dict[str, Any]], part: int) -> list[dict[str, Any]]:
    """The rows of one part."""
    return [r for r in rows if r["part"] == part]
