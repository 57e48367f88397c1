"""`podracer study` under the local executor: bad study files are refused before anything runs; a
tiny study runs every point, writes the scaling figure and table with one series per system, skips
what is done when run again and grows; the stock-trading variant times a cumulative-return
threshold; the notebook draws the study folder.

Real runs (mpiexec, the pods' own logs), kept tiny for 2 cores: Pendulum, 64 envs per pod, 4k env
steps. RLlib takes part only where .venv-rllib exists (tests/system/test_rllib_baseline.py says why it
skips).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from helpers import mpiexec_or_skip, rank_pids, wait_for  # noqa: E402

from analysis import aggregate, plots  # noqa: E402
from podracer_hpc.cli import main as cli_main  # noqa: E402

TINY = [
    "env.num_envs=64",
    "total_env_steps=4096",
    "eval.interval_env_steps=2048",
    "eval.episodes=4",
    "log.progress_interval_s=0",
    "threads=1",
    "agent.update_epochs=2",
]


def tiny_study(tmp_path: Path, name: str = "tiny", **over) -> Path:
    """A study file: two podracer systems (a tournament and independent pods), points 1 and 2."""
    study = {
        "name": name,
        "task": "pendulum",
        "target": -5000,
        "points": [1, 2],
        "seeds": [0],  # -5000: every evaluation (>= -3254)
        "out": str(tmp_path / name),
        "systems": {
            "podracer": {
                "job": "jobs/pendulum_fast.yaml",
                "set": TINY + ["tournament.mode=elegantrl", "tournament.interval_env_steps=2048"],
            },
            "independent": {"kind": "podracer", "job": "jobs/pendulum_fast.yaml", "set": TINY},
        },
    }
    study.update(over)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def study(*args: str) -> int:
    return cli_main(["study", *args])


@pytest.mark.parametrize(
    "edit,message",
    [
        ({"points": [0, 2]}, "points must be >= 1"),
        ({"points": "many"}, "points: expected a list, got 'many'"),
        ({"target": None}, "target is required"),
        ({"metric": "cumulative_return"}, "metric cumulative_return is the stock-trading target"),
        ({"sytems": {}}, "unknown config key 'sytems'. Did you mean 'systems'?"),
        ({"systems": {"mine": {"job": "jobs/pendulum_fast.yaml"}}}, "kind must be one of podracer, rllib"),
        ({"systems": {"podracer": {"job": "jobs/nope.yaml"}}}, "jobs/nope.yaml not found"),
        (
            {"systems": {"podracer": {"job": "jobs/pendulum_fast.yaml", "set": ["agent.learning_rat=1"]}}},
            "unknown config key 'agent.learning_rat'",
        ),
        ({"systems": {"podracer": {"job": "jobs/cartpole.yaml"}}}, "its job trains 'cartpole'"),
        (
            {"systems": {"rllib": {"job": "jobs/rllib/pendulum.yaml", "python": "/nonexistent/python"}}},
            "/nonexistent/python not found: create .venv-rllib",
        ),
        ({"resources": {"pods_per_node": 2}, "points": [3]}, "3 pods do not split evenly over 2 nodes"),
        (
            {"systems": {"podracer": {"job": "jobs/pendulum_fast.yaml", "scheme": "ensemble"}}},
            "scheme must be one of pool, best_of_n, random_search, data_parallel",
        ),
        ({"device_reference": "nope"}, "device_reference 'nope' is not a system of this study"),
        ({"allreduce": {"gbytes_per_s": 0}}, "gbytes_per_s must be > 0"),
        (
            {"systems": {"rllib": {"job": "jobs/rllib/pendulum.yaml", "scheme": "best_of_n"}}},
            "scheme best_of_n is podracer's",
        ),
        (
            {"systems": {"podracer": {"job": "jobs/pendulum_fast.yaml", "devices_per_pod": 2}}, "points": [2, 3]},
            "point 3 is not a whole number of pods of 2 devices (devices_per_pod)",
        ),
        (
            {"systems": {"dp": {"job": "jobs/pendulum_fast.yaml", "scheme": "data_parallel", "devices_per_pod": 2}}},
            "data_parallel is already one pod of all",
        ),
        (
            {"systems": {"rllib": {"job": "jobs/rllib/pendulum.yaml", "devices_per_pod": 2}}, "points": [2]},
            "devices_per_pod is podracer's",
        ),
        (
            {"systems": {"podracer": {"job": "jobs/pendulum_fast.yaml", "devices_per_pod": 0}}},
            "devices_per_pod must be",
        ),
        (
            {"systems": {"podracer": {"job": "jobs/pendulum_fast.yaml", "lr_scaling": "linear"}}},
            "lr_scaling must be one of none, sqrt",
        ),
        (
            {"systems": {"rs": {"job": "jobs/pendulum_fast.yaml", "scheme": "random_search", "lr_scaling": "sqrt"}}},
            "random search draws each pod's learning rate itself",
        ),
        (
            {"systems": {"rllib": {"job": "jobs/rllib/pendulum.yaml", "lr_scaling": "sqrt"}}},
            "lr_scaling (RLlib's own: --set resources.lr_scaling=...) is podracer's",
        ),
        ({"seeds": [0, 1]}, "seeds 0 and 1 share pods at 2 pods (pod r of a run trains with its seed + r"),
        ({"seeds": [0, 5], "points": [1, 8]}, "Space the seeds at least 8 apart, e.g. seeds: [0, 10]"),
    ],
)
def test_bad_study_files_are_refused_before_anything_runs(tmp_path, capsys, edit, message):
    path = tiny_study(tmp_path, **edit)
    assert study(str(path), "--executor", "local") == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("podracer study: error:"), err
    assert not (tmp_path / "tiny").exists()  # nothing ran, nothing was written


@pytest.mark.parametrize(
    "seeds, systems",
    [
        ([0, 2], None),  # 2 apart at 2 pods: seed 0 trains pods with seeds 0-1, seed 2 with 2-3
        ([0, 1], {"dp": {"job": "jobs/pendulum_fast.yaml", "scheme": "data_parallel"}}),  # one learner a run
        ([0, 1], {"rllib": {"job": "jobs/rllib/pendulum.yaml"}}),  # one seed a run
    ],
)
def test_seeds_that_share_no_pod_are_accepted(tmp_path, seeds, systems):
    from podracer_hpc.tools.study import load_study

    st = load_study(tiny_study(tmp_path, seeds=seeds, **({"systems": systems} if systems else {})))
    assert sorted({p.seed for p in st.runs()}) == seeds


def test_pods_sharing_a_gpu_run_locally_only(tmp_path):
    from podracer_hpc.tools.study import StudyError, check, load_study

    st = load_study(tiny_study(tmp_path, resources={"gpus_per_pod": 0.5}, points=[2, 4]))
    assert [(p.pods, p.gpus) for p in st.runs()][:2] == [(2, 1.0), (4, 2.0)]
    with pytest.raises(StudyError, match="runs with --executor local only"):
        check(st, "slurm")


def test_a_point_asks_slurm_for_nodes_and_runs_on_one_machine_locally(tmp_path):
    from podracer_hpc.tools.study import load_study, podracer_request, rllib_sets

    st = load_study(
        tiny_study(
            tmp_path,
            resources={"pods_per_node": 2, "cpus_per_pod": 4},
            points=[1, 4],
            systems={
                "rllib": {"job": "jobs/rllib/pendulum.yaml", "seeds": [7], "gpus_per_pod": 1},
                "podracer": {"job": "jobs/pendulum_fast.yaml", "seeds": [7], "gpus_per_pod": 1},
            },
        )
    )
    pt, po = (next(p for p in st.runs() if (p.system.name, p.pods) == (name, 4)) for name in ("rllib", "podracer"))
    assert (pt.pods, pt.seed, pt.nodes, pt.tasks_per_node, pt.cpus, pt.gpus, pt.gpus_per_node) == (4, 7, 2, 2, 16, 4, 2)
    assert pt.resources("slurm")["nodes"] == 2 and pt.resources("local")["nodes"] == 1
    assert pt.resources("local")["devices_per_learner"] == 4  # RLlib's learners all-reduce over every device
    assert rllib_sets(st, pt, "slurm")[-5:] == [
        "seed=7",
        "resources.pods=4",
        "resources.gpus_per_pod=1",
        "resources.cpus=16",
        "resources.nodes=2",
    ]
    assert (po.nodes, po.tasks_per_node, po.gpus_per_node) == (pt.nodes, pt.tasks_per_node, pt.gpus_per_node)
    req = podracer_request(st, po, "slurm")
    assert (req.nodes, req.tasks_per_node, req.gpus_per_node, req.run_dir) == (2, 2, 2, str(po.run_dir))
    assert podracer_request(st, po, "local").tasks_per_node == 4  # all pods here, one machine


@pytest.mark.parametrize(
    ("system", "devices", "layout"),
    [
        ({}, 4, "4 pods"),
        ({}, 1, "1 pod"),
        ({"devices_per_pod": 2}, 16, "8 pods of 2 devices' envs each"),
        ({"scheme": "data_parallel"}, 16, "one learner with 16 x the envs"),
        (
            {"kind": "rllib", "job": "jobs/rllib/pendulum.yaml", "python": "/nonexistent/python"},
            4,
            "RLlib on 4 devices",
        ),
    ],
)
def test_a_point_says_what_runs_on_its_devices(tmp_path, system, devices, layout):
    """The progress line names the ranks that run, not the point's devices: 16 devices as pods of 2
    run 8 pods; one learner of 16 devices runs one."""
    from podracer_hpc.tools.study import load_study

    spec = {"kind": "podracer", "job": "jobs/pendulum_fast.yaml", **system}
    (pt,) = load_study(tiny_study(tmp_path, points=[devices], systems={"s": spec})).runs()
    assert pt.layout == layout


@pytest.mark.parametrize(
    "system, devices, learning_rate, ranks",
    [
        ({"scheme": "data_parallel"}, 8, None, 1),  # the job's learning rate (lr_scaling none)
        ({"scheme": "data_parallel", "lr_scaling": "sqrt"}, 8, 2e-3 * 8**0.5, 1),
        ({"devices_per_pod": 2, "lr_scaling": "sqrt"}, 4, 2e-3 * 2**0.5, 2),
        ({"devices_per_pod": 4, "lr_scaling": "sqrt", "set": ["agent.learning_rate=1e-3"]}, 8, 2e-3, 2),
        ({"lr_scaling": "sqrt"}, 4, None, 4),  # pods of one device: nothing to scale
    ],
)
def test_a_learner_of_several_devices_scales_its_learning_rate_by_sqrt_devices(
    tmp_path, system, devices, learning_rate, ranks
):
    """``lr_scaling: sqrt`` (RLlib's rule for its learners): a learner whose envs stand for m
    devices trains at the job's (or the system's) learning rate x sqrt(m); pods of one device keep it."""
    from podracer_hpc.tools.study import load_study, podracer_request

    spec = {"kind": "podracer", "job": "jobs/pendulum_fast.yaml", **system}
    st = load_study(tiny_study(tmp_path, points=[devices], systems={"s": spec}))
    (pt,) = st.runs()
    assert pt.tasks_per_node == ranks
    sets = podracer_request(st, pt, "local").overrides
    lrs = [float(x.split("=", 1)[1]) for x in sets if x.startswith("agent.learning_rate=")]
    if learning_rate is None:
        assert lrs == []
    else:
        assert lrs[-1] == pytest.approx(learning_rate, rel=1e-5)  # the last one set wins


def test_a_missing_or_broken_study_file_is_refused(tmp_path, capsys):
    assert study(str(tmp_path / "none.yaml"), "--executor", "local") == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("points: [1, 2\n")
    assert study(str(tmp_path / "bad.yaml"), "--executor", "local") == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert study(str(tiny_study(tmp_path)), "--executor", "local", "--set", "seeds=[-1]") == 2
    assert "seeds must be >= 0" in capsys.readouterr().err


def _series(fig) -> dict[str, list[float]]:
    """Median lines of the first panel: label -> x values."""
    return {
        ln.get_label(): [float(x) for x in ln.get_xdata()]
        for ln in fig.axes[0].lines
        if not ln.get_label().startswith("_")
    }


def test_tiny_local_study_runs_every_point_then_skips_and_grows(tmp_path, capfd):
    mpiexec_or_skip()
    path = tiny_study(tmp_path)
    out = tmp_path / "tiny"
    # first only 1 pod: then grown to points 1 and 2 (the 1-pod runs are skipped)
    assert study(str(path), "--executor", "local", "--set", "points=[1]") == 0
    first = capfd.readouterr()
    assert "study tiny [1/2] podracer pods=1 seed=0: running" in first.err
    assert study(str(path), "--executor", "local") == 0
    cap = capfd.readouterr()
    assert "[1/4] podracer pods=1 seed=0: done, skipped" in cap.err
    assert "[2/4] podracer pods=2 seed=0: running (2 pods, 2 CPUs, 0 GPUs)" in cap.err
    assert "[3/4] independent pods=1 seed=0: done, skipped" in cap.err
    summary = json.loads(cap.out.strip().splitlines()[-1])
    assert summary["done"] == summary["runs"] == 4 and summary["failed"] == []
    assert "| pendulum | independent | 2 |" in cap.out  # the table is printed

    res = out / "results"
    for f in ("scaling.png", "scaling.pdf", "scaling.csv", "scaling.md", "runs.csv", "evals.csv", "summary.json"):
        assert (res / f).stat().st_size > 100, f
    sc = aggregate.read_csv(res / "scaling.csv")
    assert [(r["system"], r["pods"]) for r in sc.rows()] == [
        ("podracer", 1),
        ("podracer", 2),
        ("independent", 1),
        ("independent", 2),
    ]
    assert set(sc["reference"].tolist()) == {"podracer"} and sc["reached"].tolist() == [1, 1, 1, 1]
    assert np.all(np.isfinite(sc["time_to_target_median"])) and np.all(sc["steps_per_s_median"] > 0)
    assert sc.where(system="podracer")["time_ratio"].tolist() == [1.0, 1.0]
    rt = aggregate.read_csv(res / "runs.csv")
    assert sorted(zip(rt["system"].tolist(), rt["pods"].tolist(), rt["cpus"].tolist())) == [
        ("independent", 1, 1.0),
        ("independent", 2, 2.0),
        ("podracer", 1, 1.0),
        ("podracer", 2, 2.0),
    ]
    two = json.loads((out / "runs" / "podracer" / "p2-s0" / "resources.json").read_text())
    assert two == {
        "system": "podracer",
        "kind": "podracer",
        "pods": 2,
        "gpus": 0.0,
        "cpus": 2,
        "nodes": 1,
        "seed": 0,
        "executor": "local",
        "scheme": "pods",
        "study_scheme": "pool",
        "devices_per_learner": 1,
    }
    # the figure: one median series per system, over the points
    fig = plots.scaling(rt)
    assert _series(fig) == {
        "podracer": [1.0, 2.0],
        "podracer ideal": [1.0, 2.0],
        "independent": [1.0, 2.0],
        "independent ideal": [1.0, 2.0],
    }
    assert plots.text_overlaps(fig) == []

    # run again: everything is done, nothing runs, the report is rewritten
    assert study(str(path), "--executor", "local") == 0
    again = capfd.readouterr().err
    assert again.count("done, skipped") == 4 and "running" not in again

    # the notebook draws the study folder
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb_path = REPO / "analysis" / "notebooks" / "podracer_analysis.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    env_before = dict(os.environ)
    os.environ["PODRACER_STUDY"] = str(out)
    try:
        nbclient.NotebookClient(
            nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(nb_path.parent)}}
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "study tiny: 4 finished runs" in text and "| pendulum | independent | 2 |" in text
    assert sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs) >= 2


def test_trading_study_times_a_cumulative_return_threshold(tmp_path, capfd):
    """The stock-trading variant: time to a cumulative return on the training window (tiny synthetic run)."""
    mpiexec_or_skip()
    sets = [
        "env.trading.synthetic_stocks=3",
        "env.trading.synthetic_days=300",
        "env.trading.end=",
        "env.num_envs=16",
        "env.max_episode_steps=20",
        "total_env_steps=2048",
        "agent.hidden_sizes=[16, 16]",
        "agent.rollout_steps=16",
        "eval.interval_env_steps=1024",
        "eval.episodes=2",
        "tournament.mode=none",
        "log.progress_interval_s=0",
        "threads=1",
    ]
    path = tiny_study(
        tmp_path,
        name="trade",
        task="stock_trading",
        metric="cumulative_return",
        target=-0.5,
        points=[1],
        systems={"podracer": {"job": "jobs/trading_quickstart.yaml", "set": sets}},
    )
    assert study(str(path), "--executor", "local") == 0, capfd.readouterr().err
    res = tmp_path / "trade" / "results"
    ev = aggregate.read_csv(res / "evals.csv")
    assert len(ev) >= 2
    np.testing.assert_allclose(ev["cumulative_return"], ev["return_mean"] / 100.0)  # reward: % of initial cash
    rt = aggregate.read_csv(res / "runs.csv")
    assert rt["metric"].tolist() == ["cumulative_return"] and rt["target"].tolist() == [-0.5]
    first = ev["wall_s"][np.flatnonzero(ev["cumulative_return"] >= -0.5)[0]]
    assert rt["wall_s_to_target"].tolist() == [first]  # the first evaluation at or above -50%
    sc = aggregate.read_csv(res / "scaling.csv")
    assert sc["metric"].tolist() == ["cumulative_return"] and sc["reached"].tolist() == [1]
    # a threshold no run reaches: "not reached", with the bound
    table = aggregate.run_table(
        aggregate.load_runs([], [f"podracer={tmp_path / 'trade' / 'runs' / 'podracer' / 'p1-s0'}"]),
        {"stock_trading": 10.0},
        "cumulative_return",
    )
    s = aggregate.scaling_table(table)
    assert s["reached"].tolist() == [0] and math.isinf(s["time_to_target_median"][0])
    assert "not reached (> " in aggregate.scaling_markdown(s)


PRIOR = "tournament.hparam_space={learning_rate: [1.0e-4, 1.0e-2, true], ent_coef: [0.0, 0.01]}"


def test_the_alternatives_and_dexpbt_run_end_to_end_in_device_equivalent_time(tmp_path, capfd):
    """Best-of-N (the device reference at 1 pod), random search over the PBT prior, one learner
    with N times the envs, and a DexPBT pool: each runs, and each appears in the device-equivalent
    table, the run table and the figure."""
    mpiexec_or_skip()
    from podracer_hpc.config import load_config
    from podracer_hpc.pool.hparams import prior_draw
    from podracer_hpc.report.runs import load_run

    systems = {
        "best_of_n": {"job": "jobs/pendulum_fast.yaml", "scheme": "best_of_n", "set": TINY},
        "random_search": {
            "job": "jobs/pendulum_fast.yaml",
            "scheme": "random_search",
            "set": [*TINY, PRIOR],
            "points": [2],
        },
        "data_parallel": {"job": "jobs/pendulum_fast.yaml", "scheme": "data_parallel", "set": TINY, "points": [2]},
        "dexpbt": {
            "kind": "podracer",
            "job": "jobs/pendulum_fast.yaml",
            "set": [*TINY, PRIOR, "tournament.mode=dexpbt", "tournament.interval_env_steps=2048"],
            "points": [2],
        },
        "pods_of_2": {  # 4 devices: 2 pods of 2 devices each, an ElegantRL tournament between them
            "kind": "podracer",
            "job": "jobs/pendulum_fast.yaml",
            "set": [*TINY, "tournament.mode=elegantrl", "tournament.interval_env_steps=2048"],
            "points": [4],
            "devices_per_pod": 2,
        },
    }
    path = tiny_study(tmp_path, name="alt", systems=systems, device_reference="best_of_n")
    assert study(str(path), "--executor", "local") == 0
    cap = capfd.readouterr()
    summary = json.loads(cap.out.strip().splitlines()[-1])
    assert summary["done"] == summary["runs"] == 6 and summary["failed"] == []
    assert "device-equivalent time to return -5000" in cap.out
    runs = tmp_path / "alt" / "runs"

    # random search starts where a PBT pool would: pod 0 with the job's values, pod 1 with its own
    # draw from the prior, seeded by its seed (0 + 1)
    rs = load_run(runs / "random_search" / "p2-s0")
    space = {"learning_rate": (1e-4, 1e-2, True), "ent_coef": (0.0, 0.01)}
    job = load_config("jobs/pendulum_fast.yaml", TINY).agent
    first, second = (rs.logs[r]["attrs"]["config"]["agent"] for r in (0, 1))
    assert (first["learning_rate"], first["ent_coef"]) == (pytest.approx(job.learning_rate), job.ent_coef)
    assert second["learning_rate"] == pytest.approx(prior_draw(space, 1)["learning_rate"])
    assert second["ent_coef"] == pytest.approx(prior_draw(space, 1)["ent_coef"])
    assert rs.config["tournament"]["mode"] == "none"
    # it ended at the target (stop_at_target, the default): where its first pod reached it
    assert rs.config["eval"]["stop_at_return"] == -5000.0
    ended = json.loads((runs / "random_search" / "p2-s0" / "summary.json").read_text())["ended_at_target"]
    assert ended["env_steps"] < rs.config["total_env_steps"]
    # one learner with 2 x the envs: one rank, 2 x 64 envs, 2 x the env steps
    dp = load_run(runs / "data_parallel" / "p2-s0")
    assert list(dp.logs) == [0] and dp.config["env"]["num_envs"] == 128 and dp.config["total_env_steps"] == 8192
    assert (dp.pods, dp.scheme) == (2, "data_parallel") and dp.logs[0]["attrs"]["param_count"] > 0
    # DexPBT held its rounds
    dx = load_run(runs / "dexpbt" / "p2-s0")
    assert dx.mode == "dexpbt" and all(len(log["tournament"]["round"]) >= 1 for log in dx.logs.values())
    # pods of 2 devices: 2 ranks at 4 devices, each 2 x the envs and 2 x the env steps, meeting
    # every 2 x 2,048 env steps (per device, the rounds of a pod of one device)
    po = load_run(runs / "pods_of_2" / "p4-s0")
    assert list(po.logs) == [0, 1] and (po.pods, po.scheme, po.devices_per_learner) == (4, "pods", 2)
    assert po.config["env"]["num_envs"] == 128 and po.config["total_env_steps"] == 8192
    assert po.config["tournament"]["interval_env_steps"] == 4096 and po.mode == "elegantrl"
    assert all(len(log["tournament"]["round"]) >= 1 for log in po.logs.values())

    res = tmp_path / "alt" / "results"
    for f in ("device.md", "device_time.png", "device_time.pdf", "scaling.png"):
        assert (res / f).stat().st_size > 100, f
    rt = aggregate.read_csv(res / "runs.csv")
    assert set(rt["device_step_source"].tolist()) == {"best_of_n at 1 pod (1 run)"}
    assert np.all(np.isfinite(rt["device_s_to_target"])) and np.all(rt["device_s_to_target"] > 0)
    d = next(r for r in rt.rows() if r["system"] == "data_parallel")
    assert d["env_steps_per_pod_to_target"] == d["env_steps_to_target"] / 2 and d["allreduce_s_to_target"] > 0
    o = next(r for r in rt.rows() if r["system"] == "pods_of_2")
    assert o["devices_per_learner"] == 2 and o["env_steps_per_pod_to_target"] == o["env_steps_to_target"] / 2
    assert o["allreduce_s_to_target"] > 0 and o["device_s_to_target"] == pytest.approx(
        o["env_steps_per_pod_to_target"] * o["device_step_s"] + o["round_s_to_target"] + o["allreduce_s_to_target"]
    )
    x = next(r for r in rt.rows() if r["system"] == "dexpbt")
    assert x["device_s_to_target"] == pytest.approx(
        x["env_steps_per_pod_to_target"] * x["device_step_s"] + x["round_s_to_target"]
    )
    md = (res / "device.md").read_text()
    for name, pods in (
        ("best_of_n", 1),
        ("best_of_n", 2),
        ("random_search", 2),
        ("data_parallel", 2),
        ("dexpbt", 2),
        ("pods_of_2", 4),
    ):
        assert f"| pendulum | {name} | {pods} | 1 | 1/1 |" in md, name
    fig = plots.device_time(
        aggregate.run_table(
            aggregate.load_runs([], [f"{r['system']}={r['run_dir']}" for r in rt.rows()]),
            -5000.0,
            device=aggregate.DeviceModel(reference="best_of_n"),
        )
    )
    names = {ln.get_label() for ln in fig.axes[0].lines}
    assert {"best_of_n", "best_of_n ideal", "random_search", "data_parallel", "dexpbt", "pods_of_2"} <= names


def test_a_dry_run_plans_without_rllib_and_says_which_system_it_would_skip(tmp_path, capsys):
    """No RLlib venv here: the dry run still plans every point (exit 0), names the system a run here
    would have to skip and why; the real run refuses it (exit 2) before anything runs."""
    rllib = {"job": "jobs/rllib/pendulum.yaml", "python": "/nonexistent/python"}
    path = tiny_study(tmp_path, systems={"podracer": {"job": "jobs/pendulum_fast.yaml", "set": TINY}, "rllib": rllib})
    assert study(str(path), "--executor", "local", "--dry-run") == 0
    out = capsys.readouterr().out
    skip = [line for line in out.splitlines() if line.startswith("# skipped here:")]
    assert len(skip) == 1 and "system rllib (/nonexistent/python not found: create .venv-rllib" in skip[0], out
    assert out.count("[skipped: not installed here]") == 2 and out.count("[to run]") == 2, out  # points 1, 2
    assert "/nonexistent/python -m baselines.rllib.train" in out  # the command it would run, once installed
    assert study(str(path), "--executor", "local") == 2
    assert "/nonexistent/python not found" in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()  # neither wrote anything


@pytest.mark.parametrize("path", sorted((REPO / "jobs" / "studies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_file_plans_its_runs_in_a_dry_run(path, tmp_path, capsys):
    """A study file we ship loads (its seeds spaced, its jobs and overrides valid) and plans every
    run it names without writing anything: a typo in one fails here, not an hour into a user's study."""
    out_dir = tmp_path / "study"
    assert study(str(path), "--executor", "local", "--dry-run", "--set", f"out={out_dir}") == 0
    out = capsys.readouterr().out
    assert out.count("[to run]") + out.count("[skipped: not installed here]") >= 2, out
    assert not out_dir.exists()


