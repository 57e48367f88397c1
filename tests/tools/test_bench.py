"""`podracer bench env`: our batched env next to the fastest gymnasium peer of the task."""

from __future__ import annotations

import json

import pytest

from podracer_hpc.tools import bench


def test_cartpole_is_compared_with_gymnasiums_vector_env_at_the_same_num_envs():
    out = bench.bench_env("cartpole", [8, 32], seconds=0.05, gym_envs=4, threads=1)
    res = out["result"]
    assert res["peer"] == "gymnasium vector env" and res["threads"] == 1
    for row, n in zip(res["rows"], (8, 32)):
        assert row["num_envs"] == n and row["vector_steps_per_s"] > 0
        assert row["vs_vector"] == pytest.approx(row["steps_per_s"] / row["vector_steps_per_s"])
        assert row["vs_vector_cpu_time"] > 0
    assert res["ratio_vs_peer"] == res["rows"][-1]["vs_vector"]
    assert res["gym_steps_per_s"] > 0  # SyncVectorEnv stays as the historical reference
    assert "gymnasium vector env" in out["table"] and "x vector" in out["table"]


def test_pendulum_has_no_vector_env_and_is_compared_with_sync_vector_env():
    assert bench.gym_vector_env("pendulum", 4) is None
    res = bench.bench_env("pendulum", [8], seconds=0.05, gym_envs=4)["result"]
    assert res["peer"] == "gymnasium SyncVectorEnv" and res["rows"][0]["vs_vector"] is None
    assert res["ratio_vs_peer"] == res["ratio_vs_gym"] > 0


def test_paired_rates_alternate_and_measure_each_side():
    calls = []
    r = bench._paired_rates(lambda: calls.append("a"), lambda: calls.append("b"), 10, 0.02)
    assert set(r) == {"ours", "peer", "ours_cpu", "peer_cpu"} and min(r.values()) > 0
    switches = sum(1 for x, y in zip(calls, calls[1:]) if x != y)
    assert switches >= 3  # alternating blocks, not one long run each


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--threads", "0"], "--threads must be >= 1"),
        (["--num-envs", "64", "0"], "--num-envs must be >= 1"),
        (["--task", "doom"], "unknown task 'doom'; known tasks:"),
        (["--seconds", "0"], "--seconds must be > 0"),
    ],
)
def test_bench_env_bad_input_exits_2_with_a_message(cli, args, msg):
    r = cli("bench", "env", *args)
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_bench_env_cli_prints_a_table_then_one_json_line(cli):
    r = cli(
        "bench",
        "env",
        "--task",
        "cartpole",
        "--num-envs",
        "16",
        "--gym-envs",
        "0",
        "--seconds",
        "0.05",
        "--threads",
        "1",
    )
    assert r.returncode == 0, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["peer"] == "gymnasium vector env" and last["gym_steps_per_s"] is None
