"""Running a study: each point x seed x system as a launcher job (podracer's ranks through
``launch.submit_local`` / ``launch.submit_slurm``; RLlib as a command here, or its template on
Slurm), watched by ``launch.wait``; then the report (locally at the end, on Slurm as a job after
every point's). No sbatch caller, poller or log reader of its own."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from podracer_hpc import launch
from podracer_hpc.config import Config, HParamRange, load_config
from podracer_hpc.docfield import ConfigError
from podracer_hpc.files import bounded
from podracer_hpc.files.rundir import RunDir
from podracer_hpc.pool.hparams import effective_space, first_draw
from podracer_hpc.tools.study.schema import ROOT, Point, Study, StudyError

__all__ = [
    "check",
    "is_done",
    "podracer_request",
    "rllib_args",
    "rllib_python",
    "rllib_sets",
    "run_point_local",
    "scheme_sets",
    "submit_point_slurm",
]


def rllib_python(system: Any) -> Path:
    """The interpreter that runs the RLlib baseline (``.venv-rllib``, baselines/rllib/README.md)."""
    return Path(system.python).expanduser() if system.python else ROOT / ".venv-rllib" / "bin" / "python"


def _prior(cfg: Config) -> dict[str, HParamRange]:
    """The prior a PBT run of this job declares: its tournament.hparam_space (the names its
    learner has), else the learner's default PBT space."""
    return effective_space(dataclasses.replace(cfg.tournament, mode="pbt", sync="collective"), cfg.agent.algo)


def scheme_sets(pt: Point) -> list[str]:
    """The overrides a podracer point's scheme adds after the system's own (``schema.SCHEMES``):

    - ``best_of_n``: independent pods (``tournament.mode=none``);
    - ``random_search``: independent pods starting where a PBT pool of the job would
      (``pool.hparams.first_draw``): pod 0 with the job's values, pod ``r`` (seed ``seed + r``)
      with its own draw from the job's prior (:func:`_prior`), as ``members`` entries;
    - ``data_parallel``: one learner with ``pods x`` the job's ``env.num_envs``, and ``pods x`` its
      total and evaluation env steps (so its env steps per device match a pod's), no tournament;
    - ``devices_per_pod`` m > 1 (any other scheme): each pod is one learner with ``m x`` the envs
      and ``m x`` the total, evaluation and round env steps, so that per device it evaluates and
      meets the others at the same env steps as a pod of one device;
    - a learner of m > 1 devices with ``lr_scaling: sqrt``: the job's learning rate x sqrt(m).
    """
    s = pt.system
    m = s.devices_per_learner(pt.pods)
    if m == 1 and s.scheme in ("pool", "best_of_n"):  # nothing of the job to read
        return [] if s.scheme == "pool" else ["tournament.mode=none"]
    try:
        cfg = load_config(s.job, [*s.sets, f"seed={pt.seed}"])
    except ConfigError as e:
        raise StudyError(f"systems.{s.name}: {e}") from None
    if cfg.members and s.scheme in ("random_search", "data_parallel"):
        raise StudyError(f"systems.{s.name}: scheme {s.scheme} sets each pod itself; its job has members")
    sets = [] if s.scheme == "pool" else ["tournament.mode=none"]
    if s.scheme == "random_search":
        prior = _prior(cfg)
        draws = [first_draw(prior, pt.seed + r, r) or {} for r in range(s.ranks(pt.pods))]
        pods = [{f"agent.{k}": v for k, v in d.items()} for d in draws]
        sets.append(f"members={json.dumps(pods)}")
    if m == 1:
        return sets
    if s.lr_scaling == "sqrt":
        if cfg.agent.algo != "ppo":
            raise StudyError(
                f"systems.{s.name}: lr_scaling sqrt scales PPO's learning rate; its job trains {cfg.agent.algo}"
            )
        sets.append(f"agent.learning_rate={cfg.agent.learning_rate * math.sqrt(m):.6g}")
    every, rounds = cfg.eval.interval_env_steps, cfg.tournament.interval_env_steps
    return [
        *sets,
        f"env.num_envs={cfg.env.num_envs * m}",
        f"total_env_steps={cfg.total_env_steps * m}",
        *([f"eval.interval_env_steps={every * m}"] if every else []),
        *([f"tournament.interval_env_steps={rounds * m}"] if s.scheme == "pool" and rounds else []),
    ]


