#!/usr/bin/env bash
# Installs Debian's podman for the image build (scripts/build-image.sh) and the container tier
# (tests/containers/), once; later runs return at once. runc: crun, podman's default runtime, cannot
# start containers on cgroup-v1 hosts like ours (infra/podman/containers.conf picks runc); iptables:
# netavark's bridge networks; debootstrap: the base image when no registry answers.
set -euo pipefail

if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
  echo "podman already installed: $(podman --version)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
else
  sudo_cmd=()
fi

start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
  podman runc netavark aardvark-dns iptables catatonit debootstrap uidmap slirp4netns >/dev/null
echo "installed $(podman --version) in $(( $(date +%s) - start ))s"
