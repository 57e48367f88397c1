"""Tournament rules: pure, deterministic decisions from the fitness table."""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from podracer_hpc.config import HParamRange, TournamentConfig
from podracer_hpc.pool.hparams import explore
from podracer_hpc.pool.rules import (
    ACTION_CODES,
    Decision,
    PodReport,
    decide,
    dexpbt_cuts,
    dexpbt_select,
    elegantrl_select,
    make_rng,
    pbt_select,
    quantile_size,
    softmax_zscore,
)

NAN = float("nan")
SPACE = {"lr": (1e-5, 1e-2, True), "ent_coef": (0.0, 0.1, False), "gamma": (0.9, 0.999, False)}
HP = {"lr": 3e-4, "ent_coef": 0.01, "gamma": 0.99, "clip": 0.2}


def reports(fitness, steps=1000, hparams=None):
    steps = steps if isinstance(steps, (list, tuple)) else [steps] * len(fitness)
    return [
        PodReport(rank=r, fitness=f, env_steps=s, hparams=dict(hparams[r] if hparams else {**HP, "lr": 1e-4 * (r + 1)}))
        for r, (f, s) in enumerate(zip(fitness, steps))
    ]


def as_json(decisions: list[Decision]) -> str:
    return json.dumps([d.to_dict() for d in decisions], sort_keys=True)


def cfg(mode, **kw):
    return TournamentConfig(mode=mode, hparam_space=SPACE, **kw)


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "n, q, k",
    [
        (0, 0.25, 0),
        (1, 0.25, 0),
        (2, 0.25, 1),
        (3, 0.25, 1),
        (4, 0.25, 1),
        (5, 0.25, 2),
        (8, 0.25, 2),
        (9, 0.25, 3),
        (16, 0.25, 4),
        (64, 0.25, 16),
        (10, 0.1, 1),
        (3, 0.5, 1),
        (10, 0.5, 5),
        (7, 0.0, 0),
    ],
)
def test_quantile_size(n, q, k):
    assert quantile_size(n, q) == k
    assert 2 * quantile_size(n, q) <= n  # top and bottom never overlap


def test_softmax_zscore_properties():
    p = softmax_zscore([1.0, 2.0, 3.0])
    assert p.sum() == pytest.approx(1.0) and p[0] < p[1] < p[2]
    np.testing.assert_allclose(softmax_zscore([5.0, 5.0, 5.0]), [1 / 3] * 3)
    np.testing.assert_allclose(softmax_zscore([1.0, 9.0], temperature=math.inf), [0.5, 0.5])
    # z-scoring: invariant to shifting and scaling the scores
    np.testing.assert_allclose(softmax_zscore([1.0, 2.0, 4.0]), softmax_zscore([1000.0, 2000.0, 4000.0]))
    # a higher temperature is flatter
    assert softmax_zscore([1.0, 2.0, 3.0], 5.0).max() < p.max()
    with pytest.raises(ValueError):
        softmax_zscore([1.0, NAN])
    with pytest.raises(ValueError):
        softmax_zscore([])


def test_make_rng_is_deterministic_and_distinct():
    a = make_rng(1, 2, 3, 1).random(4)
    np.testing.assert_array_equal(a, make_rng(1, 2, 3, 1).random(4))
    for other in [(1, 2, 4, 1), (1, 3, 3, 1), (2, 2, 3, 1), (1, 2, 3, 2)]:
        assert not np.array_equal(a, make_rng(*other).random(4))
    with pytest.raises(ValueError):
        make_rng(-1, 0, 0, 1)


# --------------------------------------------------------------------------- elegantrl


