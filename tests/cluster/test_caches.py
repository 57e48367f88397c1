"""Per-node compile caches (cluster/caches.py): node-local directories, the job's own settings kept,
the container image's given way (pyxis applies an image's ENV over the job's), Warp kernels baked
into the image seeded into the node's cache.

The precedence test runs the batch script's own line (from ``sbatch_text``) in bash, then a pod's
start in a fresh Python whose environment is the job's with the image's ENV applied over it, as
pyxis does; with an image built by ``make container-gpu`` from this tree it also runs inside it
under ch-run (``--set-env``: the image's ENV over the job's, the same precedence).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CACHE_HOST, env_without_caches

from podracer_hpc.cluster.caches import (
    IMAGE_CACHE,
    JOB_CACHE_VARS,
    JOB_VALUE,
    node_caches,
    node_name,
    record_line,
    seed_warp_cache,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def env():
    return env_without_caches()


def test_node_caches_go_under_the_cache_dir_per_host(env, tmp_path):
    e = {**env, "PODRACER_CACHE_DIR": str(tmp_path), "TRITON_CACHE_DIR": "/mine"}
    set_now = node_caches(e)
    assert e["WARP_CACHE_PATH"] == str(tmp_path / CACHE_HOST / "warp") == set_now["WARP_CACHE_PATH"]
    assert e["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / CACHE_HOST / "inductor")
    assert e["TRITON_CACHE_DIR"] == "/mine" and "TRITON_CACHE_DIR" not in set_now  # the user's wins
    assert node_caches(dict(env)) == {}


@pytest.mark.parametrize(("hostname", "short"), [("node7.cluster.example", "node7"), ("dgx-a01", "dgx-a01")])
def test_a_nodes_name_is_its_short_host_name(monkeypatch, env, tmp_path, hostname, short):
    monkeypatch.setattr("socket.gethostname", lambda: hostname)
    assert node_name() == short
    e = {**env, "PODRACER_CACHE_DIR": str(tmp_path)}
    node_caches(e)
    assert e["CUDA_CACHE_PATH"] == str(tmp_path / short / "cuda")  # the domain never splits a node's caches


def test_the_images_own_cache_gives_way_and_the_jobs_does_not(env, tmp_path):
    image = {IMAGE_CACHE: "/opt/podracer/cache", "WARP_CACHE_PATH": "/opt/podracer/cache/warp"}
    e = {**env, "PODRACER_CACHE_DIR": str(tmp_path), **image, "TORCHINDUCTOR_CACHE_DIR": "/scratch/me/inductor"}
    node_caches(e)
    assert e["WARP_CACHE_PATH"] == str(tmp_path / CACHE_HOST / "warp")  # under the image's cache: replaced
    assert e["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/me/inductor"  # no record: a set variable is the job's
    # the batch script's record: the job set only TRITON_CACHE_DIR (its value recorded); whatever
    # is set here besides (the image's ENV, pyxis's precedence) gives way
    e = {**env, "PODRACER_CACHE_DIR": str(tmp_path), JOB_CACHE_VARS: "TRITON_CACHE_DIR "}
    e |= {JOB_VALUE + "TRITON_CACHE_DIR": "/mine", "TRITON_CACHE_DIR": "/usr/local/triton"}
    e |= {"TORCHINDUCTOR_CACHE_DIR": "/usr/local/inductor", "CUDA_CACHE_PATH": "/c"}
    node_caches(e)
    assert e["TRITON_CACHE_DIR"] == "/mine"
    assert e["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / CACHE_HOST / "inductor")
    assert e["CUDA_CACHE_PATH"] == str(tmp_path / CACHE_HOST / "cuda")
    assert e["WARP_CACHE_PATH"] == str(tmp_path / CACHE_HOST / "warp")


def _baked(root: Path) -> Path:
    for name, data in (("wp_mjwarp_ab12", b"cubin-ab"), ("wp_mjwarp_cd34", b"cubin-cd")):
        d = root / "warp" / "1.19.0" / name
        d.mkdir(parents=True)
        (d / f"{name}.sm90.cubin").write_bytes(data)
        (d / f"{name}.meta").write_text("{}")
    return root


def test_baked_kernels_seed_the_node_cache_once_and_never_overwrite(env, tmp_path):
    baked = _baked(tmp_path / "image")
    cache = tmp_path / "node" / "warp"
    (cache / "1.19.0" / "wp_mjwarp_cd34").mkdir(parents=True)  # this node built it already
    (cache / "1.19.0" / "wp_mjwarp_cd34" / "mine").write_text("x")
    assert seed_warp_cache(baked / "warp", cache) == 1
    assert (cache / "1.19.0" / "wp_mjwarp_ab12" / "wp_mjwarp_ab12.sm90.cubin").read_bytes() == b"cubin-ab"
    assert sorted(p.name for p in (cache / "1.19.0" / "wp_mjwarp_cd34").iterdir()) == ["mine"]
    assert not [p for p in (cache / "1.19.0").iterdir() if p.name.startswith(".")]  # no temporary left
    assert seed_warp_cache(baked / "warp", cache) == 0
    assert seed_warp_cache(tmp_path / "no-such", cache) == 0
    # through node_caches: the image's variable names where the baked kernels are
    e = {**env, "PODRACER_CACHE_DIR": str(tmp_path / "c"), IMAGE_CACHE: str(baked)}
    node_caches(e)
    assert (Path(e["WARP_CACHE_PATH"]) / "1.19.0" / "wp_mjwarp_cd34" / "wp_mjwarp_cd34.sm90.cubin").is_file()


POD_START = (
    "import json, os; from podracer_hpc.cluster.caches import node_caches; node_caches(); "
    "print(json.dumps({v: os.environ.get(v) for v in ('WARP_CACHE_PATH', 'TORCHINDUCTOR_CACHE_DIR')}))"
)


def _job_setup(tmp_path: Path) -> str:
    """The batch script's set-up lines before srun, for a --container-image job (bash)."""
    from podracer_hpc.config import load_config
    from podracer_hpc.launch import Request, sbatch_text

    req = Request(
        job_file="jobs/quickstart.yaml",
        executor="slurm",
        mpi="pmi2",
        container_image=str(tmp_path / "img.sqsh"),
        run_dir=str(tmp_path / "run"),
        cache_dir=str(tmp_path / "node"),
    )
    text = sbatch_text(req, load_config("jobs/quickstart.yaml"))
    lines = [ln for ln in text.splitlines() if re.match(r"(export )?(PODRACER_JOB_CACHE_VARS|PODRACER_CACHE_DIR)=", ln)]
    assert len(lines) == 2, text
    return "\n".join(lines)


