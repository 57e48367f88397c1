"""``podracer submit --site FILE``: the templates' site file, read by the launcher too.

One file says how a site is used (slurm_templates/site.sh: partition, account, QoS, CPUs and
memory per task, modules, MPI plugin, sbatch and srun extras, container image), for both
``slurm_templates/submit.sh`` and ``podracer submit``. The file is bash (``: "${PODRACER_X:=value}"``
lines, or any bash that sets them), so it is read the way ``submit.sh`` reads it: ``bash`` sources
it and prints the variables. Options given on the command line win over the file.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from podracer_hpc.launch.errors import LaunchError

__all__ = ["SITE_KEYS", "apply_site", "read_site"]

# site variable -> Request field (how its text becomes the value: int, list of KEY=VALUE, flag)
SITE_KEYS: dict[str, tuple[str, str]] = {
    "PODRACER_PARTITION": ("partition", "str"),
    "PODRACER_ACCOUNT": ("account", "str"),
    "PODRACER_QOS": ("qos", "str"),
    "PODRACER_CPUS_PER_TASK": ("cpus_per_task", "int"),
    "PODRACER_NODE_CPUS": ("node_cpus", "int"),
    "PODRACER_MEM": ("mem", "str"),
    "PODRACER_CONSTRAINT": ("constraint", "str"),
    "PODRACER_MAIL_TYPE": ("mail_type", "str"),
    "PODRACER_MAIL_USER": ("mail_user", "str"),
    "PODRACER_MPI": ("mpi", "str"),
    "PODRACER_GPU_BIND": ("gpu_bind", "str"),
    "PODRACER_IMAGE": ("container_image", "str"),
    "PODRACER_CONTAINER_MOUNTS": ("container_mounts", "str"),
    "PODRACER_SBATCH_ARGS": ("sbatch", "options"),
    "PODRACER_SRUN_ARGS": ("srun", "options"),
    "PODRACER_MODULES": ("modules", "str"),
    "PODRACER_SNAPSHOT": ("snapshot", "flag"),
}


def read_site(path: str | os.PathLike) -> dict[str, str]:
    """The site variables a site file sets (``bash`` sources it, as ``submit.sh`` does)."""
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"--site {path}: no such file (a site file like slurm_templates/site.sh)")
    names = " ".join(SITE_KEYS)
    script = (
        f"PODRACER_ROOT=${{PODRACER_ROOT:-$PWD}}; source {shlex.quote(str(p.resolve()))} >/dev/null || exit 3; "
        f'for v in {names}; do printf "%s=%s\\0" "$v" "${{!v}}"; done'
    )
    try:
        env = {**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/bin:/bin"}  # the file may call id, hostname
        r = subprocess.run(
            [shutil.which("bash") or "/bin/bash", "-c", script], capture_output=True, timeout=30, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"--site {path}: could not be read with bash ({e})") from None
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise LaunchError(f"--site {path}: bash could not source it ({why[0]}); fix the file")
    out = {}
    for item in r.stdout.decode(errors="replace").split("\0"):
        k, eq, v = item.partition("=")
        if eq and k in SITE_KEYS and v != "":
            out[k] = v
    return out


def _options(text: str) -> list[str]:
    """``"--reservation=dgx --hint=nomultithread"`` -> ["reservation=dgx", "hint=nomultithread"]."""
    return [t.lstrip("-") for t in shlex.split(text)]


def apply_site(kw: dict[str, Any], path: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """``kw`` (a Request's fields from the command line) with the site file's values where the
    command line left a field at its default; list options are the site's followed by the
    command line's (sbatch and srun take the last of a repeated option: the command line wins)."""
    out = dict(kw)
    for var, value in read_site(path).items():
        name, kind = SITE_KEYS[var]
        if kind == "options":
            out[name] = _options(value) + list(kw.get(name) or [])
            continue
        if kw.get(name, defaults.get(name)) != defaults.get(name):
            continue  # given on the command line
        if kind == "int":
            try:
                out[name] = int(value)
            except ValueError:
                raise LaunchError(f"--site {path}: {var}={value!r} is not a number") from None
        elif kind == "flag":
            out[name] = value.strip().lower() not in ("0", "false", "no", "")
        else:
            out[name] = value
    return out