def test_elegantrl_replaces_only_with_a_better_entry():
    entries = [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    for rnd in range(50):
        ds = elegantrl_select([5.0, 3.0, 2.5], entries, round=rnd, seed=0, include_pods=False)
        assert ds[0].action == "keep"  # nothing beats 5
        assert ds[1].action == "keep"  # an equal score (c) is not better
        d = ds[2]
        assert d.action == "keep" or (d.action == "load_entry" and d.source_entry == "c" and d.source_score == 3.0)
        for d in ds:
            if d.action == "load_entry":
                assert d.source_score > d.fitness


def test_elegantrl_single_better_entry_is_always_taken():
    ds = elegantrl_select([0.0, -1.0], [("best", 10.0)], round=0, seed=0, include_pods=False)
    assert [(d.action, d.source_entry) for d in ds] == [("load_entry", "best")] * 2


def test_elegantrl_pods_are_candidates_and_publish():
    fitness = [1.0, 4.0, 2.0, 3.0]
    for rnd in range(30):
        ds = elegantrl_select(fitness, [], round=rnd, seed=7, top_k=2)
        assert [d.publish for d in ds] == [False, True, False, True]  # the top-2 pods publish
        assert ds[1].action == "keep"  # the best pod never finds a better candidate
        for d in ds:
            if d.action == "copy_pod":
                assert d.source_rank in (1, 3) and fitness[d.source_rank] > d.fitness
            assert d.action in ("keep", "copy_pod")


def test_elegantrl_top_k_cuts_the_pool():
    entries = [(f"e{i}", float(i)) for i in range(10)]
    seen = set()
    for rnd in range(200):
        ds = elegantrl_select([-1.0], entries, round=rnd, seed=3, top_k=3, include_pods=False)
        seen.add(ds[0].source_entry)
    assert seen == {"e9", "e8", "e7"}


def test_elegantrl_softmax_sampling_statistics():
    scores = [1.0, 2.0, 3.0, 4.0, 10.0]
    entries = [(f"e{i}", s) for i, s in enumerate(scores)]
    n_rounds = 3000
    counts = Counter(
        elegantrl_select([-100.0], entries, round=rnd, seed=11, include_pods=False)[0].source_entry
        for rnd in range(n_rounds)
    )
    assert counts.most_common(1)[0][0] == "e4"  # the best entry is drawn most
    p = softmax_zscore(scores)
    for i in range(len(scores)):
        freq = counts[f"e{i}"] / n_rounds
        assert abs(freq - p[i]) < 4 * math.sqrt(p[i] * (1 - p[i]) / n_rounds) + 1e-3
    # a high temperature spreads the draws
    hot = Counter(
        elegantrl_select([-100.0], entries, round=rnd, seed=11, temperature=100.0, include_pods=False)[0].source_entry
        for rnd in range(600)
    )
    assert min(hot.values()) > 80


def test_elegantrl_nan_pods_are_replaced_and_never_sources():
    fitness = [NAN, 1.0, NAN, 2.0, float("inf")]
    for rnd in range(40):
        ds = elegantrl_select(fitness, [("old", 0.5)], round=rnd, seed=1)
        for r in (0, 2, 4):
            assert ds[r].action in ("copy_pod", "load_entry") and not ds[r].publish
        for d in ds:
            assert d.source_rank not in (0, 2, 4)


def test_elegantrl_all_nan_without_entries_resets_and_ties_are_by_rank():
    ds = elegantrl_select([NAN, NAN], [], round=0, seed=0)
    assert [d.action for d in ds] == ["reset", "reset"]
    # equal scores: pods before entries, pods by rank, entries by id
    ds = elegantrl_select([1.0, 1.0, 1.0], [("b", 1.0), ("a", 1.0)], round=0, seed=0, top_k=2)
    assert [d.publish for d in ds] == [True, True, False]
    assert all(d.action == "keep" for d in ds)  # nobody is strictly better
    ds = elegantrl_select([0.0], [("b", 1.0), ("a", 1.0)], round=0, seed=0, top_k=1, include_pods=False)
    assert ds[0].source_entry == "a"


def test_elegantrl_world_of_one():
    ds = elegantrl_select([1.0], [], round=0, seed=0)
    assert ds[0].action == "keep" and ds[0].publish
    actions = {elegantrl_select([1.0], [("better", 5.0)], round=rnd, seed=0)[0].action for rnd in range(60)}
    assert actions == {"keep", "load_entry"}  # keeps when it draws itself, loads when it draws the entry


def test_elegantrl_ignores_nan_entries_and_duplicates():
    ds = elegantrl_select([0.0], [("bad", NAN), ("good", 1.0), ("good", 1.0)], round=0, seed=0, include_pods=False)
    assert ds[0].source_entry == "good"


@pytest.mark.parametrize(
    "entry_steps, tolerance, loadable",
    [
        (100_000, 0.25, False),  # trained 100k, pod at 150k: 100k < 150k x 0.75, stale
        (112_500, 0.25, True),  # exactly at the limit
        (150_000, 0.25, True),  # as old as the pod
        (100_000, 1.0, True),  # tolerance 1: any age
        (None, 0.25, True),  # unknown steps count as fresh
        (100_000, None, True),  # rule off
    ],
)
def test_elegantrl_freshness_a_pod_never_goes_back_in_time(entry_steps, tolerance, loadable):
    entry = ("e", 50.0) if entry_steps is None else ("e", 50.0, entry_steps)
    actions = {
        elegantrl_select(
            [1.0], [entry], round=rnd, seed=0, include_pods=False, env_steps=[150_000], steps_tolerance=tolerance
        )[0].action
        for rnd in range(20)
    }
    assert actions == ({"load_entry"} if loadable else {"keep"})


def test_elegantrl_stale_entries_leave_the_pool_before_the_top_k_cut():
    stale = [("s1", 90.0, 50_000), ("s2", 80.0, 50_000)]
    ds = elegantrl_select(
        [1.0, 2.0], stale, round=0, seed=0, top_k=2, env_steps=[100_000, 100_000], steps_tolerance=0.25
    )
    assert [d.publish for d in ds] == [True, True]  # both pods hold the pool, not the stale entries
    assert all(d.source_entry is None for d in ds)
    # without the rule the stale entries take both slots and are drawn
    ds = elegantrl_select([1.0, 2.0], stale, round=0, seed=0, top_k=2)
    assert [d.publish for d in ds] == [False, False] and all(d.action == "load_entry" for d in ds)


def test_elegantrl_freshness_is_per_pod():
    # a late joiner (20k steps) may load a 60k entry that is stale for the 100k pod
    entries = [("mid", 9.0, 60_000)]
    for rnd in range(10):
        ds = elegantrl_select(
            [1.0, 1.0],
            entries,
            round=rnd,
            seed=3,
            include_pods=False,
            env_steps=[100_000, 20_000],
            steps_tolerance=0.25,
        )
        assert ds[0].action == "keep" and ds[1].action == "load_entry"


def test_decide_elegantrl_applies_the_freshness_rule():
    cfg = TournamentConfig(mode="elegantrl", top_k=4, steps_tolerance=0.25)
    rs = reports([1.0, 2.0], steps=100_000)
    old = {d.source_entry for rnd in range(20) for d in decide(rs, [("old", 99.0, 40_000)], rnd, 0, cfg)}
    new = {d.source_entry for rnd in range(20) for d in decide(rs, [("new", 99.0, 100_000)], rnd, 0, cfg)}
    assert "old" not in old and "new" in new


# --------------------------------------------------------------------------- pbt


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 33])
def test_pbt_truncation_sizes_and_sources(n):
    fitness = [float(r) for r in range(n)]  # rank r has fitness r
    k = quantile_size(n, 0.25)
    ds = pbt_select(reports(fitness), round=1, seed=5, space=SPACE)
    copied = [d for d in ds if d.action == "copy_pod"]
    assert sorted(d.rank for d in copied) == list(range(k))  # the bottom k
    assert all(d.source_rank in range(n - k, n) for d in copied)  # from the top k
    assert all(d.action == "keep" and d.new_hparams is None for d in ds if d.rank >= k)
    drawn = {d.source_rank for d in copied}
    assert {d.rank for d in ds if d.publish} >= drawn


