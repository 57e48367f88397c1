"""The training pool under a real mpiexec: tournament rounds of real pods, faults, PBT."""

import json
import math
from pathlib import Path

import pytest
from helpers import run_mpi

from podracer_hpc.files.h5log import read_log
from podracer_hpc.pool.fitness import eval_seed
from podracer_hpc.pool.leaderboard import Leaderboard

pytestmark = pytest.mark.mpi


def train_args(run_dir: Path, *sets: str) -> list[str]:
    return [
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(run_dir),
        "--quiet",
        *sum((["--set", s] for s in sets), []),
    ]


@pytest.mark.parametrize("mode", ["elegantrl", "pbt"])
def test_round_decisions_identical_and_copies_bit_exact(tmp_path, mode):
    r = run_mpi(4, "tests/mpi_scripts/pool_round.py", str(tmp_path), mode)
    assert r.returncode == 0, r.stderr
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(4)]
    assert all(x["size"] == 4 for x in ranks)
    # Every rank computed the same decisions for everybody.
    assert all(x["decisions"] == ranks[0]["decisions"] for x in ranks)
    movers = [x for x in ranks if x["action"] in ("load_entry", "copy_pod")]
    assert movers, "the weakest pod (fitness -1000) must take a better agent"
    assert ranks[0]["action"] != "keep"
    for x in movers:
        assert x["after"] == x["loaded_sha"], "copied weights must arrive bit-exact"
        assert x["after"] in x["all_before"] and x["after"] != x["before"]
    for x in ranks:
        if x["action"] == "keep":
            assert x["after"] == x["before"]
    if mode == "pbt":
        assert ranks[0]["hparams"] != ranks[1]["hparams"] or ranks[0]["decisions"][0]["new_hparams"]


@pytest.mark.parametrize("task", ["quickstart", "cartpole"])
def test_pods_are_scored_on_common_start_states_and_copies_tie_exactly(tmp_path, task):
    """4 pods with their own seeds reset their eval envs to the same start states for a
    round; 4 identical agents get identical fitness bit for bit (CPU); so a round with margin 0
    replaces nobody (before, each pod drew its own start states and copies scored apart)."""
    r = run_mpi(4, "tests/mpi_scripts/common_eval.py", str(tmp_path), task)
    assert r.returncode == 0, r.stderr
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(4)]
    assert [x["seed"] for x in ranks] == [11, 12, 13, 14]  # the pods differ in their seed
    assert len({x["round_seed"] for x in ranks}) == 1 and len({x["states"] for x in ranks}) == 1
    assert all(x["copy"] == ranks[0]["copy"] for x in ranks)  # bit for bit
    assert len({tuple(x["own"]) for x in ranks}) > 1 or task == "cartpole"  # their own agents still differ
    assert all(x["actions"] == ["keep"] * 4 and x["diffs"] == [0.0] * 4 for x in ranks)


