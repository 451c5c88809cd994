#!/usr/bin/env python3
"""A llama.cpp built for this machine (GGML_NATIVE=ON), the benchmarks' native anchor.

The test oracle (scripts/test.sh) is llama-cpp-python built with GGML_NATIVE=OFF: AVX2 at most, the code paths
ggtools' numerics reproduce bit for bit. Users build llama.cpp natively; on a CPU with AVX-512 / VNNI that is
faster, so speed is also compared against such a build. It is the same llama-cpp-python version built from the
same sdist with CMAKE_ARGS="-DGGML_NATIVE=ON", kept apart from the oracle: its shared libraries are unpacked into
`<cache>/native/<version>-<cpu flags hash>/lib/` (a CPU with other flags gets its own build) and loaded by a
llama-cpp-python process started with LLAMA_CPP_LIB_PATH pointing there (scripts/bench/llama_process.py), never
installed over the oracle.

On a CPU with AMX the build leaves AMX out (-mno-amx-*): llama.cpp's AMX matmul (ggml_backend_amx_mul_mat) dies with
a general protection fault at its first ldtilecfg on a 2-vCPU Xeon VM the benches ran on, for Q4_K_M and Q8_0
alike (ggml-org/llama.cpp#20824 reports the same crash, closed unfixed), while AMX itself works there (a C program's
ldtilecfg / tilezero ran). The anchor is then llama.cpp's AVX-512 / VNNI kernels, what such a machine runs when
AMX is unusable; the build's manifest and the benchmark say so.

  python -m scripts.bench.native_llama          # build once (5-10 minutes on 2 cores), print the lib directory
"""

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from scripts.fixtures.fixture_cache import build_once, cache_root, is_complete, log
from scripts.fixtures.llama_cpp_src import find_sdist, wanted_version

BUILD_COMMAND = "python -m scripts.bench.native_llama"


def cpu_flags() -> list:
    """The CPU's feature flags (x86 /proc/cpuinfo 'flags', ARM 'Features'), sorted."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return sorted(value.split())
    return []


def simd_flags() -> str:
    """The flags that decide which ggml kernels a native build compiles (what docs' tables name)."""
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
              "avx512_bf16", "avx512vbmi", "avx_vnni", "amx_int8", "amx_bf16", "asimd", "asimddp", "sve")
    have = set(cpu_flags())
    return " ".join(f for f in wanted if f in have)


NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_args() -> str:
    """GGML_NATIVE=ON, less AMX where the CPU has it (module docstring)."""
    if "amx_tile" not in cpu_flags():
        return "-DGGML_NATIVE=ON"
    return f"-DGGML_NATIVE=ON '-DCMAKE_C_FLAGS={NO_AMX}' '-DCMAKE_CXX_FLAGS={NO_AMX}'"


def native_dir(version: str | None = None) -> Path:
    version = wanted_version(version)
    digest = hashlib.sha256(" ".join(cpu_flags() + [cmake_args()]).encode()).hexdigest()[:12]
    return cache_root() / "native" / f"{version}-{digest}"


def describe() -> str:
    """Which native build this machine gets, for the benchmark's header."""
    return f"llama.cpp native build: CMAKE_ARGS={cmake_args()}"


def built_lib(version: str | None = None) -> Path | None:
    """The native build's lib directory, or None when it has not been built on this machine."""
    dest = native_dir(version)
    return dest / "lib" if is_complete(dest) else None


def build(version: str | None = None) -> Path:
    """Build (once, cached) and return the lib directory of a GGML_NATIVE=ON llama-cpp-python."""
    version = wanted_version(version)

    def builder(tmp: Path) -> dict:
        sdist = find_sdist(version)
        log(f"building llama-cpp-python {version} with {cmake_args()} (5-10 minutes on 2 cores)...")
        env = dict(os.environ, CMAKE_ARGS=cmake_args(),
                   CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
        env.pop("LLAMA_CPP_LIB_PATH", None)
        wheels = tmp / "wheel"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(sdist)],
                       env=env, check=True)
        (wheel,) = wheels.glob("*.whl")
        (tmp / "lib").mkdir()
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith("llama_cpp/lib/") and not name.endswith("/"):
                    (tmp / "lib" / Path(name).name).write_bytes(zf.read(name))
        wheel.unlink()
        return {"version": version, "cmake_args": cmake_args(), "cpu_flags": simd_flags()}

    build_once(native_dir(version), builder)
    return native_dir(version) / "lib"


def main():
    print(build())


if __name__ == "__main__":
    main()