def test_pbt_copies_source_hparams_and_perturbs_within_bounds():
    n = 8
    hps = [{**HP, "lr": 1e-3, "gamma": 0.999, "ent_coef": 0.0} for _ in range(n)]
    ds = pbt_select(reports(list(range(n)), hparams=hps), round=3, seed=9, space=SPACE, resample_prob=0.0)
    for d in ds:
        if d.action != "copy_pod":
            continue
        src = hps[d.source_rank]
        assert d.old_hparams == hps[d.rank]
        assert d.new_hparams["clip"] == src["clip"]  # outside the space: copied unchanged
        assert d.new_hparams["lr"] in (pytest.approx(0.8e-3), pytest.approx(1.2e-3))
        assert d.new_hparams["gamma"] in (0.9, 0.999)  # x0.8 and x1.2 are both clipped
        assert d.new_hparams["ent_coef"] == 0.0
        for name, (lo, hi, _) in SPACE.items():
            assert lo <= d.new_hparams[name] <= hi


@pytest.mark.parametrize(
    "fitness, expected",
    [
        ([1.0, 1.0, 1.0, 1.0], {}),  # all tied: nobody is strictly better, nobody copies
        ([1.0, 1.0, 1.0, 0.0], {3: 0}),  # top tie broken by rank
        ([0.0, 0.0, 5.0, 5.0], {1: 2}),  # bottom tie: the higher rank is last
        ([3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0], {6: None, 7: None}),
    ],
)
def test_pbt_ties_by_rank(fitness, expected):
    ds = pbt_select(reports(fitness), round=0, seed=0, space=SPACE)
    got = {d.rank: d.source_rank for d in ds if d.action == "copy_pod"}
    assert set(got) == set(expected)
    for r, s in expected.items():
        if s is not None:
            assert got[r] == s
        else:
            assert got[r] in (0, 1)


def test_pbt_nan_is_always_replaced_never_copied():
    fitness = [NAN, 5.0, 4.0, NAN, 3.0, 2.0, 1.0, 0.0]
    for rnd in range(20):
        ds = pbt_select(reports(fitness), round=rnd, seed=2, space=SPACE)
        for r in (0, 3):  # NaN pods, even in the middle of the ranking by rank
            assert ds[r].action == "copy_pod" and ds[r].source_rank in (1, 2) and not ds[r].publish
        assert all(d.source_rank not in (0, 3) for d in ds)


def test_pbt_nan_with_more_experience_still_replaced_by_best():
    fitness = [NAN, 1.0, 2.0, 0.5]
    ds = pbt_select(reports(fitness, steps=[10_000, 100, 100, 100]), round=0, seed=0, space=SPACE)
    assert ds[0].action == "copy_pod" and ds[0].source_rank == 2


