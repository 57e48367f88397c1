# shellcheck shell=bash
# slurm_templates/site.sh -- the site settings of every template, in one file.
#
# Sourced inside the job (by lib.sh, on the first node of the allocation) and by submit.sh on
# the login node. Edit the defaults below for your cluster. Each line only sets a value that
# is not set yet, so anything here can also be overridden from the submitting shell, because
# sbatch passes that environment into the job (its default --export=ALL):
#     PODRACER_MPI=pmi2 sbatch slurm_templates/tournament.sbatch
# Another file can replace this one: PODRACER_SITE=/path/to/mysite.sh sbatch ...
#
# Only variables are set here; nothing is run.

# ---- submission (read by submit.sh before it calls sbatch; a plain `sbatch` takes -p/-A/-q...)
# These choose the allocation, so they must reach sbatch itself: inside the job it is too late
# for them. Empty = not given (the template's #SBATCH line, else Slurm's default). Options given
# to submit.sh win over these; these win over the templates' #SBATCH lines.
: "${PODRACER_PARTITION:=}"        # e.g. batch        -> sbatch --partition
: "${PODRACER_ACCOUNT:=}"          # e.g. myproject    -> sbatch --account
: "${PODRACER_QOS:=}"              # e.g. normal       -> sbatch --qos
: "${PODRACER_CPUS_PER_TASK:=}"    # e.g. 14 (DGX H100/H200/B200: 112 cores / 8 GPUs) -> sbatch --cpus-per-task
# CPUs per node as Slurm counts them for a job (DGX H100/H200/B200: 112 cores; 224 with hyper-threads
# unless --hint=nomultithread). podracer submit --site only: a GPU job's --cpus-per-task defaults to
# this / --tasks-per-node, and more than fits is refused before queueing (default: sinfo's).
: "${PODRACER_NODE_CPUS:=}"
: "${PODRACER_MEM:=}"              # e.g. 0 (all of the node) or 256G  -> sbatch --mem
: "${PODRACER_CONSTRAINT:=}"       # e.g. h100         -> sbatch --constraint
: "${PODRACER_MAIL_TYPE:=}"        # e.g. END,FAIL     -> sbatch --mail-type
: "${PODRACER_MAIL_USER:=}"        # e.g. me@example.org -> sbatch --mail-user
# Anything else, as sbatch options (word-split): e.g. "--reservation=dgx --hint=nomultithread
# --wckey=myteam". No wckey is sent unless given here.
: "${PODRACER_SBATCH_ARGS:=}"
# Any other srun options for the ranks (word-split): e.g. "--cpu-bind=cores --network=single_node_vni"
: "${PODRACER_SRUN_ARGS:=}"

# ---- software on the compute nodes
: "${PODRACER_MODULES:=}"          # e.g. "cuda/12.6 openmpi/4.1.7": `module load` them first
: "${PODRACER_CONDA_ENV:=}"        # e.g. podracer-hpc (environment.yml); wins over PODRACER_VENV
: "${PODRACER_VENV:=$PODRACER_ROOT/.venv}"  # a venv with `pip install -e .`; if absent, PATH as is
# srun --mpi=<this>, the same default as `podracer submit --mpi`. pmix: the site's Open MPI /
# HPC-X (and conda's openmpi=*=external_*); pmi2: the PyPI mpich wheel (`pip install mpich`, this
# repo's .venv; also MPICH/MVAPICH). `srun --mpi=list` shows what this Slurm offers.
# Only when mpi4py loads the PyPI mpich wheel under pmi2 does each rank set
# MPIR_CVAR_CH4_NETMOD=ofi (and rank 0 says so), unless it is set here or in the submitting
# shell: Slurm's pmi2 server cuts PMI-1 lines over 1024 bytes, and that MPICH's UCX addresses
# make such lines (docs/local-slurm.md, "Solved"). A site's MPICH keeps its own netmod.
: "${PODRACER_MPI:=pmix}"
# Where run directories (checkpoints, HDF5 logs, leaderboards) go: a shared parallel filesystem
# (Lustre/GPFS scratch) that every node sees, not a node-local disk.
: "${PODRACER_RUNS:=$PODRACER_ROOT/runs}"
# Seconds srun lets the other ranks run once one rank has exited (srun --wait): a rank that
# crashes cannot leave the others hanging in a collective until the time limit.
: "${PODRACER_SRUN_WAIT:=120}"
# Requeues allowed per job (SLURM_RESTART_COUNT); beyond it the job ends with exit code 75.
: "${PODRACER_MAX_REQUEUES:=20}"
# One GPU per pod. per-task: srun --gpus-per-task=1, so each pod sees one GPU (CUDA_VISIBLE_DEVICES)
# and checks it sees exactly one; none: each pod sees the node's GPUs and takes GPU <local rank>
# (for sites whose gres.conf cannot bind). Either way a node with more pods than GPUs is refused.
: "${PODRACER_GPU_BIND:=per-task}"
# Code snapshot (lib.sh, podracer_rundir): 1 = the job runs a copy of podracer_hpc/ and the job
# file kept in its run directory, so a requeue days later runs the same code; 0 = the live checkout.
: "${PODRACER_SNAPSHOT:=1}"

