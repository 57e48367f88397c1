# Set-up and checks for a fresh machine (Linux, Python >= 3.11). Everything lives in $(VENV).
#   make quickstart   the core only (torch, numpy, scipy, h5py, mpi4py + the mpich wheel, submitit, matplotlib,
#                     pyyaml, safetensors), then the 4-pod quickstart tournament
#   make test         the core plus the `test` extra (every optional extra but playground, and the test tools)
PY     ?= python3
VENV   ?= .venv
# torch: pip's own index by default. On Linux x86_64 PyPI's torch is a CUDA build (it pulls the nvidia/cuda wheels,
# several GB); TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU build (about 0.2 GB), .../whl/cu126
# a given CUDA. On a GPU cluster, environment.yml (conda, CUDA build) is the other way.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
JOB    ?= jobs/quickstart.yaml
PODS   ?= 4
PYTEST_ARGS ?=
LOWEST_PHASE ?= all
# test workers (pytest-xdist): 3 on a 2-core machine. 2 made the suite 1.3x faster than 1 (its MPI tests
# are CPU-bound), but with 2 the cores stood 28% idle (tests waiting on Slurm's scheduler, on signals, on sleeps);
# 3 ran it in 992 s against 1,104 s with 2, all passing (one idle run each). The Slurm tier stays in one
# worker (tests/slurm/conftest.py). 0 = serial.
TEST_WORKERS ?= 3

BIN := $(VENV)/bin

.PHONY: setup setup-core quickstart lint format test test-lowest bench clean container container-gpu container-quickstart

# the core: what `make quickstart` needs (the mpi-wheel extra is the mpich wheel's mpiexec)
$(BIN)/.core: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH)"
	$(BIN)/pip install -q -e '.[mpi-wheel]'
	touch $@

# the core plus the `test` extra: what `make test` and `make lint` need
$(BIN)/.installed: $(BIN)/.core
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup-core: $(BIN)/.core

setup: $(BIN)/.installed

## quickstart: set up, then run the main job on this machine (no Slurm needed): a 4-pod
## tournament under the mpiexec of the PyPI mpich wheel, behind podracer_hpc/cluster/mpirun.py's signal
## relay: Ctrl-C, USR1, USR2 or TERM stop every pod with a checkpoint (exit 75; run again to resume)
quickstart: setup-core
	$(BIN)/podracer mpirun -n $(PODS) $(BIN)/podracer train $(JOB)

## lint: the layout and lint checks CI runs (ruff format --check, ruff check; settings in pyproject.toml)
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

## format: apply ruff's layout and its safe fixes (import order) to the tree
format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

## test: set up, then run the whole test suite (unit, MPI under a real mpiexec, the local Slurm cluster)
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS)

## test-lowest: the lowest versions pyproject.toml allows (its own venv, .venv-lowest), and the core tests
## (LOWEST_PHASE=install or test: one half; .ci/run installs beside the main lane, then tests)
test-lowest:
	PY=$(PY) bash scripts/lowest_versions.sh $(LOWEST_PHASE)

## bench: the benchmarks of bench/ (tables + a JSON line each)
bench: setup
	bash bench/run_all.sh

## container: the image of container/Containerfile (project, torch, mpi4py, h5py, gymnasium[mujoco], envpool,
## MuJoCo Warp; Python 3.11), built without a registry (debootstrap + podman import), as a squashfs for
## enroot/pyxis and a ch-run directory, all under build/container/ (root, podman; docs/slurm-templates.md).
## Slow (7-20 min cold on 2 shared cores, 4-5 min for a change to the code): not part of `make test` or .ci/run
container:
	PY=$(PY) bash container/build.sh

## container-gpu: the same recipe with PyPI's torch, the CUDA build (nvidia-* wheels from PyPI), under build/container-gpu/
## as localhost/podracer-hpc:gpu; its build checks torch.version.cuda, Warp and MuJoCo, writes the image's MPI
## (/opt/podracer/IMAGE.json, read at submit time) and runs the quickstart on CPU inside it. WARP_KERNELS=1 bakes
## MuJoCo Warp's kernels for the shipped models into the image. About 5 GB of wheels, 12 GB of image
container-gpu:
	PY=$(PY) PODRACER_CONTAINER_VARIANT=gpu PODRACER_CONTAINER_WARP_KERNELS=$(or $(WARP_KERNELS),0) bash container/build.sh

## container-quickstart: the 4-pod quickstart tournament inside that image (ch-run; srun when the local
## Slurm cluster runs); prints the summary's JSON line
container-quickstart:
	PODS=$(PODS) bash container/quickstart.sh

clean:
	rm -rf $(VENV) .venv-lowest runs .pytest_cache
