"""The rank program: one pod per rank, training, evaluation, logs, checkpoints, signals.

Run directory layout (``--run-dir``, default ``runs/<name>``):

- ``config.yaml``: the resolved config (written by rank 0),
- ``logs/<name>_rank<r>.h5``: the rank's HDF5 log (h5log.py),
- ``checkpoints/rank<r>.safetensors`` (and ``.prev``): the pod state, written atomically,
- ``summary.json``: the final summary (rank 0), also printed as the last line of stdout.

A run directory that holds checkpoints is resumed: every rank continues from its own
checkpoint, rows logged after it are dropped from the log, and the run goes on as if it had
never stopped. SIGUSR1/SIGUSR2/SIGTERM (Slurm's warning before a time limit or preemption)
make every rank finish its update, checkpoint and exit with ``EXIT_REQUEUE``.

Any kill, at any moment, leaves a run directory that the same command resumes: a fresh pod
checkpoints before its first update; the log is flushed before every checkpoint (so it holds
every update the checkpoint holds) and cut back to the checkpoint on resume; a log left open
by a killed writer is rebuilt (h5log.py); the ranks agree on one update to resume from
(resume.py); a tournament round redone after a kill decides on the same leaderboard listing
(kept in ``rounds/<i>.json``) and publishes the same entries (content ids).
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from . import __version__, resume, safeio
from .comm import Comm, get_comm
from .config import Config, ConfigError, to_dict
from .h5log import H5Writer
from .leaderboard import EntryCorrupt, EntryGone, Leaderboard
from .pod import Pod, resolve_device, set_cpu_threads
from .rundir import EXIT_REQUEUE, RunDir, job_id
from .records import RoundRecord, Source
from .signals import StopFlag
from .tournament import PodReport, decide, describe_space, effective_space, round_env_steps

# Keys that may differ between a run and its resumption; anything else must match.
RESUMABLE_KEYS = ("total_env_steps", "log", "eval", "device", "threads", "name")


class Tournament:
    """One rank's side of the training pool's tournament (see tournament.py for the protocol).

    Every rank calls :meth:`round` at the same env-step count; collectives go through
    ``comm``, files through the leaderboard; the decision rules are the pure ``decide``.
    """

    def __init__(self, cfg: Config, comm: Comm, pod: Pod, rundir: RunDir, job: str,
                 say: Any, log: H5Writer | None = None):
        self.cfg, self.comm, self.pod, self.say, self.log = cfg, comm, pod, say, log
        self.tcfg = cfg.tournament
        self.rundir = rundir
        self.board = Leaderboard(rundir.leaderboard(self.tcfg.leaderboard_dir))
        self.job = job
        self.space = tuple(effective_space(self.tcfg))
        self.last_copy_round = -1  # the last round this pod took another agent (PBT's "ready")

    def listing(self, index: int) -> list[tuple]:
        """Rank 0's view of the leaderboard for round ``index``, the same on a redo.

        A round redone after a kill (its checkpoint predates it) must decide on what the first
        attempt saw, not on the entries that attempt published: the listing is kept in the run
        directory the first time and read back after.
        """
        path = self.rundir.round_listing(index)
        try:
            return [tuple(e) for e in json.loads(path.read_text())]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as e:
            self.say(f"round {index}: ignoring unreadable {path} ({e}); listing the leaderboard again")
        entries = self.board.candidates(with_steps=True)
        safeio.atomic_write_bytes(path, json.dumps(entries).encode())
        return entries

    def publish(self, fitness: float, index: int, hp: dict[str, float]) -> str | None:
        """This pod's agent as a leaderboard entry (None if it could not be written: logged, not fatal)."""
        tensors, meta = self.pod.agent_tensors()
        meta.update(job=self.job, pod=self.comm.rank, round=index, hparams=hp)
        try:
            return self.board.publish(tensors, float(fitness), meta, content_id=True)
        except OSError as e:
            self.say(f"round {index}: could not publish to the leaderboard ({e}); pods that chose this one keep their own")
            return None

    def join(self) -> str | None:
        """Elastic join: a fresh pod starts from a leaderboard entry when there is one."""
        entries = self.comm.bcast(self.board.candidates(self.tcfg.top_k) if self.comm.rank == 0 else None)
        if not entries:
            return None
        # Spread the pods over the best entries; fall through to the next one if it is gone or bad.
        k = self.comm.rank % len(entries)
        eid = None
        for cand, _score in entries[k:] + entries[:k]:
            try:
                _, tensors, meta = self.board.load_best_available([cand], device=self.pod.device, skip_corrupt=False)
                self.pod.load_agent(tensors, meta, source=f"leaderboard entry {cand}")
                eid = cand
                break
            except EntryGone:
                continue
            except (EntryCorrupt, safeio.StateFileError) as e:
                self.say(f"skipping leaderboard entry {cand}: {e}")
        if eid is None:
            self.say("no leaderboard entry could be loaded; starting from scratch")
            return None
        score = dict(entries).get(eid, float("nan"))
        self.say(f"joined from leaderboard entry {eid} (score {score:.1f})")
        if self.log is not None:  # round -1: how this pod started
            hp = self.pod.hparams(self.space) if self.space else self.pod.hparams()
            self.log.append("tournament", RoundRecord(-1, self.pod.env_steps, 0.0, score, "join", Source("entry", eid),
                                                      hp, hp, 0.0).to_row(), flush=True)
        return eid

    def round(self, index: int, fitness: float, wall_s: float) -> dict[str, Any]:
        pod, comm = self.pod, self.comm
        t0 = time.perf_counter()
        hp = pod.hparams(self.space) if self.space else pod.hparams()
        reports = comm.allgather(PodReport(comm.rank, float(fitness), pod.env_steps, hp, self.last_copy_round))
        # every entry, not the top K: the freshness rule drops stale ones before the top-K cut
        entries = comm.bcast(self.listing(index) if comm.rank == 0 else None)
        decisions = decide(reports, entries, index, self.cfg.seed, self.tcfg)
        d = decisions[comm.rank]
        mine = self.publish(fitness, index, hp) if d.publish else None
        entry_of_rank = comm.allgather(mine)  # also a barrier: every source is on disk now
        action, source = d.action, Source()
        if d.action == "copy_pod" and entry_of_rank[d.source_rank] is None:
            action, source = "keep", Source("pod", str(d.source_rank), rejected=True)  # its publish failed
        elif d.action in ("load_entry", "copy_pod"):
            eid = d.source_entry if d.action == "load_entry" else entry_of_rank[d.source_rank]
            source = Source("entry", eid)  # (copy_pod: the entry that pod published this round)
            try:
                _, tensors, meta = self.board.load_best_available([eid], device=pod.device, skip_corrupt=False)
                pod.load_agent(tensors, meta, source=f"leaderboard entry {eid}", load_hparams=False)
                self.last_copy_round = index
            except (EntryGone, EntryCorrupt, safeio.StateFileError) as e:
                self.say(f"round {index}: kept own agent, source rejected: {e}")
                action = "keep"
                source = Source(source.kind, source.id, rejected=True)
        elif d.action == "reset":
            self.say(f"round {index}: fitness {fitness} and no finite source anywhere: re-initializing the agent")
            pod.reset_agent()
            source = Source("fresh")
        if d.new_hparams is not None and action == d.action:  # not when the source was rejected
            pod.set_hparams(d.new_hparams)
        new_hp = pod.hparams(self.space) if self.space else pod.hparams()
        comm.barrier()  # everyone has loaded: pruning cannot pull an entry from under a reader
        if comm.rank == 0:  # keeps this round's sources: a redo of the round loads them again
            needed = {x.source_entry if x.action == "load_entry" else entry_of_rank[x.source_rank]
                      for x in decisions if x.action in ("load_entry", "copy_pod")} - {None}
            self.board.prune(self.tcfg.top_k, keep=needed)
        record = RoundRecord(index, pod.env_steps, wall_s, float(fitness), action, source, hp, new_hp,
                             time.perf_counter() - t0)
        if self.log is not None:
            self.log.append("tournament", record.to_row(), flush=True)
        return {"record": record, "action": action, "source": source, "decision": d, "decisions": decisions}

    def table(self, n: int = 8) -> str:
        rows = self.board.list()[:n]
        lines = [f"leaderboard {self.board.root} ({len(self.board.list())} entries, top {self.tcfg.top_k} kept)",
                 f"{'#':>3} {'score':>10} {'env steps':>11} {'pod':>4} {'round':>5}  entry"]
        for i, e in enumerate(rows):
            lines.append(f"{i + 1:>3} {e.score:>10.1f} {e.env_steps or 0:>11,} {e.pod if e.pod is not None else '-':>4} "
                         f"{e.round if e.round is not None else '-':>5}  {e.id}")
        return "\n".join(lines)