# ---- container variant (container.sbatch; pyxis + enroot)
# An image with podracer-hpc's dependencies (torch, mpi4py built against the image's PMIx-aware
# MPI, h5py, safetensors, pyyaml), as an enroot squashfs file or a registry reference
# (`nvcr.io#nvidia/pytorch:...` style). docs/slurm-templates.md shows how to build one.
: "${PODRACER_IMAGE:=}"
# Extra bind mounts, pyxis syntax SRC[:DST[:FLAGS]],... (the checkout and PODRACER_RUNS are
# always mounted at their own paths)
: "${PODRACER_CONTAINER_MOUNTS:=}"

# ---- the environment of every rank (srun passes the batch shell's environment on)
export PODRACER_COMM="${PODRACER_COMM:-mpi}"   # fail loudly if MPI cannot be loaded
export PYTHONUNBUFFERED=1
# Every rank imports the same modules: none may write __pycache__ into the shared checkout, snapshot
# or venv (hundreds of ranks racing to write the same .pyc files at the first start).
export PYTHONDONTWRITEBYTECODE=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}"
# HDF5 file locking of the pods' logs. HDF5 locks every file it opens (flock); Lustre mounted
# without the `flock` option (or with `noflock`) answers ENOSYS and the log cannot be created.
# BEST_EFFORT locks where the filesystem can and goes on where it cannot (each log has one
# writer, its pod; readers open without locks). FALSE never locks; TRUE fails without flock.
# GPFS and Lustre with `flock` (or `localflock`) support locks.
export HDF5_USE_FILE_LOCKING="${HDF5_USE_FILE_LOCKING:-BEST_EFFORT}"
# Compile caches (Warp kernels of MuJoCo Warp, torch.compile/Triton, CUDA's PTX JIT): each pod
# uses $PODRACER_CACHE_DIR/<host>/... (podracer_hpc/cluster/caches.py), a node-local directory by default
# rather than ~/.cache on the shared filesystem, where every rank of every node would write at once.
export PODRACER_CACHE_DIR="${PODRACER_CACHE_DIR:-/tmp/podracer-cache-${USER:-$(id -un)}}"
# The job's own cache settings, recorded before srun: in a container each pod restores them and
# uses the node-local caches for the rest, whatever the image's ENV says (pyxis applies it over
# the job's; podracer_hpc/cluster/caches.py record_line writes this same line for podracer submit).
PODRACER_JOB_CACHE_VARS=; for v in WARP_CACHE_PATH TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR CUDA_CACHE_PATH; do if [ -n "${!v:-}" ]; then export "PODRACER_JOB_$v=${!v}"; PODRACER_JOB_CACHE_VARS+="$v "; fi; done; export PODRACER_JOB_CACHE_VARS
# PMIx (srun --mpi=pmix): quiets the Open MPI wheel's munge warning; harmless elsewhere.
export PMIX_MCA_psec="${PMIX_MCA_psec:-native}"
# NCCL and UCX. The tournament's collectives are small pickled MPI messages, so these matter
# little for podracer today; they matter for Open MPI over UCX and for any torch.distributed /
# NCCL code. NCCL_DEBUG=WARN prints only problems.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
# Site-specific: the InfiniBand adapters of the compute fabric, and the interface for NCCL's
# bootstrap. Example for a DGX A100 (check `ibstat`/`ibdev2netdev` and your site's notes),
# uncomment and adapt:
# export NCCL_IB_HCA="${NCCL_IB_HCA:-mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9}"
# export UCX_NET_DEVICES="${UCX_NET_DEVICES:-mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_9:1}"
# export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-enp225s0f0}"
# export UCX_TLS="${UCX_TLS:-rc,sm,self}"
# Debian's apt Open MPI across logical nodes of one host (not the default mpich wheel here)
# segfaulted in shared memory; this fixed it:
# export OMPI_MCA_btl="${OMPI_MCA_btl:-self,tcp}"
