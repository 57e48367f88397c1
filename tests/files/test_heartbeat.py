"""Heartbeats, aggregates and hang records on real files."""

import json
import time

from podracer_hpc.files import heartbeat
from podracer_hpc.files.rundir import RunDir


def test_a_heartbeat_is_written_at_most_every_interval_unless_forced(tmp_path):
    rd = RunDir(tmp_path)
    hb = heartbeat.Heartbeat(rd, 3, {"rank": 1, "part": 1, "host": "n7", "device": "cuda:1", "pid": 42}, 60.0)
    assert hb.beat("training", update=1, env_steps=100)
    assert not hb.beat("training", update=2, env_steps=200)  # within the interval: kept, not written
    assert json.loads(rd.heartbeat(3).read_text())["update"] == 1
    assert hb.beat("waiting for every rank (wait 4)", force=True, wait=4)
    b = heartbeat.read_beats(rd, range(5))
    assert list(b) == [3] and b[3]["update"] == 2 and b[3]["wait"] == 4 and b[3]["host"] == "n7"
    assert heartbeat.age(b[3]) < 5 and heartbeat.age(None) == float("inf")
    text = heartbeat.describe(3, {**b[3], "t": time.time() - 31}, time.time())
    assert text.startswith("pod 3 (rank 1 of part 1, host n7, cuda:1, pid 42): last update 2 (200 env steps)")
    assert "no sign of life for 31 s, was waiting" in text
    assert "no heartbeat at all" in heartbeat.describe(9, None)
    assert not list(tmp_path.rglob(".*.tmp"))  # no temporary left behind


def test_aggregates_and_hang_records_are_read_back_and_torn_ones_skipped(tmp_path):
    rd = RunDir(tmp_path)
    heartbeat.write_aggregate(rd, 0, {"job": "7", "pods": [{"pod": 0}]})
    heartbeat.write_aggregate(rd, 1, {"job": "8", "pods": [{"pod": 2}]})
    rd.part_aggregate(2).write_text('{"part": 2, "pods": [')  # torn
    heartbeat.write_hang(rd, 1, {"hung": [{"pod": 3}]})
    aggs = heartbeat.read_aggregates(rd)
    assert list(aggs) == [0, 1] and aggs[1]["job"] == "8"  # the hang record is not an aggregate
    assert heartbeat.read_hang(rd, 1)["hung"] == [{"pod": 3}] and heartbeat.read_hang(rd, 0) is None
    heartbeat.clear_part(rd, 1)
    assert heartbeat.read_hang(rd, 1) is None