class TrainingError(RuntimeError):
    """Training cannot go on (NaN loss, ...); the last good checkpoint is kept."""


@dataclass
class RunResult:
    """What one rank reports at the end."""

    complete: bool
    summary: dict[str, Any] = field(default_factory=dict)


def git_revision() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
        rev = out.stdout.strip()
        if rev:
            dirty = subprocess.run(
                ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True, text=True, timeout=5,
            ).stdout.strip()
            return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def slurm_ids() -> dict[str, str]:
    keys = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID",
            "SLURM_PROCID", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _diff_config(old: dict[str, Any], new: dict[str, Any], defaults: dict[str, Any], prefix: str = "") -> list[str]:
    """Keys whose values differ between a checkpoint's config and this run's. A key the checkpoint
    does not have (added to podracer-hpc since) is no difference if this run has its default."""
    out = []
    for k in sorted(set(old) | set(new)):
        if not prefix and k in RESUMABLE_KEYS:
            continue
        a, b, d = old.get(k), new.get(k), (defaults or {}).get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff_config(a, b, d if isinstance(d, dict) else {}, prefix + k + ".")
        elif k not in old and b == d:
            continue
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint has {a!r}, this run has {b!r}")
    return out


def _nan_injection(rank: int) -> int:
    """Fault testing: ``PODRACER_INJECT_NAN=RANK:UPDATE`` poisons that rank's weights at that update."""
    spec = os.environ.get("PODRACER_INJECT_NAN", "")
    if not spec:
        return 0
    r, u = (int(x) for x in spec.split(":"))
    return u if r == rank else 0


