#!/usr/bin/env bash
# Build llama.cpp for the benchmarks (never in CI): the llama.cpp vendored in the llama-cpp-python sdist,
# from the package index, built with cmake + ninja for this CPU. About 20-30 minutes on 2 cores.
# Binaries land in ${LLAMA_CPP_HOME:-$HOME/.cache/edge-spec/llama.cpp}/build/bin; benchmarks/lib/llamacpp.py
# looks there (or in $LLAMA_CPP_BIN).
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
home="${LLAMA_CPP_HOME:-$HOME/.cache/edge-spec/llama.cpp}"
mkdir -p "$home"
cd "$home"
if [ ! -d "src/vendor/llama.cpp" ]; then
  # the sdist itself, straight from the index: `pip download --no-binary :all:` would first build its
  # build dependencies from source (cmake's own bootstrap alone takes most of an hour on 2 cores)
  mkdir -p sdist
  python3 - "$version" <<'PY'
import json, sys, urllib.request
version = sys.argv[1]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
url = next(f["url"] for f in files if f["filename"] == f"llama_cpp_python-{version}.tar.gz")
urllib.request.urlretrieve(url, f"sdist/llama_cpp_python-{version}.tar.gz")
PY
  rm -rf src && mkdir src
  tar xzf "sdist/llama_cpp_python-$version.tar.gz" -C src --strip-components=1
fi
cd src/vendor/llama.cpp
# On the 2-core Xeon these sessions get, the CPU advertises AMX and the kernel grants its tiles, yet the native
# build's llama-server exits with SIGSEGV loading a Q4_K_M file (../shared/GUIDE.md §3 traced it to ggml's AMX
# path); built without AMX, everything else native, it runs (GCC keeps an explicit -mno-* over -march=native).
noamx=""
if grep -q -w amx_tile /proc/cpuinfo 2>/dev/null; then noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
cmake -B "$home/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON
cmake --build "$home/build" -j"$(nproc)" --target llama-bench llama-completion llama-speculative-simple \
  llama-lookup llama-server
echo "llama.cpp binaries in $home/build/bin"