def stop_return(study: Study, system: Any) -> float | None:
    """The return at which a run of ``system`` ends (``stop_at_target`` with the return as the
    metric): podracer's ``eval.stop_at_return``, RLlib's ``--stop-at-return``; None: its budget."""
    return study.target if system.stop_at_target and study.metric == "return" else None


def podracer_request(study: Study, pt: Point, executor: str) -> launch.Request:
    """The ``launch.Request`` of a podracer point (its scheme's overrides after the system's; with
    ``stop_at_target``, the run ends where its first pod reaches a return target)."""
    gpn = pt.gpus_per_node if study.gpus_of(pt.system) >= 1 else 0  # a shared GPU is not a Slurm GPU request
    target = stop_return(study, pt.system)
    stop = [] if target is None else [f"eval.stop_at_return={target!r}"]
    return launch.Request(
        job_file=str(pt.system.job),
        overrides=[*pt.system.sets, f"seed={pt.seed}", *scheme_sets(pt), *stop],
        executor=executor,
        nodes=pt.nodes if executor == "slurm" else 1,
        tasks_per_node=pt.tasks_per_node if executor == "slurm" else pt.nodes * pt.tasks_per_node,
        gpus_per_node=gpn,
        partition=str(study.slurm["partition"] or ""),
        account=str(study.slurm["account"] or ""),
        time_min=int(study.slurm["time_min"]),
        mpi=str(study.slurm["mpi"]),
        run_dir=str(pt.run_dir),
    )


def rllib_sets(study: Study, pt: Point, executor: str = "local") -> list[str]:
    """The ``--set`` list of an RLlib point: the system's own, then the seed and the resource point
    (``resources.*``, which ``baselines/rllib/train.py`` turns into learners and env runners)."""
    return [
        *pt.system.sets,
        f"seed={pt.seed}",
        f"resources.pods={pt.pods}",
        f"resources.gpus_per_pod={study.gpus_of(pt.system):g}",
        f"resources.cpus={pt.cpus}",
        f"resources.nodes={pt.resources(executor)['nodes']}",
    ]


def rllib_args(study: Study, pt: Point, executor: str = "local") -> list[str]:
    """Arguments of ``baselines.rllib.train`` after the job file for an RLlib point."""
    s = pt.system
    args = ["--run-dir", str(pt.run_dir), "--quiet"]
    for kv in rllib_sets(study, pt, executor):
        args += ["--set", kv]
    if (target := stop_return(study, s)) is not None:
        args += ["--stop-at-return", f"{target:g}"]
    if s.max_wall_s is not None:
        args += ["--max-wall-s", f"{s.max_wall_s:g}"]
    return args


def _check_rllib(study: Study, pt: Point, executor: str, planning: bool = False) -> str:
    """Raises StudyError for what is wrong with an RLlib system at ``pt``; when ``planning`` (a dry
    run), an RLlib that is not installed is no error: the reason it would be skipped is returned."""
    s = pt.system
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # the baseline lives in a checkout (baselines/), not in the package
    try:
        from baselines.rllib.train import ConfigError as RllibConfigError
        from baselines.rllib.train import load_config as rllib_config
    except ImportError:
        raise StudyError(
            f"systems.{s.name}: the RLlib baseline (baselines/rllib) is not here: podracer study runs "
            "RLlib from a checkout of podracer-hpc only (README, 'Scaling studies')"
        ) from None
    try:
        cfg = rllib_config(s.job, rllib_sets(study, pt, executor))
    except (RllibConfigError, OSError, yaml.YAMLError) as e:
        raise StudyError(f"systems.{s.name} at {pt.pods} pods: {e}") from None
    if cfg["task"] != study.task:
        raise StudyError(f"systems.{s.name}: its job trains {cfg['task']!r}, the study's task is {study.task!r}")
    if not rllib_python(s).exists():
        why = (
            f"{rllib_python(s)} not found: create .venv-rllib as baselines/rllib/README.md says, or set "
            f"systems.{s.name}.python, or drop the system"
        )
        if planning:
            return why
        raise StudyError(f"systems.{s.name}: {why}")
    return ""


