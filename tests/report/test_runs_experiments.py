"""report/runs.py: analysis pools runs as seeds only when they are one experiment (the config
minus the seed). Real tiny runs: two gymnasium envs from one job file, and plain and PBT runs of
the quickstart; then what the tables, the experiments table and the learning curves say."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `analysis` is a top-level folder of the repository
    sys.path.insert(0, str(REPO))

from analysis import aggregate, plots  # noqa: E402
from analysis.aggregate import Table, mean_curve  # noqa: E402
from analysis.make_figures import experiments_markdown  # noqa: E402

QUICK = ["total_env_steps=2048", "env.num_envs=64", "eval.interval_env_steps=1024", "eval.episodes=2"]
QUICK += ["tournament.interval_env_steps=1024", "eval.final_episodes=0", "log.progress_interval_s=0", "threads=1"]
GYM = ["total_env_steps=2048", "env.num_envs=4", "agent.rollout_steps=256", "eval.interval_env_steps=1024"]
GYM += [
    "eval.episodes=1",
    "eval.final_episodes=0",
    "env.max_episode_steps=100",
    "log.progress_interval_s=0",
    "threads=1",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Finished one-pod runs: jobs/gymnasium.yaml on Acrobot-v1 and on CartPole-v1 (seed 0 each);
    jobs/quickstart.yaml with seeds 0 and 1, and with tournament.mode=pbt (seed 0)."""
    pytest.importorskip("gymnasium")
    from podracer_hpc.config import load_config
    from podracer_hpc.rank.program import train

    root = tmp_path_factory.mktemp("experiments")
    made = {
        "acrobot": ("gymnasium.yaml", [*GYM, "env.gymnasium.id=Acrobot-v1"]),
        "cartpole": ("gymnasium.yaml", [*GYM, "env.gymnasium.id=CartPole-v1"]),
        "qs0": ("quickstart.yaml", [*QUICK, "seed=0"]),
        "qs1": ("quickstart.yaml", [*QUICK, "seed=1"]),
        "pbt": ("quickstart.yaml", [*QUICK, "seed=0", "tournament.mode=pbt"]),
    }
    for name, (job, sets) in made.items():
        assert train(load_config(REPO / "jobs" / job, sets), root / name, quiet=True).complete
    return root


def series(evals: Table, task: str) -> dict[str, set[str]]:
    t = evals.where(task=task)
    return {s: set(t.where(system=s).unique("run")) for s in t.unique("system")}


def test_two_envs_of_one_job_file_are_two_tasks_and_two_experiments(runs):
    rs = aggregate.load_runs([runs / "acrobot", runs / "cartpole"])
    evals = aggregate.eval_table(rs)
    assert sorted(evals.unique("task")) == ["gymnasium:Acrobot-v1", "gymnasium:CartPole-v1"]
    assert series(evals, "gymnasium:Acrobot-v1") == {"gymnasium": {"acrobot"}}  # one run, never "seeds 2"
    assert series(evals, "gymnasium:CartPole-v1") == {"gymnasium": {"cartpole"}}
    assert rs[0].experiment != rs[1].experiment
    fig = plots.learning_curves(evals)
    assert len(fig.axes) == 4  # a row of panels per env: two y axes, not one
    titles = {ax.get_title() for ax in fig.axes}
    assert any("Acrobot-v1" in t for t in titles) and any("CartPole-v1" in t for t in titles), titles
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "gymnasium (1 run)" in legend and not any("2 runs" in s for s in legend), legend
    # a target for the task name still reaches each env, and one for an env id only that env
    assert aggregate.target_for({"gymnasium": -100.0}, "gymnasium:Acrobot-v1") == -100.0
    assert aggregate.target_for({"CartPole-v1": 475.0}, "gymnasium:Acrobot-v1") is None


def test_pbt_runs_of_a_job_are_not_counted_among_its_plain_seeds(runs):
    rs = aggregate.load_runs([runs / "qs0", runs / "qs1", runs / "pbt"])
    evals = aggregate.eval_table(rs)
    got = series(evals, "pendulum")
    assert got == {
        "quickstart [tournament.mode=elegantrl]": {"qs0", "qs1"},  # its two seeds, pooled
        "quickstart [tournament.mode=pbt]": {"pbt"},
    }, got
    table = aggregate.run_table(rs)
    assert {r["run"]: r["system"] for r in table.rows()}["pbt"] == "quickstart [tournament.mode=pbt]"
    md = experiments_markdown(rs)
    assert "| pendulum | quickstart [tournament.mode=elegantrl] | 1 | 2 | 0, 1 | qs0, qs1 |" in md, md
    assert "| pendulum | quickstart [tournament.mode=pbt] | 1 | 1 | 0 | pbt |" in md, md
    assert "quickstart: 2 experiments, not pooled: they differ in tournament.mode (elegantrl, pbt)" in md, md
    legend = [t.get_text() for t in plots.learning_curves(evals).legends[0].get_texts()]
    assert (
        "quickstart [tournament.mode=elegantrl] (2 runs)" in legend
        and "quickstart [tournament.mode=pbt] (1 run)" in legend
    )
    # the plain seeds alone: one experiment, its name unchanged
    alone = aggregate.load_runs([runs / "qs0", runs / "qs1"])
    assert {r.system for r in alone} == {"quickstart"} and not any(r.not_pooled for r in alone)


