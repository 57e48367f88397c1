"""Scaling studies: podracer and RLlib at the same resource points, from one command.

    podracer study jobs/studies/pendulum_scaling.yaml --executor local|slurm [--wait] [--dry-run]
        [--set KEY=VALUE ...] [--report-only]

A study file (``jobs/studies/*.yaml``; ``podracer study --keys``) names a task, a target, the
resource points (pods: 1, 2, 4, ...), the seeds and the systems. The command

1. checks everything before anything runs or is queued (:mod:`.schema`: the file through
   config.py's machinery, documented keys and did-you-mean errors; :mod:`.execute`: every
   system's job at every point, the RLlib interpreter, on Slurm the cluster); a bad study exits 2;
2. runs every point x seed x system that is not done yet, through the launcher (:mod:`.execute`):
   locally one after another, on Slurm one job each (RLlib through ``slurm_templates/rllib.sbatch``,
   a Ray cluster over the same nodes);
3. writes the tables and figures (:mod:`.report`): locally at the end, on Slurm in a final job that
   depends on every point's job (``--dependency=afterany``).

Running the same command again skips the points that are done (and, on Slurm, those whose job is
still queued or running): a study resumes, and grows when points or seeds are added. Progress goes
to stderr; the last line of stdout is a JSON summary. Layout of ``out`` (default
``runs/studies/<name>``): ``study.yaml`` (the resolved study), ``runs/<system>/p<P>-s<seed>/`` (one
run directory each, with ``resources.json``), ``results/`` (tables, figures, summary.json).

How resources are matched (one point = P pods): podracer runs P MPI ranks, one pod each; RLlib gets
the same allocation and runs P learners on it (baselines/rllib/README.md, "Matched resources").
RLlib runs and Slurm reports need a checkout of podracer-hpc (baselines/, slurm_templates/).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from podracer_hpc import launch
from podracer_hpc.cluster.signals import interrupt_on_term
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.tools.study.execute import (
    active_job,
    check,
    is_done,
    podracer_request,
    read_json,
    rllib_args,
    rllib_python,
    rllib_sets,
    run_point_local,
    slurm_common,
    submit_point_slurm,
    watch_slurm,
)
from podracer_hpc.tools.study.report import report, study_runs
from podracer_hpc.tools.study.schema import ROOT, Point, Study, StudyError, System, keys_text, load_study

__all__ = [
    "Point",
    "Study",
    "StudyError",
    "System",
    "add_study_parser",
    "check",
    "is_done",
    "load_study",
    "main",
    "podracer_request",
    "report",
    "rllib_args",
    "rllib_sets",
    "run_study",
    "study_runs",
]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Progress:
    """Numbered progress lines on stderr: ``study NAME [i/n] system pods=P seed=S: what``."""

    def __init__(self, study: Study, total: int, out: Any = None):
        self.name, self.total, self.out, self.i = study.name, total, out or sys.stderr, 0

    def __call__(self, pt: Point | None, what: str, step: bool = False) -> None:
        if step:
            self.i += 1
        head = f"study {self.name}" + (f" [{self.i}/{self.total}] {pt.label}" if pt is not None else "")
        print(f"{head}: {what}", file=self.out, flush=True)


def report_command(study: Study) -> list[str]:
    """The command of the final job: this study's report from its folder."""
    return [sys.executable, "-m", "podracer_hpc.cli", "study", str(study.out / "study.yaml"), "--report-only"]


def write_manifest(study: Study) -> Path:
    study.out.mkdir(parents=True, exist_ok=True)
    path = study.out / "study.yaml"
    path.write_text(
        "# written by `podracer study`: the resolved study (absolute paths); the report job reads it\n"
        + yaml.safe_dump(study.source, sort_keys=False)
    )
    return path


def _run_local(study: Study, pts: list[Point], say: Progress) -> tuple[dict[str, Any], list[str]]:
    failed: list[str] = []
    for pt in pts:
        if is_done(pt):
            say(pt, "done, skipped", step=True)
            continue
        say(pt, f"running ({pt.layout}, {pt.cpus} CPUs, {pt.gpus:g} GPUs)", step=True)
        t0 = time.monotonic()
        try:
            run_point_local(study, pt, say)
            say(pt, f"finished in {time.monotonic() - t0:.0f} s")
        except launch.JobError as e:
            failed.append(pt.label)
            say(pt, f"FAILED: {e}")
    return report(study), failed