def check(study: Study, executor: str, planning: bool = False) -> dict[str, str]:
    """Check every system at every point before anything runs (raises StudyError / launch errors).
    ``planning`` (a dry run): a system whose software is not installed here (RLlib's venv) is
    returned as ``{name: why}``, the systems a run here would have to skip, instead of refused."""
    if executor not in ("local", "slurm"):
        raise StudyError(f"--executor must be local or slurm, got {executor!r}")
    if executor == "slurm" and any(0 < study.gpus_of(s) < 1 for s in study.systems):
        raise StudyError(
            "resources.gpus_per_pod below 1 (pods sharing a GPU) runs with --executor local only: Slurm "
            "gives whole GPUs"
        )
    checked: set[tuple[str, int]] = set()
    skipped: dict[str, str] = {}
    for pt in study.runs():
        s = pt.system
        if (s.name, pt.pods) in checked:
            continue
        checked.add((s.name, pt.pods))
        if not s.job.is_file():
            raise StudyError(f"systems.{s.name}.job: {s.job} not found")
        if s.kind == "podracer":
            try:
                cfg = launch.validate(podracer_request(study, pt, executor))
            except (launch.LaunchError, ConfigError) as e:
                raise StudyError(f"systems.{s.name} at {pt.pods} pods: {e}") from None
            if cfg.env.name != study.task:
                raise StudyError(
                    f"systems.{s.name}: its job trains {cfg.env.name!r}, the study's task is {study.task!r}"
                )
        elif why := _check_rllib(study, pt, executor, planning):
            skipped[s.name] = why
    if executor == "slurm" and any(s.kind == "rllib" for s in study.systems) and shutil.which("sbatch") is None:
        raise StudyError("--executor slurm, but there is no sbatch here")
    return skipped


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = bounded.read_json(path)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def done_summary(s: dict[str, Any] | None) -> bool:
    """A run that needs no more work: it is complete (its budget trained, or a podracer run ended at
    its target), or an RLlib run stopped at the target or at its ``max_wall_s`` bound."""
    return s is not None and (s.get("complete", True) is not False or bool(s.get("stopped_at_wall_s")))


def is_done(pt: Point) -> bool:
    return done_summary(read_json(RunDir(pt.run_dir).summary))


def active_job(pt: Point) -> str | None:
    """The Slurm job of this point that is still queued or running, if any (``job.json``)."""
    j = read_json(pt.run_dir / "job.json")
    if not j or not j.get("job_id"):
        return None
    st = launch.slurm_job_state(str(j["job_id"]))
    if st is None or launch.still_active(st.state):
        return str(j["job_id"])
    return None


def _prepare(pt: Point, executor: str) -> None:
    """A fresh run directory for an RLlib run (it cannot resume), and resources.json."""
    if pt.system.kind == "rllib" and pt.run_dir.exists():
        shutil.rmtree(pt.run_dir)
    pt.run_dir.mkdir(parents=True, exist_ok=True)
    (pt.run_dir / "resources.json").write_text(json.dumps(pt.resources(executor), indent=2) + "\n")


class _Prefixed:
    """A text stream whose lines become the study's progress lines for one point."""

    def __init__(self, say: Any, pt: Point):
        self.say, self.pt = say, pt

    def write(self, s: str) -> int:
        if s.strip():
            self.say(self.pt, s.rstrip("\n"))
        return len(s)

    def flush(self) -> None:
        pass