def _fmt_steps(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def train(cfg: Config, run_dir: str | os.PathLike | None = None, comm: Comm | None = None,
          stop_after_updates: int = 0, quiet: bool = False, stop: StopFlag | None = None) -> RunResult:
    """Train one pod per rank until ``cfg.total_env_steps``; resume from ``run_dir`` if it has checkpoints.

    ``stop``: the warning-signal flag (the console script installs the process's own before
    anything else); by default a new one is installed here.
    """
    comm = comm or get_comm()
    rank, size = comm.rank, comm.size
    rundir = RunDir(run_dir or Path("runs") / cfg.name, cfg.name)
    run_dir = rundir.root
    ckpt_path = rundir.checkpoint(rank)
    stop = stop or StopFlag().install()

    def say(msg: str, progress: bool = False) -> None:
        """Events always go to stderr; ``quiet`` silences only the periodic progress lines."""
        if not (quiet and progress):
            print(f"[{cfg.name} r{rank}] {msg}", file=sys.stderr, flush=True)

    device = resolve_device(cfg.device, comm.local_rank)
    if device.type == "cpu":
        set_cpu_threads(cfg.threads, comm.local_size)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)

    if comm.launcher_size and comm.launcher_size > 1 and size == 1:
        raise TrainingError(
            f"the launcher started {comm.launcher_size} processes but they do not form one MPI world "
            f"({comm.note}). Refusing to run {comm.launcher_size} copies of rank 0 into one run directory: "
            "match srun's --mpi plugin to the MPI of mpi4py (pmi2 for the mpich wheel, pmix for Open MPI)."
        )
    try:
        pod = Pod(cfg, rank=rank, device=device)
    except MemoryError as e:
        raise TrainingError(f"rank {rank}: {e}") from None
    state_meta: dict[str, Any] = {}
    choice = resume.agree(comm.allgather, rank, size, ckpt_path, say,
                          rundir.checkpoint_ranks() if rank == 0 else [])
    if not choice.fresh:
        _, meta0, _ = safeio.load(ckpt_path, "pod-state")  # verifies before anything is touched
        diffs = _diff_config(meta0.get("config", {}), to_dict(cfg), to_dict(Config()))
        if diffs:
            raise ConfigError(
                f"{run_dir} holds a run with another config; it cannot be resumed with this one:\n  "
                + "\n  ".join(diffs)
                + f"\nUse a new --run-dir, or the original settings (see {rundir.config})."
            )
        state_meta = pod.load(ckpt_path)
        say(f"resuming from {ckpt_path} at {_fmt_steps(pod.env_steps)} env steps, update {pod.updates}")
        if not state_meta.get("env_exact", True):
            say("this task's environment backend cannot be checkpointed: the agent resumes exactly, "
                "its environments start new episodes")
    elif rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        safeio.atomic_write_bytes(rundir.config, yaml.safe_dump(to_dict(cfg), sort_keys=False).encode(), mode=0o644)

    attrs = {
        "config": to_dict(cfg),
        "git_revision": git_revision(),
        "host": socket.gethostname(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "device_type": device.type,
        "versions": {"podracer_hpc": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "seed": pod.seed,
        "rank": rank,
        "world_size": size,
        "slurm": slurm_ids(),
        "comm": comm.note or ("mpi" if comm.is_mpi else "single"),
        "created": time.time(),
    }
    log = H5Writer(rundir.log(rank), attrs, say=say)
    # Rows after the checkpoint are work that is redone; a fresh start keeps none (a run killed
    # before its first checkpoint must not log updates 1, 2, ... twice).
    dropped = log.truncate_after(pod.env_steps if state_meta else -1)
    if dropped:
        say(f"dropped {dropped} log rows written after the checkpoint it resumes from (their work is redone)")

    tour = None
    if cfg.tournament.mode != "none":
        tour = Tournament(cfg, comm, pod, rundir, job_id(), say, log)
        if not state_meta:
            tour.join()
        tour.last_copy_round = int(state_meta.get("last_copy_round", -1))
        if rank == 0 and cfg.tournament.mode == "pbt":
            what = "tournament.hparam_space" if cfg.tournament.hparam_space else "the default space (tournament.hparam_space is empty)"
            say(f"PBT explores {describe_space(effective_space(cfg.tournament))}: {what}; a pod that copied "
                f"another is not replaced again for {cfg.tournament.ready_rounds} rounds")
    round_index = int(state_meta.get("round", 0))
    next_round = round_env_steps(cfg.tournament, round_index)
    poisoned = False  # a pod whose loss went NaN waits, frozen, for the next round to replace it
    inject_nan = _nan_injection(rank)

    total = cfg.total_env_steps
    eval_every = cfg.eval.interval_env_steps or total
    best = float(state_meta.get("best_return", -math.inf))
    last_eval = float(state_meta.get("last_eval_return", math.nan))
    next_eval = int(state_meta.get("next_eval", eval_every))
    wall_before = float(state_meta.get("wall_s", 0.0))
    t_start = time.perf_counter()
    steps_at_start = pod.env_steps
    last_ckpt = last_progress = time.monotonic()
    updates_here = 0
    last_train = math.nan

    def wall() -> float:
        return wall_before + time.perf_counter() - t_start

    def checkpoint() -> None:
        log.flush()  # the log holds every row up to the checkpoint before the checkpoint exists
        extra = {"best_return": best, "last_eval_return": last_eval, "next_eval": next_eval, "wall_s": wall(),
                 "round": round_index, "world_size": size,
                 "last_copy_round": tour.last_copy_round if tour is not None else -1}
        if ckpt_path.exists():  # keep the last one as .prev; the path always holds a whole checkpoint
            tmp = ckpt_path.with_suffix(".prev.tmp")
            tmp.unlink(missing_ok=True)
            os.link(ckpt_path, tmp)
            os.replace(tmp, ckpt_path.with_suffix(".prev"))
        pod.save(ckpt_path, extra)

    def evaluate() -> float:
        nonlocal best, last_eval, next_eval
        r = pod.evaluate().cpu().numpy()
        if poisoned:
            r = r * math.nan
        last_eval = float(r.mean())
        best = max(best, last_eval)
        log.append("eval", {
            "update": pod.updates, "env_steps": pod.env_steps, "wall_s": wall(),
            "return_mean": last_eval, "return_std": float(r.std()), "return_min": float(r.min()),
            "return_max": float(r.max()), "episodes": len(r),
        }, flush=True)
        while next_eval <= pod.env_steps:
            next_eval += eval_every
        return last_eval

    try:
        if not state_meta:
            checkpoint()  # a kill from here on resumes; it never starts over (nor joins again)
        while pod.env_steps < total:
            t0 = time.perf_counter()
            if poisoned:  # keep the pool in lockstep without training on NaN weights
                pod.env_steps += pod.batch_size
                pod.updates += 1
                vals = {"loss": math.nan, "episodes": 0.0, "return_sum": 0.0, "return_sqsum": 0.0}
            else:
                m = pod.train_iteration()
                if inject_nan and pod.updates == inject_nan:
                    m["loss"] = torch.tensor(math.nan)
                    with torch.no_grad():
                        for prm in pod.agent.net.parameters():
                            prm.fill_(math.nan)
                vals = {k: float(v) for k, v in zip(m, torch.stack([v.double().cpu() for v in m.values()]).tolist())}
            dt = time.perf_counter() - t0
            if not math.isfinite(vals["loss"]) and not poisoned:
                if tour is None:
                    raise TrainingError(
                        f"rank {rank}: loss is {vals['loss']} at update {pod.updates} ({pod.env_steps} env steps). "
                        f"Nothing after the last checkpoint ({ckpt_path}) was saved. Lower agent.learning_rate, "
                        "keep agent.norm_obs/norm_reward on, or check the environment for NaN observations."
                    )
                poisoned = True
                say(f"loss is {vals['loss']} at update {pod.updates}: this pod is frozen until round "
                    f"{round_index} replaces it from the leaderboard")
            n_ep = int(vals["episodes"])
            mean = vals["return_sum"] / n_ep if n_ep else math.nan
            if n_ep:
                last_train = mean
            std = math.sqrt(max(0.0, vals["return_sqsum"] / n_ep - mean * mean)) if n_ep else math.nan
            row = {"update": pod.updates, "env_steps": pod.env_steps, "wall_s": wall(),
                   "steps_per_s": pod.batch_size / dt, "loss": vals["loss"]}
            if not poisoned:
                row.update(return_mean=mean, return_std=std, episodes=n_ep,
                           **{k: vals[k] for k in ("policy_loss", "value_loss", "entropy", "approx_kl",
                                                   "clipfrac", "explained_variance", "learning_rate")})
            log.append("train", row)
            if tour is not None and pod.env_steps >= next_round:
                fitness = evaluate()
                out = tour.round(round_index, fitness, wall())
                if poisoned and out["action"] != "keep":
                    poisoned = False
                    say(f"round {round_index}: restored from {out['source'].id or 'a fresh agent'} after NaN; "
                        "training goes on")
                round_index += 1
                next_round = round_env_steps(cfg.tournament, round_index)
                checkpoint()
                last_ckpt = time.monotonic()
            elif pod.env_steps >= next_eval or pod.env_steps >= total:
                evaluate()
            updates_here += 1
            now = time.monotonic()
            if cfg.log.progress_interval_s and now - last_progress >= cfg.log.progress_interval_s:
                last_progress = now
                sps = (pod.env_steps - steps_at_start) / max(1e-9, time.perf_counter() - t_start)
                eta = (total - pod.env_steps) / max(sps, 1e-9)
                say(f"{100 * pod.env_steps / total:5.1f}% {_fmt_steps(pod.env_steps)}/{_fmt_steps(total)} steps | "
                    f"{sps / 1e3:.0f}k steps/s | train {last_train:.1f} | eval {last_eval:.1f} (best {best:.1f}) | "
                    f"ETA {eta:.0f}s", progress=True)
            ckpt_due = bool(cfg.log.checkpoint_interval_s and now - last_ckpt >= cfg.log.checkpoint_interval_s)
            want_stop = stop.signal is not None or bool(stop_after_updates and updates_here >= stop_after_updates)
            if size > 1:  # decided together: every rank checkpoints and stops after the same update
                votes = comm.allgather((ckpt_due, want_stop))
                ckpt_due, want_stop = any(v[0] for v in votes), any(v[1] for v in votes)
            if ckpt_due and not want_stop:
                checkpoint()
                last_ckpt = now
            if want_stop:
                break
        if updates_here or not ckpt_path.exists():
            checkpoint()
    finally:
        log.close()

    complete = pod.env_steps >= total
    if not complete:
        why = f"signal {stop.name}" if stop.signal else f"--stop-after-updates {stop_after_updates}"
        say(f"stopped by {why} at {_fmt_steps(pod.env_steps)} env steps; checkpoint saved, run again to resume")
    mine = {
        "env_steps": pod.env_steps, "best": best, "final": last_eval, "wall_s": wall(),
        "run_steps": pod.env_steps - steps_at_start, "run_wall": time.perf_counter() - t_start,
    }
    everyone = comm.allgather(mine)
    finals = [p["final"] for p in everyone if math.isfinite(p["final"])]
    wall_s = max(p["wall_s"] for p in everyone)
    env_steps = sum(p["env_steps"] for p in everyone)
    run_wall = max(p["run_wall"] for p in everyone)
    summary = {
        "task": cfg.env.name,
        "pods": size,
        "env_steps": env_steps,
        "wall_s": round(wall_s, 3),
        "steps_per_s": round(sum(p["run_steps"] for p in everyone) / max(run_wall, 1e-9), 1),
        "best_return": max(p["best"] for p in everyone),
        "final_return": max(finals) if finals else None,
    }
    if not complete:
        summary["complete"] = False
    if tour is not None:
        summary["best_pod"] = max(range(size), key=lambda r: everyone[r]["best"])
        summary["rounds"] = round_index
    if tour is not None and complete and rank == 0:
        tour.board.prune(cfg.tournament.top_k)  # every rank has checkpointed: the last round's sources may go
    if rank == 0:
        safeio.atomic_write_bytes(rundir.summary, (json.dumps(summary, indent=2) + "\n").encode(), mode=0o644)
        if tour is not None and not quiet:
            print(tour.table(), file=sys.stderr, flush=True)
    return RunResult(complete=complete, summary=summary)
