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
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from . import __version__, safeio
from .comm import Comm, get_comm
from .config import Config, ConfigError, to_dict
from .h5log import H5Writer
from .leaderboard import EntryCorrupt, EntryGone, Leaderboard
from .pod import Pod, resolve_device, set_cpu_threads
from .tournament import PodReport, decide, round_env_steps

EXIT_REQUEUE = 75  # EX_TEMPFAIL: stopped early with every rank checkpointed; run again to resume

# Keys that may differ between a run and its resumption; anything else must match.
RESUMABLE_KEYS = ("total_env_steps", "log", "eval", "device", "threads", "name")


class Tournament:
    """One rank's side of the training pool's tournament (see tournament.py for the protocol).

    Every rank calls :meth:`round` at the same env-step count; collectives go through
    ``comm``, files through the leaderboard; the decision rules are the pure ``decide``.
    """

    def __init__(self, cfg: Config, comm: Comm, pod: Pod, run_dir: Path, job: str,
                 say: Any, log: H5Writer | None = None):
        self.cfg, self.comm, self.pod, self.say, self.log = cfg, comm, pod, say, log
        self.tcfg = cfg.tournament
        root = Path(self.tcfg.leaderboard_dir) if self.tcfg.leaderboard_dir else run_dir / "leaderboard"
        self.board = Leaderboard(root)
        self.job = job
        self.space = tuple(self.tcfg.hparam_space) or ()

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
            hp = json.dumps(self.pod.hparams())
            self.log.append("tournament", {"round": -1, "env_steps": self.pod.env_steps, "wall_s": 0.0,
                                           "fitness": score, "action": "join", "source": eid,
                                           "old_hparams": hp, "new_hparams": hp, "tournament_s": 0.0}, flush=True)
        return eid

    def round(self, index: int, fitness: float, wall_s: float) -> dict[str, Any]:
        pod, comm = self.pod, self.comm
        t0 = time.perf_counter()
        hp = pod.hparams(self.space) if self.space else pod.hparams()
        reports = comm.allgather(PodReport(comm.rank, float(fitness), pod.env_steps, hp))
        # every entry, not the top K: the freshness rule drops stale ones before the top-K cut
        entries = comm.bcast(self.board.candidates(with_steps=True) if comm.rank == 0 else None)
        decisions = decide(reports, entries, index, self.cfg.seed, self.tcfg)
        d = decisions[comm.rank]
        mine = None
        if d.publish:
            tensors, meta = pod.agent_tensors()
            meta.update(job=self.job, pod=comm.rank, round=index, hparams=hp)
            mine = self.board.publish(tensors, float(fitness), meta)
        entry_of_rank = comm.allgather(mine)  # also a barrier: every source is on disk now
        action, source = d.action, ""
        if d.action in ("load_entry", "copy_pod"):
            source = d.source_entry if d.action == "load_entry" else entry_of_rank[d.source_rank]
            try:
                _, tensors, meta = self.board.load_best_available([source], device=pod.device, skip_corrupt=False)
                pod.load_agent(tensors, meta, source=f"leaderboard entry {source}", load_hparams=False)
            except (EntryGone, EntryCorrupt, safeio.StateFileError) as e:
                self.say(f"round {index}: kept own agent, source rejected: {e}")
                action = "keep"
                source = f"rejected:{source}"
        elif d.action == "reset":
            self.say(f"round {index}: fitness {fitness} and no finite source anywhere: re-initializing the agent")
            fresh = Pod(self.cfg, rank=pod.rank, device=pod.device)
            t, m = fresh.agent_tensors()
            pod.load_agent(t, m, source="fresh agent", load_hparams=False)
        if d.new_hparams is not None and action == d.action:  # not when the source was rejected
            pod.set_hparams(d.new_hparams)
        row = {"round": index, "env_steps": pod.env_steps, "wall_s": wall_s, "fitness": float(fitness),
               "action": action, "source": source or (f"pod{d.source_rank}" if d.source_rank is not None else ""),
               "old_hparams": json.dumps(hp), "new_hparams": json.dumps(pod.hparams(self.space) if self.space else pod.hparams())}
        comm.barrier()  # everyone has loaded: pruning cannot pull an entry from under a reader
        if comm.rank == 0:
            self.board.prune(self.tcfg.top_k)
        row["tournament_s"] = time.perf_counter() - t0
        if self.log is not None:
            self.log.append("tournament", row, flush=True)
        return {**row, "decision": d, "decisions": decisions}

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