def test_pbt_all_nan_and_world_of_one():
    ds = pbt_select(reports([NAN, NAN]), round=0, seed=0, space=SPACE, entries=[("e1", 1.0), ("e2", 3.0)])
    assert [(d.action, d.source_entry) for d in ds] == [("load_entry", "e2")] * 2
    assert [d.action for d in pbt_select(reports([NAN, NAN]), round=0, seed=0, space=SPACE)] == ["reset"] * 2
    (d,) = pbt_select(reports([1.0]), round=0, seed=0, space=SPACE)
    assert d.action == "keep" and d.new_hparams is None
    (d,) = pbt_select(reports([NAN]), round=0, seed=0, space=SPACE)
    assert d.action == "reset"


@pytest.mark.parametrize(
    "source_steps, target_steps, copies",
    [
        (1000, 1000, True),  # equal experience
        (800, 1000, True),  # within the 25% tolerance
        (700, 1000, False),  # the source is much less trained: not comparable
        (100_000, 1000, True),  # a late joiner may copy from an old pod
    ],
)
def test_pbt_experience_comparability(source_steps, target_steps, copies):
    ds = pbt_select(reports([5.0, 0.0], steps=[source_steps, target_steps]), round=0, seed=0, space=SPACE)
    assert (ds[1].action == "copy_pod") == copies
    if not copies:
        assert ds[1].action == "keep" and "experience" in ds[1].reason


def test_pbt_publishes_top_k_candidates():
    ds = pbt_select(reports([1.0, 4.0, 2.0, 3.0]), round=0, seed=0, space=SPACE, entries=[("e", 3.5)], top_k=2)
    assert {d.rank for d in ds if d.publish} == {1}  # in the top 2 (with e), and pod 0's source
    ds = pbt_select(reports([1.0, 4.0, 2.0, 3.0]), round=0, seed=0, space=SPACE, entries=[("e", 3.5)], top_k=3)
    assert {d.rank for d in ds if d.publish} == {1, 3}


# --------------------------------------------------------------------------- decide / determinism


@pytest.mark.parametrize("mode", ["elegantrl", "pbt", "dexpbt", "none"])
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
def test_every_rank_computes_the_same_decisions(mode, n):
    rng = random.Random(n)
    fitness = [NAN if rng.random() < 0.15 else round(rng.uniform(-10, 10), 1) for _ in range(n)]
    steps = [rng.choice([1000, 1000, 1200, 500]) for _ in range(n)]
    table = reports(fitness, steps)
    entries = [("j1-0-3-0123456789ab", 4.0), ("j1-1-3-0123456789ac", NAN), ("j2-0-1-0123456789ad", -2.0)]
    c = cfg(mode)
    reference = as_json(decide(table, entries, round=4, seed=42, cfg=c))
    for _rank in range(n):  # each rank gets the table in rank order (allgather) and the same entries
        assert as_json(decide(list(table), list(entries), round=4, seed=42, cfg=c)) == reference
    shuffled = table[:]
    rng.shuffle(shuffled)
    assert as_json(decide(shuffled, entries[::-1], round=4, seed=42, cfg=c)) == reference
    ds = json.loads(reference)
    assert [d["rank"] for d in ds] == list(range(n))
    for d in ds:
        if not math.isfinite(d["fitness"]) and mode != "none":
            assert d["action"] != "keep" and not d["publish"]


def test_rounds_and_seeds_change_draws():
    table = reports([float(r) for r in range(8)])
    outs = {as_json(decide(table, [], round=rnd, seed=s, cfg=cfg("pbt"))) for rnd in range(4) for s in range(2)}
    assert len(outs) > 1


def test_mode_none_keeps_everyone():
    ds = decide(reports([NAN, 1.0]), [("e", 9.0)], round=0, seed=0, cfg=TournamentConfig(mode="none"))
    assert [(d.action, d.publish) for d in ds] == [("keep", False)] * 2


def test_decide_rejects_incomplete_tables():
    with pytest.raises(ValueError, match="ranks 0..n-1"):
        decide([PodReport(rank=1, fitness=0.0, env_steps=0)], [], round=0, seed=0, cfg=cfg("pbt"))


def test_decision_record():
    d = decide(reports([0.0, 1.0]), [], round=3, seed=0, cfg=cfg("pbt"))[0]
    assert d.action == "copy_pod" and d.replaces and d.action_code == ACTION_CODES["copy_pod"]
    json.dumps(d.to_dict())


# --------------------------------------------------------------------------- config


