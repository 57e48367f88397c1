"""The ``podracer`` console script: train | mpirun | submit | status | jobs | cancel | evaluate | export | backtest |
data | bench | config | study."""

from __future__ import annotations

import argparse
import json
import os
import sys

from podracer_hpc.config import describe, load_config
from podracer_hpc.docfield import ConfigError


def _cmd_train(args: argparse.Namespace) -> int:
    from podracer_hpc.cluster.signals import ignore_from_now_on, process_flag

    stop = process_flag()  # before torch and MPI load: a warning signal during start-up is kept
    cfg = load_config(args.config, args.set)
    from podracer_hpc.files.rundir import PoolPart

    try:
        part = PoolPart.parse(args.pool_part)
    except ValueError as e:
        print(f"podracer train: error: {e}", file=sys.stderr)
        return 2
    from podracer_hpc.files.h5log import LogError, LogWriteError
    from podracer_hpc.files.rundir import EXIT_BAD_INPUT, EXIT_OK, EXIT_REQUEUE, RunDirLocked
    from podracer_hpc.files.safeio import StateFileError
    from podracer_hpc.rank.program import TrainingError, train
    from podracer_hpc.rank.resume import ResumeError

    try:
        result = train(
            cfg,
            run_dir=args.run_dir,
            stop_after_updates=args.stop_after_updates,
            quiet=args.quiet,
            stop=stop,
            part=part,
            force_final_eval=args.force_final_eval,
        )
    except RunDirLocked as e:  # every rank of the world raises it: none waits for another
        print(f"podracer train: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (StateFileError, TrainingError, LogError, ResumeError) as e:
        return _train_failed(str(e), EXIT_BAD_INPUT)
    except OSError as e:  # the run directory: read-only, full, under a file, gone
        return _train_failed(_os_error_text(e), EXIT_BAD_INPUT, hard=isinstance(e, LogWriteError))
    except Exception:  # a bug: the other ranks would wait for this one in their next collective forever
        from podracer_hpc.cluster.mpi import abort_world, world_position

        rank, size = world_position()
        if size > 1:
            import traceback

            traceback.print_exc()
            print(
                f"podracer train: rank {rank} failed (the traceback above); aborting the other "
                f"{size - 1} ranks, which would wait for it forever. The last checkpoints are intact.",
                file=sys.stderr,
                flush=True,
            )
            abort_world(1)
        raise
    ignore_from_now_on()  # the work is saved: a late warning signal must not turn this into a crash code
    from podracer_hpc.cluster.mpi import get_comm

    if get_comm().rank == 0:
        print(json.dumps(result.summary), flush=True)
        if result.complete:
            _say_what_next(args.run_dir or os.path.join("runs", cfg.name), result.summary)
    return EXIT_OK if result.complete else EXIT_REQUEUE


def _say_what_next(run_dir: str, summary: dict) -> None:
    """The last lines a user reads (stderr: stdout's last line stays the summary's JSON): where
    the run is and three commands to go on with."""
    verdict = (
        f" --episodes {summary['final_episodes']} --seed {summary['final_eval_seed']}"
        if summary.get("final_episodes")
        else ""
    )
    figures = (
        f"python -m analysis.make_figures {run_dir} --out {run_dir}/figures   # learning curves, tables (PNG, CSV)"
        if os.path.isfile(os.path.join("analysis", "make_figures.py"))
        else f"podracer export tensorboard {run_dir} --out {run_dir}/tb   # curves for TensorBoard"
    )
    print(
        f"\nthe run is in {run_dir}/: summary.json (the line above), logs/ (HDF5, one per pod), checkpoints/"
        + (", leaderboard/" if "rounds" in summary else "")
        + "\nnext:\n"
        + f"  podracer status {run_dir}   # each pod's steps and returns"
        + (", and the leaderboard" if "rounds" in summary else "")
        + f"\n  podracer evaluate {run_dir}{verdict}   # the agents side by side on common start states\n"
        + f"  {figures}",
        file=sys.stderr,
        flush=True,
    )


def _train_failed(message: str, code: int, hard: bool = False) -> int:
    """Print a rank's clean error and return its exit code; in a world of several ranks, abort
    it with that code: the others would wait for this rank in their next collective forever
    (a full disk, a bad log or checkpoint on one rank only). ``hard``: leave at once with the
    code (os._exit): HDF5's cleanup of a log whose write failed can abort the process at exit."""
    from podracer_hpc.cluster.mpi import abort_world, world_position

    rank, size = world_position()
    prefix = f"podracer train: rank {rank}: error" if size > 1 else "podracer train: error"
    text = f"{prefix}: {message}"
    if size > 1:  # one write: a launcher tearing the world down forwards all of it or none
        text += (
            f"\npodracer train: rank {rank}: aborting the other {size - 1} ranks (exit {code}), which would "
            "wait for it forever; the last checkpoints are intact"
        )
    print(text, file=sys.stderr, flush=True)
    if size > 1:
        abort_world(code)
    if hard:
        sys.stdout.flush()
        os._exit(code)
    return code


def _os_error_text(e: OSError) -> str:
    """One line for a filesystem error: what failed, where, and what to do."""
    import errno

    where = f": {e.filename}" if e.filename else ""
    advice = {
        errno.ENOSPC: (
            "the filesystem is full: free space (the last checkpoint is intact), then run the same command again"
        ),
        errno.EDQUOT: "the disk quota is exceeded: free space, then run the same command again",
        errno.EFBIG: "a file-size limit (ulimit -f) was reached: raise it, then run the same command again",
        errno.EROFS: "the filesystem is read-only: choose a writable --run-dir",
        errno.EACCES: "no permission: choose a --run-dir you can write to",
        errno.EPERM: "no permission: choose a --run-dir you can write to",
        errno.ENOTDIR: "a path component is a file, not a directory: choose another --run-dir",
        errno.EEXIST: "a file stands where a directory is needed: choose another --run-dir",
        errno.EISDIR: "a directory stands where a file is expected: move it away or choose another --run-dir",
    }.get(e.errno or 0, "check the run directory and its filesystem")
    return f"{e.strerror or e}{where}; {advice}"


def _cmd_submit(args: argparse.Namespace) -> int:
    import shutil

    import yaml

    from podracer_hpc import launch
    from podracer_hpc.config import to_dict

    try:
        req = launch.from_args(args, slurm_here=shutil.which("sbatch") is not None)
        _check_retries(args, req)
        cfg = launch.validate(req, dry_run=args.dry_run)
        if args.dry_run:
            _print_dry_run(req, cfg, args.config)
            print("# resolved config")
            print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
            return 0
        launched = launch.submit_slurm(req, cfg) if req.executor == "slurm" else launch.submit_local(req, cfg)
        print(launched.describe(), file=sys.stderr, flush=True)
        if not args.wait or not launched.run_dirs:
            return 0
        try:
            summaries = launch.wait(
                launched,
                timeout_s=args.timeout or float("inf"),
                slurm_every_s=args.poll_slurm,
                retry=_retrier(req, cfg, launched, args.retries, {}),
            )
        except KeyboardInterrupt:
            print("interrupted: the job goes on (cancel it with scancel or kill)", file=sys.stderr)
            return 130
        for s in summaries:
            print(json.dumps(s), flush=True)
        return 0
    except launch.JobError as e:  # the job did not complete its training: 1, or 75 when stopped with checkpoints
        print(f"podracer submit: error: {e}", file=sys.stderr)
        return e.exit_code
    except launch.LaunchError as e:  # a request that cannot be right: nothing (more) was queued
        print(f"podracer submit: error: {e}", file=sys.stderr)
        return 2


def _check_retries(args: argparse.Namespace, req) -> None:
    """--retries K and --poll-slurm: refused before anything is queued when they cannot work."""
    from podracer_hpc.launch.errors import LaunchError

    if args.poll_slurm < 1:
        raise LaunchError(
            f"--poll-slurm {args.poll_slurm:g}: give 1 second or more (default 30, or $PODRACER_SLURM_POLL_S)"
        )
    if not args.retries:
        return
    if args.retries < 0:
        raise LaunchError(f"--retries {args.retries}: give the number of retries per part, 0 or more")
    if not args.wait and not args.dry_run:
        raise LaunchError(
            "--retries needs --wait (the retries are made by the command that watches the jobs); a pool "
            "submitted without --wait is watched and retried by: podracer resume RUN_DIR --retries K"
        )
    if req.executor != "slurm" or req.array:
        raise LaunchError(
            "--retries resubmits Slurm jobs: a pool's parts (--pods-per-job) or one job, with --executor slurm "
            "and no --array"
        )


def _retrier(req, cfg, launched, retries: int, excluded: dict):
    """The retry hook of --wait for ``retries`` > 0 (None otherwise)."""
    if retries <= 0 or launched.executor != "slurm":
        return None
    from podracer_hpc import launch
    from podracer_hpc.launch.retry import Retrier

    return Retrier(launched, retries, lambda part, nodes: launch.resubmit(req, cfg, launched, part, nodes), excluded)


def _cmd_resume(args: argparse.Namespace) -> int:
    from podracer_hpc import launch

    try:
        if args.retries < 0 or args.poll_slurm < 1:
            raise launch.LaunchError(
                f"--retries {args.retries} --poll-slurm {args.poll_slurm:g}: give K >= 0 retries per part and "
                "a poll of 1 second or more"
            )
        from pathlib import Path

        req, cfg, launched, excluded = launch.resume_pool(Path(args.run_dir))
        if not launched.jobs:
            print(f"{args.run_dir}: every part of the pool is done", file=sys.stderr)
            return 0
        print(
            f"watching {len(launched.jobs)} part(s) of the pool in {args.run_dir}: jobs "
            + ", ".join(j.job_id for j in launched.jobs)
            + f"; up to {args.retries} retr{'ies' if args.retries != 1 else 'y'} per part",
            file=sys.stderr,
            flush=True,
        )
        summaries = launch.wait(
            launched,
            timeout_s=args.timeout or float("inf"),
            slurm_every_s=args.poll_slurm,
            retry=_retrier(req, cfg, launched, args.retries, excluded),
        )
        for s in summaries:
            print(json.dumps(s), flush=True)
        return 0
    except KeyboardInterrupt:
        print("interrupted: the jobs go on", file=sys.stderr)
        return 130
    except launch.JobError as e:
        print(f"podracer resume: error: {e}", file=sys.stderr)
        return e.exit_code
    except launch.LaunchError as e:
        print(f"podracer resume: error: {e}", file=sys.stderr)
        return 2


def _print_dry_run(req, cfg, job_file: str) -> None:
    """The sbatch script (Slurm) or the mpiexec lines (local) a submission would run."""
    from podracer_hpc import launch

    if req.jobs > 1:
        print(
            f"# a pool of {req.ranks} pods as {req.jobs} jobs of {req.job_ranks} (--pods-per-job): each job its own "
            "MPI world (podracer train --pool-part I/N), one run directory and leaderboard"
        )
    if req.executor == "slurm":
        print("# sbatch script (generated by submitit; one task per pod rank: the srun line at the end)")
        print(launch.sbatch_text(req, cfg))
        _print_array_tasks(req, cfg)
        return
    if req.pods_per_job:
        d = launch.run_dir_for(req, cfg)
        for g in range(req.jobs):
            print(
                f"# podracer mpirun -n {req.job_ranks} podracer train {job_file} --run-dir {d} --pool-part "
                f"{g}/{req.jobs} " + " ".join(f"--set {s}" for s in req.overrides)
            )
        return
    for t in req.array or [None]:
        sets, d = launch.task_overrides(req, cfg, t)
        print(
            f"# podracer mpirun -n {req.ranks} podracer train {job_file} --run-dir {d} "
            + " ".join(f"--set {s}" for s in sets)
        )
    _print_array_tasks(req, cfg)


def _print_array_tasks(req, cfg) -> None:
    """An array's tasks, one line each: its seed (pod k of the task: seed + k) and run directory."""
    if not req.array:
        return
    from podracer_hpc import launch

    rows = []
    for t in req.array:
        sets, d = launch.task_overrides(req, cfg, t)
        seed = [s.split("=", 1)[1] for s in sets if s.startswith("seed=")][-1]
        board = [s.split("=", 1)[1] for s in sets if s.startswith("tournament.leaderboard_dir=")]
        rows.append((str(t), seed, str(d), board[-1] if board else ""))
    throttle = f", at most {req.array_parallelism} at once" if req.array_parallelism else ""
    shared = {r[3] for r in rows if r[3]}
    print(
        f"# array: {len(rows)} tasks{throttle}, {req.ranks} pod{'s' * (req.ranks != 1)} each (pod k: seed + k)"
        + (f"; one leaderboard for all: {shared.pop()}" if len(shared) == 1 and len(rows) > 1 else "")
    )
    w = max(len(r[1]) for r in rows)
    print(f"#   task  {'seed':<{w}}  run directory")
    for t, seed, d, _ in rows:
        print(f"#   {t:<4}  {seed:<{w}}  {d}")


def _cmd_status(args: argparse.Namespace) -> int:
    from podracer_hpc.tools.status import status

    if args.watch < 0 or args.top < 0:
        print(f"podracer status: {'--watch' if args.watch < 0 else '--top'} must be >= 0", file=sys.stderr)
        return 2
    return status(args.run_dir, args.watch, pods=args.pods, top_pods=args.top)


def _cmd_jobs(args: argparse.Namespace) -> int:
    from podracer_hpc.launch.control import jobs_table
    from podracer_hpc.launch.errors import LaunchError

    try:
        print("\n".join(jobs_table(args.target)))
    except LaunchError as e:
        print(f"podracer jobs: error: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from podracer_hpc.launch.control import cancel
    from podracer_hpc.launch.errors import LaunchError

    try:
        for line in cancel(args.target, args.requeue):
            print(line)
    except LaunchError as e:
        print(f"podracer cancel: error: {e}", file=sys.stderr)
        return 2
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from podracer_hpc.envs import TASKS
    from podracer_hpc.tools import bench

    if args.what == "env":
        bad = (
            "--threads must be >= 1"
            if args.threads is not None and args.threads < 1
            else "--num-envs must be >= 1"
            if min(args.num_envs) < 1
            else "--seconds must be > 0"
            if args.seconds <= 0
            else "--gym-envs must be >= 0"
            if args.gym_envs < 0
            else None
        )
        if bad is None and args.task not in TASKS:
            bad = f"unknown task {args.task!r}; known tasks: {', '.join(sorted(TASKS))}"
        if bad:
            print(f"podracer bench env: {bad}", file=sys.stderr)
            return 2
        out = bench.bench_env(
            args.task,
            args.num_envs,
            device=args.device,
            seconds=args.seconds,
            gym_envs=args.gym_envs,
            compile_mode=args.compile,
            threads=args.threads,
        )
    else:
        out = bench.bench_train(args.config, args.set, seconds=args.seconds)
    print(out["table"])
    print(json.dumps(out["result"]), flush=True)
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from podracer_hpc.tools.data import data_command

    return data_command(args.what, args.source, args.set, args.cache_dir, getattr(args, "force", False))


def _cmd_config(args: argparse.Namespace) -> int:
    if args.config:
        import yaml

        from podracer_hpc.config import Config, to_dict
        from podracer_hpc.envs import registry

        cfg = load_config(args.config, args.set)
        resolved, own, defaults = to_dict(cfg), registry.get(cfg.env.name).section, to_dict(Config())["env"]
        others = [s for s in registry.sections() if s != own and resolved["env"].get(s) == defaults.get(s)]
        for s in others:
            resolved["env"].pop(s, None)
        print(yaml.safe_dump(resolved, sort_keys=False), end="")
        if others:  # other tasks' sections at their defaults: noise for this job (one set by the job stays)
            print(f"# env.{', env.'.join(others)}: other tasks' sections, left out (podracer config lists every key)")
        return 0
    from podracer_hpc.config import ALGOS

    algos = [args.algo] if args.algo else list(ALGOS)
    rows = describe(algo=algos[0])
    width = max(len(k) for algo in algos for k, _, _ in describe(algo=algo))
    for key, doc, default in rows:
        print(f"{key:<{width}}  {default!r:<12}  {doc}")
    for algo in algos[1:]:  # the other learners' agent sections (agent.algo chooses one per pod)
        print(f"\n# agent.algo: {algo}: its agent section (the other sections as above)")
        for key, doc, default in describe(algo=algo):
            if key.startswith("agent."):
                print(f"{key:<{width}}  {default!r:<12}  {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from podracer_hpc.launch.watch import slurm_poll_s  # torch-free: --help stays fast

    p = argparse.ArgumentParser(prog="podracer", description="Massively parallel deep RL pods on Slurm clusters.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one pod per MPI rank (run under mpiexec/srun for a pool)")
    t.add_argument("config", help="job file, e.g. jobs/pendulum.yaml")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (dotted)")
    t.add_argument("--run-dir", default=None, help="run directory (default runs/<name>); resumed if it has checkpoints")
    t.add_argument(
        "--stop-after-updates",
        type=int,
        default=0,
        metavar="N",
        help="checkpoint and stop after N updates of this invocation (time slicing, tests)",
    )
    t.add_argument(
        "--quiet", action="store_true", help="no periodic progress lines (events and errors are still printed)"
    )
    t.add_argument(
        "--force-final-eval",
        action="store_true",
        help="on a run that is already complete, evaluate every pod's final agent again (eval.final_episodes) "
        "and rewrite the summary; without it a complete run is left as it is",
    )
    t.add_argument(
        "--pool-part",
        default="0/1",
        metavar="I/N",
        help="this MPI world runs part I of a pool of N such worlds (one job each, one run directory and "
        "leaderboard; podracer submit --pods-per-job sets it): its ranks are pods I*n..I*n+n-1; "
        "auto: this Slurm array task's (sbatch --array=0-<N-1> of a template)",
    )
    t.set_defaults(func=_cmd_train)

    s = sub.add_parser("submit", help="launch a job: on Slurm (submitit) or on this machine (mpiexec)")
    from podracer_hpc.launch.request import add_arguments  # every option declared once, with its doc (no submitit)

    add_arguments(s)
    s.set_defaults(func=_cmd_submit)

    rs = sub.add_parser(
        "resume",
        help="watch a pool of several Slurm jobs submitted without --wait (as --wait does) and retry its "
        "parts that fail, hang or are ended by the system (--retries K)",
    )
    rs.add_argument("run_dir", metavar="RUN_DIR")
    rs.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="K",
        help="resubmit a part that failed, hung or was ended by the system, from its checkpoints, up to K times "
        "(counted over every watcher: <run>/retries.jsonl), excluding the node that failed; a part you "
        "cancelled is not retried",
    )
    rs.add_argument(
        "--poll-slurm",
        type=float,
        default=slurm_poll_s(),
        metavar="SECONDS",
        help="ask Slurm at most this often (default $PODRACER_SLURM_POLL_S or 30)",
    )
    rs.add_argument("--timeout", type=float, default=0, help="seconds to watch at most (default: until the pool ends)")
    rs.set_defaults(func=_cmd_resume)

    st = sub.add_parser("status", help="pods and leaderboard of a run, while it trains (--watch) or after")
    st.add_argument("run_dir")
    # the flags of status.add_arguments (declared here too: `podracer --help` does not import h5py)
    st.add_argument(
        "--watch",
        type=float,
        default=0,
        metavar="SECONDS",
        help="refresh every SECONDS until interrupted or until the run ends (each refresh reads only the "
        "log rows appended since the last one)",
    )
    st.add_argument(
        "--pods",
        "--all",
        action="store_true",
        dest="pods",
        default=None,
        help="a row for every pod (default: up to 16 pods; beyond, counts, percentiles over the pods and "
        "the top pods only)",
    )
    st.add_argument(
        "--top",
        type=int,
        default=5,
        metavar="N",
        help="pods shown beside the aggregates of a large pool, best evaluation first (default 5)",
    )
    st.set_defaults(func=_cmd_status)

    jb = sub.add_parser(
        "jobs", help="a run's Slurm jobs (submitted, template, a pool's parts) with their states and requeue counts"
    )
    jb.add_argument("target", metavar="RUN_DIR|JOB", help="a run directory, or a Slurm job id")
    jb.set_defaults(func=_cmd_jobs)
    ca = sub.add_parser(
        "cancel",
        help="cancel a run's queued and running Slurm jobs (their ranks checkpoint), or with "
        "--requeue checkpoint and requeue them",
    )
    ca.add_argument("target", metavar="RUN_DIR|JOB", help="a run directory, or a Slurm job id")
    ca.add_argument(
        "--requeue",
        action="store_true",
        help="send the warning signal instead (scancel --signal=USR2 --full): every rank checkpoints and "
        "the job is requeued, as before a time limit or a preemption",
    )
    ca.set_defaults(func=_cmd_cancel)

    d = sub.add_parser(
        "data", help="stock trading: prepare the shared market cache of a data file (podracer data prepare DATA)"
    )
    dsub = d.add_subparsers(dest="what", required=True)
    for what, text in (
        (
            "prepare",
            "read, align and compute the features of a data file once; pods and backtests open the "
            "cache (a table, then one JSON line; progress on stderr)",
        ),
        ("info", "where the cache of a data file is and whether it is fresh (prepares nothing)"),
    ):
        dp = dsub.add_parser(what, help=text)
        dp.add_argument(
            "source",
            help="a data file (CSV, Parquet, HDF5; long or wide; pkg:PACKAGE/path) or a job file "
            "(.yaml: its env.trading settings)",
        )
        dp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="an env.trading setting that changes the preparation: stocks=[A,B], turbulence_window=390 "
            "(or any dotted key of a job file)",
        )
        dp.add_argument(
            "--cache-dir",
            default=None,
            help="where the cache goes (default $PODRACER_MARKET_CACHE, else beside the data file)",
        )
        if what == "prepare":
            dp.add_argument("--force", action="store_true", help="prepare again even if the cache is fresh")
        dp.set_defaults(func=_cmd_data)

    sub.add_parser(
        "mpirun",
        add_help=False,  # parsed by podracer_hpc.cluster.mpirun.main
        help="mpiexec behind a signal relay: USR1/USR2/TERM/Ctrl-C to the job stop every pod with a "
        "checkpoint (exit 75), e.g. podracer mpirun -n 4 podracer train jobs/quickstart.yaml",
    )
    sub.add_parser(
        "evaluate",
        add_help=False,  # parsed by podracer_hpc.tools.evaluate.main
        help="agents (a checkpoint, a leaderboard entry, a run's pods and top entries) on the same start "
        "states: mean, standard error, 95%% interval (podracer evaluate --help)",
    )
    sub.add_parser(
        "export",
        add_help=False,  # parsed by podracer_hpc.tools.export.main
        help="a run's logs as TensorBoard event files, or a checkpoint's policy as TorchScript or ONNX "
        "(podracer export --help)",
    )
    sub.add_parser(
        "backtest",
        add_help=False,  # parsed by podracer_hpc.tools.backtest.main
        help="stock trading: run a checkpoint's policy on held-out data (podracer backtest --help)",
    )

    b = sub.add_parser("bench", help="benchmarks: a table, then one JSON line")
    bsub = b.add_subparsers(dest="what", required=True)
    be = bsub.add_parser(
        "env",
        help="env steps/s over num_envs, next to gymnasium's vector env (where the task "
        "has one: CartPole) and SyncVectorEnv",
    )
    be.add_argument("--task", default="pendulum")
    be.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 4096, 65536])
    be.add_argument("--gym-envs", type=int, default=64, help="SyncVectorEnv size of the reference (0 = skip)")
    be.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    be.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    be.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's; gymnasium uses one)"
    )
    be.add_argument(
        "--compile",
        default=None,
        metavar="MODE",
        help="also measure the torch.compile'd step (default | reduce-overhead: CUDA graphs)",
    )
    be.set_defaults(func=_cmd_bench)
    bt = bsub.add_parser("train", help="end-to-end training throughput (env steps/s, learning included)")
    bt.add_argument("config", nargs="?", default=None, help="job file (default: jobs/pendulum.yaml settings)")
    bt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    bt.add_argument("--seconds", type=float, default=10.0)
    bt.set_defaults(func=_cmd_bench)

    c = sub.add_parser("config", help="list every config key with its doc, or print a resolved job file")
    c.add_argument("config", nargs="?", default=None)
    c.add_argument(
        "--algo",
        choices=("ppo", "sac", "td3"),
        default=None,
        help="list the keys with this learner's agent section only (default: every learner's)",
    )
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.set_defaults(func=_cmd_config)

    from podracer_hpc.tools.study import add_study_parser

    add_study_parser(sub)  # podracer study: a scaling study (podracer_hpc/tools/study)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:  # catch warning signals before anything slow (argparse, torch, MPI)
        from podracer_hpc.cluster.signals import process_flag

        process_flag()
    if argv[:1] == ["mpirun"]:  # mpiexec's own arguments follow: no argparse (podracer_hpc/cluster/mpirun.py)
        from podracer_hpc.cluster.mpirun import main as mpirun_main

        return mpirun_main(argv[1:])
    if argv[:1] == ["evaluate"]:  # its own argument parser (podracer_hpc/tools/evaluate.py)
        from podracer_hpc.tools.evaluate import main as evaluate_main

        return evaluate_main(argv[1:])
    if argv[:1] == ["export"]:  # its own argument parser (podracer_hpc/tools/export.py)
        from podracer_hpc.tools.export import main as export_main

        return export_main(argv[1:])
    if argv[:1] == ["backtest"]:  # its own argument parser (podracer_hpc/tools/backtest_args.py)
        from podracer_hpc.tools.backtest_args import parser as backtest_parser

        backtest_parser().parse_args(argv[1:])  # --help and usage errors before torch loads
        from podracer_hpc.tools.backtest import main as backtest_main

        return backtest_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"podracer {args.cmd}: config error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `podracer config | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
