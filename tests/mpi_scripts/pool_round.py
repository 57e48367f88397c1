"""Run under mpiexec: one real tournament round of real pods; each rank writes what it saw."""

import hashlib
import json
import sys
from pathlib import Path

import torch

from podracer_hpc.cluster.mpi import get_comm
from podracer_hpc.config import load_config
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.pod import Pod
from podracer_hpc.pool.fitness import Fitness, eval_seed
from podracer_hpc.pool.rounds import Pool

out, mode = Path(sys.argv[1]), sys.argv[2]
comm = get_comm("mpi")
torch.set_num_threads(1)
cfg = load_config(
    None,
    [
        "env.num_envs=32",
        "agent.rollout_steps=8",
        "agent.num_minibatches=2",
        "agent.update_epochs=1",
        f"tournament.mode={mode}",
        "tournament.top_k=3",
        "tournament.quantile=0.5",
        "tournament.ready_rounds=0",  # one round, round 0: every pod ready (PBT counts the start as a change)
        "tournament.hparam_space={learning_rate: [1.0e-5, 1.0e-2, true], ent_coef: [0.0, 0.01]}",
        f"tournament.leaderboard_dir={out / 'board'}",
    ],
)
pod = Pod(cfg, rank=comm.rank)
pod.train_iteration()


def net_sha(p: Pod) -> str:
    h = hashlib.sha256()
    for k, v in sorted(p.agent.net.state_dict().items()):
        h.update(k.encode())
        h.update(v.cpu().numpy().tobytes())
    return h.hexdigest()


before = net_sha(pod)
value = [-1000.0, -10.0, -500.0, -20.0, float("nan"), -300.0][comm.rank % 6]
fitness = Fitness((value,) * 4, eval_seed(cfg.seed, "round", 0))  # the same on every episode: differences exact
tour = Pool(cfg, comm, pod, RunDir(out, cfg.name), "test", say=lambda m: None)
rec = tour.collective_round(0, fitness, 0.0, comm.allgather(tour.report(fitness)))
res = {"action": rec.action, "source": rec.source, "decisions": tour.last_decisions}
decisions = [d.to_dict() for d in res["decisions"]]
after = net_sha(pod)
loaded_sha = None
if res["action"] in ("load_entry", "copy_pod"):
    tensors, meta = tour.board.load(res["source"].id)
    ref = Pod(cfg, rank=comm.rank)
    ref.load_agent(tensors, meta)
    loaded_sha = net_sha(ref)
(out / f"rank{comm.rank}.json").write_text(
    json.dumps(
        {
            "rank": comm.rank,
            "size": comm.size,
            "decisions": decisions,
            "action": res["action"],
            "source": res["source"].id,
            "before": before,
            "after": after,
            "loaded_sha": loaded_sha,
            "all_before": comm.allgather(before),
            "hparams": pod.hparams(),
        },
        default=str,
    )
)