def _submit_points(study: Study, pts: list[Point], say: Progress, poll_s: float) -> tuple[list[str], list[str]]:
    """Every point not done as a Slurm job (serial: one at a time); returns (job ids, failed labels)."""
    jobs, failed = [], []
    serial, limit = bool(study.slurm["serial"]), float(study.slurm["time_min"]) * 60 + 600
    for pt in pts:
        if is_done(pt):
            say(pt, "done, skipped", step=True)
            continue
        active = active_job(pt)
        if active:
            say(pt, f"Slurm job {active} is still queued or running: not submitted again", step=True)
            jobs.append(active)
            log = (
                RunDir(pt.run_dir).slurm_logs(active) / f"{active}_0_log.err"
                if pt.system.kind == "podracer"
                else pt.run_dir / f"slurm-{active}.out"
            )
            launched = launch.Launched("slurm", [pt.run_dir], jobs=[launch.Job(active, log)], stale_summaries=[None])
        else:
            launched = submit_point_slurm(study, pt)
            jobs.append(launched.jobs[0].job_id)
            say(
                pt,
                f"submitted Slurm job {jobs[-1]} ({pt.nodes} node{'s' * (pt.nodes != 1)} x {pt.tasks_per_node} "
                f"pod{'s' * (pt.tasks_per_node != 1)}, {pt.gpus_per_node} GPUs/node)",
                step=True,
            )
        if serial and not watch_slurm(launched, limit, say, pt, poll_s):
            failed.append(pt.label)
    return jobs, failed


def _run_slurm(
    study: Study, pts: list[Point], say: Progress, wait: bool, poll_s: float
) -> tuple[dict[str, Any] | None, list[str]]:
    jobs, failed = _submit_points(study, pts, say, poll_s)
    # afterany on every job Slurm still knows (one that ended long ago is gone: nothing to wait for)
    known = [j for j in jobs if (lambda st: st is None or bool(st.state))(launch.slurm_job_state(j))]
    dep = [f"--dependency=afterany:{':'.join(known)}"] if known else []
    results = study.out / "results"
    stale = launch.summary_signature(results)
    log = study.out / "report-%j.out"
    final = launch.slurm.submit_script(
        [
            f"--job-name=study-{study.name}",
            "--nodes=1",
            "--ntasks=1",
            "--cpus-per-task=1",
            "--time=20",
            f"--output={log}",
            f"--chdir={ROOT}",
            *dep,
            *slurm_common(study),
            "--wrap",
            shlex.join(report_command(study)),
        ]
    )
    say(
        None,
        f"report job {final}"
        + (f" runs after {', '.join(known)} (afterany)" if known else "")
        + f"; it writes {results}",
    )
    if not wait:
        print(
            json.dumps(
                {"study": study.name, "executor": "slurm", "jobs": jobs, "report_job": final, "results": str(results)}
            ),
            flush=True,
        )
        return None, failed
    report_log = Path(str(log).replace("%j", final))
    watched = launch.Launched("slurm", [results], jobs=[launch.Job(final, report_log)], stale_summaries=[stale])
    if not watch_slurm(watched, 24 * 3600.0, say, None, poll_s):
        failed.append(f"report job {final}")
    summary = read_json(results / "summary.json") or {}
    if (results / "scaling.md").exists():
        print(
            f"{study.task}: time to {study.metric} {study.target:g}\n" + (results / "scaling.md").read_text(),
            end="",
            flush=True,
        )
    failed += [pt.label for pt in pts if not is_done(pt) and pt.label not in failed]
    return summary, failed


def run_study(study: Study, executor: str, wait: bool = False, poll_s: float = 3.0) -> int:
    """Run (local) or submit (slurm) every point that is not done, then the report; returns the exit code."""
    pts = study.runs()
    say = Progress(study, len(pts))
    write_manifest(study)
    say(
        None,
        f"{len(study.systems)} systems x {len(study.points)} points x seeds = {len(pts)} runs "
        f"in {study.out} ({executor})",
    )
    if executor == "local":
        summary, failed = _run_local(study, pts, say)
    else:
        summary, failed = _run_slurm(study, pts, say, wait, poll_s)
        if summary is None:
            return EXIT_OK
    summary["failed"] = failed
    print(json.dumps(summary), flush=True)
    if failed:
        say(
            None,
            f"{len(failed)} run(s) did not finish: {', '.join(failed)}; run the same command again to "
            "retry them (finished runs are skipped)",
        )
    return EXIT_FAILED if failed else EXIT_OK


