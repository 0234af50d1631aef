#!/usr/bin/env bash
# The OSWorld desktop as an image, made without any container registry: a Debian 12 root file system with
# the desktop's packages (containers/desktop.packages) from the Debian package registry (mmdebstrap),
# imported into podman. The podman sandboxes run desktops on it with
# env.sandbox.image=localhost/dockyard-desktop:bookworm; an Apptainer image for clusters is built from
# containers/desktop.def (or converted: apptainer build desktop.sif docker-daemon://... on a machine with
# both). Without an image, bubblewrap and podman run the desktop on this machine's /usr, where
# tools/install.sh installs the same packages.
#   tools/build_desktop_image.sh [TAG]      (default localhost/dockyard-desktop:bookworm; ~1-2 min)
# Idempotent: an existing TAG is kept (remove it with `podman rmi TAG` to rebuild).
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-localhost/dockyard-desktop:bookworm}
podman=(podman --runtime runc)
if "${podman[@]}" image exists "$tag"; then
  echo "$tag is there"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }
started=$(date +%s)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
packages=$(grep -v '^#' containers/desktop.packages | tr '\n' ',' | sed 's/,$//')
{ mmdebstrap --quiet --variant=minbase --include="python3,procps,$packages" bookworm - | "${podman[@]}" import - "$tag"; } \
  >>"$log" 2>&1 || { echo "building $tag failed (last lines of its log below)" >&2; tail -20 "$log" >&2; exit 1; }
size=$("${podman[@]}" image inspect "$tag" --format '{{.Size}}')
echo "built $tag in $(( $(date +%s) - started )) s ($(( size / 1000000 )) MB)"
