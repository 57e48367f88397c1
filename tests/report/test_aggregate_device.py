"""Device-equivalent time from synthetic logs: env steps per pod to the target x seconds per env
step of one pod (from a named source) + seconds in rounds (+ a modelled all-reduce for one learner
with N times the envs); a run that never reaches the target is censored at its budget, not dropped.

The logs are tiny HDF5 files written with the pods' own writer (files/h5log.py), so the numbers
every test expects follow from the rows written here and nothing else.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from analysis import aggregate, plots  # noqa: E402
from podracer_hpc.files.h5log import H5Writer  # noqa: E402
from podracer_hpc.report.curves import t95  # noqa: E402

TARGET = -200.0
AGENT = {"update_epochs": 2, "num_minibatches": 4}


def write_run(
    path: Path,
    pods: int,
    cross: list[float | None],
    wall_per_step: float = 0.001,
    budget: int = 10_000,
    batch: int = 1000,
    rounds: list[tuple[int, list[float]]] = (),
    scheme: str = "pods",
    param_count: int | None = None,
    seed: int = 0,
) -> Path:
    """A run directory: ``len(cross)`` rank logs, train rows every ``batch`` env steps to ``budget``
    (``wall_per_step`` training seconds each, plus the round seconds), an evaluation every 1000 env
    steps whose return is -1000 until the pod's crossing point ``cross[r]`` (None: never) and 0
    from there, and one /tournament row per pod per round ``(env_steps, tournament_s per pod)``."""
    (path / "logs").mkdir(parents=True)
    cfg = {"name": "syn", "seed": seed, "env": {"name": "pendulum", "num_envs": 64}, "agent": AGENT}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "resources.json").write_text(
        json.dumps({"pods": pods, "gpus": 0, "cpus": pods, "nodes": 1, "scheme": scheme, "seed": seed})
    )
    for r, x in enumerate(cross):
        attrs = {"config": cfg, "rank": r, "world_size": len(cross), "seed": seed + r, "device_type": "cpu"}
        if param_count is not None:
            attrs["param_count"] = param_count
        with H5Writer(path / "logs" / f"syn_rank{r}.h5", attrs) as w:
            steps = np.arange(batch, budget + 1, batch)
            round_s = np.asarray([sum(ts[r] for s, ts in rounds if s <= e) for e in steps], dtype=float)
            w.extend(
                "train",
                {"update": np.arange(1, len(steps) + 1), "env_steps": steps, "wall_s": steps * wall_per_step + round_s},
            )
            ev = np.arange(1000, budget + 1, 1000)
            w.extend(
                "eval",
                {
                    "update": ev // batch,
                    "env_steps": ev,
                    "wall_s": ev * wall_per_step,
                    "return_mean": np.where((x is not None) & (ev >= (x or 0)), 0.0, -1000.0),
                },
            )
            for i, (s, ts) in enumerate(rounds):
                w.append(
                    "tournament",
                    {
                        "round": i,
                        "env_steps": s,
                        "wall_s": s * wall_per_step,
                        "fitness": 0.0,
                        "action": "keep",
                        "tournament_s": ts[r],
                    },
                )
    return path


@pytest.fixture
def study(tmp_path: Path) -> dict[str, list[Path]]:
    """solo: 1 pod, 3 seeds (reach at 6k, 7k, 8k); pool: 4 pods x 3 seeds, rounds every 2k
    (0.2 s for the last pod to arrive), seed 1 never reaches the target; dp: one learner with 4x
    the envs at 1 and 4 pods-equivalent."""
    rounds4 = [(s, [0.5, 0.2, 0.3, 0.4]) for s in (2000, 4000, 6000, 8000)]
    return {
        "solo": [write_run(tmp_path / f"solo{s}", 1, [6000 + 1000 * s], seed=s) for s in range(3)],
        "pool": [
            write_run(tmp_path / "pool0", 4, [None, None, 5000, 9000], wall_per_step=0.004, rounds=rounds4),
            write_run(tmp_path / "pool1", 4, [None] * 4, wall_per_step=0.004, rounds=rounds4, seed=1),
            write_run(tmp_path / "pool2", 4, [3000, None, None, 4000], wall_per_step=0.004, rounds=rounds4, seed=2),
        ],
        "dp": [
            write_run(tmp_path / "dp1", 1, [7000], scheme="data_parallel", param_count=1000),
            write_run(
                tmp_path / "dp4", 4, [16_000], budget=40_000, batch=4000, scheme="data_parallel", param_count=1000
            ),
        ],
    }


def table(study, **model):
    labels = [f"{name}={p}" for name, paths in study.items() for p in paths]
    return aggregate.run_table(aggregate.load_runs([], labels), TARGET, device=aggregate.DeviceModel(**model))


def row(t, run):
    return next(r for r in t.rows() if r["run"] == run)


def test_device_time_is_env_steps_per_pod_times_step_seconds_plus_rounds(study):
    t = table(study, reference="solo", allreduce_gbytes_per_s=0.001, allreduce_latency_s=0.01)
    solo = row(t, "solo1")
    assert solo["own_step_s"] == pytest.approx(0.001) and solo["device_step_source"] == "solo at 1 pod (3 runs)"
    assert solo["env_steps_per_pod_to_target"] == 7000 and solo["device_s_to_target"] == pytest.approx(7.0)
    pool = row(t, "pool2")  # pod 0 reached it first at 3000 env steps, after one round (the smallest 0.2 s)
    assert (pool["env_steps_per_pod_to_target"], pool["round_s_to_target"]) == (3000, pytest.approx(0.2))
    assert pool["device_s_to_target"] == pytest.approx(3000 * 0.001 + 0.2)
    assert pool["wall_s_to_target"] == pytest.approx(3000 * 0.004)  # this machine's (4 pods sharing cores)
    assert pool["round_s"] == pytest.approx(0.8) and pool["own_step_s"] == pytest.approx(0.004)  # rounds left out
    # pool0 crossed at 5000: the rounds at 2000 and 4000 came before it, those at 6000 and 8000 after
    assert row(t, "pool0")["device_s_to_target"] == pytest.approx(5.0 + 0.4)


def test_a_stated_round_cost_replaces_the_seconds_the_logs_measured(study):
    t = table(study, reference="solo", round_s=0.05)
    pool = row(t, "pool2")  # one round before its crossing at 3000, four in its whole budget
    assert pool["round_s_to_target"] == pytest.approx(0.05) and pool["round_s"] == pytest.approx(0.2)
    assert pool["device_s_to_target"] == pytest.approx(3000 * 0.001 + 0.05)
    assert pool["device_step_source"] == "solo at 1 pod (3 runs); rounds 0.05 s each (round_s)"
    assert row(t, "solo1")["device_step_source"] == "solo at 1 pod (3 runs)"  # no rounds, nothing stated


def test_a_run_that_never_reaches_the_target_is_censored_at_its_budget(study):
    t = table(study, reference="solo")
    miss = row(t, "pool1")
    assert math.isnan(miss["device_s_to_target"]) and math.isnan(miss["env_steps_per_pod_to_target"])
    assert miss["device_s_bound"] == pytest.approx(10_000 * 0.001 + 4 * 0.2)  # the whole budget and every round
    sc = aggregate.scaling_table(t)
    pool = next(sc.where(system="pool").rows())
    assert (pool["seeds"], pool["reached"], pool["device_s_censored"]) == (3, 2, 1)
    assert pool["device_s_mean"] == pytest.approx((5.4 + 10.8 + 3.2) / 3)  # a lower bound: censored at 10.8
    assert math.isnan(pool["device_s_ci"]) and pool["device_s_max"] == math.inf
    assert pool["device_s_median"] == pytest.approx(5.4)  # of 3.2, 5.4 and the censored one (never reached)
    assert pool["env_steps_per_pod_to_target_median"] == 5000 and pool["env_steps_per_pod_bound"] == 10_000
    md = aggregate.device_markdown(sc)
    line = next(ln for ln in md.splitlines() if "| pool |" in ln)
    assert "≥ 6.47 (1 of 3 censored at the budget)" in line and "[3,000, ≥ 10,000]" in line
    # each seed's time (a censored one at its bound), for the paired comparison of the verdicts
    seeds = json.loads(pool["device_s_seeds"])
    assert seeds == {"0": [pytest.approx(5.4), 0], "1": [pytest.approx(10.8), 1], "2": [pytest.approx(3.2), 0]}
    # every seed reached: the mean and its 95% t half-width
    solo = next(sc.where(system="solo").rows())
    assert solo["device_s_mean"] == pytest.approx(7.0) and solo["device_s_censored"] == 0
    assert solo["device_s_ci"] == pytest.approx(t95(2) * 1.0 / math.sqrt(3))
    assert "7 ± 2.5" in next(ln for ln in md.splitlines() if "| solo |" in ln)


def test_one_learner_with_n_times_the_envs_divides_its_steps_and_pays_an_allreduce(study):
    t = table(study, reference="solo", allreduce_gbytes_per_s=0.001, allreduce_latency_s=0.01)
    dp = row(t, "dp4")
    assert dp["scheme"] == "data_parallel" and dp["env_steps_per_pod_to_target"] == 4000
    per_step = 2 * 4000 / 1e6 + 0.01 * math.log2(4)  # 1000 float32 parameters, 1 MB/s, 10 ms x log2 4
    grad_steps = 4 * 2 * 4  # 4 updates of 4000 env steps to 16k, 2 epochs x 4 minibatches each
    assert dp["allreduce_s_to_target"] == pytest.approx(grad_steps * per_step)
    assert dp["device_s_to_target"] == pytest.approx(4000 * 0.001 + grad_steps * per_step)
    assert row(t, "dp1")["allreduce_s_to_target"] == 0.0  # one device: nothing to reduce
    # the parameter bytes from the study file instead of the log
    t2 = table(study, reference="solo", allreduce_gbytes_per_s=0.001, allreduce_latency_s=0.0, param_bytes=500.0)
    assert row(t2, "dp4")["allreduce_s_to_target"] == pytest.approx(grad_steps * 2 * 500 / 1e6)


@pytest.mark.parametrize(
    "model, source, step",
    [
        ({}, "solo at 1 pod (3 runs)", 0.001),  # its own one-pod runs
        ({"step_s": 0.002}, "device_step_s", 0.002),
        ({"step_s": 0.002, "step_s_of": {"pool": 0.003}}, "systems.pool.device_step_s", 0.003),
    ],
)
def test_the_seconds_per_env_step_come_from_a_named_source(study, model, source, step):
    t = table(study, **model)
    r = row(t, "pool2") if "step_s_of" in model else row(t, "solo0")
    assert (r["device_step_source"], r["device_step_s"]) == (source, pytest.approx(step))


def test_without_a_one_pod_run_there_is_no_device_time_and_it_says_why(study):
    r = row(table({"pool": study["pool"]}), "pool2")
    assert math.isnan(r["device_s_to_target"]) and r["device_step_source"].startswith("none: no one-pod run of pool")


def test_the_figure_draws_device_time_against_pods_log_log_with_ideal_lines(study):
    t = table(study, reference="solo")
    fig = plots.device_time(t)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    assert {"solo", "dp", "dp ideal"} <= set(lines)
    assert "pool" not in lines  # its one point has a censored seed: its mean is a lower bound, not a line
    ideal = lines["dp ideal"]
    np.testing.assert_allclose(ideal.get_xdata(), [1, 4])
    np.testing.assert_allclose(ideal.get_ydata()[1], ideal.get_ydata()[0] / 4)  # T(1) / p
    # the censored seed is drawn (an open triangle at its bound), not dropped
    marks = [c for c in ax.collections if c.get_label() == "censored"]
    assert marks and any(np.allclose(off, [4, 10.8]) for c in marks for off in c.get_offsets())
    assert plots.text_overlaps(fig) == []


def _scaling_rows(rows):
    """A scaling table of only the columns device_verdicts reads."""
    cols = ("task", "pods", "system", "target", "device_s_mean", "device_s_censored")
    cols += ("device_round_s_mean", "device_rounds_mean")
    return aggregate.Table.from_rows([dict(zip(cols, r)) for r in rows], cols)


@pytest.mark.parametrize(
    "pbt, search, lead, bound, even",
    [
        # 2.0 s with 5 rounds of 0.1 s (1.5 s training) vs 2.6 s: leads 1.30x; 1.3x while 5 r <= 0.5
        ((2.0, 0, 0.5, 5), (2.6, 0, 0.0, 0), 1.3, "", 0.1),
        ((2.14, 0, 0.5, 5), (2.36, 0, 0.0, 0), 2.36 / 2.14, "", (2.36 / 1.3 - 1.64) / 5),
        ((2.5, 0, 0.5, 5), (2.6, 0, 0.0, 0), 2.6 / 2.5, "", (2.6 / 1.3 - 2.0) / 5),  # 0: never, even free
        ((6.0, 1, 1.5, 15), (2.6, 0, 0.0, 0), 2.6 / 6.0, "<=", math.nan),  # it was censored: a lower bound
        # only the alternative was censored: its mean, and so the break-even, is a lower bound
        ((2.0, 0, 0.5, 5), (4.4, 3, 0.0, 0), 2.2, ">=", (4.4 / 1.3 - 1.5) / 5),
        ((2.5, 0, 0.5, 5), (2.6, 1, 0.0, 0), 2.6 / 2.5, ">=", (2.6 / 1.3 - 2.0) / 5),
    ],
)
def test_a_system_with_rounds_is_set_against_the_fastest_without(pbt, search, lead, bound, even):
    sc = _scaling_rows(
        [
            ("pendulum", 8, "pbt", -180.0, *pbt),
            ("pendulum", 8, "random_search", -180.0, *search),
            ("pendulum", 8, "best_of_n", -180.0, 9.0, 3, 0.0, 0),  # slower and censored: never the peer
            ("pendulum", 4, "random_search", -180.0, 0.5, 0, 0.0, 0),  # another point: never the peer
        ]
    )
    (v,) = aggregate.device_verdicts(sc).rows()
    assert (v["system"], v["alternative"], v["lead_bound"]) == ("pbt", "random_search", bound)
    assert v["lead"] == pytest.approx(lead) and v["round_share"] == pytest.approx(pbt[2] / pbt[0])
    if math.isnan(even):
        assert math.isnan(v["break_even_round_s"])
    else:  # at that round cost its time is exactly the alternative's / 1.3
        assert v["break_even_round_s"] == pytest.approx(even, abs=1e-12)
        assert (pbt[0] - pbt[2]) + pbt[3] * v["break_even_round_s"] == pytest.approx(search[0] / 1.3)
    md = aggregate.verdicts_markdown(aggregate.device_verdicts(sc))
    assert "| pendulum | 8 | pbt | random_search |" in md
    line = next(ln for ln in md.splitlines() if "| pbt |" in ln)
    line = line.rsplit(" | ", 1)[0] + " |"  # up to the break-even cell (the last compares with best of N)
    if even == even and even <= 1e-12:  # even free rounds do not give 1.3x: never, or unknown against a bound
        assert line.endswith(
            "| ? (the alternative's time is a lower bound) |" if bound else "| never (its training alone is too long) |"
        )
    elif even == even:
        assert line.endswith(f"| {'≥ ' if bound else ''}{even:.3g} s |")


@pytest.mark.parametrize(
    "mine, theirs, outcome",
    [
        ((2.0, 0), (2.5, 0), "sooner"),
        ((3.0, 0), (3.0, 0), "same"),
        ((4.0, 0), (3.0, 0), "later"),
        ((4.0, 0), (4.4, 1), "sooner"),  # it reached before the other's bound: the other took longer
        ((5.0, 0), (4.4, 1), "unknown"),  # the other might have reached it at 4.5 or never
        ((4.4, 1), (2.0, 0), "later"),
        ((4.4, 1), (5.0, 0), "unknown"),
        ((4.4, 1), (4.4, 1), "unknown"),
    ],
)
def test_seeds_are_compared_one_by_one_a_censored_one_only_past_its_bound(mine, theirs, outcome):
    a = json.dumps({"7": list(mine), "8": [1.0, 0]})  # seed 8: only one side ran it, not a pair
    b = json.dumps({"7": list(theirs), "9": [1.0, 0]})
    counts = dict(zip(("sooner", "same", "later", "unknown"), aggregate.paired_seeds(a, b)))
    assert counts == {k: int(k == outcome) for k in counts}


def test_the_verdict_counts_the_paired_seeds():
    seeds = lambda *xs: json.dumps({str(i): list(x) for i, x in enumerate(xs)})  # noqa: E731
    sc = _scaling_rows(
        [
            ("pendulum", 8, "pbt", -180.0, 3.0, 1, 0.6, 6),
            ("pendulum", 8, "random_search", -180.0, 2.6, 2, 0.0, 0),
        ]
    )
    sc.columns["device_s_seeds"] = np.array(
        [seeds((2.0, 0), (3.0, 0), (4.0, 0), (5.0, 1)), seeds((2.5, 0), (3.0, 0), (4.4, 1), (4.4, 1))], dtype=object
    )
    (v,) = aggregate.device_verdicts(sc).rows()
    assert (v["seeds_sooner"], v["seeds_same"], v["seeds_later"], v["seeds_unknown"]) == (2, 1, 0, 1)
    assert "| 2 / 1 / 0 (1 unknown) |" in aggregate.verdicts_markdown(aggregate.device_verdicts(sc))


def test_no_verdict_without_a_system_that_holds_rounds():
    sc = _scaling_rows([("pendulum", 8, "random_search", -180.0, 2.0, 0, 0.0, 0)])
    assert len(aggregate.device_verdicts(sc)) == 0 and aggregate.verdicts_markdown(aggregate.device_verdicts(sc)) == ""


@pytest.mark.parametrize(
    "mine, theirs, verdict",
    [
        # seed by seed 1.0, 1.1, 0.9 s later: the interval lies above 0
        ([(3.0, 0), (3.1, 0), (2.9, 0)], [(2.0, 0), (2.0, 0), (2.0, 0)], "worse"),
        ([(1.0, 0), (1.1, 0), (0.9, 0)], [(2.0, 0), (2.0, 0), (2.0, 0)], "better"),
        ([(3.0, 0), (1.0, 0), (2.2, 0)], [(2.0, 0), (2.0, 0), (2.0, 0)], "within noise"),  # +1, -1, +0.2
        # a censored seed on either side is left out: one pair is not enough to judge
        ([(3.0, 0), (4.4, 1), (4.4, 1)], [(2.0, 0), (2.0, 0), (4.4, 1)], "unknown"),
        ([(3.0, 0), (3.0, 0)], [(2.0, 0), (4.4, 1)], "unknown"),
    ],
)
def test_a_rule_is_judged_against_best_of_n_seed_by_seed_beyond_the_seeds_noise(mine, theirs, verdict):
    a = json.dumps({str(i): list(x) for i, x in enumerate(mine)})
    b = json.dumps({str(i): list(x) for i, x in enumerate(theirs)})
    mean, half, n, got = aggregate.paired_difference(a, b)
    assert got == verdict
    pairs = [(x, y) for (x, cx), (y, cy) in zip(mine, theirs) if not cx and not cy]
    assert n == len(pairs) and mean == pytest.approx(np.mean([x - y for x, y in pairs]))
    if n >= 2:  # the paired 95% t half-width
        d = np.array([x - y for x, y in pairs])
        assert half == pytest.approx(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))


def test_the_verdict_sets_each_rule_against_best_of_n_as_well_as_the_fastest_alternative():
    """Item: never worse than best of N beyond its noise. Random search is the fastest peer here,
    but the rule is also judged against the best_of_n series at its pods; without one, it says so."""
    seeds = lambda *xs: json.dumps({str(i): [x, 0] for i, x in enumerate(xs)})  # noqa: E731
    rows = [
        ("pendulum", 8, "pbt", -180.0, 3.0, 0, 0.6, 6),
        ("pendulum", 8, "random_search", -180.0, 2.0, 0, 0.0, 0),
        ("pendulum", 8, "best_of_n", -180.0, 2.0, 0, 0.0, 0),
        ("pendulum", 4, "pbt", -180.0, 3.0, 0, 0.6, 6),
        ("pendulum", 4, "random_search", -180.0, 2.0, 0, 0.0, 0),
    ]
    sc = _scaling_rows(rows)
    sc.columns["device_s_seeds"] = np.array(
        [seeds(3.0, 3.1, 2.9), seeds(1.5, 2.0, 2.5), seeds(2.0, 2.0, 2.0), seeds(3.0, 3.0), seeds(2.0, 2.0)],
        dtype=object,
    )
    v = {r["pods"]: r for r in aggregate.device_verdicts(sc).rows()}
    assert v[8]["alternative"] == "random_search" and v[8]["vs_best_of_n"] == "worse"
    assert v[8]["vs_best_of_n_s"] == pytest.approx(1.0) and v[8]["vs_best_of_n_seeds"] == 3
    assert v[4]["vs_best_of_n"] == "none"
    md = aggregate.verdicts_markdown(aggregate.device_verdicts(sc))
    line8 = next(ln for ln in md.splitlines() if ln.startswith("| pendulum | 8 | pbt |"))
    assert line8.endswith("| +1 ± 0.25 (3): worse beyond noise |"), line8
    assert "| n/a (no best_of_n series) |" in md
