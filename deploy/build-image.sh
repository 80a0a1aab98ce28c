#!/usr/bin/env bash
# Builds the image from Debian's packages alone, no registry: mmdebstrap makes a bookworm base with
# python3 and python3-venv, podman imports it, pip wheel makes every dependency a wheel here, then podman builds deploy/Containerfile on it (buildah too:
# BUILDER=buildah). Run as root from anywhere; IMAGE names the result (localhost/openrelay:latest).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/openrelay:latest}
BASE=${BASE:-localhost/openrelay-base:bookworm}
BUILDER=${BUILDER:-podman}
# chroot: RUN steps without an OCI runtime; crun refuses this machine's hybrid cgroups (v1 + v2)
# ("cgroups in hybrid mode not supported"). ISOLATION=oci where the runtime works.
ISOLATION=${ISOLATION:-chroot}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! podman image exists "$BASE"; then
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/base.tar"
  podman import --change 'CMD ["/bin/bash"]' "$work/base.tar" "$BASE"
fi
# Every dependency as a wheel (the project's own left out: the image runs the code from /app).
rm -rf .build/wheels
# async-timeout: redis asks for it on Python < 3.11.3, and bookworm's is 3.11.2 (this machine's may be newer).
python3 -m pip wheel -q --wheel-dir .build/wheels . 'async-timeout>=4.0.3'
rm -f .build/wheels/openrelay_batch-*.whl
case "$BUILDER" in
  podman) podman build --isolation "$ISOLATION" --build-arg BASE="$BASE" -f deploy/Containerfile -t "$IMAGE" . ;;
  buildah) buildah bud --isolation "$ISOLATION" --build-arg BASE="$BASE" -f deploy/Containerfile -t "$IMAGE" . ;;
esac
echo "built $IMAGE"
