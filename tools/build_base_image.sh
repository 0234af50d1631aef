#!/usr/bin/env bash
# The default local base for task images (env.sandbox.task_images: build), made without any container
# registry: a Debian 12 root file system from the Debian package registry (mmdebstrap), imported into
# podman, with uv and pytest from PyPI. Terminal-Bench's test scripts fetch uv's installer from a host
# that compute nodes (and this project's build machine) often cannot reach, then run `uv`; with uv in
# the base they find it. Map published bases to it with env.sandbox.base_images, or make it the
# default with env.sandbox.default_base_image=localhost/dockyard-base:bookworm.
#   tools/build_base_image.sh [TAG]        (default localhost/dockyard-base:bookworm; ~1 min, ~600 MB)
# Idempotent: an existing TAG is kept (remove it with `podman rmi TAG` to rebuild).
set -euo pipefail
tag=${1:-localhost/dockyard-base:bookworm}
podman=(podman --runtime runc)
python_tag="$tag-python"
# what the `python:*` images give a Dockerfile that the Debian base does not: `python` on PATH and a pip
# that installs into the system (no PEP 668 marker); a FROM python:... that base_images does not map is
# built on it (sandboxes/images.py: family bases)
build_python() {
  printf 'FROM %s\nRUN ln -s /usr/bin/python3 /usr/bin/python && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED\n' "$tag" |
    "${podman[@]}" build --pull=never --network=none --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
      -t "$python_tag" -f - "$(mktemp -d)" >/dev/null || { echo "building $python_tag failed" >&2; exit 1; }
  echo "$python_tag built"
}
if "${podman[@]}" image exists "$tag"; then
  echo "$tag is there"
  "${podman[@]}" image exists "$python_tag" || build_python
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "mmdebstrap is missing (apt-get install mmdebstrap)" >&2; exit 1; }
started=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log="$work/build.log"
fail() { echo "building $tag failed: $1 (last lines of its log below)" >&2; tail -20 "$log" >&2; exit 1; }
packages=python3,python3-pip,python3-venv,python3-pytest,ca-certificates,curl,wget,git,procps,less,file,\
xz-utils,unzip,tar,gzip,bzip2,findutils,grep,sed,gawk,diffutils,patch,tmux,make,gcc,g++,libc6-dev
{ mmdebstrap --quiet --variant=minbase --include="$packages" bookworm - | "${podman[@]}" import - "$tag-debian"; } \
  >>"$log" 2>&1 || fail "mmdebstrap | podman import"
# pip reads Debian's CA bundle; where TLS is intercepted (as on the build machine) the host's bundle is the one
# that verifies: it is mounted for the build step only
ca=/etc/ssl/certs/ca-certificates.crt
printf 'FROM %s\nRUN python3 -m pip install --break-system-packages --no-cache-dir uv==0.9.30 && uv --version\n' "$tag-debian" |
  "${podman[@]}" build --pull=never --network=host --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
    ${ca:+--volume "$ca:$ca:ro"} -t "$tag" -f - "$work" >>"$log" 2>&1 || fail "pip install uv"
"${podman[@]}" rmi "$tag-debian" >>"$log" 2>&1
echo "$tag built in $(( $(date +%s) - started )) s: $("${podman[@]}" image inspect --format '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}')"
build_python