def test_a_killed_study_stops_the_run_it_started_and_says_how_to_resume(tmp_path):
    """kill (SIGTERM) on a local study: the run under way, started in a session of its own, stops
    with its checkpoints instead of training on without the study; the study exits 130 and says
    that the same command resumes."""
    mpiexec_or_skip()
    long = [*TINY, "total_env_steps=100000000"]
    path = tiny_study(
        tmp_path,
        points=[2],
        systems={"independent": {"kind": "podracer", "job": "jobs/pendulum_fast.yaml", "set": long}},
    )
    run = tmp_path / "tiny" / "runs" / "independent" / "p2-s0"
    env = {k: v for k, v in os.environ.items() if k != "PODRACER_COMM"}
    cmd = [sys.executable, "-m", "podracer_hpc.cli", "study", str(path), "--executor", "local"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = lambda: len(list((run / "logs").glob("*.h5"))) == 2  # noqa: E731
        wait_for(lambda: started() or proc.poll() is not None, 120, "both ranks' logs")
        assert proc.poll() is None and len(rank_pids(run)) >= 2  # the ranks (and the relay) run
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "run the same command again to resume" in err, err
        wait_for(lambda: rank_pids(run) == [], 10, "the run's ranks to end")
    finally:  # whatever failed, leave no process behind
        proc.kill()
        for pid in rank_pids(run):
            os.kill(pid, signal.SIGKILL)
    assert sorted(p.name for p in (run / "checkpoints").glob("rank*.safetensors")) == [
        "rank0.safetensors",
        "rank1.safetensors",
    ]
