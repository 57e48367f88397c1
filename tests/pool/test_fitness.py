"""Fitness on common start states and comparisons that carry their error (podracer_hpc/pool/fitness.py),
and how the tournament rules use them: small parametrized checks of the math."""

import math

import numpy as np
import pytest

from podracer_hpc.config import TournamentConfig
from podracer_hpc.pool.fitness import EVAL_KINDS, Fitness, better, eval_seed, paired, t_interval, t_quantile
from podracer_hpc.pool.rules import PodReport, decide, elegantrl_select


def test_eval_seeds_come_from_the_run_not_the_rank_and_differ_by_purpose_and_index():
    assert eval_seed(5, "round", 3) == eval_seed(5, "round", 3)
    seeds = {eval_seed(s, k, i) for s in (0, 5) for k in EVAL_KINDS for i in range(4)}
    assert len(seeds) == 2 * len(EVAL_KINDS) * 4  # no two purposes, rounds or runs share a set
    assert all(0 <= x < 2**31 for x in seeds)
    with pytest.raises(ValueError):
        eval_seed(0, "rank", 0)
    with pytest.raises(ValueError):
        eval_seed(-1, "round", 0)


@pytest.mark.parametrize(
    "returns, mean, se",
    [
        ((1.0,), 1.0, 0.0),
        ((1.0, 3.0), 2.0, 1.0),
        ((-200.0, -100.0, -150.0, -250.0), -175.0, math.sqrt(np.var([-200, -100, -150, -250], ddof=1) / 4)),
    ],
)
def test_fitness_mean_and_standard_error(returns, mean, se):
    f = Fitness(returns, seed=3)
    assert (f.mean, f.episodes, f.key) == (pytest.approx(mean), len(returns), (3, len(returns)))
    assert f.se == pytest.approx(se)
    assert Fitness.from_json(f.to_json()) == f
    assert Fitness.from_json({"seed": 1}) is None and Fitness.from_json("x") is None


def test_paired_differences_cancel_the_start_states_luck():
    states = np.array([-1500.0, -900.0, -300.0, -10.0, -600.0])  # the start states' spread
    a = states + np.array([1.0, -1.0, 2.0, 0.0, -2.0])
    b = a + 5.0  # better by 5 on every start state
    m, se = paired(a, b)
    assert m == pytest.approx(5.0) and se == pytest.approx(0.0, abs=1e-12)
    assert better(a, b, margin_se=3.0)[0]  # the spread of the states (hundreds) does not matter
    assert not better(b, a, margin_se=0.0)[0]
    assert not better(a, a, margin_se=0.0)[0]  # a copy is never better: identical returns, d = 0
    with pytest.raises(ValueError):
        paired(a, b[:3])


@pytest.mark.parametrize("margin, taken", [(0.0, True), (1.0, True), (2.0, False)])
def test_the_margin_is_counted_in_standard_errors_of_the_paired_difference(margin, taken):
    a = np.zeros(4)
    b = np.array([3.0, -1.0, 2.0, 0.0])  # mean 1, sd 1.826, se 0.913: 1.095 standard errors
    ok, m, se = better(a, b, margin)
    assert (ok, m) == (taken, pytest.approx(1.0)) and se == pytest.approx(np.std(b, ddof=1) / 2)


@pytest.mark.parametrize(
    "df, q", [(1, 12.7062), (2, 4.3027), (10, 2.2281), (30, 2.0423), (31, 2.0395), (60, 2.0003), (1000, 1.9623)]
)
def test_t_quantiles_are_exact_for_any_degrees_of_freedom(df, q):
    assert t_quantile(df) == pytest.approx(q, abs=1e-3)
    x = np.arange(df + 1, dtype=float)
    lo, hi = t_interval(x)
    assert hi - lo == pytest.approx(2 * q * x.std(ddof=1) / math.sqrt(x.size), rel=1e-3)
    assert all(math.isnan(v) for v in t_interval([1.0]))


def _reports(returns_by_pod, steps=1000):
    return [PodReport(r, float(np.mean(x)), steps, {}, -1, tuple(x)) for r, x in enumerate(returns_by_pod)]


def test_elegantrl_never_replaces_a_pod_by_an_identical_copy():
    same = (-500.0, -100.0, -300.0)
    for margin in (0.0, 1.0):
        out = elegantrl_select([np.mean(same)] * 4, [], 0, 0, returns=[same] * 4, margin_se=margin)
        assert [d.action for d in out] == ["keep"] * 4
        assert all(d.diff_mean == 0.0 for d in out)


def test_elegantrl_takes_a_pod_better_on_common_states_by_the_margin_only():
    base = np.array([-1200.0, -200.0, -700.0, -50.0])
    noisy = base + np.array([4.0, -3.0, 1.0, 0.0])  # better by 0.5 on average: within the noise
    clear = base + 20.0  # better by 20 on every state
    cfg = TournamentConfig(mode="elegantrl", top_k=1, margin_se=1.0)
    out = decide(_reports([base, noisy]), [], 0, 0, cfg)
    assert out[0].action == "keep" and out[0].diff_mean == pytest.approx(0.5)
    out = decide(_reports([base, clear]), [], 0, 0, cfg)
    assert out[0].action == "copy_pod" and out[0].source_rank == 1 and out[0].diff_mean == pytest.approx(20.0)
    # without the paired test a pod lucky enough to draw easy start states would win: here the same
    # agent on its own easier states scores -300 better, but on common states it is no better
    assert decide(_reports([base, base]), [], 0, 0, cfg)[0].action == "keep"


@pytest.mark.parametrize(
    "entry_returns, action, verify",
    [
        (None, "load_entry", True),  # scored on other start states: the pod evaluates it first
        ((-90.0, -90.0, -90.0), "load_entry", False),  # on this round's states and clearly better
        ((-101.0, -99.0, -100.0), "keep", False),  # on this round's states, no better
    ],
)
def test_an_entry_from_other_start_states_is_verified_before_it_is_taken(entry_returns, action, verify):
    own = (-100.0, -100.0, -100.0)
    out = elegantrl_select(
        [-100.0],
        [("e1", -90.0, 1000, entry_returns)],
        3,
        0,
        env_steps=[1000],
        returns=[own],
        margin_se=1.0,
        include_pods=False,
    )
    assert (out[0].action, out[0].verify) == (action, verify)


def test_an_entry_that_looks_worse_is_not_even_verified():
    out = elegantrl_select([-100.0], [("e1", -120.0, 1000, None)], 3, 0, returns=[(-100.0,) * 3], include_pods=False)
    assert out[0].action == "keep" and not out[0].verify


def test_pbt_copies_only_a_source_better_on_common_states():
    easy = (-100.0, -100.0, -100.0, -100.0)
    a = _reports([easy, (-90.0,) * 4, easy, easy])  # pod 1 better; the others are one agent's copies
    cfg = TournamentConfig(mode="pbt", quantile=0.25, ready_rounds=0)
    out = decide(a, [], 0, 0, cfg)
    bottom = [d for d in out if d.action == "copy_pod"]
    assert len(bottom) == 1 and bottom[0].source_rank == 1 and bottom[0].diff_mean == pytest.approx(10.0)
    # all pods copies of one agent: nobody copies (fitness ties on common states; nothing to gain)
    same = _reports([easy] * 4)
    assert all(d.action == "keep" for d in decide(same, [], 0, 0, cfg))
