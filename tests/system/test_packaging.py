"""The project's set-up files agree with each other."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONDA_NAMES = {"torch": "pytorch"}


def _name_and_min(req: str) -> tuple[str, str | None]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:>=\s*([0-9.]+))?", req)
    assert m, req
    low = m.group(2)
    bracket = re.search(r"\[.*version\s*=\s*['\"]>=\s*([0-9.]+)['\"].*\]", req)  # conda's name[version='>=X', ...]
    if bracket:
        low = bracket.group(1)
    return m.group(1).lower().replace("_", "-"), low


TEST_TOOLS = ("pytest", "pytest-xdist", "hypothesis", "ruff", "nbformat", "nbclient", "ipykernel")


def _conda_deps(file: str) -> dict[str, str | None]:
    """name -> lowest version of a conda environment file's dependencies (conda's and pip's)."""
    env = yaml.safe_load((REPO / file).read_text())
    conda = {}
    pip_deps = next((d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d), [])
    for dep in [d for d in env["dependencies"] if isinstance(d, str) and d != "pip"] + pip_deps:
        if dep.startswith("-"):
            continue
        name, low = _name_and_min(dep.split("=", 1)[0] if "==" not in dep and ">=" not in dep else dep)
        conda[name] = low
    return conda


def test_environment_yml_lists_every_pyproject_dependency():
    """The runtime dependencies are in environment.yml; the test extra in it or in
    environment-dev.yml, where the test tools go (a compute node's environment carries none)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime, dev = _conda_deps("environment.yml"), _conda_deps("environment-dev.yml")
    tests = [r for r in project["optional-dependencies"]["test"] if not r.startswith("mpich")]
    for req, env, where in [(r, runtime, "environment.yml") for r in project["dependencies"]] + [
        (r, {**runtime, **dev}, "environment.yml or environment-dev.yml") for r in tests
    ]:
        name, low = _name_and_min(req)
        cname = CONDA_NAMES.get(name, name)
        assert cname in env, f"{name} is in pyproject.toml but not in {where}"
        assert env[cname] == low, f"{name}: pyproject wants >={low}, {where} >={env[cname]}"
    for tool in TEST_TOOLS:
        assert tool in dev and tool not in runtime, f"{tool}: a test tool belongs in environment-dev.yml only"


def test_environment_yml_pins_the_sites_mpi_abi_and_names_cuda_per_gpu_generation():
    text = (REPO / "environment.yml").read_text()
    deps = [d for d in yaml.safe_load(text)["dependencies"] if isinstance(d, str)]
    assert "openmpi=4.1.*=external_*" in deps and "HPC-X" in text  # HPC-X ships Open MPI 4.1
    assert re.search(r"B200.*12\.8", text) and re.search(r"H100.*12\.6", text)


def test_environment_yml_gives_a_cuda_torch_on_a_login_node_without_a_gpu():
    """conda must not fall back to the CPU build where it sees no GPU: the build is
    pinned to CUDA, cuda-version is pinned, and the file says to create it with
    CONDA_OVERRIDE_CUDA at that version (docs/slurm-templates.md says the same)."""
    text = (REPO / "environment.yml").read_text()
    deps = [d for d in yaml.safe_load(text)["dependencies"] if isinstance(d, str)]
    torch = [d for d in deps if d.startswith("pytorch")]
    assert len(torch) == 1 and re.search(r"build\s*=\s*['\"]cuda\*['\"]", torch[0]), torch
    (cuda,) = [d.split("=", 1)[1] for d in deps if d.startswith("cuda-version=")]
    assert f"CONDA_OVERRIDE_CUDA={cuda} conda env create -f environment.yml" in text
    assert f"CONDA_OVERRIDE_CUDA={cuda}" in (REPO / "docs" / "slurm-templates.md").read_text()
    from podracer_hpc.cluster.device import CUDA_INSTALL_HINT

    assert f"CONDA_OVERRIDE_CUDA={cuda}" in CUDA_INSTALL_HINT  # what a pod without CUDA tells the user


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert blocks, "README has no command block"
    cmds = [line for line in blocks[0].splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(cmds) == 2, cmds
    test_cmd = cmds[1].split("#")[0].strip()
    assert test_cmd in (REPO / ".ci" / "run").read_text()
    for target in ("quickstart", "test"):
        assert re.search(rf"^{target}:", (REPO / "Makefile").read_text(), re.M)


def test_console_script_and_layout():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["podracer"] == "podracer_hpc.cli:main"
    for d in ("jobs", "podracer_hpc", "slurm_templates", "analysis", "tests", "bench"):
        assert (REPO / d).is_dir(), d


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_test_extra_holds_every_extra_but_playground():
    """`make test` installs `test`: every purpose's extra must be in it (playground lives in its own venv;
    CI runs the notebook through nbclient, without Jupyter's front end)."""
    extras = _extras()
    test = {_name_and_min(r.split(";")[0])[0] for r in extras["test"]}
    for name, reqs in extras.items():
        if name in ("test", "playground"):
            continue
        missing = {_name_and_min(r.split(";")[0])[0] for r in reqs} - test - {"notebook"}  # Jupyter's front end
        assert not missing, f"extra {name!r}: {sorted(missing)} not in the test extra"
    for purpose in ("mpi-wheel", "gym", "trading", "mujoco", "warp", "jax", "export", "notebook", "lint"):
        assert purpose in extras, purpose


def test_the_core_holds_no_optional_package():
    """A plain install (and `make quickstart`) gets the core: nothing that only a purpose needs."""
    core = {
        _name_and_min(r)[0] for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    assert core == {
        "torch", "numpy", "scipy", "pyyaml", "h5py", "safetensors", "mpi4py", "submitit", "matplotlib",
    }  # fmt: skip


def test_make_quickstart_installs_the_core_and_make_test_the_test_extra():
    make = (REPO / "Makefile").read_text()
    rule = lambda target: re.search(rf"^{re.escape(target)}:.*?(?=^\S|\Z)", make, re.M | re.S).group(0)  # noqa: E731
    core = rule("$(BIN)/.core")
    assert "'.[mpi-wheel]'" in core and "[test]" not in core, core
    assert re.search(r"^quickstart: setup-core$", make, re.M)
    assert "'.[test]'" in rule("$(BIN)/.installed")
    assert re.search(r"^test: setup$", make, re.M) and re.search(r"^setup: \$\(BIN\)/\.installed$", make, re.M)
    # the README says which torch a plain install gets and how to choose
    readme = (REPO / "README.md").read_text()
    assert "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in readme and "TORCH_INDEX" in make
