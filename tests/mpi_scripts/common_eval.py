"""Run under mpiexec: the round's evaluation on common start states; each rank writes what it saw.

Every rank builds its own pod (seed + rank: its own training and evaluation env streams and its own
network initialization). Then:
- the round's start states: each rank resets its eval env with the round's seed; their hashes;
- identical agents: every rank builds the same agent (torch seed 7) and evaluates it as a round
  does; their returns (which must be equal bit for bit);
- a collective ElegantRL round with margin 0 on those evaluations (every decision must be keep).
"""

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

out, task = Path(sys.argv[1]), sys.argv[2]
comm = get_comm("mpi")
torch.set_num_threads(1)
cfg = load_config(
    f"jobs/{task}.yaml",
    [
        "env.num_envs=16",
        "agent.rollout_steps=8",
        "agent.num_minibatches=2",
        "agent.update_epochs=1",
        "eval.episodes=6",
        "tournament.mode=elegantrl",
        "tournament.top_k=4",
        "tournament.margin_se=0",
        f"tournament.leaderboard_dir={out / 'board'}",
        "seed=11",
    ],
)
pod = Pod(cfg, rank=comm.rank)
pod.train_iteration()  # the pods' own agents differ now (own init, own rollouts)
seed = eval_seed(cfg.seed, "round", 3)
states = hashlib.sha256(pod.eval_env.reset(seed).cpu().numpy().tobytes()).hexdigest()
own = Fitness(tuple(pod.evaluate(seed).tolist()), seed)
with torch.random.fork_rng():
    torch.manual_seed(7)
    same = pod._new_agent()
copy = Fitness(tuple(pod.evaluate(seed, agent=same).tolist()), seed)
pod.agent = same  # every pod holds the same agent now
tour = Pool(cfg, comm, pod, RunDir(out, cfg.name), "test", say=lambda m: None)
rec = tour.collective_round(3, copy, 0.0, comm.allgather(tour.report(copy)))
(out / f"rank{comm.rank}.json").write_text(
    json.dumps(
        {
            "rank": comm.rank,
            "seed": pod.seed,
            "round_seed": seed,
            "states": states,
            "own": list(own.returns),
            "copy": list(copy.returns),
            "action": rec.action,
            "actions": [d.action for d in tour.last_decisions],
            "diffs": [d.diff_mean for d in tour.last_decisions],
        }
    )
)
