#!/usr/bin/env bash
# container/build.sh -- `make container`: build the podracer-hpc image and convert it for HPC runtimes.
#
#   container/build.sh            # every step, each skipped when its cached result is there
#
# Steps (each cached under $PODRACER_CONTAINER_DIR, default build/container/, gitignored):
#   1. rootfs   debootstrap a Debian bookworm rootfs (Python 3.11) -> rootfs.tar (.debs kept in debs/)
#   2. base     podman import rootfs.tar as localhost/podracer-base:bookworm (no registry needed)
#   3. wheels   pip download every requirement (container/requirements.py) into wheels/ with this
#               machine's pip (its Python must be the image's: 3.11), the CPU torch==2.13.0 included
#   4. image    podman build -f container/Containerfile, wheels/ mounted at /wheels (no index)
#   5. export   the image's filesystem -> podracer/ (a directory Charliecloud's ch-run runs) and
#               podracer.sqsh (a squashfs that enroot/pyxis run: srun --container-image=...sqsh)
# and writes build.json: seconds per step, sizes, versions.
# `make container-gpu` (PODRACER_CONTAINER_VARIANT=gpu): the same recipe with PyPI's torch, the CUDA build
# (it pulls the nvidia-* CUDA wheels), under build/container-gpu/ as localhost/podracer-hpc:gpu; its wheel
# cache is filled from PODRACER_CONTAINER_INDEX (default https://pypi.org/simple) with this machine's
# pip configuration ignored (a local find-links may hold the CPU build of the same version); the
# image check then requires torch.version.cuda, and a 6th step, quickstart, runs the 4-pod
# quickstart on CPU inside the image (ch-run, STEPS=QUICKSTART_STEPS, default 8192).
# PODRACER_CONTAINER_WARP_KERNELS=1 bakes MuJoCo Warp's kernels for the shipped models into the image
# (container/bake_warp.py; docs/slurm-templates.md "Warp kernels in the image").
# Knobs: PODRACER_CONTAINER_BASE (another base image, e.g. an NGC one: steps 1-2 are skipped),
# PODRACER_CONTAINER_TORCH (torch requirement, "" keeps the base's), PODRACER_CONTAINER_EXTRAS,
# PODRACER_CONTAINER_WHEELS=0 (no wheel cache: pip inside the build uses the index),
# PODRACER_CONTAINER_IMAGE (tag), DEBIAN_MIRROR, SQUASH_OPTIONS, PY (the Python whose pip fills wheels/).
# Needs root here (debootstrap, podman): apt-get install podman buildah debootstrap squashfs-tools charliecloud
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VARIANT=${PODRACER_CONTAINER_VARIANT:-cpu}
case $VARIANT in
cpu) OUT=${PODRACER_CONTAINER_DIR:-$ROOT/build/container} IMAGE=${PODRACER_CONTAINER_IMAGE:-localhost/podracer-hpc:latest} ;;
gpu) OUT=${PODRACER_CONTAINER_DIR:-$ROOT/build/container-gpu} IMAGE=${PODRACER_CONTAINER_IMAGE:-localhost/podracer-hpc:gpu} ;;
*) printf '[container] error: PODRACER_CONTAINER_VARIANT=%s: use cpu or gpu\n' "$VARIANT" >&2; exit 2 ;;
esac
# the Debian rootfs is the same for both variants: one copy
ROOTFS=${PODRACER_CONTAINER_ROOTFS:-$ROOT/build/container/rootfs.tar}
INDEX=${PODRACER_CONTAINER_INDEX:-https://pypi.org/simple}
WARP_KERNELS=${PODRACER_CONTAINER_WARP_KERNELS:-0}
DEFAULT_BASE=localhost/podracer-base:bookworm
BASE=${PODRACER_CONTAINER_BASE:-$DEFAULT_BASE}
TORCH=${PODRACER_CONTAINER_TORCH-torch==2.13.0}
EXTRAS=${PODRACER_CONTAINER_EXTRAS:-mujoco,warp,mpi-wheel}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SQUASH_OPTIONS=${SQUASH_OPTIONS:--comp zstd -Xcompression-level 3}
PY=${PY:-python3}
PACKAGES=python3,python3-pip,python3-venv,ca-certificates,libgomp1

say() { printf '[container] %s\n' "$*"; }
die() { printf '[container] error: %s\n' "$*" >&2; exit 2; }
for tool in podman mksquashfs tar; do
    command -v "$tool" >/dev/null || die "no $tool: apt-get install podman buildah debootstrap squashfs-tools charliecloud"
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
declare -A SECONDS_OF=()
step() { # step NAME CMD...: run CMD, record its wall seconds
    local name=$1 t0=$SECONDS
    shift
    say "== $name"
    "$@"
    SECONDS_OF[$name]=$((SECONDS - t0))
    say "== $name: ${SECONDS_OF[$name]} s"
}

rootfs() {
    if [[ -f $ROOTFS ]]; then say "cached: $ROOTFS"; return; fi
    command -v debootstrap >/dev/null || die "no debootstrap: apt-get install debootstrap"
    rm -rf "$OUT/rootfs.tmp"
    mkdir -p "$OUT/debs"
    debootstrap --variant=minbase --cache-dir="$OUT/debs" --include="$PACKAGES" bookworm "$OUT/rootfs.tmp" "$MIRROR"
    chroot "$OUT/rootfs.tmp" apt-get clean
    rm -rf "$OUT/rootfs.tmp"/var/lib/apt/lists/* "$OUT/rootfs.tmp"/tmp/*
    mkdir -p "$(dirname "$ROOTFS")"
    tar -C "$OUT/rootfs.tmp" --numeric-owner -cf "$ROOTFS.tmp" .
    mv "$ROOTFS.tmp" "$ROOTFS"
    rm -rf "$OUT/rootfs.tmp"
}

base() {
    if podman image exists "$BASE"; then say "cached: image $BASE"; return; fi
    podman import --change 'CMD ["/bin/bash"]' "$ROOTFS" "$BASE" >/dev/null
}

wheels() {
    local v
    v=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ $BASE == "$DEFAULT_BASE" && $v != 3.11 ]]; then
        say "PY=$PY is Python $v, the image's is 3.11: no wheel cache (pip inside the build uses the index)"
        return
    fi
    "$PY" "$ROOT/container/requirements.py" "$TORCH" "$EXTRAS" >"$OUT/requirements.txt"
    echo "setuptools>=68" >>"$OUT/requirements.txt" # the project's build requirements (pip install .)
    echo "wheel" >>"$OUT/requirements.txt"
    if [[ -f $OUT/wheels/.complete ]] && cmp -s "$OUT/requirements.txt" "$OUT/wheels/.complete"; then
        say "cached: $OUT/wheels ($(find "$OUT/wheels" -name '*.whl' | wc -l) wheels)"
        return
    fi
    mkdir -p "$OUT/wheels"
    if [[ $VARIANT == gpu ]]; then
        # PyPI's Linux x86_64 torch is the CUDA build; this machine's pip configuration (a find-links
        # or extra index holding torch 2.13.0+cpu, which pip prefers for ==2.13.0) is left out
        PIP_CONFIG_FILE=/dev/null env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT \
            "$PY" -m pip download -q --disable-pip-version-check -d "$OUT/wheels" --prefer-binary \
            --index-url "$INDEX" -r "$OUT/requirements.txt"
        if [[ -n $TORCH ]] && ls "$OUT"/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
            die "the wheel cache $OUT/wheels holds a CPU torch ($(ls "$OUT"/wheels/torch-*+cpu-*.whl | xargs -n1 basename)): remove it and run again"
        fi
    else
        "$PY" -m pip download -q --disable-pip-version-check -d "$OUT/wheels" --prefer-binary -r "$OUT/requirements.txt"
    fi
    cp "$OUT/requirements.txt" "$OUT/wheels/.complete"
}

image() {
    local mount=()
    [[ -f $OUT/wheels/.complete ]] && mount=(-v "$OUT/wheels:/wheels:ro")
    podman build --isolation=chroot --network=host -f "$ROOT/container/Containerfile" -t "$IMAGE" \
        --build-arg BASE="$BASE" --build-arg TORCH="$TORCH" --build-arg EXTRAS="$EXTRAS" \
        --build-arg VARIANT="$VARIANT" --build-arg WARP_KERNELS="$WARP_KERNELS" "${mount[@]}" "$ROOT"
}

export_image() {
    local cid tmp=$OUT/podracer.tmp
    rm -rf "$tmp" "$OUT/podracer.sqsh.tmp"
    mkdir -p "$tmp"
    cid=$(podman create "$IMAGE")
    podman export "$cid" | tar -C "$tmp" --numeric-owner -xf -
    podman rm "$cid" >/dev/null
    # ch-run --set-env reads /ch/environment; enroot reads /etc/environment (both: the image's ENV)
    mkdir -p "$tmp/ch"
    podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d' >"$tmp/ch/environment"
    cp "$tmp/ch/environment" "$tmp/etc/environment"
    # shellcheck disable=SC2086
    mksquashfs "$tmp" "$OUT/podracer.sqsh.tmp" -noappend -quiet -no-progress $SQUASH_OPTIONS
    rm -rf "$OUT/podracer"
    mv "$tmp" "$OUT/podracer"
    mv "$OUT/podracer.sqsh.tmp" "$OUT/podracer.sqsh"
}

t0=$SECONDS
if [[ $BASE == "$DEFAULT_BASE" ]]; then
    step rootfs rootfs
    step base base
fi
[[ ${PODRACER_CONTAINER_WHEELS:-1} == 0 ]] || step wheels wheels
step image image
step export export_image

# the GPU image's own check: the quickstart on CPU inside it (a CUDA torch runs on a machine without GPUs)
quickstart() {
    PODRACER_CONTAINER_DIR=$OUT CONTAINER_SLURM=0 PODS=${QUICKSTART_PODS:-2} STEPS=${QUICKSTART_STEPS:-8192} \
        bash "$ROOT/container/quickstart.sh" | tail -1 >"$OUT/quickstart.json"
    grep -q '^{' "$OUT/quickstart.json" || die "the quickstart inside the image printed no summary line"
    say "quickstart: $(cat "$OUT/quickstart.json")"
}
[[ $VARIANT == gpu ]] && step quickstart quickstart

mib() { echo $(($(du -sb "$1" | cut -f1) / 1048576)); }
versions=$(USER=${USER:-root} ch-run "$OUT/podracer" -- python3 -c 'import sys, torch, mujoco, warp, envpool, gymnasium, mpi4py, h5py
print("python %s torch %s CUDA %s mujoco %s warp %s envpool %s gymnasium %s mpi4py %s h5py %s" % (sys.version.split()[0],
torch.__version__, torch.version.cuda, mujoco.__version__, warp.__version__, envpool.__version__, gymnasium.__version__, mpi4py.__version__, h5py.__version__))' 2>/dev/null || echo "ch-run failed")
image_mib=$(($(podman image inspect --format '{{.Size}}' "$IMAGE") / 1048576))
{
    printf '{"total_s": %d' $((SECONDS - t0))
    for k in "${!SECONDS_OF[@]}"; do printf ', "%s_s": %d' "$k" "${SECONDS_OF[$k]}"; done
    printf ', "variant": "%s", "image": "%s", "base": "%s", "image_mib": %d, "dir_mib": %d, "sqsh_mib": %d, "wheels_mib": %d' \
        "$VARIANT" "$IMAGE" "$BASE" "$image_mib" "$(mib "$OUT/podracer")" "$(mib "$OUT/podracer.sqsh")" "$(mib "$OUT/wheels" 2>/dev/null || echo 0)"
    printf ', "image_info": %s, "versions": "%s"}\n' "$(cat "$OUT/podracer/opt/podracer/IMAGE.json")" "$versions"
} >"$OUT/build.json"
say "image $IMAGE: $image_mib MiB; ch-run directory $OUT/podracer; enroot squashfs $OUT/podracer.sqsh"
say "$versions"
cat "$OUT/build.json"
