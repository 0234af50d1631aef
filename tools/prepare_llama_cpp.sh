#!/usr/bin/env bash
# Prepares llama.cpp for `dockyard export gguf`: its convert_hf_to_gguf.py and a built llama-quantize
# (plus llama-simple, the greedy generator the tests compare against transformers).
# llama.cpp is not on PyPI as such; the source distribution of llama-cpp-python carries it under
# vendor/llama.cpp, so this needs only PyPI, cmake and a C++ compiler.
#   bash tools/prepare_llama_cpp.sh [DIR]       (default: .cache/llama.cpp)
#   export DOCKYARD_LLAMA_CPP_DIR=DIR           what `dockyard export gguf` reads
# Idempotent: a second run with the binaries in place only prints the export line.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36   # llama-cpp-python release whose vendored llama.cpp this was checked with
DIR=${1:-.cache/llama.cpp}
PYTHON=${PYTHON:-.venv/bin/python}
if [ -x "$DIR/build/bin/llama-quantize" ] && [ -x "$DIR/build/bin/llama-simple" ] && [ -f "$DIR/convert_hf_to_gguf.py" ]; then
  echo "export DOCKYARD_LLAMA_CPP_DIR=$(cd "$DIR" && pwd)"
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "tools/prepare_llama_cpp.sh: needs $tool (apt-get install cmake g++)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the sdist itself, from the package index's simple page (pip download would build its build
# dependencies from source first); its sha256 is checked against the index
"$PYTHON" - "$VERSION" "$work" "${PIP_INDEX_URL:-https://pypi.org/simple}" <<'PY'
import hashlib, re, sys, urllib.request
version, work, index = sys.argv[1], sys.argv[2], sys.argv[3].rstrip("/")
page = urllib.request.urlopen(f"{index}/llama-cpp-python/", timeout=120).read().decode()
match = re.search(r'href="([^"]*llama_cpp_python-' + re.escape(version) + r'\.tar\.gz)#sha256=([0-9a-f]+)"', page)
if match is None:
    sys.exit(f"llama-cpp-python {version} sdist not found on {index}")
url = match.group(1) if match.group(1).startswith("http") else f"{index}/llama-cpp-python/{match.group(1)}"
data = urllib.request.urlopen(url, timeout=600).read()
if hashlib.sha256(data).hexdigest() != match.group(2):
    sys.exit(f"{url}: sha256 mismatch")
open(f"{work}/llama_cpp_python-{version}.tar.gz", "wb").write(data)
PY
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
mv "$work"/llama_cpp_python-*/vendor/llama.cpp "$DIR"
# only the two tools; no OpenSSL (no downloads), portable code (the binary may run on other nodes)
cmake -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >"$DIR/build.log" 2>&1 ||
  { tail -20 "$DIR/build.log" >&2; exit 1; }
cmake --build "$DIR/build" --target llama-quantize llama-simple -j "$(nproc)" >>"$DIR/build.log" 2>&1 ||
  { tail -20 "$DIR/build.log" >&2; exit 1; }
echo "export DOCKYARD_LLAMA_CPP_DIR=$(cd "$DIR" && pwd)"
