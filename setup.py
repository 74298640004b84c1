"""The one compiled piece of edge-spec: the K-quant kernels (kernels/kquant/), an ONNX Runtime custom-op library.

Everything else is in pyproject.toml. The library is a plain shared object (no Python C API) that ONNX Runtime
loads with ``register_custom_ops_library``; it is built on x86-64 only, and *optional*: without a C++ compiler
the install goes on without it and exports use ONNX Runtime's own kernels (edge_spec/kernels.py).
"""

import platform

from setuptools import Extension, setup

SRC = "kernels/kquant"
ext_modules = []
if platform.machine().lower() in ("x86_64", "amd64"):
    ext_modules.append(Extension(
        "edge_spec._kquant",
        sources=[f"{SRC}/kquant.cpp", f"{SRC}/kquant_vnni.cpp", f"{SRC}/kquant_amx.cpp", f"{SRC}/kquant_q32.cpp",
                 f"{SRC}/kquant_q32_vnni.cpp", f"{SRC}/attention.cpp", f"{SRC}/gguf_ops.cpp"],
        include_dirs=[SRC, f"{SRC}/include"],  # include/: ONNX Runtime's C API headers (MIT), vendored
        language="c++",
        # -ffp-contract=off: the float operations are the intrinsics' own, the same in every row-tile variant, so
        # an M-row pass equals M one-row passes bit for bit. The CPU's AVX2/FMA/F16C are checked at load.
        extra_compile_args=["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-std=c++17",
                            "-fvisibility=hidden", "-g0"],
        optional=True,
    ))

setup(ext_modules=ext_modules)
