"""The rank's side of the training pool: elastic join, tournament rounds, NaN restore.

Two ways to hold a round (``tournament.sync``), both with the pure rules of tournament.py:

- ``collective``: every pod reaches round i at the same env steps and the ranks meet (the rank
  program gathers the pods' reports, :class:`Meeting`); every rank computes the same decisions
  from the same table and the same leaderboard listing (rank 0 lists it, keeps it in the run
  directory for an exact redo, and broadcasts it); winners publish, the others load, rank 0
  prunes. Reproducible: a seed fixes a CPU run, and a resumed run ends bit-equal.
- ``async``: a pod that reaches its round decides alone, from the leaderboard as it is at that
  moment: it publishes (ElegantRL rule: if it would enter the top K; PBT: always, so that the
  others see the population), draws from the listing with its own random stream, loads, prunes.
  It never waits for another pod: a slow or dead pod blocks nobody (ElegantRL-Podracer's
  design). Decisions depend on timing, so runs are not reproducible across starts.

A pod whose loss turned NaN reports NaN fitness; every rule replaces it (it never publishes).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from podracer_hpc.cluster.mpi import Comm
from podracer_hpc.config import EXPLORING_MODES, Config
from podracer_hpc.files import safeio
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.h5log import H5Writer
from podracer_hpc.files.records import Comparison, RoundRecord, Source
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.pod import Pod, entry_kind
from podracer_hpc.pool.entry import Entry
from podracer_hpc.pool.entryfiles import fs_ops
from podracer_hpc.pool.fitness import Fitness, better, eval_seed
from podracer_hpc.pool.hparams import check_hparams, declared_space, effective_space, first_draw
from podracer_hpc.pool.leaderboard import EntryCorrupt, EntryGone, Leaderboard, plan_prune
from podracer_hpc.pool.population import Population
from podracer_hpc.pool.rules import Decision, PodReport, decide, make_rng

_STREAM_SAMPLE = 3  # the random stream of an async pod's draws of files to read (tournament.py has 1, 2)

__all__ = ["Meeting", "Pool", "pool_line"]


def _kind_of(e: Entry) -> str:
    """The group a prune keeps the best of: the entry's kind of agent (a mixed pool keeps each kind's)."""
    return e.kind or entry_kind(e.meta)


def _with_kind(e: Entry) -> Entry:
    """``e`` with its kind of agent read from its meta (what the rules need to match it to a pod)."""
    return replace(e, kind=entry_kind(e.meta))


@dataclass(frozen=True)
class Meeting:
    """What a rank brings to a meeting of all ranks (collective rounds and the end of the run).

    ``kind``: ``round`` (reached round ``report`` is for), ``stop`` (checkpointed, leaving:
    everyone leaves), ``target`` (a pod of the run reached ``eval.stop_at_return``: everyone
    leaves, the run complete), ``done`` (trained its budget). ``summary``: its part of the run summary.
    """

    kind: str
    report: PodReport | None = None
    announced: bool = False  # this rank announced a stop (comm.announce_stop)
    summary: dict[str, Any] = field(default_factory=dict)  # this rank's part of the run summary
    notified: tuple[int, ...] = ()  # the ranks this rank sent stop notices to (comm.notified): settled at the end
    # at a round: whole intervals this pod wants before the next round (its speed and the time
    # floor), and whether its checkpoint is due; every rank takes the same max / any
    schedule: tuple[int, bool] = (1, True)


class Pool:
    """One rank's side of the tournament; the leaderboard is files, decisions are tournament.py."""

    def __init__(
        self,
        cfg: Config,
        comm: Comm,
        pod: Pod,
        rundir: RunDir,
        job: str,
        say: Callable[[str], None],
        log: H5Writer | None = None,
        index: int | None = None,
        pool_size: int | None = None,
        part: int | None = None,
    ):
        self.cfg, self.comm, self.pod, self.say, self.log = cfg, comm, pod, say, log
        # the pod's index in the pool and the pool's size: its MPI rank and world unless the pool
        # runs as several jobs (rundir.PoolPart); a collective round is one job's world
        self.index = comm.rank if index is None else index
        self.pool_size = comm.size if pool_size is None else pool_size
        self.offset = self.index - comm.rank  # pool index of this world's rank 0
        # the part of a pool of several jobs this world is (None: the pool is one world): its rounds
        # are its own, and so are the listings it keeps (rundir.round_listing)
        self.part = part
        self.tcfg = cfg.tournament
        self.rundir = rundir
        self.board = Leaderboard(
            rundir.leaderboard(self.tcfg.leaderboard_dir), cache=True, accept_unkeyed=self.tcfg.accept_unkeyed
        )
        # async PBT: every pod's latest agent, read a bounded sample at a time (population.Population)
        self.population = (
            Population(self.board.root, self.pool_size, self.tcfg.population_buckets)
            if self.tcfg.sync == "async" and self.tcfg.mode == "pbt"
            else None
        )
        self.job = job
        self.space = tuple(effective_space(self.tcfg, cfg.agent.algo))  # the names this pod's learner has
        self.last_copy_round = (
            -1
        )  # the last round this pod took another agent or mutated its own values (PBT's "ready")
        self.publish_failed_round = -1  # the last round whose publication failed (its row says so)
        self.last_decisions: list[Decision] = []  # every pod's decision at the last collective round
        # entries collective rounds loaded since the pool last checkpointed together: a resume
        # redoes those rounds and loads them again, so no prune may take them (the run clears it)
        self.loaded_since_checkpoint: set[str] = set()

    @property
    def collective(self) -> bool:
        return self.tcfg.sync == "collective"

    # --- helpers --------------------------------------------------------------------------
    def hparams(self) -> dict[str, float]:
        return self.pod.hparams(self.space) if self.space else self.pod.hparams()

    def report(self, fitness: Fitness) -> PodReport:
        return PodReport(
            self.comm.rank,
            fitness.mean,
            self.pod.env_steps,
            self.hparams(),
            self.last_copy_round,
            fitness.returns,
            self.pod.kind,
        )

    @staticmethod
    def comparable(listing: list[Entry], fitness: Fitness) -> list[Entry]:
        """The listed entries with an entry's episodes (``returns``) only when they were on
        ``fitness``'s start states (else None: a candidate is evaluated again before it is taken)."""
        out = []
        for e in listing:
            ev = Fitness.from_json(e.eval)
            out.append(replace(e, returns=ev.returns if ev is not None and ev.key == fitness.key else None))
        return out

    def listing(self, index: int) -> list[Entry]:
        """Rank 0's view of the leaderboard for collective round ``index``, the same on a redo.

        A round redone after a kill (its checkpoint predates it) must decide on what the first
        attempt saw, not on the entries that attempt published: the listing is kept in the run
        directory the first time and read back after. A part of a pool of several jobs keeps its
        own (``rounds/part<k>/``): parts hold their rounds at their own times, and a part started
        later must never decide on another part's old listing.
        """
        path = self.rundir.round_listing(index, self.part)
        try:
            return [Entry.from_listing(row) for row in read_json(path, what="round listing")]
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError) as e:
            self.say(f"round {index}: ignoring unreadable {path} ({e}); listing the leaderboard again")
        rows = [_with_kind(e).to_listing() for e in self.board.list()]
        # (no directory fsync: only a machine crash could lose the name, and then the redo lists again)
        safeio.atomic_write_bytes(path, json.dumps(rows).encode(), sync_dir=False)
        return [Entry.from_listing(row) for row in rows]  # what a redo reads back, and no more

    def publish(self, fitness: Fitness, index: int, hp: dict[str, float], population: bool = False) -> str | None:
        """This pod's agent as a leaderboard entry (``population``: as its entry in :attr:`population`),
        with the evaluation it was scored on (None if it could not be written: logged, not fatal)."""
        if population and not math.isfinite(fitness.mean):
            return None  # a NaN pod is never a source (checked before its agent is copied out)
        tensors, meta = self.pod.agent_tensors()
        meta.update(job=self.job, pod=self.index, round=index, hparams=hp, eval=fitness.to_json())
        try:
            if population:
                return self.population.publish(tensors, fitness.mean, meta)
            return self.board.publish(tensors, fitness.mean, meta, content_id=True)
        except (OSError, safeio.StateFileError) as e:  # a full disk; a leaderboard secret that cannot be used
            self.publish_failed_round = index  # recorded in the round's row (publish_failed) and the summary
            self.say(
                f"round {index}: could not publish to the leaderboard ({e}); pods that chose this one keep their "
                "own (logged as publish_failed)"
            )
            return None

    def take(
        self, eid: str, index: int, verify: Fitness | None = None, population: bool = False
    ) -> tuple[Source, Comparison | None]:
        """Load entry ``eid`` into the pod, keeping its own hyperparameters; a source that is gone
        or fails its checks is rejected (the pod keeps its agent) and said. ``verify``: the pod's
        own evaluation; the entry is first evaluated on the same start states and taken only if
        better by ``tournament.margin_se`` (then the comparison is returned; a loss keeps the
        pod's agent, ``Source.rejected`` False and the comparison says why). ``population``: the
        entry is a pod's in :attr:`population` (async PBT), not on the leaderboard."""
        try:
            if population:
                _, tensors, meta = self.population.load(eid, device=self.pod.device)
            else:
                _, tensors, meta = self.board.load_best_available([eid], device=self.pod.device, skip_corrupt=False)
            what = f"leaderboard entry {eid}"
            compared = None
            if verify is not None:
                theirs = self.pod.evaluate(verify.seed, agent=self.pod.agent_from(tensors, meta, source=what))
                margin = self.tcfg.margin_se
                ok, m, se = better(verify.returns, theirs.cpu().tolist(), margin)
                compared = Comparison(
                    verify.se, verify.seed, verify.episodes, float(theirs.mean()), m, se, margin, True
                )
                if not ok:
                    self.say(
                        f"round {index}: kept own agent: entry {eid} on this round's start states "
                        f"{m:+.4g} +- {se:.3g} (needs > {margin:g} standard errors)"
                    )
                    return Source(), compared
            self.pod.load_agent(tensors, meta, source=what, load_hparams=False)
            self.last_copy_round = index
            return Source("entry", eid), compared
        except (EntryGone, EntryCorrupt, safeio.StateFileError) as e:
            self.say(f"round {index}: kept own agent, source rejected: {e}")
            return Source("entry", eid, rejected=True), None

    def apply(
        self,
        d: Decision,
        index: int,
        source_entry: str | None,
        fitness: Fitness | None = None,
        population: bool = False,
    ) -> tuple[str, Source, Comparison | None]:
        """Carry out one decision: load its source (or reset), then its hyperparameters; returns
        what was done, from where, and a candidate's evaluation when it was verified first.
        ``population``: a ``copy_pod`` source is a population entry (async PBT)."""
        action, source, compared = d.action, Source(), None
        if d.action in ("load_entry", "copy_pod"):
            if source_entry is None:  # the source pod's publish failed
                action, source = "keep", Source("pod", str(d.source_rank), rejected=True)
            else:
                source, compared = self.take(
                    source_entry,
                    index,
                    verify=fitness if d.verify else None,
                    population=population and d.action == "copy_pod",
                )
                action = "keep" if source.rejected or not source.kind else d.action
        elif d.action == "reset":
            self.say(f"round {index}: fitness {d.fitness} and no finite source anywhere: re-initializing the agent")
            self.pod.reset_agent()
            source = Source("fresh")
        if d.new_hparams is not None and action == d.action:  # not when the source was rejected
            new = dict(d.new_hparams)
            if population and d.action == "copy_pod":  # from a file: only what the declared space holds
                own, space = self.hparams(), self.declared()
                new = {k: v if k in space else own.get(k, v) for k, v in new.items()}
            bad = check_hparams(new, self.declared(), self.cfg.agent.algo)
            if bad:
                self.say(f"round {index}: kept own hyperparameters, the source's are refused: {'; '.join(bad)}")
            else:
                self.pod.set_hparams(new)
                if action == "keep":  # a mutation of its own values (DexPBT) needs time to show, as a copy
                    self.last_copy_round = index
        return action, source, compared

    def declared(self) -> dict:
        """The ranges another agent's hyperparameters must lie in to be taken (hparams.declared_space)."""
        return declared_space(self.tcfg, self.cfg.agent.algo, self.pod.hparams())

    def record(
        self,
        index: int,
        fitness: Fitness,
        wall_s: float,
        action: str,
        source: Source,
        hp: dict[str, float],
        t0: float,
        ops0: int,
        d: Decision | None = None,
        compared: Comparison | None = None,
    ) -> RoundRecord:
        """The round's log row, with the numbers its decision used."""
        if compared is None:
            nan = float("nan")
            score = d.source_score if d is not None and d.source_score is not None else nan
            compared = Comparison(
                fitness.se,
                fitness.seed,
                fitness.episodes,
                score,
                d.diff_mean if d is not None and d.diff_mean is not None else nan,
                d.diff_se if d is not None and d.diff_se is not None else nan,
                self.tcfg.margin_se if self.tcfg.mode == "elegantrl" else 0.0,
                False,
            )
        rec = RoundRecord(
            index,
            self.pod.env_steps,
            wall_s,
            fitness.mean,
            action,
            source,
            hp,
            self.hparams(),
            time.perf_counter() - t0,
            fs_ops() - ops0,
            compared,
            self.cfg.agent.algo,
            publish_failed=self.publish_failed_round == index,
        )
        if self.log is not None:
            self.log.append("tournament", rec.to_row(), flush=True)
        return rec

    # --- elastic join ---------------------------------------------------------------------
    def join(self) -> str | None:
        """Elastic join: a fresh pod starts from a leaderboard entry of its own kind when there is one,
        checked first as a round checks a candidate: its hyperparameters in the declared space
        (only those it takes), and on the same start states it beats the pod's fresh agent
        (``tournament.margin_se`` standard errors under the ElegantRL rule, any better mean else)."""
        if self.collective:
            infos = self.comm.bcast(self.board.list() if self.comm.rank == 0 else None)
        else:
            infos = self.board.list()
        entries = [e for e in infos if entry_kind(e.meta) == self.pod.kind][: self.tcfg.top_k]
        if not entries:
            return None
        # Spread the pods over the best entries; fall through to the next one if it is gone or bad.
        k = self.index % len(entries)
        eid, own = None, None
        for entry in entries[k:] + entries[:k]:
            try:
                _, tensors, meta = self.board.load_best_available([entry], device=self.pod.device, skip_corrupt=False)
                what = f"leaderboard entry {entry.id}"
                hp = {str(n): v for n, v in dict(meta.get("hparams") or {}).items()}
                bad = check_hparams(hp, self.declared(), self.cfg.agent.algo)
                if bad:
                    raise safeio.StateFileError(f"{what}: hyperparameters refused: {'; '.join(bad)}")
                seed = eval_seed(self.cfg.seed, "join")
                own = self.pod.evaluate(seed).cpu().tolist() if own is None else own
                theirs = self.pod.evaluate(seed, agent=self.pod.agent_from(tensors, meta, source=what))
                margin = self.tcfg.margin_se if self.tcfg.mode == "elegantrl" else 0.0
                ok, m, se = better(own, theirs.cpu().tolist(), margin)
                if not ok:
                    self.say(
                        f"skipping {what}: it does not beat a fresh agent on the join's start states "
                        f"({m:+.4g} +- {se:.3g}, needs > {margin:g} standard errors)"
                    )
                    continue
                space = self.declared()
                self.pod.load_agent(tensors, meta, source=what, load_hparams=False)
                self.pod.set_hparams({n: float(v) for n, v in hp.items() if n in space})
                eid = entry.id
                break
            except EntryGone:
                continue
            except (EntryCorrupt, safeio.StateFileError) as e:
                self.say(f"skipping leaderboard entry {entry.id}: {e}")
        if eid is None:
            self.say("no leaderboard entry could be loaded; starting from scratch")
            return None
        score = {e.id: e.score for e in entries}.get(eid, float("nan"))
        self.say(f"joined from leaderboard entry {eid} (score {score:.1f})")
        hp = self.hparams()
        self._log_start("join", score, Source("entry", eid), hp, hp)
        return eid

    def _log_start(
        self, action: str, fitness: float, source: Source, old: dict[str, float], new: dict[str, float]
    ) -> None:
        """The row of round -1 in this pod's ``/tournament`` log: how it started (a join, a draw)."""
        if self.log is not None:
            row = RoundRecord(
                -1, self.pod.env_steps, 0.0, fitness, action, source, old, new, 0.0, 0, algo=self.cfg.agent.algo
            )
            self.log.append("tournament", row.to_row(), flush=True)

    def draw_first_hparams(self) -> dict[str, float] | None:
        """PBT's first population (``tournament.initial_hparams``): with ``prior`` (``auto`` when
        ``tournament.hparam_space`` is declared) a fresh pod starts where random search's pod of
        the same index does (``hparams.first_draw``: pod 0 the job's values, every other pod its
        own draw from the declared prior for its seed), and the pool exploits from there. Returns
        the draw (None when the pod keeps the job's values)."""
        t = self.tcfg
        wanted = t.initial_hparams == "prior" or (t.initial_hparams == "auto" and bool(t.hparam_space))
        if t.mode not in EXPLORING_MODES or not wanted or not self.space:
            return None
        new = first_draw(effective_space(t, self.cfg.agent.algo), self.pod.seed, self.index)
        if new is None:
            return None
        old = self.hparams()
        self.pod.set_hparams(new)
        self.say(f"starts from its draw from the prior: {', '.join(f'{n}={v:.4g}' for n, v in new.items())}")
        self._log_start("draw", math.nan, Source(), old, new)
        return new

    # --- a collective round ---------------------------------------------------------------
    def collective_round(
        self, index: int, fitness: Fitness, wall_s: float, reports: list[PodReport], met_at: float | None = None
    ) -> RoundRecord:
        """Round ``index`` with every pod's report (gathered at the meeting that began at
        ``met_at``, a perf_counter time, counted in the round's time): same decisions on every rank."""
        comm, t0, ops0 = self.comm, time.perf_counter() if met_at is None else met_at, fs_ops()
        hp = self.hparams()
        # every entry, not the top K: the freshness rule drops stale ones before the top-K cut
        entries = comm.bcast(self.listing(index) if comm.rank == 0 else None)
        decisions = decide(
            reports,
            self.comparable(entries, fitness),
            index,
            self.cfg.seed,
            self.tcfg,
            rng_ranks=[self.offset + p.rank for p in reports] if self.offset else None,
        )
        self.last_decisions = decisions
        d = decisions[comm.rank]
        mine = self.publish(fitness, index, hp) if d.publish else None
        entry_of_rank = comm.allgather(mine)  # also a barrier: every source is on disk now
        src = (
            d.source_entry
            if d.action == "load_entry"
            else entry_of_rank[d.source_rank]
            if d.action == "copy_pod"
            else None
        )
        action, source, compared = self.apply(d, index, src, fitness)
        comm.barrier()  # everyone has loaded: pruning cannot pull an entry from under a reader
        # Every rank computes the same prune plan (same listing, decisions and entries) and removes
        # only its own entry; rank 0 removes the listed ones: no rank's work grows with the pool.
        # An entry loaded from the listing stays until the pool checkpoints (a redo of the round
        # loads it again); a source pod's entry of this round may go: a redo publishes it again
        # (same content, same id).
        self.loaded_since_checkpoint |= {x.source_entry for x in decisions if x.action == "load_entry"} - {None}
        needed = self.loaded_since_checkpoint
        seen = list(entries)  # the listing decided on: no sidecar is read again
        seen += [
            Entry(
                eid,
                float(reports[r].fitness),
                reports[r].env_steps,
                self.offset + r,
                self.job,
                index,
                kind=reports[r].kind,
            )
            for r, eid in enumerate(entry_of_rank)
            if eid
        ]
        plan = set(plan_prune(seen, self.tcfg.top_k, keep=needed, group=_kind_of))
        try:
            self.board.remove(plan & {mine} if comm.rank else plan - set(entry_of_rank[1:]))
            if comm.rank == 0:
                self.board.sweep()  # what dead writers left (entries other jobs published stay until later)
        except OSError as e:
            self.say(f"round {index}: could not prune the leaderboard ({e})")
        return self.record(index, fitness, wall_s, action, source, hp, t0, ops0, d, compared)

    # --- an asynchronous round ------------------------------------------------------------
    def async_round(self, index: int, fitness: Fitness, wall_s: float) -> RoundRecord:
        """Round ``index`` of this pod alone, against the leaderboard as it is now (and, with PBT, a
        random sample of the population). Asynchronous pods are scored on one set of start states
        for the whole tournament (``eval_seed(seed, "async")``), so every entry of the run compares
        with every pod episode by episode."""
        t0, ops0 = time.perf_counter(), fs_ops()
        hp, me = self.hparams(), self.report(fitness)
        rng = make_rng(self.cfg.seed, index, self.index, _STREAM_SAMPLE)  # this pod's draws of files to read
        # the top entries only (a prune keeps top_k of each kind), each sidecar read once, and at
        # most 2 top_k new ones per round (a burst of publications at the pool's first round)
        infos = self.board.list(max_new=2 * self.tcfg.top_k, rng=rng)
        listed = self.comparable([_with_kind(e) for e in infos], fitness)
        copy_from_population = False
        if self.tcfg.mode == "pbt":
            d, src = self._async_pbt(me, fitness, listed, index, rng)
            copy_from_population = d.action == "copy_pod"
            self.publish(fitness, index, hp, population=True)  # the population must see every pod
        else:
            d = decide([replace(me, rank=0)], listed, index, self.cfg.seed, self.tcfg, rng_ranks=[self.index])[0]
            src = d.source_entry
        mine = self.publish(fitness, index, hp) if d.publish else None  # onto the leaderboard: if among its top K
        action, source, compared = self.apply(d, index, src, fitness, population=copy_from_population)
        keep = {mine} | (set() if copy_from_population else {src})
        try:  # on the listing read above: entries published since stay until a later prune
            self.board.prune(self.tcfg.top_k, keep=keep - {None}, listing=infos, group=_kind_of)
        except OSError as e:
            self.say(f"round {index}: could not prune the leaderboard ({e})")
        return self.record(index, fitness, wall_s, action, source, hp, t0, ops0, d, compared)

    def _async_pbt(
        self, me: PodReport, fitness: Fitness, listed: list[Entry], index: int, rng: Any
    ) -> tuple[Decision, str | None]:
        """PBT against a random sample of the population (``tournament.population_sample`` other
        pods' latest entries, scored on this pod's start states: episode by episode comparable;
        others are not the population). ``listed``: the leaderboard, for a NaN pod's fallback and
        for whether this pod enters its top K (then it is published there too)."""
        sample = self.population.sample(rng, self.tcfg.population_sample, exclude=(self.job, self.index))
        pop = [
            (e, ev.returns) for e in sample if (ev := Fitness.from_json(e.eval)) is not None and ev.key == fitness.key
        ]
        reports = [replace(me, rank=0)]
        reports += [
            PodReport(i + 1, e.score, e.env_steps or 0, dict(e.hparams), returns=rets, kind=entry_kind(e.meta))
            for i, (e, rets) in enumerate(pop)
        ]
        d = decide(
            reports,
            listed,
            index,
            self.cfg.seed,
            self.tcfg,
            rng_ranks=[self.index] + [10_000 + i for i in range(len(pop))],
        )[0]
        src = pop[d.source_rank - 1][0].id if d.action == "copy_pod" else d.source_entry
        # onto the leaderboard only if it enters the top K of its kind there (its own place in the
        # population is published every round regardless)
        above = sum(1 for c in listed if c.kind in (None, me.kind) and c.score >= me.fitness)
        return replace(d, publish=math.isfinite(me.fitness) and above < self.tcfg.top_k), src

    # --- what rank 0 prints at the end ----------------------------------------------------
    def table(self, n: int = 8) -> str:
        rows = self.board.list()[:n]
        lines = [
            f"leaderboard {self.board.root} ({len(self.board.list())} entries, top {self.tcfg.top_k} kept)",
            f"{'#':>3} {'score':>10} {'env steps':>11} {'pod':>4} {'round':>5}  entry",
        ]
        for i, e in enumerate(rows):
            lines.append(
                f"{i + 1:>3} {e.score:>10.1f} {e.env_steps or 0:>11,} {e.pod if e.pod is not None else '-':>4} "
                f"{e.round if e.round is not None else '-':>5}  {e.id}"
            )
        return "\n".join(lines)


def pool_line(index: int, reports: list[Any]) -> str:
    """`` | pool at round 3: 64 pods, fitness median -310.2, best -120.5 (pod 17)``: what every
    pod reported at a collective round (tournament.PodReport), for rank 0's progress line."""
    fit = [(r.fitness, r.rank) for r in reports if r is not None and math.isfinite(r.fitness)]
    if not fit:
        return f" | pool at round {index}: {len(reports)} pods, no finite fitness"
    values = sorted(f for f, _ in fit)
    best, rank = max(fit)
    return (
        f" | pool at round {index}: {len(reports)} pods, fitness median {values[len(values) // 2]:.1f}, "
        f"best {best:.1f} (pod {rank})"
    )
