"""Asynchronous PBT's population: the bucket layout the first pod fixes, a pod's newest entries
kept, and a bounded, fair sample of the other pods' latest agents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from podracer_hpc.pool import entryfiles
from podracer_hpc.pool.population import Population, auto_buckets


def state(x: float) -> dict[str, torch.Tensor]:
    return {"actor.weight": torch.full((3, 2), x), "optim.step": torch.tensor([int(x)], dtype=torch.int64)}


def meta(pod=0, rnd=1, steps=1000, job="4242_7"):
    return {"job": job, "pod": pod, "round": rnd, "env_steps": steps, "hparams": {"lr": 3e-4}}


def fill(pop: Population, pods: int, rounds: int = 1, job: str = "77") -> None:
    for r in range(rounds):
        for p in range(pods):
            pop.publish(state(p + r / 10), float(p + r), {**meta(pod=p, rnd=r, job=job), "eval": None})


@pytest.mark.parametrize("pods, buckets", [(1, 1), (16, 1), (17, 2), (64, 4), (512, 32), (4096, 256)])
def test_auto_buckets_aim_at_16_pods_each_as_a_power_of_two(pods, buckets):
    assert auto_buckets(pods) == buckets


def test_the_first_pod_fixes_the_layout_for_every_later_one(tmp_path):
    a = Population(tmp_path, pool_size=64)
    b = Population(tmp_path, pool_size=4096)  # a later, larger job joins: it must hash the same way
    assert a.buckets == b.buckets == 4
    assert [a.bucket_of("j", p) for p in range(50)] == [b.bucket_of("j", p) for p in range(50)]
    assert len({a.bucket_of("j", p) for p in range(50)}) == 4


def test_a_pod_keeps_its_newest_two_entries_and_never_touches_others(tmp_path):
    pop = Population(tmp_path, pool_size=8)
    fill(pop, 3, rounds=4)
    names = sorted(p.name for p in pop.dir.rglob("*.json") if p.name != "layout.json")
    by_pod: dict[str, list[str]] = {}
    for n in names:
        by_pod.setdefault(n.split("-")[1], []).append(n.split("-")[2])
    assert by_pod == {"0": ["2", "3"], "1": ["2", "3"], "2": ["2", "3"]}
    assert len(list(pop.dir.rglob("*.safetensors"))) == 6  # tensors went with their sidecars


def test_a_sample_is_the_latest_entry_of_distinct_other_pods_best_first(tmp_path):
    pop = Population(tmp_path, pool_size=40)
    fill(pop, 40, rounds=2)
    s = pop.sample(np.random.default_rng(0), 10, exclude=("77", 5))
    assert len(s) == 10 and len({e.pod for e in s}) == 10 and 5 not in {e.pod for e in s}
    assert all(e.round == 1 for e in s)
    assert [e.score for e in s] == sorted((e.score for e in s), reverse=True)
    eid = s[0].id
    _, tensors, m = pop.load(eid)
    assert m["pod"] == s[0].pod and float(tensors["actor.weight"][0, 0]) == pytest.approx(s[0].pod + 0.1)


def test_a_sample_reads_a_bounded_number_of_files_whatever_the_pool_size(tmp_path):
    """The cost of one pod's draw: listings and sidecar opens do not grow with the population."""
    costs = {}
    for pods in (16, 256):
        pop = Population(tmp_path / str(pods), pool_size=pods)
        fill(pop, pods)
        before = dict(entryfiles.FS_OPS)
        s = pop.sample(np.random.default_rng(1), 8, exclude=("77", 0))
        costs[pods] = {k: entryfiles.FS_OPS.get(k, 0) - before.get(k, 0) for k in ("open", "scandir")}
        assert len(s) == 8
    assert costs[256]["open"] == costs[16]["open"] == 8
    assert costs[256]["scandir"] <= 2 and costs[16]["scandir"] == 1


def test_every_pod_is_drawn_about_equally_often(tmp_path):
    """A fair sample: over many draws of 8 of 63 other pods, each pod's share is near 8/63."""
    pop = Population(tmp_path, pool_size=64)
    fill(pop, 64)
    counts = np.zeros(64)
    rng = np.random.default_rng(2)
    draws = 300
    for _ in range(draws):
        for e in pop.sample(rng, 8, exclude=("77", 0)):
            counts[e.pod] += 1
    assert counts[0] == 0
    expected = draws * 8 / 63
    assert counts[1:].min() > 0.5 * expected and counts[1:].max() < 1.6 * expected, counts
