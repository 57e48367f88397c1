"""analysis/: tidy tables equal the logs, time to target, figures (no overlapping text), the CLI, the notebook.

Logs come from real runs made once for the module: a 2-pod PBT tournament under mpiexec and two
single-pod runs in this process.
"""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `analysis` is a top-level folder of the repository, not an installed package
    sys.path.insert(0, str(REPO))

from helpers import mpiexec_or_skip  # noqa: E402

from analysis import aggregate, plots  # noqa: E402
from analysis.aggregate import Table, first_crossing, mean_curve, read_csv, time_to_target  # noqa: E402
from analysis.make_figures import main as make_figures_main  # noqa: E402
from podracer_hpc.files.h5log import read_log  # noqa: E402
from podracer_hpc.report import lineage as lineage_module  # noqa: E402

# Small on purpose (2 CPU cores): 20 updates of 1024 env steps per pod, a round every 5 updates.
PBT_SETS = [
    "env.num_envs=64",
    "total_env_steps=20480",
    "tournament.mode=pbt",
    "tournament.interval_env_steps=5120",
    "eval.interval_env_steps=5120",
    "eval.episodes=5",
    "tournament.quantile=0.5",
    "tournament.resample_prob=0.5",
    "tournament.ready_rounds=0",  # the weaker pod may copy at every round, the first included
    "tournament.hparam_space={learning_rate: [1.0e-4, 1.0e-2, true]}",
    "log.progress_interval_s=0",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{'pbt': 2-pod PBT run, 'solo0'/'solo1': single-pod runs, seeds 0 and 1} (all finished)."""
    from podracer_hpc.config import load_config
    from podracer_hpc.rank.program import train

    root = tmp_path_factory.mktemp("runs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PODRACER_COMM", None)
    args = [
        mpiexec_or_skip(),
        "-n",
        "2",
        sys.executable,
        "-m",
        "podracer_hpc.cli",
        "train",
        "jobs/quickstart.yaml",
        "--run-dir",
        str(root / "pbt"),
        "--quiet",
        *sum((["--set", s] for s in PBT_SETS), []),
    ]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for seed in (0, 1):  # meanwhile, here
            cfg = load_config(
                REPO / "jobs" / "pendulum.yaml",
                [
                    "env.num_envs=128",
                    "total_env_steps=12288",
                    "eval.interval_env_steps=4096",
                    "eval.episodes=5",
                    f"seed={seed}",
                    "log.progress_interval_s=0",
                    "threads=1",
                ],
            )
            assert train(cfg, root / f"solo{seed}", quiet=True).complete
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return {k: root / k for k in ("pbt", "solo0", "solo1")}


@pytest.fixture(scope="module")
def loaded(runs):
    rs = aggregate.load_runs([runs["solo0"], runs["solo1"]], labels=[f"PBT x2={runs['pbt']}"])
    return rs, aggregate.eval_table(rs), aggregate.tournament_table(rs)


def _logs(run_dir: Path) -> dict[int, dict]:
    return {int(p.stem.rsplit("rank", 1)[1]): read_log(p) for p in sorted((run_dir / "logs").glob("*_rank*.h5"))}


def test_eval_table_has_one_row_per_run_pod_evaluation_with_the_logged_values(runs, loaded):
    rs, evals, _ = loaded
    assert [r.system for r in rs] == ["pendulum", "pendulum", "PBT x2"]  # config name, else the label
    assert [r.run for r in rs] == ["solo0", "solo1", "pbt"]
    for col in (
        "system",
        "task",
        "run",
        "pod",
        "seed",
        "env_steps",
        "wall_s",
        "return_mean",
        "return_std",
        "return_min",
        "return_max",
        "episodes",
        "update",
        "pods",
        "mode",
    ):
        assert col in evals, col
    expected_rows = 0
    for name in ("solo0", "solo1", "pbt"):
        for rank, log in _logs(runs[name]).items():
            ev = log["eval"]
            expected_rows += len(ev["env_steps"])
            t = evals.where(run=name, pod=rank)
            assert len(t) == len(ev["env_steps"]) > 0
            for col in (
                "update",
                "env_steps",
                "wall_s",
                "return_mean",
                "return_std",
                "return_min",
                "return_max",
                "episodes",
            ):
                np.testing.assert_array_equal(t[col], ev[col], err_msg=col)
            assert set(t["seed"].tolist()) == {log["attrs"]["seed"]}
            assert set(t["task"].tolist()) == {"pendulum"}
    assert len(evals) == expected_rows
    assert set(evals.where(run="pbt")["pods"].tolist()) == {2}
    assert set(evals.where(run="pbt")["mode"].tolist()) == {"pbt"}
    assert set(evals.where(run="solo1")["seed"].tolist()) == {1}


def test_csv_round_trip_is_exact(loaded, tmp_path):
    _, evals, tour = loaded
    for t in (evals, tour):
        back = read_csv(t.to_csv(tmp_path / "t.csv"))
        assert back.names == t.names and len(back) == len(t)
        for k in t.names:
            if t[k].dtype == object:
                assert back[k].tolist() == [str(v) for v in t[k].tolist()], k
            else:
                np.testing.assert_array_equal(back[k], t[k], err_msg=k)


def test_run_table_agrees_with_summary_json(runs, loaded):
    import json

    rs, _, _ = loaded
    table = aggregate.run_table(rs, target=-1e9)  # every run reaches it at its first evaluation
    for row in table.rows():
        summary = json.loads((runs[row["run"]] / "summary.json").read_text())
        assert row["env_steps"] == summary["env_steps"]
        assert row["pods"] == summary["pods"]
        assert row["best_return"] == summary["best_return"]
        assert row["final_return"] == summary["final_return"]
        assert row["complete"] is True
        assert row["rounds"] == summary.get("rounds", 0)
        first = min(float(log["eval"]["wall_s"][0]) for log in _logs(runs[row["run"]]).values())
        assert row["wall_s_to_target"] == first
        assert row["steps_per_s"] == pytest.approx(row["env_steps"] / row["wall_s"])


def test_tournament_table_and_pbt_hyperparameters(runs, loaded):
    _, _, tour = loaded
    logs = _logs(runs["pbt"])
    assert len(tour) == sum(len(log["tournament"]["round"]) for log in logs.values()) == 2 * 4 + 1
    assert tour.where(round=-1)["action"].tolist() == ["draw"]  # pod 1 started from its draw from the prior
    assert set(tour["run"].tolist()) == {"pbt"}
    t = tour.where(pod=1)
    np.testing.assert_array_equal(t["fitness"], logs[1]["tournament"]["fitness"])
    assert t["action"].tolist() == logs[1]["tournament"]["action"].tolist()
    moved = [r for r in tour.rows() if r["action"] in ("copy_pod", "load_entry")]
    assert moved, "with quantile 0.5 the weaker of 2 pods copies the other every round"
    for r in moved:  # the source entry was published by the other pod of this run, this round
        assert r["source_internal"] and r["source_pod"] == 1 - r["pod"] and r["source_round"] == r["round"]
    lr = tour["hp_learning_rate"]
    assert np.all((lr >= 1e-4) & (lr <= 1e-2)) and len(set(lr.tolist())) > 1


def test_parse_entry_ids_and_lineage_parents():
    from podracer_hpc.files.records import EntryName, Source, parse_entry_id

    assert parse_entry_id("local-2-3-0123456789ab") == EntryName("local", 2, 3)
    old = Source.from_legacy("rejected:123_4-0-11-0123456789ab")  # a schema-1 log's source string
    assert old.rejected and old.entry == EntryName("123_4", 0, 11) and old.pod == 0
    assert Source.from_legacy("pod3") == Source("pod", "3") and Source.from_legacy("pod3").pod == 3
    assert Source.from_legacy("") == Source() and Source.from_legacy("something-else").entry is None
    for s in ("", "pod3", "rejected:pod1", "local-2-3-0123456789ab", "rejected:j-0-1-0123456789ab"):
        assert Source.from_legacy(s).legacy() == s
    base = {"source_internal": True, "source_pod": 1, "source_round": 3, "round": 3, "pod": 0}
    assert lineage_module.lineage_parent({**base, "action": "copy_pod"}) == (2, 1)  # pod 1's entry of round 3
    assert lineage_module.lineage_parent({**base, "action": "load_entry", "source_round": 1}) == (0, 1)
    assert lineage_module.lineage_parent({**base, "action": "keep"}) == (2, 0)
    assert lineage_module.lineage_parent({**base, "action": "load_entry", "source_internal": False}) is None
    assert lineage_module.lineage_parent({**base, "action": "reset"}) is None


def test_first_crossing_and_time_to_target():
    assert first_crossing([1, 2, 3], [-500, -240, -100], -250) == 2
    assert first_crossing([1, 2, 3], [-500, -250, -100], -250) == 2  # reaching the target counts
    assert first_crossing([1, 2, 3], [np.nan, -300, -200], -250) == 3  # NaN never crosses
    assert math.isnan(first_crossing([1, 2], [-500, -300], -250))
    assert math.isnan(first_crossing([], [], 0))
    evals = Table(
        {
            "system": ["a"] * 6 + ["b"] * 3,
            "task": ["pendulum"] * 6 + ["cartpole"] * 3,
            "run": ["r1"] * 6 + ["r2"] * 3,
            "pods": [2] * 6 + [1] * 3,
            "pod": [0, 0, 0, 1, 1, 1, 0, 0, 0],
            "wall_s": [1.0, 2.0, 3.0, 1.5, 2.5, 3.5, 1.0, 2.0, 3.0],
            "env_steps": [10, 20, 30, 10, 20, 30, 10, 20, 30],
            "return_mean": [-900, -300, -200, -800, -240, -100, 100, 480, 500.0],
        }
    )
    t = time_to_target(evals, -250, "wall_s")
    row = next(t.where(run="r1").rows())
    assert row["wall_s_to_target"] == 2.5 and row["pod"] == 1  # pod 1 reaches -250 first (2.5 s < 3.0 s)
    assert next(t.where(run="r2").rows())["wall_s_to_target"] == 1.0  # one number: the target of every task
    t = time_to_target(evals, {"pendulum": -250, "cartpole": 475}, "env_steps")  # or one per task
    assert t["env_steps_to_target"].tolist() == [20.0, 20.0] and t["target"].tolist() == [-250.0, 475.0]
    t = time_to_target(evals, {"cartpole": 475}, "wall_s")
    assert t["run"].tolist() == ["r2"]  # runs of a task without a target are left out
    assert aggregate.parse_targets(["-250"]) == -250.0
    assert aggregate.parse_targets(["pendulum=-250", "cartpole=475"]) == {"pendulum": -250.0, "cartpole": 475.0}


def test_mean_curve_reduces_a_runs_pods_first():
    evals = Table(
        {
            "run": ["a"] * 6,
            "pod": [0, 0, 0, 1, 1, 1],
            "env_steps": [10, 20, 30, 10, 20, 40],
            "return_mean": [0.0, 2.0, 4.0, 2.0, 4.0, 8.0],
        }
    )
    c = mean_curve(evals, "env_steps", min_share=1.0)  # only where every pod (and run) has data
    assert c["x"].tolist() == [10, 20, 30] and c["runs"] == ["a"] and c["n"].tolist() == [1, 1, 1]
    np.testing.assert_allclose(c["mean"], [1.0, 3.0, 5.0])  # pod 1 at 30 interpolates to 6
    assert np.isnan(c["lo"]).all() and np.isnan(c["hi"]).all()  # one run: no band, however many pods
    c = mean_curve(evals, "env_steps")  # default: where at least half the pods have data
    assert c["x"].tolist() == [10, 20, 30, 40] and c["mean"][-1] == 8.0
    best = mean_curve(evals, "env_steps", min_share=1.0, reduce="best")  # the best pod at each point
    np.testing.assert_allclose(best["mean"], [2.0, 4.0, 6.0])
    with pytest.raises(ValueError, match="reduce"):
        mean_curve(evals, reduce="median")


# Two-sided 95% t quantiles from a printed table (3 decimals): the old lookup gave 1.96 from df 31.
@pytest.mark.parametrize(
    "df, table",
    [(1, 12.706), (2, 4.303), (10, 2.228), (30, 2.042), (31, 2.040), (45, 2.014), (60, 2.000), (1000, 1.962)],
)
def test_t95_is_the_exact_student_t_quantile(df, table):
    from scipy import stats

    assert aggregate.t95(df) == pytest.approx(table, abs=1e-3)
    assert aggregate.t95(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-12)


def test_t95_of_no_degrees_of_freedom_is_nan():
    assert math.isnan(aggregate.t95(0)) and aggregate.t95(math.inf) == pytest.approx(1.95996, abs=1e-5)


def _copied_pods(levels: list[float], pods: int = 4, system: str = "sys", pod_count: int | None = None) -> Table:
    """Runs whose ``pods`` pods are identical copies (as after a tournament): run k returns
    ``levels[k] + env_steps / 100`` at env steps 0, 100, 200; wall_s = env_steps / 10 + k."""
    rows = []
    for k, level in enumerate(levels):
        for p in range(pods):
            for steps in (0, 100, 200):
                rows.append(
                    {
                        "system": system,
                        "task": "pendulum",
                        "run": f"{system}-{pod_count}-r{k}",
                        "pod": p,
                        "pods": pod_count or pods,
                        "env_steps": steps,
                        "wall_s": steps / 10 + k,
                        "return_mean": level + steps / 100,
                    }
                )
    return Table.from_rows(rows)


def test_the_band_is_over_runs_not_over_copied_pods():
    two = mean_curve(_copied_pods([0.0, 3.0]))
    assert two["n"].tolist() == [2, 2, 2] and np.isnan(two["lo"]).all()  # 2 runs x 4 pods: no band
    np.testing.assert_allclose(two["curves"], [[0, 1, 2], [3, 4, 5]])  # the runs, to be drawn instead
    levels = [0.0, 1.0, 5.0]
    three = mean_curve(_copied_pods(levels))
    half = aggregate.t95(2) * np.std(levels, ddof=1) / math.sqrt(3)  # 3 runs, not 12 pods (t95(11), sqrt(12))
    curves = three["curves"]  # the band: the t-interval within the runs' own range (returns a metric can take)
    np.testing.assert_allclose(three["hi"], np.minimum(three["mean"] + half, curves.max(axis=0)))
    np.testing.assert_allclose(three["lo"], np.maximum(three["mean"] - half, curves.min(axis=0)))
    np.testing.assert_allclose(three["mean"], np.mean(levels) + np.array([0, 1, 2]))
    assert three["n"].tolist() == [3, 3, 3] and three["runs"] == ["sys-None-r0", "sys-None-r1", "sys-None-r2"]


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def _bands(fig) -> int:
    from matplotlib.collections import PolyCollection

    return sum(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)


@pytest.mark.parametrize("levels, band", [([0.0, 3.0], False), ([0.0], False), ([0.0, 1.0, 5.0], True)])
def test_the_learning_curve_legend_claims_no_band_it_does_not_draw(levels, band):
    fig = plots.learning_curves(_copied_pods(levels))
    legend = _legend(fig)
    runs = f"{len(levels)} run{'s' * (len(levels) != 1)}"
    assert legend[0] == f"sys ({runs})"
    assert (_bands(fig) > 0) == band
    assert any(s.startswith("shaded: ") and "95% t-interval over runs" in s for s in legend) == band
    assert any(s.startswith("thin lines: each run (the mean of its pods)") for s in legend) == (not band)
    assert sum(len(ax.lines) for ax in fig.axes) == 2 * (1 if band else len(levels))  # the mean, else each run
    assert not any("pods" in s and "interval" in s for s in legend)  # never a band over pods
    assert plots.text_overlaps(fig) == []


def test_a_study_systems_series_is_one_legend_entry_per_resource_point():
    evals = _concat(_copied_pods([0.0, 1.0, 2.0], pods=1, pod_count=1), _copied_pods([1.0, 2.0], pods=2, pod_count=2))
    fig = plots.learning_curves(evals, target=2.0)
    legend = _legend(fig)
    assert legend[:3] == ["sys, 1 pod (3 runs)", "sys, 2 pods (2 runs)", "target return"]
    assert sum(s.startswith("sys") for s in legend) == 2  # one entry per series, not per panel or pod count
    assert any(s.startswith("shaded") for s in legend) and any(s.startswith("thin lines") for s in legend)
    assert plots.text_overlaps(fig) == []
    best = _legend(plots.learning_curves(evals, reduce="best"))
    assert any("its best pod at each point" in s for s in best)


def _concat(*tables: Table) -> Table:
    return Table.from_rows([r for t in tables for r in t.rows()])


def test_learning_curve_figure_has_no_overlapping_text(loaded, tmp_path):
    _, evals, _ = loaded
    fig = plots.learning_curves(evals, target=-250)
    assert plots.text_overlaps(fig) == []
    ax = fig.axes[0]
    assert ax.get_xlabel() == "environment steps per pod" and "return" in ax.get_ylabel()
    assert "(s)" in fig.axes[1].get_xlabel()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:3] == ["pendulum (2 runs)", "PBT x2 (1 run)", "target return"]  # runs are the samples
    assert not any("shaded" in s or "interval" in s for s in legend)  # too few runs: no band, none claimed
    # the checker itself sees an overlap, and a text cut by the figure's edge
    ax.text(0.5, 0.5, "XXXXXXXX", transform=ax.transAxes)
    ax.text(0.5, 0.5, "YYYYYYYY", transform=ax.transAxes)
    fig.text(0.99, 0.5, "cut by the edge")
    found = plots.text_overlaps(fig)
    assert ("XXXXXXXX", "YYYYYYYY") in found and ("cut by the edge", "<figure edge>") in found


def test_other_figures_have_no_overlapping_text(loaded):
    rs, evals, tour = loaded
    table = aggregate.run_table(rs, target=-1200)
    figs = [
        plots.scaling(table, evals, target=-1200),
        plots.lineage(tour, "pbt", evals),
        plots.hparam_trajectories(tour, "pbt", rs[2].config["tournament"]["hparam_space"]),
    ]
    for fig in figs:
        assert fig is not None and plots.text_overlaps(fig) == []
    legend = _legend(figs[0])  # each system at one point: no range band, no ideal line drawn, none claimed
    assert "pendulum: median over seeds" in legend and not any("band" in s or "ideal" in s for s in legend)
    assert plots.hparam_trajectories(tour.where(run="nope"), "nope") is None


def test_make_figures_command_writes_tables_and_figures(runs, tmp_path, capsys):
    out = tmp_path / "figs"
    rc = make_figures_main(
        [
            str(runs["solo0"]),
            str(runs["solo1"]),
            "--label",
            f"pbt2={runs['pbt']}",
            "--out",
            str(out),
            "--target",
            "pendulum=-1000",
            "--dpi",
            "60",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out.split()
    names = {
        "evals.csv",
        "runs.csv",
        "tournament.csv",
        "learning_curves.png",
        "learning_curves.pdf",
        "scaling.png",
        "scaling.pdf",
        "lineage_pbt.png",
        "lineage_pbt.pdf",
        "hparams_pbt.png",
        "hparams_pbt.pdf",
    }
    assert names <= {Path(p).name for p in printed}
    for n in names:
        data = (out / n).read_bytes()
        assert len(data) > 500, n
        if n.endswith(".png"):
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
        if n.endswith(".pdf"):
            assert data[:5] == b"%PDF-"
    ev = read_csv(out / "evals.csv")
    assert set(ev["system"].tolist()) == {"pendulum", "pbt2"} and set(ev["run"].tolist()) == {"solo0", "solo1", "pbt"}
    rt = read_csv(out / "runs.csv")
    assert rt["target"].tolist() == [-1000.0] * 3


def test_make_figures_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    assert make_figures_main([str(tmp_path / "junk"), "--out", str(tmp_path / "o")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_a_folder_of_runs_expands_to_its_runs(runs):
    found = aggregate.expand_run_dirs([runs["pbt"].parent])
    assert sorted(p.name for p in found) == ["pbt", "solo0", "solo1"]
    with pytest.raises(aggregate.RunDirError, match="not a run directory"):
        aggregate.expand_run_dirs([runs["pbt"] / "logs"])


def test_notebook_runs_top_to_bottom_on_the_test_runs(runs, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    path = REPO / "analysis" / "notebooks" / "podracer_analysis.ipynb"
    monkeypatch.setenv("PODRACER_RUNS", os.pathsep.join(str(runs[k]) for k in ("solo0", "solo1")))
    monkeypatch.setenv("PODRACER_LABELS", f"PBT={runs['pbt']}")
    monkeypatch.setenv("PODRACER_TARGET", "-1000")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()  # raises on a cell error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 4  # learning curves, scaling, lineage, hyperparameters
    text = "".join(o.get("text", "") for o in outputs)
    assert "3 runs" in text and "1 tournament run(s) shown" in text


def _synthetic_tournament(pods: int, rounds: int, seed: int = 0):
    """An ElegantRL-like tournament: each round a fifth of the pods copy one of the round's best."""
    rng = np.random.default_rng(seed)
    skill = rng.normal(size=pods)
    rows = []
    for r in range(rounds):
        fit = skill + rng.normal(scale=0.3, size=pods)
        best = np.argsort(-fit)[: max(1, pods // 10)]
        new = skill.copy()
        for p in range(pods):
            copy = rng.random() < 0.2 and p not in best
            q = int(rng.choice(best)) if copy else p
            if copy:
                new[p] = skill[q] + 0.01
            rows.append(
                {
                    "run": "big",
                    "system": "pendulum",
                    "mode": "elegantrl",
                    "pods": pods,
                    "round": r,
                    "pod": p,
                    "action": "copy_pod" if copy else "keep",
                    "source_internal": copy,
                    "source_pod": q if copy else -1,
                    "source_round": r if copy else -1,
                    "fitness": float(fit[p]),
                    "algo": "ppo",
                }
            )
        skill = new
    tour = Table.from_rows(rows)
    evals = Table(
        {
            "run": ["big"] * pods,
            "pod": list(range(pods)),
            "return_mean": (skill + rng.normal(scale=0.01, size=pods)).tolist(),
        }
    )
    return tour, evals, rows


def test_lineage_at_512_pods_draws_the_top_pods_ancestry_only():
    import io

    pods, rounds = 512, 20
    tour, evals, rows = _synthetic_tournament(pods, rounds)
    fig = plots.lineage(tour, "big", evals)
    fig.savefig(io.BytesIO(), format="png", dpi=60)  # it renders
    ax = fig.axes[0]
    title = ax.get_title()
    k = int(re.search(r"ancestry of the top (\d+) final pods?", title)[1])
    assert 1 <= k <= lineage_module.LINEAGE_TOP and "512 pods" in title
    drawn = [int(t.get_text()) for t in ax.get_yticklabels()]
    assert 0 < len(drawn) <= lineage_module.LINEAGE_ROWS
    # what it claims: the rows are exactly the pods the top k final pods' agents passed through
    last = dict(zip(evals["pod"].tolist(), evals["return_mean"].tolist()))
    top = sorted(last, key=lambda p: -last[p])[:k]
    parent = {(int(r["round"]), int(r["pod"])): lineage_module.lineage_parent(r) for r in rows}
    expect = {q for p in top for (_, q) in plots.ancestry(parent, (rounds - 1, p))}
    assert sorted(expect) == drawn
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert f"pod {top[0]} (final best)" in legend and "lineages alive" in legend
    assert plots.text_overlaps(fig) == []
    small = plots.lineage(*_synthetic_tournament(8, 6)[:1], "big")  # a small pool: a row per pod, as before
    assert len(small.axes[0].get_yticks()) == 8 and "ancestry of the top" not in small.axes[0].get_title()