def _point_command(study: Study, pt: Point, executor: str) -> str:
    if pt.system.kind == "podracer":
        req = podracer_request(study, pt, executor)
        return (
            f"podracer submit {pt.system.job} --executor {executor} --nodes {req.nodes} --tasks-per-node "
            f"{req.tasks_per_node} --gpus-per-node {req.gpus_per_node} --run-dir {pt.run_dir} "
            + " ".join(f"--set {shlex.quote(s)}" for s in req.overrides)
        )
    cmd = shlex.join(
        [
            str(rllib_python(pt.system)),
            "-m",
            "baselines.rllib.train",
            str(pt.system.job),
            *rllib_args(study, pt, executor),
        ]
    )
    if executor == "slurm":
        cmd = (
            f"sbatch -N{pt.nodes} --cpus-per-task={max(1, pt.cpus // pt.nodes)} "
            f"--gpus-per-node={pt.gpus_per_node} slurm_templates/rllib.sbatch ... ({cmd})"
        )
    return cmd


def dry_run(study: Study, executor: str, skipped: dict[str, str] | None = None) -> int:
    """Print what would run: each point, its resources, whether it is done, its command; and the
    systems (``skipped``: name -> why) whose software is not here, which a run would have to skip."""
    skipped = skipped or {}
    print(f"# study {study.name}: {study.task}, target {study.metric} >= {study.target:g}, out {study.out}")
    for name, why in skipped.items():
        print(
            f"# skipped here: system {name} ({why}); its points are listed, but `podracer study` without "
            "--dry-run refuses them until it is installed"
        )
    for pt in study.runs():
        state = "done" if is_done(pt) else "skipped: not installed here" if pt.system.name in skipped else "to run"
        print(
            f"{pt.label}: {pt.layout} on {pt.nodes} node(s), {pt.gpus:g} GPUs, {pt.cpus} CPUs "
            f"[{state}]\n    {_point_command(study, pt, executor)}"
        )
    print(
        f"# then: {shlex.join(report_command(study))}"
        + (" (a Slurm job, --dependency=afterany on every point's job)" if executor == "slurm" else "")
    )
    return EXIT_OK


def add_study_parser(sub: Any) -> None:
    """Register ``podracer study`` on the CLI's sub-parsers."""
    st = sub.add_parser(
        "study",
        help="a scaling study: every system at every resource point and seed, then the "
        "tables and figures (jobs/studies/*.yaml)",
        description=__doc__.split("\n\n")[0],
    )
    st.add_argument(
        "study", nargs="?", default=None, help="study file (jobs/studies/*.yaml), or a study folder (its study.yaml)"
    )
    st.add_argument(
        "--executor",
        choices=["auto", "local", "slurm"],
        default="auto",
        help="local: one run after another here; slurm: one job per run, then a report job "
        "(auto: slurm when sbatch exists)",
    )
    st.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a study key (dotted), e.g. --set seeds=[0,1] --set systems.rllib.max_wall_s=60",
    )
    st.add_argument("--wait", action="store_true", help="slurm: wait for the report job, then print the table")
    st.add_argument("--dry-run", action="store_true", help="print every run and its command; run nothing")
    st.add_argument(
        "--report-only",
        action="store_true",
        help="only write the tables and figures of the runs that are done (what the final job runs)",
    )
    st.add_argument("--keys", action="store_true", help="list the keys of a study file and exit")
    st.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """``podracer study``: exit 0 done (or submitted), 1 a run failed, 2 a bad study (nothing run or queued)."""
    if args.keys:
        print(keys_text())
        return EXIT_OK
    if not args.study:
        print("podracer study: error: give a study file (jobs/studies/*.yaml)", file=sys.stderr)
        return EXIT_BAD_INPUT
    executor = args.executor if args.executor != "auto" else "slurm" if shutil.which("sbatch") else "local"
    interrupt_on_term()  # kill: the run under way stops with its checkpoints, as on Ctrl-C
    try:
        study = load_study(args.study, args.set)
        if args.report_only:
            print(json.dumps(report(study)), flush=True)
            return EXIT_OK
        skipped = check(study, executor, planning=args.dry_run)
        return dry_run(study, executor, skipped) if args.dry_run else run_study(study, executor, wait=args.wait)
    except launch.JobError as e:
        print(f"podracer study: error: {e}", file=sys.stderr)
        return e.exit_code
    except (StudyError, launch.LaunchError) as e:
        print(f"podracer study: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(
            "podracer study: interrupted; run the same command again to resume (finished runs are skipped)",
            file=sys.stderr,
        )
        return 130
