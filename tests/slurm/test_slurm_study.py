"""`podracer study --executor slurm` on a real local Slurm cluster (4 logical nodes): one job per run
with the point's nodes, then a report job (afterany) that writes the figure and the table; an RLlib
point as a Ray cluster over its nodes (where .venv-rllib exists)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from podracer_hpc.files.h5log import read_log

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
TINY = [
    "env.num_envs=64",
    "total_env_steps=4096",
    "eval.interval_env_steps=2048",
    "eval.episodes=4",
    "log.progress_interval_s=0",
    "threads=1",
    "agent.update_epochs=2",
]


def study(cluster, path: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "podracer_hpc.cli", "study", str(path), "--executor", "slurm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=cluster.env,
    )


def test_tiny_study_through_slurm(slurm_cluster, tmp_path):
    from analysis import aggregate, plots

    out = tmp_path / "study"
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "task": "pendulum",
                "target": -5000,
                "points": [1, 2],
                "seeds": [0],
                "out": str(out),
                "resources": {"pods_per_node": 1},  # 2 pods = 2 nodes x 1 pod: one MPI world over two logical nodes
                "slurm": {"time_min": 5, "serial": True},  # one job at a time on the one-host cluster
                "systems": {
                    "podracer": {
                        "job": "jobs/pendulum_fast.yaml",
                        "set": TINY + ["tournament.mode=elegantrl", "tournament.interval_env_steps=2048"],
                    },
                    "independent": {"kind": "podracer", "job": "jobs/pendulum_fast.yaml", "set": TINY},
                },
            },
            sort_keys=False,
        )
    )  # the systems' order is the study's: podracer is the reference
    r = study(slurm_cluster, path, "--wait")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    jobs = re.findall(r"submitted Slurm job (\d+) \((\d) nodes? x 1 pod", r.stderr)
    assert [n for _, n in jobs] == ["1", "2", "1", "2"], r.stderr
    m = re.search(r"report job (\d+) runs after ([\d, ]+) \(afterany\)", r.stderr)
    assert m and m.group(2).split(", ") == [j for j, _ in jobs], r.stderr
    assert (out / f"report-{m.group(1)}.out").exists()
    assert "| pendulum | independent | 2 |" in r.stdout  # the table, as the report job printed it

    sc = aggregate.read_csv(out / "results" / "scaling.csv")
    assert [(x["system"], x["pods"], x["nodes"]) for x in sc.rows()] == [
        ("podracer", 1, 1),
        ("podracer", 2, 2),
        ("independent", 1, 1),
        ("independent", 2, 2),
    ]
    assert sc["reached"].tolist() == [1, 1, 1, 1]
    rt = aggregate.read_csv(out / "results" / "runs.csv")
    fig = plots.scaling(rt)
    series = {ln.get_label(): list(ln.get_xdata()) for ln in fig.axes[0].lines if not ln.get_label().startswith("_")}
    assert series == {"podracer": [1, 2], "podracer ideal": [1, 2], "independent": [1, 2], "independent ideal": [1, 2]}
    assert (out / "results" / "scaling.png").stat().st_size > 1000
    # the 2-pod run was one MPI world over two nodes, in the job the study submitted for it
    logs = [read_log(p)["attrs"] for p in sorted((out / "runs" / "podracer" / "p2-s0" / "logs").glob("*_rank*.h5"))]
    assert len(logs) == 2
    assert {a["slurm"]["SLURM_NODEID"] for a in logs} == {"0", "1"}
    assert logs[0]["slurm"]["SLURM_JOB_ID"] == jobs[1][0]

    # again: every run is done and skipped; only a report job is queued (no dependency)
    r = study(slurm_cluster, path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("done, skipped") == 4 and "submitted Slurm job" not in r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["jobs"] == [] and last["report_job"]


RLLIB_PY = REPO / ".venv-rllib" / "bin" / "python"


@pytest.mark.skipif(
    not RLLIB_PY.exists(),
    reason=".venv-rllib is missing (baselines/rllib/README.md says how to "
    "create it); the RLlib point through Slurm needs ray[rllib]",
)
def test_an_rllib_point_runs_as_a_ray_cluster_over_its_nodes(slurm_cluster, tmp_path):
    """An RLlib point of 2 pods-equivalent on 2 nodes: rllib.sbatch starts Ray on both, 2 learners."""
    from analysis import aggregate

    out = tmp_path / "study"
    path = tmp_path / "rl.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "rl",
                "task": "pendulum",
                "target": -5000,
                "points": [2],
                "seeds": [0],
                "out": str(out),
                "resources": {"pods_per_node": 1},
                "slurm": {"time_min": 10, "serial": True},
                "systems": {
                    "rllib": {
                        "job": "jobs/rllib/pendulum.yaml",
                        "max_wall_s": 120,
                        "set": [
                            "total_env_steps=2048",
                            "eval.interval_env_steps=1024",
                            "eval.episodes=4",
                            "resources.env_runners_per_pod=1",
                            "resources.envs_per_pod=4",
                            "rllib.training.train_batch_size_per_learner=512",
                        ],
                    }
                },
            },
            sort_keys=False,
        )
    )
    r = study(slurm_cluster, path, "--wait", timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert re.search(r"rllib pods=2 seed=0: submitted Slurm job \d+ \(2 nodes x 1 pod", r.stderr), r.stderr
    run = out / "runs" / "rllib" / "p2-s0"
    a = read_log(next((run / "logs").glob("*_rank0.h5")))["attrs"]
    assert a["world_size"] == 2 and a["resources"]["num_learners"] == 2 and a["resources"]["nodes"] == 2
    assert a["slurm"]["SLURM_JOB_ID"] and "rllib: 2 of 2 Ray nodes up" in next(run.glob("slurm-*.out")).read_text()
    sc = aggregate.read_csv(out / "results" / "scaling.csv")
    assert [(x["system"], x["pods"], x["nodes"], x["reached"]) for x in sc.rows()] == [("rllib", 2, 2, 1)]