def test_the_batch_scripts_record_lets_the_node_cache_beat_the_images_env(env, tmp_path):
    """The job sets TORCHINDUCTOR_CACHE_DIR itself; the image's ENV sets both it and WARP_CACHE_PATH
    (applied over the job's, as pyxis does): inside, Warp's cache is the node-local one and
    Inductor's the job's own again."""
    setup = _job_setup(tmp_path)
    image_env = {"WARP_CACHE_PATH": "/usr/local/warp-cache", "TORCHINDUCTOR_CACHE_DIR": "/usr/local/inductor"}
    pod = f"env {' '.join(f'{k}={v}' for k, v in image_env.items())} {sys.executable} -c {json.dumps(POD_START)}"
    got = _pod_start(
        f"{setup}\n{pod}", {**env, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": "/scratch/job/inductor"}, 120
    )
    assert got["WARP_CACHE_PATH"] == str(tmp_path / "node" / CACHE_HOST / "warp"), got
    assert got["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/job/inductor", got  # the job's, restored


def _pod_start(script: str, env: dict, timeout: float) -> dict:
    """Run the batch script's lines and a pod's start in bash; the cache variables the pod saw."""
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


IMAGES = [REPO / "build" / "container-gpu" / "podracer", REPO / "build" / "container" / "podracer"]


@pytest.mark.skipif(shutil.which("ch-run") is None, reason="no ch-run (apt-get install charliecloud)")
def test_inside_a_built_image_under_ch_run(env, tmp_path):
    """With an image of this tree: the pod's start inside it, under ch-run, whose --set-env applies
    the image's ENV over the job's as pyxis does. The image's ENV is given a WARP_CACHE_PATH and a
    TORCHINDUCTOR_CACHE_DIR (as an older image, or a site's, sets them); the job set only the
    latter: Warp's cache is the node-local one, Inductor's the job's own."""
    image = next((i for i in IMAGES if (i / "ch" / "environment").is_file()), None)
    if image is None or "PODRACER_IMAGE_CACHE" not in (image / "ch" / "environment").read_text():
        pytest.skip("no image of this tree: make container-gpu")
    image_env = tmp_path / "image.env"
    image_env.write_text(
        (image / "ch" / "environment").read_text()
        + "WARP_CACHE_PATH=/opt/podracer/cache/warp\nTORCHINDUCTOR_CACHE_DIR=/opt/podracer/cache/inductor\n"
    )
    setup = _job_setup(tmp_path)
    inner = f"python3 -c {json.dumps(POD_START)}"
    run = f"ch-run --set-env={image_env} -b {tmp_path}:{tmp_path} {image} -- {inner}"
    got = _pod_start(
        f"{setup}\n{run}",
        {**env, "USER": env.get("USER", "root"), "TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/job-inductor"},
        300,
    )
    assert got["WARP_CACHE_PATH"] == str(tmp_path / "node" / CACHE_HOST / "warp"), got
    assert got["TORCHINDUCTOR_CACHE_DIR"] == f"{tmp_path}/job-inductor", got


def test_the_templates_record_the_same_way():
    """slurm_templates/site.sh carries the batch script's record line as podracer submit writes it."""
    assert record_line() in (REPO / "slurm_templates" / "site.sh").read_text().splitlines()