def test_config_normalizes_yaml_space_and_validates():
    c = TournamentConfig(
        mode="pbt",
        perturb_factors=[0.8, 1.2],
        hparam_space={"lr": [1e-5, 1e-2, True], "clip": {"low": 0.1, "high": 0.3}, "g": [0.9, 0.99]},
    )
    assert c.hparam_space["lr"] == HParamRange(1e-5, 1e-2, True)
    assert c.hparam_space["clip"] == HParamRange(0.1, 0.3, False)
    assert c.hparam_space["g"].log_scale is False and c.perturb_factors == (0.8, 1.2)
    bad = [
        dict(mode="tournament"),
        dict(top_k=0),
        dict(temperature=0.0),
        dict(quantile=0.7),
        dict(resample_prob=1.5),
        dict(perturb_factors=()),
        dict(steps_tolerance=-0.1),
        dict(hparam_space={"lr": (1e-2, 1e-5, True)}),
        dict(hparam_space={"lr": (0.0, 1.0, True)}),
        dict(interval_env_steps=0),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            TournamentConfig(**kw)


@pytest.mark.parametrize(
    "interval, warmup, expected",
    [
        (50, 0, [50, 100, 150]),  # no warm-up: every interval
        (50, 100, [100, 150, 200]),  # first round after the warm-up, then every interval
        (50, 120, [120, 170, 220]),
        (50, 30, [50, 100, 150]),  # a warm-up shorter than the interval changes nothing
    ],
)
def test_round_env_steps_schedule(interval, warmup, expected):
    from podracer_hpc.pool.rules import round_env_steps

    cfg = TournamentConfig(mode="elegantrl", interval_env_steps=interval, warmup_env_steps=warmup)
    assert [round_env_steps(cfg, k) for k in range(3)] == expected


def test_negative_warmup_is_refused():
    with pytest.raises(ValueError, match="warmup_env_steps must be >= 0"):
        TournamentConfig(mode="elegantrl", warmup_env_steps=-1)


# ----------------------------------------------------------------------------- PBT defaults and "ready"


def test_pbt_with_an_empty_space_explores_the_default_ppo_space():
    from podracer_hpc.pool.hparams import DEFAULT_PBT_SPACE, describe_space, effective_space

    cfg = TournamentConfig(mode="pbt", quantile=0.5, resample_prob=1.0)
    assert effective_space(cfg) == DEFAULT_PBT_SPACE
    assert set(DEFAULT_PBT_SPACE) == {"learning_rate", "ent_coef", "clip_coef", "gae_lambda"}
    assert "learning_rate [1e-05, 0.01] log" in describe_space(DEFAULT_PBT_SPACE)
    hp = {"learning_rate": 3e-6, "ent_coef": 0.0, "clip_coef": 0.2, "gae_lambda": 0.95}
    ds = decide(
        [PodReport(0, -1000.0, 1000, hp), PodReport(1, -100.0, 1000, hp)], [], 3, 0, cfg
    )  # round 3: past the start's ready_rounds
    new = ds[0].new_hparams
    assert ds[0].action == "copy_pod" and set(new) == set(DEFAULT_PBT_SPACE)
    for k, r in DEFAULT_PBT_SPACE.items():
        assert r.low <= new[k] <= r.high
    assert new != hp  # resampled: PBT explores without a declared space
    assert effective_space(TournamentConfig(mode="elegantrl")) == {}  # the ElegantRL rule keeps hyperparameters
    declared = TournamentConfig(mode="pbt", hparam_space={"learning_rate": [1e-4, 1e-3, True]})
    assert list(effective_space(declared)) == ["learning_rate"]


@pytest.mark.parametrize(
    "last_copy,round,ready,replaced",
    [
        (-1, 5, 2, True),  # never copied, long after the start: ready
        (4, 5, 2, False),  # copied at the last round: protected
        (3, 5, 2, True),  # two rounds ago: ready again
        (4, 5, 0, True),  # ready_rounds 0: the old behaviour
    ],
)
def test_pbt_ready_criterion_protects_a_freshly_explored_pod(last_copy, round, ready, replaced):
    cfg = TournamentConfig(
        mode="pbt", quantile=0.25, ready_rounds=ready, hparam_space={"learning_rate": [1e-5, 1e-2, True]}
    )
    hp = {"learning_rate": 1e-3}
    pods = [
        PodReport(0, -900.0, 1000, hp, last_copy),
        PodReport(1, -100.0, 1000, hp),
        PodReport(2, -200.0, 1000, hp),
        PodReport(3, -300.0, 1000, hp),
    ]
    ds = decide(pods, [], round, 0, cfg)
    assert (ds[0].action == "copy_pod") == replaced, ds[0]
    if not replaced:  # the next worst ready pod outside the top quantile is replaced in its place
        assert "not ready" in ds[0].reason
        assert ds[3].action == "copy_pod" and ds[3].source_rank == 1
    assert sum(d.action == "copy_pod" for d in ds) == 1


@pytest.mark.parametrize(("round", "copies"), [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_no_pod_is_ready_before_it_trained_ready_rounds_intervals_from_the_start(round, copies):
    """The start counts as round -1: with ready_rounds 3 the first replacement is at round 2 (after
    intervals 0, 1 and 2), however far apart the first evaluations are."""
    cfg = TournamentConfig(mode="pbt", ready_rounds=3, hparam_space={"learning_rate": [1e-5, 1e-2, True]})
    pods = [PodReport(r, f, 1000, {"learning_rate": 1e-3}) for r, f in enumerate([-1300.0, -100.0, -200.0, -300.0])]
    ds = decide(pods, [], round, 0, cfg)
    assert sum(d.action == "copy_pod" for d in ds) == copies
    if not copies:
        assert ds[0].action == "keep" and "not ready (started at round -1)" in ds[0].reason


@pytest.mark.parametrize(
    "mode,reserve,fitness,replaced",
    [
        ("pbt", 0, (-900, -100, -200, -300), {0}),  # no reserve: the worst pod copies
        ("pbt", 1, (-900, -100, -200, -300), {3}),  # pod 0 kept; the next worst outside the top instead
        ("pbt", 2, (-100, -900, -200, -300), {3}),  # the worst pod is rank 1, in a reserve of 2
        ("pbt", 4, (-900, -100, -200, -300), set()),  # every pod reserved: independent pods
        ("dexpbt", 0, (-900, -100, -200, -300), {0}),
        ("dexpbt", 1, (-900, -100, -200, -300), set()),  # dexpbt: only the underperformer acts, and it is reserved
    ],
)
def test_a_pod_in_the_reserve_is_never_replaced(mode, reserve, fitness, replaced):
    cfg = TournamentConfig(
        mode=mode, quantile=0.25, ready_rounds=0, reserve=reserve, hparam_space={"learning_rate": [1e-5, 1e-2, True]}
    )
    pods = [PodReport(r, float(f), 1000, {"learning_rate": 1e-3}) for r, f in enumerate(fitness)]
    ds = decide(pods, [], 5, 0, cfg)
    assert {d.rank for d in ds if d.replaces or d.new_hparams is not None} == replaced, ds
    worst = min(range(4), key=lambda r: fitness[r])
    if worst < reserve:
        assert ds[worst].action == "keep" and ds[worst].new_hparams is None
        assert "reserve: never replaced" in ds[worst].reason
    best = max(range(4), key=lambda r: fitness[r])
    assert all(ds[r].source_rank == best for r in replaced)  # a reserved pod still serves as a source


def test_the_reserve_counts_mpi_ranks_and_spares_no_nan_pod():
    """rng_ranks name the pods' MPI ranks (a later job's offset, an async pod deciding alone): the
    reserve is over those, and a pod whose fitness is NaN is replaced even inside it."""
    cfg = TournamentConfig(mode="pbt", ready_rounds=0, reserve=2, hparam_space={"learning_rate": [1e-5, 1e-2, True]})
    pods = [PodReport(r, f, 1000, {"learning_rate": 1e-3}) for r, f in enumerate([-900.0, -100.0, -200.0, -300.0])]
    assert decide(pods, [], 5, 0, cfg)[0].action == "keep"
    assert decide(pods, [], 5, 0, cfg, rng_ranks=[8, 9, 10, 11])[0].action == "copy_pod"  # a later job's pods
    alone = [replace(pods[0], rank=0), PodReport(1, -100.0, 1000, {"learning_rate": 1e-3})]
    assert decide(alone, [], 5, 0, cfg, rng_ranks=[1, 10_000])[0].action == "keep"  # pod 1 deciding alone
    nan = [replace(pods[0], fitness=float("nan"))] + pods[1:]
    assert decide(nan, [], 5, 0, cfg)[0].action == "copy_pod"
    with pytest.raises(ValueError, match="tournament.reserve must be >= 0"):
        TournamentConfig(mode="pbt", reserve=-1)


def test_a_nan_pod_is_replaced_even_when_not_ready():
    cfg = TournamentConfig(mode="pbt", ready_rounds=5, hparam_space={"learning_rate": [1e-5, 1e-2, True]})
    pods = [
        PodReport(0, float("nan"), 1000, {"learning_rate": 1e-3}, 9),
        PodReport(1, -1.0, 1000, {"learning_rate": 1e-3}),
    ]
    assert decide(pods, [], 10, 0, cfg)[0].action == "copy_pod"


def test_explore_resamples_a_value_outside_its_range_instead_of_pinning_it_to_the_bound():
    from podracer_hpc.pool.rules import make_rng

    space = {"learning_rate": (1e-5, 1e-2, True)}
    lrs = [
        explore({"learning_rate": 3e-6}, space, make_rng(0, r, 0, 2), resample_prob=0.0)["learning_rate"]
        for r in range(50)
    ]
    assert all(1e-5 <= x <= 1e-2 for x in lrs)
    assert len(set(lrs)) == 50 and max(lrs) > 1e-3  # drawn from the prior, not 3e-6 x 1.2 clipped to 1e-5
    inside = explore({"learning_rate": 1e-3}, space, make_rng(0, 0, 0, 2), resample_prob=0.0)["learning_rate"]
    assert inside in (pytest.approx(8e-4), pytest.approx(1.2e-3))  # inside the range: perturbed as before


@pytest.mark.parametrize(
    "rate, floor, expect",
    [
        (5e5, 60.0, 300),  # an H200 pod at 500k env steps/s, 100k interval: a round every 60 s, not every 0.2 s
        (2e4, 60.0, 12),  # a CPU pod at 20k/s
        (1e3, 60.0, 1),  # slower than one interval a minute: every interval
        (5e5, 0.0, 1),  # no floor: every interval (the CPU default)
        (float("nan"), 60.0, 1),
        (0.0, 60.0, 1),
    ],
)
def test_intervals_to_next_round_keep_a_time_floor_on_the_interval_grid(rate, floor, expect):
    from podracer_hpc.pool.rules import intervals_to_next_round

    cfg = TournamentConfig(mode="elegantrl", interval_env_steps=100_000)
    assert intervals_to_next_round(cfg, rate, floor) == expect


@pytest.mark.parametrize("n, passing", [(10, {0, 2, 4, 6, 8}), (100, {37}), (40, set(range(40))), (5, set())])
def test_draw_eligible_is_uniform_over_the_passing_items(n, passing):
    """PBT draws a target's source by rejection, then from the list: uniform over the eligible
    sources either way (so a pool's round is linear in the pool), None when none is eligible."""
    import numpy as np

    from podracer_hpc.pool.hparams import draw_eligible

    rng = np.random.default_rng(0)
    draws = [draw_eligible(rng, list(range(n)), lambda x: x in passing) for _ in range(4000)]
    if not passing:
        assert set(draws) == {None}
        return
    assert set(draws) == passing
    counts = np.array([draws.count(x) for x in sorted(passing)])
    expected = 4000 / len(passing)
    assert ((counts - expected) ** 2 / expected).sum() < 3 * len(passing) + 10  # chi-square, generous


# --------------------------------------------------------------------------- dexpbt


@pytest.mark.parametrize(
    "fitness, k, a, leaders, under",
    [
        ([0.0, 10.0], 0.1, 0.0, {1}, {0}),  # m 5, s 5: cuts 4.5 / 5.5
        ([1.0, 2.0, 3.0, 4.0], 1.0, 0.0, {3}, {0}),  # m 2.5, s 1.118: cuts 1.38 / 3.62
        ([1.0, 2.0, 3.0, 4.0], 2.0, 0.0, set(), set()),  # nobody beyond 2 std
        ([5.0, 5.0, 5.0], 0.1, 0.0, set(), set()),  # no spread: nobody acts
        ([0.0, 0.0, 0.0, -10.0], 0.1, 0.0, {0, 1, 2}, {3}),
        ([0.0, 0.0, 0.0, -10.0], 0.1, 5.0, set(), {3}),  # the absolute cut keeps the zeros from leading
        ([0.0, 0.0, 0.0, -10.0], 0.1, 20.0, set(), set()),
        ([NAN, 1.0, 3.0], 0.5, 0.0, {2}, {0, 1}),  # NaN: always acted on; stats over the finite pods
        ([7.0], 0.1, 0.0, set(), set()),  # a world of one
    ],
)
def test_dexpbt_only_pods_beyond_the_cuts_act(fitness, k, a, leaders, under):
    upper, lower = dexpbt_cuts(fitness, k, a)
    f = np.asarray([x for x in fitness if math.isfinite(x)])
    assert upper == pytest.approx(max(f.mean() + k * f.std(), f.mean() + a))
    assert lower == pytest.approx(min(f.mean() - k * f.std(), f.mean() - a))
    ds = dexpbt_select(reports(fitness), round=2, seed=7, space=SPACE, threshold_std=k, threshold_abs=a)
    acting = {d.rank for d in ds if d.action != "keep" or d.new_hparams is not None}
    assert acting == under
    for d in ds:
        if d.rank not in under:  # leaders and the middle keep training untouched
            assert d.action == "keep" and d.new_hparams is None
        elif d.action == "copy_pod":
            assert d.source_rank in (leaders or {max(range(len(fitness)), key=lambda r: fitness[r])})
        else:  # no leader: keep the agent, mutate its own hyperparameters
            assert d.action == "keep" and not leaders and d.new_hparams.keys() == d.old_hparams.keys()
    assert {d.rank for d in ds if d.publish} == {d.source_rank for d in ds if d.action == "copy_pod"}


def test_dexpbt_underperformer_copies_a_uniform_leader_and_mutates_its_hyperparameters():
    fitness = [10.0, 10.0, 10.0, 0.0, 5.0, 5.0, 5.0, 5.0]  # m 6.25, s 3.07: leaders 0-2, pod 3 below
    table = reports(fitness)
    drawn = Counter()
    for rnd in range(300):
        ds = dexpbt_select(table, round=rnd, seed=3, space=SPACE, threshold_std=1.0, mutation_rate=0.5)
        assert [d.action for d in ds] == ["keep"] * 3 + ["copy_pod"] + ["keep"] * 4
        d = ds[3]
        drawn[d.source_rank] += 1
        src = table[d.source_rank].hparams
        assert d.new_hparams["clip"] == src["clip"]  # outside the space: copied as it is
        for name, (lo, hi, _) in SPACE.items():
            v, x = d.new_hparams[name], src[name]
            assert lo <= v <= hi
            assert v == x or 1.1 - 1e-9 <= max(v / x, x / v) <= 1.5 + 1e-9 or v in (lo, hi)
    assert set(drawn) == {0, 1, 2} and min(drawn.values()) > 60  # uniform over the leaders


@pytest.mark.parametrize(
    "steps, action",
    [
        ([1000, 1000, 1000], "copy_pod"),
        ([700, 1000, 1000], "keep"),  # the leader has too little experience: mutate own
        ([760, 1000, 1000], "copy_pod"),  # within steps_tolerance 0.25
    ],
)
def test_dexpbt_a_leader_needs_comparable_experience(steps, action):
    d = dexpbt_select(reports([9.0, 5.0, 0.0], steps), round=0, seed=0, space=SPACE, threshold_std=0.5)[2]
    assert d.action == action and d.new_hparams is not None


@pytest.mark.parametrize(
    "fitness, entries, action, source",
    [
        ([NAN, 1.0, 1.0], [], "copy_pod", 1),  # no leader (no spread): the best finite pod, ties by rank
        ([NAN, NAN], [("e1", 3.0), ("e2", 5.0)], "load_entry", "e2"),
        ([NAN, NAN], [("e1", NAN)], "reset", None),
    ],
)
def test_dexpbt_nan_pods_are_always_replaced(fitness, entries, action, source):
    d = dexpbt_select(reports(fitness), round=1, seed=0, space=SPACE, entries=entries)[0]
    assert d.action == action and (d.source_rank if action == "copy_pod" else d.source_entry) == source


@pytest.mark.parametrize(
    "last_change, round, ready, acts",
    [
        (-1, 0, 3, False),  # the start counts as a change: nothing before it trained 3 intervals
        (-1, 1, 3, False),
        (-1, 2, 3, True),
        (4, 6, 3, False),  # copied or mutated at round 4: protected through round 6
        (4, 7, 3, True),
        (-1, 0, 0, True),  # ready_rounds 0: acts at once, as Isaac Lab's rule
    ],
)
@pytest.mark.parametrize("leaders", [True, False])
def test_dexpbt_an_underperformer_acts_only_once_ready(last_change, round, ready, acts, leaders):
    fitness = [9.0, 5.0, 0.0] if leaders else [5.0, 5.0, 0.0]  # without a leader it mutates its own values
    table = [replace(p, last_copy_round=last_change) for p in reports(fitness)]
    d = dexpbt_select(table, round=round, seed=0, space=SPACE, threshold_std=0.5, ready_rounds=ready)[2]
    assert (d.action != "keep" or d.new_hparams is not None) == acts
    if not acts:
        assert d.action == "keep" and d.new_hparams is None and "not ready" in d.reason


def test_dexpbt_a_nan_pod_is_replaced_even_when_not_ready():
    table = [replace(p, last_copy_round=5) for p in reports([NAN, 1.0, 3.0])]
    assert dexpbt_select(table, round=6, seed=0, space=SPACE, ready_rounds=3)[0].action == "copy_pod"


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(threshold_std=-0.1), "threshold_std must be a number >= 0"),
        (dict(threshold_abs=NAN), "threshold_abs must be a number >= 0"),
        (dict(mutation_rate=1.5), "mutation_rate must be in [0, 1]"),
        (dict(change_range=[0.8, 1.2]), "change_range must be [min, max] with 1 <= min <= max"),
        (dict(change_range=[1.5, 1.1]), "change_range must be [min, max]"),
        (dict(mode="dexpbt", sync="async"), "runs with tournament.sync collective"),
    ],
)
def test_dexpbt_settings_are_checked(kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TournamentConfig(**kw)


def test_decide_dexpbt_uses_the_config_and_the_default_space():
    c = TournamentConfig(mode="dexpbt", threshold_std=0.5, mutation_rate=1.0)
    table = [
        PodReport(r, f, 1000, {"learning_rate": 1e-3, "ent_coef": 0.01, "clip_coef": 0.2, "gae_lambda": 0.95})
        for r, f in enumerate([9.0, 5.0, 0.0])
    ]
    ds = decide(table, [], round=c.ready_rounds - 1, seed=0, cfg=c)  # the first round every pod is ready
    assert [d.action for d in ds] == ["keep", "keep", "copy_pod"] and ds[2].source_rank == 0 and ds[0].publish
    assert set(ds[2].new_hparams) == set(table[0].hparams)
    assert all(ds[2].new_hparams[k] != table[0].hparams[k] for k in table[0].hparams)  # rate 1: every one moved
