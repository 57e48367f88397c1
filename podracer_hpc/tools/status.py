"""``podracer status RUN_DIR [--watch SECONDS]``: a table of the pods and of the leaderboard.

Reads only what a run writes (``docs/hdf5-schema.md``): the per-rank HDF5 logs (opened as SWMR
readers, so a run can be watched while it trains), the leaderboard sidecars and, once the run has
ended, ``summary.json``. It writes nothing and takes no lock: a status reader can never slow down
or break the run it looks at.

- :func:`render` returns the text (a header, one row per pod, a total, the leaderboard's top
  entries, the summary once there is one);
- :func:`status` prints it once, or with ``watch > 0`` every ``watch`` seconds until interrupted
  or until ``summary.json`` appears (then it prints once more and returns).

Usable without the CLI as ``python -m podracer_hpc.tools.status RUN_DIR [--watch S]``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from podracer_hpc.cluster.jobstate import slurm_job_states
from podracer_hpc.files import heartbeat
from podracer_hpc.files.bounded import read_json
from podracer_hpc.files.live import (
    STALE_S,
    Monitor,
    PodStatus,
    StatusError,
    check_run_dir,
    pod_fates,
    pod_state,
)
from podracer_hpc.files.retries import read_retries, retries_of
from podracer_hpc.files.rundir import EXIT_HUNG, RunDir

__all__ = ["render", "status", "main"]

TOP_ENTRIES = 8  # leaderboard rows shown
TOP_ENTRIES_AGGREGATED = 5  # leaderboard rows shown with aggregated pods (a large pool: the screen is shorter)
POD_ROWS = 16  # up to this many pods, a row each by default; beyond, aggregates and the top pods (--pods: all)
TOP_PODS = 5  # pods shown beside the aggregates (--top)
SLURM_ROWS = 4  # Slurm jobs named one per line
SLURM_EVERY_S = 30.0  # a watcher asks Slurm at most this often (its answer is kept in between)
PART_ROWS = 16  # parts named one per line; beyond, the ones not running well


# ---------------------------------------------------------------------- formatting


def _table(header: list[str], rows: list[list[str]], left: tuple[int, ...] = ()) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _num(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None or not math.isfinite(x) else fmt.format(x)


def _age(s: float) -> str:
    if not math.isfinite(s):
        return "-"
    return (f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.0f}h") + " ago"


def _leaderboard_lines(run_dir: Path, cfg: dict[str, Any], top: int) -> list[str]:
    tcfg = cfg.get("tournament") or {}
    root = RunDir(run_dir).leaderboard(tcfg.get("leaderboard_dir") or "")
    if not (root / "entries").is_dir():
        if tcfg.get("mode", "none") == "none":
            return []
        return [f"leaderboard {root}: none yet"]
    from podracer_hpc.pool.leaderboard import Leaderboard

    with warnings.catch_warnings():  # a status reader reports the run, not the directory's hygiene
        warnings.simplefilter("ignore")
        board = Leaderboard(root, read_only=True)  # creates nothing, renames nothing
        entries = board.list()
    now = time.time()
    kept = (
        f"top {tcfg.get('top_k', '?')} of each kind of agent kept"
        if cfg.get("population")
        else f"top {tcfg.get('top_k', '?')} kept"
    )
    lines = [f"leaderboard {root} ({len(entries)} entries, {kept})"]
    rows = [
        [
            str(i + 1),
            _num(e.score),
            f"{e.env_steps:,}" if e.env_steps is not None else "-",
            "-" if e.pod is None else str(e.pod),
            "-" if e.round is None else str(e.round),
            str(e.meta.get("algo") or "ppo"),
            e.job or "-",
            _age(now - e.created) if e.created else "-",
            e.id,
        ]
        for i, e in enumerate(entries[:top])
    ]
    lines += [
        "  " + s
        for s in _table(
            ["#", "score", "env steps", "pod", "round", "algo", "job", "age", "entry"], rows, left=(5, 6, 8)
        )
    ]
    return lines


def _pod_rows(pods: list[PodStatus], total: int) -> list[list[str]]:
    rows = []
    for p in pods:
        if p.error:
            rows.append([str(p.rank), "-", "-", "-", "-", "-", "-", "-", "-", _age(p.age_s), f"unreadable: {p.error}"])
            continue
        pct = f" ({100 * p.env_steps / total:.0f}%)" if total else ""
        rows.append(
            [
                str(p.rank),
                "-" if p.seed is None else str(p.seed),
                "-" if p.rounds is None else str(p.rounds),
                f"{p.env_steps:,}{pct}",
                _num(p.steps_per_s, "{:,.0f}"),
                _num(p.last_eval),
                _num(p.best_eval),
                p.algo or "-",
                _num(p.wall_s, "{:.0f}s"),
                _age(p.age_s),
                p.last_action or "-",
            ]
        )
    return rows


POD_HEADER = [
    "rank",
    "seed",
    "rounds",
    "env steps",
    "steps/s",
    "last eval",
    "peak eval",
    "algo",
    "train time",
    "log written",
    "last tournament action",
]


def _returns_lines(summary: dict[str, Any] | None) -> list[str]:
    """What the eval columns are, and the run's verdict (the number to report) once it has one
    (docs/training.md, "Which return to report")."""
    lines = ["eval columns: a pod's latest and its best evaluation so far; over the pods: final_return, peak_return"]
    if summary is not None and summary.get("final_episodes") and summary.get("best_return") is not None:
        lo, hi = summary.get("best_return_ci95") or (None, None)
        lines.append(
            f"verdict: best_return {_num(summary['best_return'])} [95% {_num(lo)}, {_num(hi)}], pod "
            f"{summary.get('best_pod')}, {summary['final_episodes']} episodes on common start states: "
            "the number to report"
        )
    elif summary is not None:
        lines.append("verdict: none (eval.final_episodes 0, or a pod not done): best_return is peak_return")
    return lines


def _ranks_text(ranks: list[int], most: int = 8) -> str:
    return ", ".join(map(str, ranks[:most])) + (f", ... ({len(ranks)})" if len(ranks) > most else "")


def _aggregate_lines(
    pods: list[PodStatus], total: int, ended: set[int], world: int | None, fates: dict[int, str] | None = None
) -> list[str]:
    """Counts of pods by state (and the ranks of those not running well), percentiles over pods.
    ``ended``: the pods whose run or part has ended; ``fates``: how a pod's last start ended, where
    the run directory tells (:func:`pod_fates`)."""
    fates = fates or {}
    by: dict[str, list[int]] = {}
    for p in pods:
        by.setdefault(pod_state(p, total, p.rank in ended, fates.get(p.rank, "")), []).append(p.rank)
    order = ("running", "done", "stopped", "hung", "killed", "stalled", "unreadable")
    parts = [f"{len(by[k])} {k}" for k in order if k in by]
    missing = (world or 0) - len(pods)
    if missing > 0:
        parts.append(f"{missing} without a log yet")
    lines = [f"pods: {', '.join(parts) or 'none'}"]
    for k in ("hung", "killed", "stalled", "unreadable"):
        if k in by:
            lines.append(f"  {k}: rank {_ranks_text(by[k])}")
    if "killed" in by:
        lines.append(
            "  killed: "
            + ", ".join(f"pod {r} {fates[r].partition(' ')[2]}" for r in by["killed"][:8])
            + "; the same command resumes them"
        )
    ok = [p for p in pods if not p.error]
    if len(ok) < 2:
        return lines
    qs = (0, 10, 50, 90, 100)
    rows = []
    for name, vals, fmt in (
        ("env steps", [p.env_steps for p in ok], "{:,.0f}"),
        ("steps/s", [p.steps_per_s for p in ok], "{:,.0f}"),
        ("last eval", [p.last_eval for p in ok], "{:.1f}"),
        ("peak eval", [p.best_eval for p in ok], "{:.1f}"),
        ("rounds", [math.nan if p.rounds is None else p.rounds for p in ok], "{:.0f}"),
    ):
        a = np.asarray(vals, dtype=float)
        a = a[np.isfinite(a)]
        if not len(a):
            continue
        rows.append([name, *(fmt.format(v) for v in np.percentile(a, qs)), f"{len(a)}"])
    if rows:
        lines += [
            "  " + x for x in _table(["over pods", "min", "p10", "median", "p90", "max", "pods"], rows, left=(0,))
        ]
    return lines


def _ask_slurm(
    monitor: Monitor, jobs: list[str], ask: Callable[[list[str]], dict[str, Any]] | None
) -> dict[str, Any] | None:
    """Slurm's states of ``jobs``, asked at most every SLURM_EVERY_S per monitor (a watcher's
    refreshes in between reuse the answer); None when there is no scontrol here."""
    if not jobs:
        return {}
    memo = monitor.memo.get("slurm")
    now = time.monotonic()
    if memo is not None and memo[1] == jobs and now - memo[0] < SLURM_EVERY_S:
        return memo[2]
    if ask is None:
        if shutil.which("scontrol") is None:
            return None
        ask = slurm_job_states
    states = ask(jobs)
    monitor.memo["slurm"] = (now, list(jobs), states)
    return states


def _pool_parts(run_dir: Path) -> tuple[int, int, dict[str, Any]]:
    """A pool of several jobs (pool.json): its jobs, pods per job and each part's last job; (0, 0, {}) if none."""
    try:
        d = json.loads(RunDir(run_dir).pool_file.read_text())
        return int(d["jobs"]), int(d["pods_per_job"]), dict(d.get("parts") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, {}


def _pid_alive(job: dict[str, Any]) -> bool | None:
    """A local part's process: whether it runs (None: another host's, not ours to see)."""
    import os
    import socket

    if job.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(job.get("pid") or 0), 0)
    except (OSError, ValueError):
        return False
    try:
        return Path(f"/proc/{int(job['pid'])}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _retry_text(rows: list[dict[str, Any]]) -> str:
    """``; retried 2: job 11 -> 12 (failed, exit code 0:9), excluded n3; job 12 -> 15 (...)``."""
    if not rows:
        return ""
    return f"; retried {len(rows)}: " + "; ".join(
        f"job {r['old_job']} -> {r['new_job']} ({r['reason']})"
        + (f", excluded {','.join(r['excluded'])}" if r["excluded"] else "")
        for r in rows[-3:]
    )


def _part_lines(
    run_dir: Path, monitor: Monitor, statuses: list[PodStatus], total: int, states: dict[str, Any] | None
) -> tuple[list[str], set[int]]:
    """One line per part of a pool of several jobs (job, state, hosts, pods running / done /
    stopped / missing, last heartbeat) and the pods whose part has ended: a part is ended only
    when its own job is (its final aggregate, its hang record, Slurm, or its local process says so)."""
    jobs, per_job, parts = _pool_parts(run_dir)
    if not jobs and monitor.parts and monitor.pool_size:  # one job: its one part, when it wrote an aggregate
        jobs, per_job = 1, monitor.pool_size
    if not jobs:
        return [], set()
    rd, by_pod = RunDir(run_dir), {p.rank: p for p in statuses}
    retried = read_retries(rd)
    lines, ended = [f"parts: {jobs} job{'s' * (jobs != 1)} of {per_job} pods"], set()
    for k in range(jobs):
        pods = range(k * per_job, (k + 1) * per_job)
        job, agg, hang = parts.get(str(k)) or {}, monitor.parts.get(k), heartbeat.read_hang(rd, k)
        jid = str(job.get("job") or (agg or {}).get("job") or "")
        if job.get("executor") == "local":
            alive, jtext = _pid_alive(job), f"local pid {job.get('pid')}"
            sstate = "" if alive is None else "RUNNING" if alive else "ENDED"
        else:
            st = (states or {}).get(jid)
            sstate, jtext = (st.state or "GONE") if st is not None else "", f"job {jid or '?'}"
            alive = None if st is None else st.state in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED")
        over = bool(hang) or (agg or {}).get("state") in ("done", "stopped") or alive is False
        if over:
            ended |= set(pods)
        for h in (hang or {}).get("hung") or []:
            if isinstance(h, dict) and h.get("pod") in by_pod:
                by_pod[h["pod"]].ended = "hung"
        if agg is None and not hang:
            where = ""
            st = (states or {}).get(jid)
            if st is not None and st.nodes:
                where = f" on nodes {st.nodes}"
            lines.append(
                f"  part {k}: no record yet ({jtext} {sstate or 'state unknown'}{where})"
                + _retry_text(retries_of(retried, k))
            )
            continue
        counts: dict[str, int] = {}
        for i in pods:
            p = by_pod.get(i)
            key = "missing" if p is None else pod_state(p, total, over)
            counts[key] = counts.get(key, 0) + 1
        order = ("running", "done", "stopped", "hung", "stalled", "missing", "unreadable")
        pods_text = " / ".join(
            f"{counts.get(x, 0)} {x}" for x in order if counts.get(x) or x in order[:3] + ("missing",)
        )
        beat = min((by_pod[i].age_s for i in pods if i in by_pod and math.isfinite(by_pod[i].age_s)), default=math.nan)
        state = "HUNG" if hang else ((agg or {}).get("state") or "running").upper()
        if sstate and state == "RUNNING" and sstate != "RUNNING":
            state = f"{state} (slurm: {sstate})"
        hosts = ", ".join((agg or {}).get("hosts") or []) or "-"
        lines.append(
            f"  part {k}: {jtext} {state}, hosts {hosts}, pods {pods_text}, last heartbeat {_age(beat)}"
            + (f"; hung: {', '.join(str(h.get('pod')) for h in hang.get('hung') or [])}" if hang else "")
            + _retry_text(retries_of(retried, k))
        )
    if len(lines) > PART_ROWS + 1:
        lines = lines[:1] + [x for x in lines[1:] if "RUNNING," not in x][:PART_ROWS]
    return lines, ended


def render(
    run_dir: str | Path,
    top: int = TOP_ENTRIES,
    pods: bool | None = None,
    top_pods: int = TOP_PODS,
    monitor: Monitor | None = None,
    slurm: Callable[[list[str]], dict[str, Any]] | None = None,
) -> str:
    """The status of a run as text: header, pods, total, leaderboard, Slurm, summary (once the run has ended).

    ``pods``: a row for every pod (True), or aggregates and the ``top_pods`` best pods only
    (False); None: every pod's row up to POD_ROWS pods, aggregates beyond. ``monitor``: the
    :class:`Monitor` of earlier polls (a watcher passes the same one each time: only new log rows
    are read); ``slurm``: what asks Slurm (default :func:`jobstate.slurm_job_states`, one call per
    poll). Raises :class:`StatusError` if ``run_dir`` is not a run directory.
    """
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    monitor = monitor if monitor is not None else Monitor(run_dir)
    summary: dict[str, Any] | None = None
    summary_path = RunDir(run_dir).summary
    if summary_path.exists():
        try:
            summary = read_json(summary_path, what="run summary")
        except (OSError, ValueError):
            summary = None  # being written: the next refresh shows it
    statuses = monitor.poll()
    cfg = monitor.config
    jobs = monitor.job_ids()
    for job in (_pool_parts(run_dir)[2] or {}).values():
        if isinstance(job, dict) and job.get("executor") != "local" and job.get("job"):
            jobs.append(str(job["job"]))
    jobs = list(dict.fromkeys(jobs))
    states = _ask_slurm(monitor, jobs, slurm)
    part_lines, ended = _part_lines(run_dir, monitor, statuses, int(cfg.get("total_env_steps") or 0), states)
    if not part_lines and summary is not None:
        ended = {p.rank for p in statuses}
    fates = pod_fates(run_dir, statuses, ended)
    killed = sorted(r for r, f in fates.items() if f.startswith("killed"))
    total = int(cfg.get("total_env_steps") or 0)
    mode = (cfg.get("tournament") or {}).get("mode", "none")
    quiet_s = min((p.age_s for p in statuses if math.isfinite(p.age_s)), default=math.nan)
    if summary is None and not statuses:
        state = "starting (no logs yet)"
    elif killed and not any(f == "running" for f in fates.values()):
        state = (
            f"killed: pod{'s' * (len(killed) > 1)} {_ranks_text(killed)} {fates[killed[0]]}, not stopped "
            "with a checkpoint; run the same command again to resume"
        )
    elif summary is None and quiet_s > STALE_S:
        state = f"last log write {_age(quiet_s)} and no summary.json: stalled, or killed before it could end?"
    elif part_lines and any(" HUNG," in x for x in part_lines) and len(ended) >= len(statuses):
        state = (
            f"hung: a rank missed a meeting's deadline (exit {EXIT_HUNG}; the parts below say who; run again to resume)"
        )
    elif summary is None or (part_lines and len(ended) < len(statuses)):
        state = "running"
    elif any(f == "running" for f in fates.values()):
        state = "running (the summary so far is of the parts of the pool that ended)"
    elif summary.get("complete", True) and summary.get("ended_at_target"):
        at = summary["ended_at_target"]
        state = (
            f"finished at its target (eval.stop_at_return): pod {_ranks_text(at['pods'])} reached it "
            f"at {at['env_steps']:,} env steps"
        )
    elif summary.get("complete", True):
        state = "finished"
    else:
        state = "stopped early (checkpointed; run again to resume)"
    task = (cfg.get("env") or {}).get("name", "?")
    lines = [
        f"run {run_dir}  [{cfg.get('name', '?')}: {task}, {len(statuses)} pod{'s' * (len(statuses) != 1)}, "
        f"tournament {mode}]  {state}  at {time.strftime('%H:%M:%S')}"
    ]
    every = len(statuses) <= POD_ROWS if pods is None else pods
    world = monitor.pool_size  # the pool's pods (all its jobs)
    if len(statuses) > 1 or world > len(statuses):
        agg = _aggregate_lines(statuses, total, ended, world, fates)
        lines += ["", *(agg if not every or len(statuses) > POD_ROWS else agg[:1])]  # a few pods: their rows say it
    ok = [p for p in statuses if not p.error]
    shown = (
        statuses
        if every
        else sorted(ok, key=lambda p: (-p.best_eval if math.isfinite(p.best_eval) else math.inf, p.rank))[:top_pods]
    )
    rows = _pod_rows(shown, total)
    if len(statuses) > 1:  # each column over the pods, as the pods' cells are: the peak is the pods' best peak
        best = max((p for p in ok if math.isfinite(p.best_eval)), key=lambda p: p.best_eval, default=None)
        rows.append(
            [
                "all",
                "",
                "",
                f"{sum(p.env_steps for p in ok):,}",
                _num(sum(p.steps_per_s for p in ok if math.isfinite(p.steps_per_s)), "{:,.0f}"),
                _num(max((p.last_eval for p in ok if math.isfinite(p.last_eval)), default=math.nan)),
                _num(best.best_eval if best else math.nan),
                "",
                "",
                "",
                f"peak: pod {best.rank}" if best else "",
            ]
        )
    lines.append("")
    if not every:
        lines.append(f"top {len(shown)} of {len(statuses)} pods by peak eval (--pods: every pod's row)")
    lines += _table(POD_HEADER, rows, left=(7, 10)) if statuses else ["(no rank logs yet)"]
    if statuses:
        lines += _returns_lines(summary)
    board = _leaderboard_lines(run_dir, cfg, top if every else min(top, TOP_ENTRIES_AGGREGATED))
    if board:
        lines += ["", *board]
    if part_lines:
        lines += ["", *part_lines]
    if jobs:
        lines += ["", *_slurm_lines(jobs, states)]
    if summary is not None:
        keys = (
            "env_steps",
            "wall_s",
            "steps_per_s",
            "best_return",
            "final_return",
            "peak_return",
            "best_pod",
            "rounds",
        )
        parts = [
            f"{k} {summary[k]:,.1f}" if isinstance(summary.get(k), float) else f"{k} {summary[k]}"
            for k in keys
            if k in summary and summary[k] is not None
        ]
        lines += ["", "summary: " + ", ".join(parts)]
    return "\n".join(lines) + "\n"


def _slurm_lines(jobs: list[str], states: dict[str, Any] | None) -> list[str]:
    """One line per Slurm job the logs name: its state (reason, exit code) and requeues
    (``states``: Slurm's answer; None: no scontrol here)."""
    if states is None:
        return [f"slurm job {_ranks_text(jobs, 4)}: no scontrol here to ask its state"]
    out = []
    for j in jobs[:SLURM_ROWS]:
        st = states.get(j)
        if st is None:
            out.append(f"slurm job {j}: slurmctld did not answer (asked again at the next refresh)")
            continue
        text = st.state or "gone from the queue (no accounting record)"
        if st.reason and st.reason not in ("None", "(null)"):
            text += f" ({st.reason})"
        if st.exit_code and st.exit_code != "0:0":
            text += f", exit code {st.exit_code}"
        if st.restarts:
            text += f", requeued {st.restarts} time{'s' * (st.restarts != 1)}"
        out.append(f"slurm job {j}: {text}")
    if len(jobs) > SLURM_ROWS:
        out.append(f"slurm: {len(jobs) - SLURM_ROWS} more job(s)")
    return out


def status(
    run_dir: str | Path, watch: float = 0, out: TextIO | None = None, pods: bool | None = None, top_pods: int = TOP_PODS
) -> int:
    """Print the status of a run to ``out`` (default stdout); with ``watch > 0`` refresh every
    ``watch`` seconds (clearing the screen when ``out`` is a terminal). ``pods``/``top_pods``: as
    :func:`render`'s. A watcher keeps one :class:`Monitor`: each refresh reads only the log rows
    appended since the last one, and asks Slurm once.

    Watching stops on Ctrl-C, or once ``summary.json`` exists (the run has ended): the table is
    printed once more, with the summary, and the call returns. While watching, a directory that
    does not exist yet (a job still in the queue) or is still empty (a job starting) is waited
    for, and a refresh that fails (a file caught mid-write) is retried. Returns an exit code: 0,
    or 2 (with a message on stderr) if ``run_dir`` is not a run directory.
    """
    run_dir = Path(run_dir)
    out = out if out is not None else sys.stdout
    clear = watch > 0 and hasattr(out, "isatty") and out.isatty()
    waiting = False
    monitor = Monitor(run_dir)
    try:
        while True:
            ended = RunDir(run_dir).summary.exists()  # looked at before reading the logs they summarize
            try:
                text = render(run_dir, pods=pods, top_pods=top_pods, monitor=monitor)
            except StatusError as e:
                # A queued or starting job: wait. Once waiting, a directory caught half made is waited for too.
                if not (watch > 0 and (e.pending or waiting)):
                    raise
                waiting, ended = True, False
                text = f"{e}\nwaiting for the run to start (Ctrl-C to stop)\n"
            except Exception as e:  # noqa: BLE001 - a watcher outlives a file caught mid-write; it retries
                if watch <= 0:
                    raise
                ended = False
                text = f"status of {run_dir}: refresh failed ({type(e).__name__}: {e}); retrying\n"
            if clear:
                out.write("\x1b[H\x1b[2J")
            elif watch > 0:
                out.write("\n")
            out.write(text)
            out.flush()
            if watch <= 0 or ended:
                return 0
            time.sleep(watch)
    except StatusError as e:
        print(f"podracer status: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out.write("\n")
        return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``podracer status`` (for the CLI's subparser)."""
    p.add_argument("run_dir", help="run directory (podracer train --run-dir)")
    p.add_argument(
        "--watch",
        type=float,
        default=0,
        metavar="SECONDS",
        help="refresh every SECONDS until interrupted or until the run ends (each refresh reads only "
        "the log rows appended since the last one)",
    )
    p.add_argument(
        "--pods",
        "--all",
        action="store_true",
        dest="pods",
        default=None,
        help=f"a row for every pod (default: up to {POD_ROWS} pods; beyond, counts, percentiles over the "
        "pods and the top pods only)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=TOP_PODS,
        metavar="N",
        help=f"pods shown beside the aggregates of a large pool, best evaluation first (default {TOP_PODS})",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="podracer status", description="The pods and leaderboard of a run.")
    add_arguments(p)
    a = p.parse_args(argv)
    if a.watch < 0:
        p.error("--watch must be >= 0")
    if a.top < 0:
        p.error("--top must be >= 0")
    return status(a.run_dir, a.watch, pods=a.pods, top_pods=a.top)


if __name__ == "__main__":
    sys.exit(main())
