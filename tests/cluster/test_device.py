"""podracer_hpc/cluster/device.py: a pod's device, GPU binding check, CPU threads, caches, start line.

No GPU is needed: the GPU paths run against a stand-in for torch.cuda (what only a real multi-GPU
node can show is in bench/gpu_check.sh)."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from podracer_hpc.cluster import device as D

SLURM_AND_MPI = (
    "SLURM_",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "PODRACER_",
    "MPI_LOCAL",
    "OMPI_COMM_WORLD",
    "WARP_CACHE_PATH",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "CUDA_CACHE_PATH",
)


@pytest.fixture
def env(monkeypatch):
    """A clean environment dict (no Slurm, MPI or podracer variables) for the functions' ``environ``."""
    import os

    e = {k: v for k, v in os.environ.items() if not k.startswith(SLURM_AND_MPI)}
    return e


# ------------------------------------------------------------------------------ threads
def test_threads_follow_the_allocation(env, monkeypatch):
    never = lambda cpus: pytest.fail("a bound or Slurm-given allocation needs no probe")  # noqa: E731
    assert D.cpu_threads(3, 1, env, probe=never).n == 3  # an explicit setting wins
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    t = D.cpu_threads(0, 1, {**env, "SLURM_CPUS_PER_TASK": "16"}, probe=never)
    assert t.n == 8 and "SLURM_CPUS_PER_TASK=16" in t.why  # never more than the mask
    assert D.cpu_threads(0, 1, {**env, "SLURM_CPUS_PER_TASK": "4"}, probe=never).n == 4
    assert D.cpu_threads(0, 1, {**env, "OMP_NUM_THREADS": "6"}, probe=never).n == 6
    t = D.cpu_threads(0, 4, env, probe=never)
    assert t.n == 8 and "bound to 8 of the node's 64" in t.why


def test_threads_on_a_shared_node_take_only_idle_cpus(env, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    busy = D.cpu_threads(0, 1, env, probe=lambda cpus: 0.2)
    assert busy.n == 1 and "shared node" in busy.why
    assert D.cpu_threads(0, 1, env, probe=lambda cpus: 5.9).n == 6
    assert D.cpu_threads(0, 2, env, probe=lambda cpus: 16.0).n == 8  # idle: its share of the node
    assert D.cpu_threads(0, 2, env, probe=lambda cpus: None).n == 8  # no /proc/stat: the share


def test_idle_cpus_reads_proc_stat():
    idle = D.idle_cpus(seconds=0.05)
    n = len(D._affinity())
    assert idle is None or 0.0 <= idle <= n + 1e-6


def test_set_cpu_threads_sets_torch(env):
    before = torch.get_num_threads()
    try:
        assert D.set_cpu_threads(1, 1, env) == 1 and torch.get_num_threads() == 1
        assert D.threads_reason() == "threads setting"
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------ devices
@pytest.mark.skipif(torch.version.cuda is not None, reason="checks the CPU-only build's message")
@pytest.mark.parametrize(
    "spec,extra,what",
    [
        ("cuda", {}, "device='cuda'"),
        ("cuda:1", {}, "device='cuda:1'"),
        ("auto", {"SLURM_GPUS_ON_NODE": "8"}, "the job asked for GPUs (SLURM_GPUS_ON_NODE=8)"),
        ("auto", {"PODRACER_GPUS": "4"}, "the job asked for GPUs (PODRACER_GPUS=4)"),
        ("auto", {"SLURM_JOB_GPUS": "0,1"}, "the job asked for GPUs (SLURM_JOB_GPUS=0,1)"),
    ],
)
def test_cuda_on_a_cpu_only_torch_fails_with_how_to_install(env, spec, extra, what):
    with pytest.raises(D.DeviceError) as e:
        D.resolve_device(spec, environ={**env, **extra})
    msg = str(e.value)
    assert what in msg and "CPU-only build" in msg
    assert "--index-url https://download.pytorch.org/whl/cu" in msg and "CONDA_OVERRIDE_CUDA" in msg


@pytest.mark.parametrize(
    "extra,why",
    [
        ({"PODRACER_GPUS": "8", "SLURM_GPUS_PER_NODE": "0"}, "PODRACER_GPUS=8"),  # the launcher's word wins
        ({"PODRACER_GPUS": "0", "SLURM_JOB_GPUS": "0,1"}, ""),  # --exclusive holds GPUs nobody asked for
        ({"SLURM_GPUS_PER_NODE": "0", "SLURM_JOB_GPUS": "0,1"}, ""),
        ({"SLURM_GPUS_PER_NODE": "h100:8"}, "SLURM_GPUS_PER_NODE=h100:8"),
        ({"SLURM_GPUS_ON_NODE": "2"}, "SLURM_GPUS_ON_NODE=2"),  # --gres=gpu:2
        ({}, ""),
    ],
)
def test_what_counts_as_asking_for_gpus(env, extra, why):
    assert D.gpus_requested({**env, **extra}) == why


def test_cpu_and_auto_without_gpus_are_the_cpu(env):
    assert D.resolve_device("auto", environ=dict(env)) == torch.device("cpu") or torch.cuda.is_available()
    assert D.resolve_device("cpu", environ={**env, "SLURM_GPUS_ON_NODE": "2"}) == torch.device("cpu")


class FakeCuda:
    """torch.cuda with ``n`` GPUs, for the binding rules."""

    def __init__(self, monkeypatch, n: int):
        self.set: list[torch.device] = []
        monkeypatch.setattr(torch.version, "cuda", "12.6")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: self.set.append(torch.device(d)))
        monkeypatch.setattr(D, "_gpu_uuid", lambda idx: f"GPU-{idx}")