def _rllib_progress(pt: Point) -> Any:
    # one log for all learners: progress_line's pod count is 1, the point's is P
    return lambda d: launch.progress_line(d).replace(": 1 pods |", f": {pt.pods} pods-equivalent (learners) |")


def run_point_local(study: Study, pt: Point, say: Any, poll_s: float = 1.0) -> None:
    """Run one point here, to the end (raises launch.JobError when it does not complete; a run
    past its timeout is stopped: podracer's with checkpoints)."""
    _prepare(pt, "local")
    if pt.system.kind == "podracer":
        req = podracer_request(study, pt, "local")
        launched, progress = launch.submit_local(req, launch.validate(req)), launch.progress_line
    else:
        launched, progress = launch.Launched("local", []), _rllib_progress(pt)
        cmd = [str(rllib_python(pt.system)), "-m", "baselines.rllib.train", str(pt.system.job), *rllib_args(study, pt)]
        launch.start_command(cmd, pt.run_dir, launched, env={"PYTHONPATH": str(ROOT)})
    try:
        launch.wait(
            launched,
            timeout_s=pt.system.timeout_s,
            poll_s=poll_s,
            out=_Prefixed(say, pt),
            done=done_summary,
            progress=progress,
        )
    finally:
        launch.local.stop(launched)


def submit_point_slurm(study: Study, pt: Point) -> launch.Launched:
    """Submit one point as a Slurm job; returns what ``launch.wait`` watches (``job.json`` names it)."""
    _prepare(pt, "slurm")
    if pt.system.kind == "podracer":
        req = podracer_request(study, pt, "slurm")
        launched = launch.submit_slurm(req, launch.validate(req))
    else:
        cpus_per_node = max(1, pt.cpus // pt.nodes)
        log = pt.run_dir / "slurm-%j.out"
        args = [
            f"--job-name=rllib-{study.name}",
            f"--nodes={pt.nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={cpus_per_node}",
            f"--gpus-per-node={pt.gpus_per_node}",
            f"--time={int(study.slurm['time_min'])}",
            f"--output={log}",
            f"--chdir={ROOT}",
            *slurm_common(study),
            str(ROOT / "slurm_templates" / "rllib.sbatch"),
            str(pt.system.job),
            *[a for a in rllib_args(study, pt, "slurm") if a not in ("--run-dir", str(pt.run_dir))],
        ]
        stale = launch.summary_signature(pt.run_dir)
        job = launch.slurm.submit_script(
            args,
            env={
                "PODRACER_RUN_DIR": str(pt.run_dir),
                "PODRACER_ROOT": str(ROOT),
                "RLLIB_VENV": str(rllib_python(pt.system).parent.parent),
            },
        )
        out = Path(str(log).replace("%j", job))
        launched = launch.Launched(
            "slurm", [pt.run_dir], jobs=[launch.Job(job, out)], logs=[out], stale_summaries=[stale]
        )
    (pt.run_dir / "job.json").write_text(
        json.dumps({"job_id": launched.jobs[0].job_id, "kind": pt.system.kind, "submitted": time.time()}) + "\n"
    )
    return launched


def slurm_common(study: Study) -> list[str]:
    """The study's partition and account as sbatch options."""
    return [f"--{k}={study.slurm[k]}" for k in ("partition", "account") if study.slurm[k]]


def watch_slurm(launched: launch.Launched, timeout_s: float, say: Any, pt: Point | None, poll_s: float = 3.0) -> bool:
    """Wait for a study's Slurm job with ``launch.wait``; True when its run is done, False when it
    ended without (said)."""
    try:
        launch.wait(
            launched, timeout_s=timeout_s, poll_s=poll_s, out=_Prefixed(say, pt), done=done_summary, progress=None
        )
        return True
    except launch.JobError as e:
        say(pt, f"FAILED: {e}")
        return False
