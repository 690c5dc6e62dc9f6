#!/usr/bin/env bash
# Build the project image (Dockerfile) with docker when its daemon answers, else with podman.
#
#   scripts/build-image.sh                     # layerlab:latest (`make image`)
#   scripts/build-image.sh --variant cuda      # the CUDA build (torch and the CUDA libraries the lock pins)
#   IMAGE=layerlab:dev scripts/build-image.sh  # another tag
#   scripts/build-image.sh --file F --context DIR --tag T [--build-arg K=V]...   # another image, same way
#
# Offline hosts (no registry, no PyTorch index), like our CI machines:
# - Base image: when python:3.11-slim-bookworm cannot be pulled, the script makes an equivalent one
#   (localhost/layerlab-base:bookworm): debootstrap of Debian bookworm from the Debian mirror, Debian's
#   Python 3.11 in a venv at /opt/python (first on PATH, as /usr/local is in the python image), imported
#   with `podman import`. About 2 minutes, once.
# - torch: pip's own configuration on this host (find-links, extra-index-url: local wheel folders; cert:
#   the CA bundle of a TLS-inspecting proxy) is passed to the build, and podman mounts those files
#   read-only into it, so torch installs from the local wheels. The cpu variant needs the PyTorch CPU index (TORCH_INDEX); when it does not answer,
#   --variant auto (the default) builds the cuda variant, which is requirements.lock exactly as the test
#   suite runs it (its torch runs on CPU too; the CUDA libraries make the image larger).
# - podman: CONTAINERS_CONF defaults to infra/podman/containers.conf (runc, no default ulimits), the
#   only combination that starts containers on cgroup-v1 sandboxes.
# A build with unchanged inputs reuses every layer (seconds). Prints the build time and the image size.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGE=${IMAGE:-layerlab:latest}
VARIANT=${TORCH_VARIANT:-auto}
BASE_IMAGE=${BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}
LOCAL_BASE=localhost/layerlab-base:bookworm
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
NICE=${NICE:-nice -n 19}

FILE=$ROOT/Dockerfile
CONTEXT=$ROOT
extra_args=()

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) VARIANT=$2; shift 2 ;;
    --tag) IMAGE=$2; shift 2 ;;
    --base) BASE_IMAGE=$2; shift 2 ;;
    --file) FILE=$2; shift 2 ;;
    --context) CONTEXT=$2; shift 2 ;;
    --build-arg) extra_args+=(--build-arg "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build-image.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
done

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  ENGINE=docker
elif command -v podman >/dev/null; then
  ENGINE=podman
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/infra/podman/containers.conf}
else
  echo "build-image.sh: neither a docker daemon nor podman here; install podman and runc (apt-get install podman runc)" >&2
  exit 1
fi
log() { echo "build-image.sh [$ENGINE]: $*" >&2; }

case "$VARIANT" in
  auto)
    if curl -fs -o /dev/null --max-time 10 "$TORCH_INDEX/torch/"; then VARIANT=cpu; else
      VARIANT=cuda
      log "the CPU torch index $TORCH_INDEX does not answer: building the cuda variant (requirements.lock as tested)"
    fi ;;
  cpu|cuda) ;;
  *) echo "build-image.sh: --variant $VARIANT: use auto, cpu or cuda" >&2; exit 2 ;;
esac

# --- base image: pulled, or made from the Debian mirror
make_local_base() {
  command -v debootstrap >/dev/null || { echo "build-image.sh: no registry answers and debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
  local rootfs
  rootfs=$(mktemp -d /var/tmp/layerlab-base.XXXXXX)
  trap 'rm -rf "$rootfs"' RETURN
  log "making $LOCAL_BASE with debootstrap from $DEBIAN_MIRROR"
  $NICE debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$DEBIAN_MIRROR" >"$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; exit 1; }
  rm -f "$rootfs.log"
  chroot "$rootfs" /usr/bin/python3 -m venv /opt/python
  chroot "$rootfs" sh -c 'apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin'
  # What the python image sets and the Dockerfile relies on: python and pip first on PATH, UTF-8.
  tar -C "$rootfs" -c . | $NICE $ENGINE import \
    --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$LOCAL_BASE" >/dev/null
}
if $ENGINE image inspect "$BASE_IMAGE" >/dev/null 2>&1; then :
elif timeout 60 $ENGINE pull -q "$BASE_IMAGE" >/dev/null 2>&1; then :
else
  log "cannot pull $BASE_IMAGE: using $LOCAL_BASE"
  BASE_IMAGE=$LOCAL_BASE
  $ENGINE image inspect "$BASE_IMAGE" >/dev/null 2>&1 || make_local_base
fi

# --- pip's local wheels: the folders this host's pip configuration names
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_VARIANT=$VARIANT" --build-arg "TORCH_INDEX=$TORCH_INDEX")
pip_conf() { python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z:]*\.$1='\(.*\)'$/\1/p" | tail -1; }
find_links=${PIP_FIND_LINKS:-$(pip_conf find-links)}
extra_index=${PIP_EXTRA_INDEX_URL:-$(pip_conf extra-index-url)}
cert=${PIP_CERT:-$(pip_conf cert)}
volumes=()
if [ "$ENGINE" = podman ]; then
  for entry in $find_links $extra_index; do
    dir=${entry#file://}
    [ "$dir" != "$entry" ] && dir=$(dirname "$dir")  # file:///opt/pypi/simple: mount /opt/pypi (files/ is beside simple/)
    [ -d "$dir" ] && volumes+=(--volume "$dir:$dir:ro")
  done
  [ -n "$find_links" ] && build_args+=(--build-arg "PIP_FIND_LINKS=$find_links")
  [ -n "$extra_index" ] && build_args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra_index")
  # Mounted beside the image's own CA bundle, used by pip only, and gone after the build.
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    volumes+=(--volume "$cert:/run/host-pip-ca.crt:ro")
    build_args+=(--build-arg "PIP_CERT=/run/host-pip-ca.crt")
  fi
elif [ -n "$find_links$extra_index" ]; then
  log "docker build mounts no host folders: pip's local wheels ($find_links $extra_index) are not used"
fi

log "building $IMAGE from $FILE (variant $VARIANT, base $BASE_IMAGE)"
start=$(date +%s)
[ "$FILE" = "$ROOT/Dockerfile" ] && build_args+=(--label "org.layerlab.torch-variant=$VARIANT")
# podman writes OCI images, which drop HEALTHCHECK (compose and Kubernetes define their own probes);
# --format docker keeps it but makes podman 4.3 copy the whole image again at each commit (~8 GB here).
$NICE $ENGINE build -f "$FILE" -t "$IMAGE" "${build_args[@]}" "${extra_args[@]}" "${volumes[@]}" \
  --label "org.opencontainers.image.revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" "$CONTEXT"
size=$($ENGINE image inspect --format '{{.Size}}' "$IMAGE")
log "built $IMAGE in $(( $(date +%s) - start )) s; size $(( size / 1000000 )) MB"