def test_a_bound_pod_takes_its_one_gpu(env, monkeypatch):
    fake = FakeCuda(monkeypatch, 1)
    e = {**env, "PODRACER_GPU_BIND": "per-task", "CUDA_VISIBLE_DEVICES": "5", "SLURM_LOCALID": "5"}
    assert D.resolve_device("auto", local_rank=5, local_size=8, environ=e) == torch.device("cuda", 0)
    assert fake.set == [torch.device("cuda", 0)]


def test_a_pod_bound_by_slurm_must_see_exactly_one_gpu(env, monkeypatch):
    FakeCuda(monkeypatch, 8)
    with pytest.raises(D.DeviceError, match="exactly one GPU.*sees 8"):
        D.resolve_device("cuda", local_rank=2, environ={**env, "PODRACER_GPU_BIND": "per-task"})


def test_unbound_pods_take_gpu_local_rank_and_never_share(env, monkeypatch):
    FakeCuda(monkeypatch, 8)
    assert D.resolve_device("auto", local_rank=3, local_size=8, environ=dict(env)) == torch.device("cuda", 3)
    with pytest.raises(D.DeviceError, match="8 pods .* but 4 GPUs"):
        FakeCuda(monkeypatch, 4)
        D.resolve_device("auto", local_rank=5, local_size=8, environ=dict(env))
    # the launcher's variables tell the local size when the caller does not
    e = {**env, "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2,6"}
    with pytest.raises(D.DeviceError, match="6 pods"):
        D.resolve_device("cuda", local_rank=1, environ=e)
    assert D.resolve_device("cuda:2", local_rank=7, local_size=8, environ=dict(env)) == torch.device("cuda", 2)


def test_ranks_compare_gpus_and_share_one_error(env, monkeypatch):
    FakeCuda(monkeypatch, 1)
    host = socket.gethostname()
    with pytest.raises(D.DeviceError, match=r"ranks \[0, 1\] on .* share one GPU"):
        D.resolve_device("auto", 0, 2, allgather=lambda x: [x, (host, "GPU-0", "")], environ=dict(env))
    assert D.resolve_device(
        "auto", 0, 2, allgather=lambda x: [x, (host, "GPU-7", "")], environ=dict(env)
    ) == torch.device("cuda", 0)
    with pytest.raises(D.DeviceError, match="rank 1 on n7: no GPU"):
        D.resolve_device("auto", 0, 2, allgather=lambda x: [x, ("n7", "", "no GPU")], environ=dict(env))


def test_pods_share_a_gpu_only_when_asked(env, monkeypatch):
    """``device: cuda:shared`` (a study of several pods on one GPU): round-robin, no refusal."""
    FakeCuda(monkeypatch, 4)
    with pytest.raises(D.DeviceError, match="8 pods .* but 4 GPUs.*cuda:shared"):
        D.resolve_device("cuda", local_rank=5, local_size=8, environ=dict(env))
    assert D.resolve_device("cuda:shared", local_rank=5, local_size=8, environ=dict(env)) == torch.device("cuda", 1)
    FakeCuda(monkeypatch, 1)
    host = socket.gethostname()
    same_gpu = lambda x: [x, (host, "GPU-0", "")]  # noqa: E731  (rank 1 on the same GPU)
    with pytest.raises(D.DeviceError, match="share one GPU"):
        D.resolve_device("cuda", 0, 2, allgather=same_gpu, environ=dict(env))
    assert D.resolve_device("cuda:shared", 0, 2, allgather=same_gpu, environ=dict(env)) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(D.DeviceError, match="CPU-only build"):
        D.resolve_device("cuda:shared", environ=dict(env))


def test_cuda_build_without_a_visible_gpu(env, monkeypatch):
    FakeCuda(monkeypatch, 0)
    assert D.resolve_device("auto", environ=dict(env)) == torch.device("cpu")
    with pytest.raises(D.DeviceError, match="sees no GPU.*nvidia-smi"):
        D.resolve_device("auto", environ={**env, "SLURM_GPUS_ON_NODE": "1"})


# ------------------------------------------------------------------------------ start line
def test_start_line_says_where_the_pod_runs(env):
    line = D.start_line(
        3, "n1", torch.device("cpu"), 2, "torch", world_size=4, local_rank=1, revision="abc1234-dirty", environ=env
    )
    assert line.startswith("pod 3/4 on n1 (local 1): CPU ")
    assert ", 2 threads on CPUs " in line and " | env backend torch | torch " + torch.__version__ in line
    assert line.endswith("| code abc1234-dirty")
    assert ("CUDA none (CPU-only build)" in line) == (torch.version.cuda is None)