class _StopFlag:
    """Set by the warning signals; checked between updates."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.signal = signum

    def install(self) -> None:
        for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
            try:
                signal.signal(s, self)
            except ValueError:  # not the main thread (tests calling train() from a thread)
                pass


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


def _diff_config(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        if not prefix and k in RESUMABLE_KEYS:
            continue
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff_config(a, b, prefix + k + ".")
        elif a != b:
            out.append(f"{prefix}{k}: checkpoint has {a!r}, this run has {b!r}")
    return out


def _agree_on_checkpoint(comm: Comm, ckpt_path: Path, say: Any) -> Path:
    """Make every rank resume from the same update (a hard kill may have caught a checkpoint
    half-way through the ranks): ranks ahead fall back to their ``.prev``; else a clear error."""
    def updates_of(p: Path) -> int | None:
        if not p.exists():
            return None
        try:
            return int(safeio.load(p, "pod-state")[1]["updates"])
        except safeio.StateFileError:
            return -1  # reported properly when loaded
    mine = updates_of(ckpt_path)
    if comm.size == 1:
        return ckpt_path
    everyone = comm.allgather(mine)
    if len(set(everyone)) == 1:
        return ckpt_path
    if None in everyone and any(u is not None for u in everyone):
        missing = [r for r, u in enumerate(everyone) if u is None]
        raise TrainingError(
            f"{ckpt_path.parent}: ranks {missing} have no checkpoint while others do; this run directory "
            "was written by a different number of ranks or damaged. Use the same number of ranks, or a new --run-dir."
        )
    target = min(u for u in everyone if u is not None)
    prev = ckpt_path.with_suffix(".prev")
    choice = ckpt_path if mine == target else prev if updates_of(prev) == target else None
    agreed = comm.allgather(choice is not None)
    if not all(agreed):
        raise TrainingError(
            f"{ckpt_path.parent}: the ranks' checkpoints are at updates {everyone} and cannot be brought to "
            f"one update ({target}); start a new --run-dir."
        )
    if choice != ckpt_path:
        say(f"checkpoint at update {mine} is ahead of other ranks; resuming from {prev} (update {target})")
        os.replace(prev, ckpt_path)
    return ckpt_path


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
          stop_after_updates: int = 0, quiet: bool = False) -> RunResult:
    """Train one pod per rank until ``cfg.total_env_steps``; resume from ``run_dir`` if it has checkpoints."""
    comm = comm or get_comm()
    rank, size = comm.rank, comm.size
    run_dir = Path(run_dir or Path("runs") / cfg.name)
    ckpt_path = run_dir / "checkpoints" / f"rank{rank}.safetensors"
    log_path = run_dir / "logs" / f"{cfg.name}_rank{rank}.h5"

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
    pod = Pod(cfg, rank=rank, device=device)
    state_meta: dict[str, Any] = {}
    ckpt_path = _agree_on_checkpoint(comm, ckpt_path, say)
    if ckpt_path.exists():
        _, meta0, _ = safeio.load(ckpt_path, "pod-state")  # verifies before anything is touched
        diffs = _diff_config(meta0.get("config", {}), to_dict(cfg))
        if diffs:
            raise ConfigError(
                f"{run_dir} holds a run with another config; it cannot be resumed with this one:\n  "
                + "\n  ".join(diffs)
                + f"\nUse a new --run-dir, or the original settings (see {run_dir / 'config.yaml'})."
            )
        state_meta = pod.load(ckpt_path)
        say(f"resuming from {ckpt_path} at {_fmt_steps(pod.env_steps)} env steps, update {pod.updates}")
        if not state_meta.get("env_exact", True):
            say("this task's environment backend cannot be checkpointed: the agent resumes exactly, "
                "its environments start new episodes")
    elif rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

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
    log = H5Writer(log_path, attrs)
    if state_meta:
        dropped = log.truncate_after(pod.env_steps)
        if dropped:
            say(f"dropped {dropped} log rows written after that checkpoint (their work is redone)")

    tour = None
    if cfg.tournament.mode != "none":
        job = os.environ.get("SLURM_ARRAY_JOB_ID", os.environ.get("SLURM_JOB_ID", "local"))
        job += f"_{os.environ['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in os.environ else ""
        tour = Tournament(cfg, comm, pod, run_dir, job, say, log)
        if not state_meta:
            tour.join()
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
    stop = _StopFlag()
    stop.install()
    updates_here = 0
    last_train = math.nan

    def wall() -> float:
        return wall_before + time.perf_counter() - t_start

    def checkpoint() -> None:
        extra = {"best_return": best, "last_eval_return": last_eval, "next_eval": next_eval, "wall_s": wall(),
                 "round": round_index}
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
                    say(f"round {round_index}: restored from {out['source']} after NaN; training goes on")
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
        why = f"signal {signal.Signals(stop.signal).name}" if stop.signal else f"--stop-after-updates {stop_after_updates}"
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
    if rank == 0:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if tour is not None and not quiet:
            print(tour.table(), file=sys.stderr, flush=True)
    return RunResult(complete=complete, summary=summary)
