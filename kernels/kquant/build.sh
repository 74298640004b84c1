#!/usr/bin/env bash
# Build libedge_spec_kquant.so (the GgufMatMul, GgufGather and CacheAttention custom ops) next to this script, by hand (pip builds
# the same sources through setup.py); BUILD_BENCH=1 also builds bench_kernels (the kernels alone).
# Needs g++; ONNX Runtime's C API headers are vendored in include/ ($ORT_INCLUDE points at others).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
inc="${ORT_INCLUDE:-$here/include}"
if [[ ! -f "$inc/onnxruntime_c_api.h" ]]; then
    echo "build.sh: no onnxruntime_c_api.h in $inc; put ONNX Runtime's C API headers there or set ORT_INCLUDE" >&2
    exit 1
fi
out="${1:-$here/libedge_spec_kquant.so}"
# -ffp-contract=off: the float operations are the intrinsics' own, the same in every row-tile variant.
g++ -O3 -mavx2 -mfma -mf16c -ffp-contract=off -std=c++17 -fPIC -shared -fvisibility=hidden \
    -Wall -Wextra -I"$inc" "$here/kquant.cpp" "$here/kquant_vnni.cpp" "$here/kquant_amx.cpp" "$here/kquant_q32.cpp" "$here/kquant_q32_vnni.cpp" "$here/attention.cpp" "$here/gguf_ops.cpp" -o "$out"
echo "$out"
if [[ "${BUILD_BENCH:-0}" == 1 ]]; then  # the kernels alone, without ONNX Runtime (bench_kernels.cpp)
    g++ -O3 -mavx2 -mfma -mf16c -ffp-contract=off -std=c++17 -Wall -Wextra \
        "$here/kquant.cpp" "$here/kquant_vnni.cpp" "$here/kquant_amx.cpp" "$here/bench_kernels.cpp" -o "$here/bench_kernels"
    echo "$here/bench_kernels"
fi