def test_code_revision_prefers_the_snapshot(env, tmp_path, monkeypatch):
    assert D.code_revision({**env, "PODRACER_GIT_REVISION": "0123abc"}) == "0123abc"
    rev = D.code_revision(env)
    assert rev == "unknown" or len(rev.split("-")[0]) >= 7
    pkg = tmp_path / "podracer_hpc"
    pkg.mkdir()
    (tmp_path / "SNAPSHOT.json").write_text(json.dumps({"revision": "feed123-dirty"}))
    import podracer_hpc.files.rundir as R  # the one owner of the run's provenance (device re-exports it)

    monkeypatch.setattr(R, "__file__", str(pkg / "files" / "rundir.py"))
    assert D.code_revision(env) == "feed123-dirty" == R.git_revision(env)


def _fake_sys(root, nodes: dict[int, str], gpus: dict[str, int]):
    """A /sys tree with NUMA nodes (node -> cpulist) and GPUs (PCI address -> numa_node)."""
    for n, cpus in nodes.items():
        d = root / "devices" / "system" / "node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    (root / "devices" / "system" / "node" / "possible").write_text("0-1\n")  # not a node directory
    for pci, node in gpus.items():
        d = root / "bus" / "pci" / "devices" / pci
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def test_start_line_names_the_gpus_numa_node_and_the_pods_cpus(env, tmp_path):
    """A 2-socket DGX's topology (56 cores a socket, hyper-threads 112-223), read from a /sys tree."""
    sys_root = _fake_sys(tmp_path, {0: "0-55,112-167", 1: "56-111,168-223"}, {"0000:1b:00.0": 0, "0000:9b:00.0": 1})
    assert D.cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8" and D.cpu_list(set()) == ""
    assert D.numa_nodes_of(set(range(42, 56)), sys_root) == [0]
    assert D.numa_nodes_of({55, 56}, sys_root) == [0, 1]
    assert D.gpu_numa_node("0000:9B:00.0", sys_root) == 1 and D.gpu_numa_node("0000:00:00.0", sys_root) is None
    near = D.placement(set(range(42, 56)), "0000:1b:00.0", sys_root)
    assert near == (" on CPUs 42-55 (NUMA 0)", "NUMA 0")
    far, node = D.placement(set(range(56, 70)), "0000:1b:00.0", sys_root)
    assert far.startswith(" on CPUs 56-69 (NUMA 1), not on its GPU's NUMA node 0") and node == "NUMA 0"
    line = D.start_line(
        0, "dgx1", "cpu", 14, "torch", revision="abc", environ=env, cpus=set(range(56, 70)), sys_root=sys_root
    )
    assert ", 14 threads on CPUs 56-69 (NUMA 1) | env backend torch" in line


def test_start_line_where_the_machine_does_not_tell(env, tmp_path):
    (tmp_path / "bus" / "pci" / "devices" / "0000:1b:00.0").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "devices" / "0000:1b:00.0" / "numa_node").write_text("-1\n")  # no NUMA
    assert D.placement({0, 1}, "0000:1b:00.0", tmp_path) == (" on CPUs 0-1", "")
    line = D.start_line(0, "n", "cpu", 2, "torch", revision="abc", environ=env, cpus={0, 1}, sys_root=tmp_path)
    assert ": CPU " in line and ", 2 threads on CPUs 0-1 | env backend" in line
    # this machine's own /sys: whatever it tells, the line names the pod's CPUs
    assert " on CPUs " in D.start_line(0, "n", "cpu", 1, "torch", revision="abc", environ=env)


def test_a_gpu_pods_line_names_its_gpu_its_numa_node_and_its_cpus(env, tmp_path, monkeypatch):
    """The GPU branch's formatting on this CPU-only machine: the GPU's name is injected (a DGX's
    fourth GPU, on socket 0), the topology is a /sys tree."""
    sys_root = _fake_sys(tmp_path, {0: "0-55", 1: "56-111"}, {"0000:5d:00.0": 0})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda idx=None: "NVIDIA H100 80GB HBM3")
    line = D.start_line(
        3,
        "dgx017",
        torch.device("cuda:0"),
        14,
        "warp",
        world_size=32,
        local_rank=3,
        revision="abc",
        environ={**env, "CUDA_VISIBLE_DEVICES": "3"},
        cpus=set(range(42, 56)),
        gpu_pci="0000:5d:00.0",
        sys_root=sys_root,
    )
    assert line.startswith(
        "pod 3/32 on dgx017 (local 3): GPU NVIDIA H100 80GB HBM3 (cuda:0, CUDA_VISIBLE_DEVICES=3, NUMA 0), "
        "14 CPU threads on CPUs 42-55 (NUMA 0) | env backend warp"
    ), line
    apart = D.describe_device("cuda:0", 14, env, cpus=set(range(56, 70)), gpu_pci="0000:5d:00.0", sys_root=sys_root)
    assert apart.endswith(
        "on CPUs 56-69 (NUMA 1), not on its GPU's NUMA node 0: bind pods next to their GPU (podracer submit's default)"
    )
