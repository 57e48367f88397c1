"""pool/hparams.py: PBT's explore step, DexPBT's mutation, and where a search starts (a draw from
the prior for every pod but pod 0)."""

from __future__ import annotations

import numpy as np
import pytest

from podracer_hpc.config import HParamRange, normalize_space
from podracer_hpc.pool.hparams import explore, first_draw, mutate, prior_draw
from podracer_hpc.pool.rules import make_rng

NAN = float("nan")
SPACE = {"lr": (1e-5, 1e-2, True), "ent_coef": (0.0, 0.1, False), "gamma": (0.9, 0.999, False)}


@pytest.mark.parametrize("seed", range(20))
def test_explore_respects_bounds(seed):
    rng = np.random.default_rng(seed)
    space = normalize_space({**SPACE, "wide": (-5.0, 5.0, False), "tiny": (1e-8, 1e-6, True)})
    hp = {
        "lr": 10 ** rng.uniform(-6, -1),
        "ent_coef": rng.uniform(-1, 1),
        "gamma": rng.uniform(0.5, 1.5),
        "wide": rng.uniform(-50, 50),
        "tiny": NAN,
    }
    for _ in range(25):
        hp = explore(hp, space, make_rng(seed, _, 0, 2), resample_prob=0.3)
        for name, r in space.items():
            assert r.low <= hp[name] <= r.high, (name, hp[name])


def test_explore_resample_prior_log_scale():
    space = {"lr": HParamRange(1e-5, 1e-1, True)}
    vals = [explore({"lr": 1e-3}, space, make_rng(0, i, 0, 2), resample_prob=1.0)["lr"] for i in range(2000)]
    logs = np.log10(vals)
    assert logs.min() >= -5 and logs.max() <= -1
    assert abs(np.median(logs) - (-3)) < 0.15  # log-uniform: median at the geometric middle
    assert explore({}, space, make_rng(0, 0, 0, 2), resample_prob=0.0)["lr"] > 0  # missing: sampled


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("rate", [0.0, 0.3, 1.0])
def test_mutate_changes_each_value_with_its_rate_by_a_factor_in_range(seed, rate):
    hp = {"lr": 1e-3, "ent_coef": 0.05, "gamma": 0.95, "clip": 0.2}
    out = mutate(hp, SPACE, np.random.default_rng(seed), rate, (1.2, 1.4))
    assert out["clip"] == 0.2 and out == mutate(hp, SPACE, np.random.default_rng(seed), rate, (1.2, 1.4))
    for name, (lo, hi, _) in SPACE.items():
        v, x = out[name], hp[name]
        assert lo <= v <= hi
        if rate == 0.0:
            assert v == x
        elif rate == 1.0 and lo < v < hi:
            assert 1.2 - 1e-9 <= max(v / x, x / v) <= 1.4 + 1e-9


def test_mutate_draws_a_value_outside_its_range_from_the_prior():
    out = mutate({"lr": 3e-6}, {"lr": (1e-5, 1e-2, True)}, np.random.default_rng(0), 0.0)
    assert 1e-5 <= out["lr"] <= 1e-2 and out["lr"] not in (1e-5, 1e-2)


def test_prior_draw_is_the_pods_own_and_spans_the_prior():
    draws = [prior_draw(SPACE, s) for s in range(400)]
    assert draws[5] == prior_draw(SPACE, 5) and draws[5] != draws[6]
    lr = np.log10([d["lr"] for d in draws])  # log-uniform over [1e-5, 1e-2]
    assert lr.min() >= -5 and lr.max() <= -2 and abs(np.median(lr) + 3.5) < 0.25
    ent = np.asarray([d["ent_coef"] for d in draws])
    assert ent.min() >= 0 and ent.max() <= 0.1 and abs(ent.mean() - 0.05) < 0.01
    with pytest.raises(ValueError, match="seed must be >= 0"):
        prior_draw(SPACE, -1)


@pytest.mark.parametrize("seed, index", [(0, 0), (7, 0), (7, 1), (12, 3)])
def test_a_search_starts_with_the_jobs_values_at_pod_0_and_draws_elsewhere(seed, index):
    draw = first_draw(SPACE, seed, index)
    assert draw is None if index == 0 else draw == prior_draw(SPACE, seed)