def test_quickstart_tournament_under_mpiexec(tmp_path):
    run = tmp_path / "run"
    r = run_mpi(
        4,
        *train_args(
            run, "total_env_steps=163840", "tournament.interval_env_steps=40960", "eval.interval_env_steps=40960"
        ),
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["pods"] == 4 and summary["rounds"] == 4 and summary["best_pod"] in range(4)
    best = []
    for rank in range(4):
        log = read_log(run / "logs" / f"quickstart_rank{rank}.h5")
        t = log["tournament"]
        assert list(t["round"]) == [0, 1, 2, 3]
        assert set(t["action"]) <= {"keep", "load_entry", "copy_pod"}
        best.append(max(log["eval"]["return_mean"]))
    assert summary["peak_return"] == max(best)  # the best evaluation of any pod at any time
    # the verdict: every pod once more on one common set; the best of those, with its interval
    lo, hi = summary["best_return_ci95"]
    assert summary["final_episodes"] == 100 and lo < summary["best_return"] < hi
    board = Leaderboard(run / "leaderboard")
    entries = board.list()
    assert 1 <= len(entries) <= 4  # top_k of the quickstart
    for e in entries:
        board.load(e.id)  # every entry is whole and verified


def test_nan_pod_is_restored_from_the_leaderboard(tmp_path):
    run = tmp_path / "run"
    r = run_mpi(
        2,
        *train_args(
            run, "total_env_steps=61440", "tournament.interval_env_steps=20480", "eval.interval_env_steps=20480"
        ),
        env={"PODRACER_INJECT_NAN": "1:2"},
    )
    assert r.returncode == 0, r.stderr
    assert "frozen until round" in r.stderr and "restored from" in r.stderr
    log = read_log(run / "logs" / "quickstart_rank1.h5")
    assert math.isnan(log["train"]["loss"][1])  # update 2 went NaN
    t = log["tournament"]
    assert math.isnan(t["fitness"][0]) and t["action"][0] in ("load_entry", "copy_pod")
    assert all(math.isfinite(x) for x in log["train"]["loss"][5:])  # trained again after the round
    assert math.isfinite(log["eval"]["return_mean"][-1])


def test_pbt_beats_independent_pods_from_poor_hyperparameters(tmp_path):
    """Same pods, same budget, learning rate 1e-5: PBT explores its way out, independent pods cannot.
    (3 rounds: with seeds 0, 1, 2 the best PBT pod ended 470-886 above the best independent one.)"""
    common = [
        "total_env_steps=122880",
        "agent.learning_rate=1e-5",
        "agent.anneal_lr=false",
        "tournament.interval_env_steps=40960",
        "eval.interval_env_steps=40960",
        "tournament.quantile=0.5",
        "tournament.resample_prob=0.5",
        "tournament.hparam_space={learning_rate: [1.0e-5, 1.0e-2, true]}",
    ]
    res = {}
    for mode in ("pbt", "none"):
        r = run_mpi(4, *train_args(tmp_path / mode, *common, f"tournament.mode={mode}"))
        assert r.returncode == 0, r.stderr
        finals = [
            read_log(tmp_path / mode / "logs" / f"quickstart_rank{k}.h5")["eval"]["return_mean"][-1] for k in range(4)
        ]
        res[mode] = max(finals)
    assert res["pbt"] > res["none"] + 100, res


def test_pods_in_the_reserve_train_exactly_as_independent_pods(tmp_path):
    """tournament.reserve 2: ranks 0 and 1 are never replaced, so they take the same updates as the
    independent pods of the same seeds (PBT with a reserve of R is never later than the best of
    those R); the other pods are replaced as usual."""
    from podracer_hpc.files.records import read_records

    common = [
        "total_env_steps=61440",
        "tournament.interval_env_steps=20480",
        "eval.interval_env_steps=20480",
        "tournament.quantile=0.5",
        "tournament.ready_rounds=0",
    ]
    runs = {"none": ["tournament.mode=none"], "reserve": ["tournament.mode=pbt", "tournament.reserve=2"]}
    logs = {}
    for name, sets in runs.items():
        r = run_mpi(4, *train_args(tmp_path / name, *common, *sets))
        assert r.returncode == 0, r.stderr
        logs[name] = [read_log(tmp_path / name / "logs" / f"quickstart_rank{k}.h5") for k in range(4)]
    acted = {k: [x.action for x in read_records(logs["reserve"][k]["tournament"])] for k in range(4)}
    assert all(a == "keep" for k in (0, 1) for a in acted[k]), acted
    assert any(a != "keep" for k in (2, 3) for a in acted[k]), acted  # the rule did act on the others
    for k in (0, 1):
        assert list(logs["reserve"][k]["train"]["loss"]) == list(logs["none"][k]["train"]["loss"]), k


@pytest.mark.parametrize("initial", ["auto", "job"])
def test_a_pbt_pool_with_a_declared_prior_starts_from_random_searchs_draws(tmp_path, initial):
    """tournament.initial_hparams: with a declared space (auto) pods 1.. start from the draw random
    search makes for their seed, logged as round -1 'draw'; pod 0 keeps the job's values; 'job'
    starts every pod at the job's values."""
    from podracer_hpc.files.records import read_records
    from podracer_hpc.pool.hparams import prior_draw

    space = "{learning_rate: [1.0e-5, 1.0e-2, true]}"
    run = tmp_path / "run"
    sets = ["total_env_steps=4096", "tournament.mode=pbt", "tournament.interval_env_steps=4096"]
    sets += [
        "eval.interval_env_steps=4096",
        f"tournament.hparam_space={space}",
        f"tournament.initial_hparams={initial}",
    ]
    r = run_mpi(3, *train_args(run, *sets))
    assert r.returncode == 0, r.stderr
    for k in range(3):
        first = read_records(read_log(run / "logs" / f"quickstart_rank{k}.h5")["tournament"])[0]
        if initial == "job" or k == 0:
            assert first.round == 0 and first.old_hparams["learning_rate"] == pytest.approx(1e-3)
        else:
            draw = prior_draw({"learning_rate": [1.0e-5, 1.0e-2, True]}, k)  # seed 0 + pod index
            assert (first.round, first.action) == (-1, "draw")
            assert first.new_hparams["learning_rate"] == pytest.approx(draw["learning_rate"])
            assert f"pod {k}" in r.stderr and "starts from its draw from the prior" in r.stderr


def test_ranks_resume_in_the_same_round_after_a_torn_post_round_checkpoint(tmp_path):
    """A hard kill after a round, between the ranks' post-round checkpoints: the rank that had
    written its own goes back to its .prev (the last state of the round the other still holds)."""
    run = tmp_path / "run"
    sets = ("total_env_steps=40960", "tournament.interval_env_steps=20480", "eval.interval_env_steps=20480")
    r = run_mpi(2, *train_args(run, *sets), "--stop-after-updates", "6")  # 4,096 steps an update: past round 0
    assert r.returncode == 75, r.stderr
    ck = run / "checkpoints"
    from podracer_hpc.files import safeio

    meta = lambda p: safeio.load(p, "pod-state")[1]  # noqa: E731
    assert [meta(ck / "rank1.safetensors")[k] for k in ("round", "updates")] == [1, 6]
    assert meta(ck / "rank1.prev")["round"] == 0  # .prev keeps the last state of round 0
    (ck / "rank0.prev").replace(ck / "rank0.safetensors")  # rank 0 "was killed" before its post-round checkpoint
    r = run_mpi(2, *train_args(run, *sets))
    assert r.returncode == 0, r.stderr
    assert "rank 1: checkpoint in round 1, past the round the other ranks reached; resuming from its .prev" in r.stderr
    assert (ck / "rank1.safetensors.ahead").exists()
    for k in range(2):
        log = read_log(run / "logs" / f"quickstart_rank{k}.h5")
        assert list(log["train"]["update"]) == list(range(1, 11))
        assert [x for x in log["tournament"]["round"]] == [0, 1]


def test_a_mixed_pool_of_ppo_and_sac_pods_under_mpiexec(tmp_path):
    """jobs/pendulum_mixed.yaml (ranks 0, 2 PPO; 1, 3 SAC) under a real mpiexec: it finishes, the
    leaderboard holds entries of both kinds, and every agent a pod took came from a pod of its own
    learner (the entry ids name the publishing rank); status and the logs name each pod's learner."""
    from podracer_hpc.files.records import read_records
    from podracer_hpc.tools.status import render

    run = tmp_path / "run"
    r = run_mpi(
        4,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/pendulum_mixed.yaml",
        "--run-dir",
        str(run),
        "--quiet",
        "--set",
        "total_env_steps=16384",
        "--set",
        "tournament.interval_env_steps=4096",
        "--set",
        "eval.interval_env_steps=4096",
        "--set",
        "eval.final_episodes=20",
        "--set",
        "threads=1",
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["algos"] == ["ppo", "sac", "ppo", "sac"] and summary["rounds"] == 4
    algo = {rank: a for rank, a in enumerate(summary["algos"])}
    entries = Leaderboard(run / "leaderboard").list()
    assert {e.meta["algo"] for e in entries} == {"ppo", "sac"}
    assert all(e.meta["algo"] == algo[e.pod] and e.meta["kind"].startswith(algo[e.pod]) for e in entries)
    taken = 0
    for rank in range(4):
        log = read_log(run / "logs" / f"pendulum_mixed_rank{rank}.h5")
        assert log["attrs"]["config"]["agent"]["algo"] == algo[rank]
        for rec in read_records(log["tournament"]):
            assert rec.algo == algo[rank]
            if rec.action in ("copy_pod", "load_entry"):
                taken += 1
                assert algo[rec.source.pod] == algo[rank], (rank, rec)
        assert "does not fit" not in r.stderr  # no incompatible agent was ever offered
    assert taken >= 1  # the rule did take agents (within each kind)
    text = render(run)
    assert "algo" in text and " sac " in text and " ppo " in text


def test_pods_with_batches_of_their_own_meet_at_the_same_rounds(tmp_path):
    """Ranks 0, 2 step 4,096 env steps an update, ranks 1, 3 1,536 (population: env.num_envs). With a
    budget of 23,000 the first reach 24,576 (past the round point 24,576), the others stop at
    23,040: a round beyond the budget is held by nobody (it used to be held by the first pair
    only, and the run failed: 'ranks reached different points of the schedule'). Every pod of a
    round is scored on the start states of the periodic evaluation at the round's point, whatever
    its batch: the states an independent pod of the run meets there."""
    run = tmp_path / "run"
    r = run_mpi(
        4,
        *train_args(
            run,
            "total_env_steps=23000",
            "tournament.interval_env_steps=8192",
            "eval.interval_env_steps=8192",
            "eval.final_episodes=4",
            "threads=1",
            "population=[{}, {env.num_envs: 96}]",
        ),
    )
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["rounds"] == 2 and summary["env_steps"] == 2 * 24576 + 2 * 23040
    for rank in range(4):
        log = read_log(run / "logs" / f"quickstart_rank{rank}.h5")
        t, seed = log["tournament"], log["attrs"]["config"]["seed"]
        assert list(t["round"]) == [0, 1] and log_envs(run, rank) == (256 if rank % 2 == 0 else 96)
        assert list(t["eval_seed"]) == [eval_seed(seed, "eval", 8192), eval_seed(seed, "eval", 16384)]


def log_envs(run: Path, rank: int) -> int:
    return read_log(run / "logs" / f"quickstart_rank{rank}.h5")["attrs"]["config"]["env"]["num_envs"]


def test_a_dexpbt_pod_that_changed_is_left_alone_for_ready_rounds(tmp_path):
    """DexPBT under mpiexec: a pod that copied a leader or mutated its own values at round r
    changes nothing at rounds r+1 .. r+ready_rounds-1 (the change is carried from round to round,
    not only decided on paper); at least one pod changes, so the check is not vacuous."""
    from podracer_hpc.files.records import read_records

    ready = 3
    run = tmp_path / "run"
    sets = [
        "total_env_steps=24576",
        "env.num_envs=64",
        "eval.interval_env_steps=2048",
        "eval.episodes=4",
        "tournament.mode=dexpbt",
        "tournament.interval_env_steps=2048",
        f"tournament.ready_rounds={ready}",
        "tournament.hparam_space={learning_rate: [1.0e-5, 1.0e-2, true]}",
    ]
    r = run_mpi(4, *train_args(run, *sets))
    assert r.returncode == 0, r.stderr
    changes = 0
    for k in range(4):
        rows = [
            x for x in read_records(read_log(run / "logs" / f"quickstart_rank{k}.h5")["tournament"]) if x.round >= 0
        ]
        changed = [x.round for x in rows if x.action == "copy_pod" or x.new_hparams != x.old_hparams]
        changes += len(changed)
        for a, b in zip(changed, changed[1:]):
            assert b - a >= ready, (k, changed)
        assert not changed or changed[0] >= ready - 1, (k, changed)  # the start counts as round -1
    assert changes > 0, "no pod changed: the run did not exercise the rule"