def test_the_band_stays_within_what_the_runs_took():
    """Three Pendulum-like runs (returns <= 0) close to 0: their t-interval (+-2.5 sd at 3 runs)
    would reach above 0; the band stops at the runs' own highest and lowest value."""
    rows = [
        {
            "system": "s",
            "task": "pendulum",
            "run": f"r{k}",
            "pod": 0,
            "pods": 1,
            "env_steps": x,
            "wall_s": x / 10.0,
            "return_mean": level * (1 - x / 400),
        }
        for k, level in enumerate([-1.0, -3.0, -200.0])
        for x in (0, 100, 200)
    ]
    c = mean_curve(Table.from_rows(rows))
    assert np.isfinite(c["hi"]).all() and (c["hi"] <= 0).all() and (c["hi"] <= c["curves"].max(axis=0)).all()
    assert (c["lo"] >= c["curves"].min(axis=0)).all() and (c["lo"] <= c["mean"]).all()
    unclipped = c["mean"] + aggregate.t95(2) * c["curves"].std(axis=0, ddof=1) / math.sqrt(3)
    assert (unclipped > 0).all()  # what the band would have claimed


@pytest.mark.parametrize(
    "started_in, relative_to",
    [("root", "root"), ("folder", "root"), ("folder", "folder")],
)
def test_the_notebook_runs_from_the_root_and_from_its_folder(runs, monkeypatch, started_in, relative_to):
    """The notebook, executed headless as `jupyter nbconvert --execute` does (nbclient, an
    ipykernel; both in the notebook and test extras), with a relative PODRACER_RUNS: Jupyter
    started in the repository root or in analysis/notebooks (the kernel's folder is always the
    notebook's), the path relative to either."""
    nbformat = pytest.importorskip("nbformat", reason="the notebook extra (pip install -e .[notebook]) runs it")
    nbclient = pytest.importorskip("nbclient", reason="the notebook extra (pip install -e .[notebook]) runs it")
    pytest.importorskip("ipykernel", reason="the notebook extra (pip install -e .[notebook]) runs it")
    import os

    path = REPO / "analysis" / "notebooks" / "podracer_analysis.ipynb"
    start = REPO if started_in == "root" else path.parent
    base = REPO if relative_to == "root" else path.parent
    rel = [os.path.relpath(runs / k, base) for k in ("qs0", "qs1", "pbt")]
    monkeypatch.setenv("PODRACER_RUNS", os.pathsep.join(rel))
    monkeypatch.setenv("PODRACER_TARGET", "-1000")
    monkeypatch.setenv("PWD", str(start))  # where Jupyter was started, as its kernel sees it
    monkeypatch.delenv("PODRACER_LABELS", raising=False)
    monkeypatch.delenv("PODRACER_STUDY", raising=False)
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()  # raises on a cell error (a relative path not found: RunDirError)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "3 runs," in text and "quickstart [tournament.mode=pbt]" in text
    assert "not pooled: they differ in tournament.mode (elegantrl, pbt)" in text


def test_random_search_draws_are_the_seeds_not_another_experiment():
    """A study's random search puts each seed's draws in ``members``: its seeds stay one series."""
    from podracer_hpc.report.runs import experiment_key

    a = {"seed": 10, "members": [{"agent.learning_rate": 5.5e-05}], "agent": {"learning_rate": 3e-05}}
    b = {"seed": 11, "members": [{"agent.learning_rate": 5.5e-04}], "agent": {"learning_rate": 3e-05}}
    assert experiment_key(a, "random_search") == experiment_key(b, "random_search")
    assert experiment_key(a) != experiment_key(b)  # a mixed pool's members are its experiment
    assert experiment_key(a, "random_search") != experiment_key(
        {**b, "agent": {"learning_rate": 1e-3}}, "random_search"
    )


def test_a_key_one_version_did_not_write_is_not_another_experiment(tmp_path):
    """Runs of one system where only one config has a key (a newer version's, at its default) are
    seeds of one experiment; a key both have with two values splits them."""
    from podracer_hpc.report.runs import Run, split_experiments

    def run(name, config):
        return Run(path=tmp_path / name, system="dp", run=name, config=config, logs={}, summary=None, attrs={})

    old = run("a", {"seed": 0, "agent": {"learning_rate": 1e-3}})
    new = run("b", {"seed": 1, "agent": {"learning_rate": 1e-3}, "tournament": {"initial_hparams": "auto"}})
    assert {r.system for r in split_experiments([old, new])} == {"dp"} and not new.not_pooled
    other = run("c", {"seed": 2, "agent": {"learning_rate": 3e-4}, "tournament": {"initial_hparams": "auto"}})
    names = {r.run: r.system for r in split_experiments([run("d", new.config), other])}
    assert names["d"] != names["c"] and "agent.learning_rate" in other.not_pooled
