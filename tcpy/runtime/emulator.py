"""The `cuda-emu` runtime: the exact CUDA source of the `cuda` target, built by the host
C++ compiler with a small header that provides CUDA's built-ins, and run on the CPU.

Blocks and threads: every (block, thread) pair of a launch runs as one iteration of an
OpenMP loop, with `blockIdx` and `threadIdx` thread-local, which is exact for kernels
without `__syncthreads()`; a kernel that synchronises instead runs its blocks one
after another, each block's threads as the threads of an OpenMP parallel region, with
`__syncthreads()` an OpenMP barrier and `__shared__` storage per block. Warp-level
built-ins are not used by the generated code yet and are not emulated. The CUDA math
functions C lacks come from the same C implementations the `cpu` target uses.

Each kernel gets a launcher, `tc_launch_<k>(grid_and_block, sizes, buffers, status)`,
generated from the kernel's parameter list, which the Python side calls in order.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tcpy import knobs
from tcpy.codegen.c_helpers import math_helpers
from tcpy.errors import TCCompileError, TCLaunchError
from tcpy.parser.builtins import BUILTINS
from tcpy.runtime import toolchain
from tcpy.runtime.status import check_status

FLAGS = ("-O2", "-fopenmp", "-shared", "-fPIC", "-std=gnu++17", "-w")

_HEADER_TOP = r"""
/* tcpy's CUDA emulation header: CUDA built-ins for running kernels on the CPU. */
#include <math.h>
#include <stdint.h>
#include <omp.h>
using std::isfinite;
struct dim3 { unsigned int x, y, z; };
static thread_local dim3 blockIdx, threadIdx;
static dim3 gridDim, blockDim;
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __syncthreads() _Pragma("omp barrier")
template <class T> static inline T __ldg(const T *p) { return *p; }
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline dim3 tc_unflatten(long long i, const long long *d) {
  return dim3{(unsigned)(i % d[0]), (unsigned)(i / d[0] % d[1]), (unsigned)(i / d[0] / d[1])};
}
"""


@functools.cache
def header() -> str:
    """The emulation header: built-ins, then every CUDA math function C lacks."""
    every = {name for name in BUILTINS} | {name + "f" for name in BUILTINS}
    return _HEADER_TOP + math_helpers(every) + "\n"


def compiler() -> str:
    return toolchain.require(knobs.cxx_compiler(), "C++ compiler", "TCPY_CXX", "g++")


def compiler_identity() -> str:
    return f"{toolchain.version_line(compiler())} {' '.join(FLAGS)}"


def launcher(index: int, parameters: list[str], n_sizes: int, source: str) -> str:
    """The host function that runs kernel `index` of `source` over its grid (C++)."""
    body = source.split(f"tc_kernel_{index}(", 1)[1].split('extern "C"', 1)[0]
    synchronises = "__syncthreads" in body
    args = []
    for k, param in enumerate(parameters):
        ctype, _, _name = param.rpartition(" ")
        if k < n_sizes:
            args.append(f"tc_sizes[{k}]")
        elif k == len(parameters) - 1:  # the status pointer closes every parameter list
            args.append("tc_status")
        else:
            pointer_type = ctype.replace("__restrict__", "").strip()
            args.append(f"({pointer_type})tc_buffers[{k - n_sizes}]")
    call = f"tc_kernel_{index}({', '.join(args)});"
    if synchronises:
        run_blocks = f"""
  for (long long b = 0; b < blocks; b++) {{
    #pragma omp parallel num_threads(threads)
    {{
      long long t = omp_get_thread_num();
      blockIdx = tc_unflatten(b, g);
      threadIdx = tc_unflatten(t, d);
      {call}
    }}
  }}"""
    else:
        run_blocks = f"""
  #pragma omp parallel for schedule(static)
  for (long long i = 0; i < blocks * threads; i++) {{
    long long b = i / threads, t = i % threads;
    blockIdx = tc_unflatten(b, g);
    threadIdx = tc_unflatten(t, d);
    {call}
  }}"""
    return f"""
extern "C" int tc_launch_{index}(const long long *tc_dims, const long long *tc_sizes,
                                  void *const *tc_buffers, int *tc_status) {{
  const long long *g = tc_dims, *d = tc_dims + 3;
  gridDim = dim3{{(unsigned)g[0], (unsigned)g[1], (unsigned)g[2]}};
  blockDim = dim3{{(unsigned)d[0], (unsigned)d[1], (unsigned)d[2]}};
  long long blocks = g[0] * g[1] * g[2], threads = d[0] * d[1] * d[2];{run_blocks}
  return 0;
}}
"""


def build(source: str, launchers: str, directory: Path) -> Path:
    """Compile the CUDA source and its launchers into `directory/kernel-emu.so` (the
    intermediate C++ files are removed once it is built)."""
    (directory / "tc_emu.h").write_text(header())
    unit = directory / "kernel-emu.cpp"
    unit.write_text(f'#include "tc_emu.h"\n{source}\n{launchers}')
    library = directory / "kernel-emu.so"
    cmd = [compiler(), *FLAGS, "-o", str(library), str(unit), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise TCCompileError(f"the C++ compiler ran for over 10 minutes on {unit}") from None
    if done.returncode != 0:
        kept = Path(tempfile.mkdtemp(prefix="tcpy-failed-"))
        shutil.copy(unit, kept / unit.name)
        shutil.copy(directory / "tc_emu.h", kept / "tc_emu.h")
        log = (done.stderr or done.stdout).strip().replace(str(directory), str(kept))
        raise TCCompileError(
            f"the C++ compiler failed on the emulated CUDA source (kept at {kept}):\n{log}"
        )
    unit.unlink()
    (directory / "tc_emu.h").unlink()
    return library


class EmulatedKernels:
    """The launchers of one compiled definition, run in order."""

    def __init__(self, library: Path, launches: Sequence[tuple[tuple[int, ...], tuple[int, ...]]]):
        try:
            self._lib = ctypes.CDLL(os.fspath(library))
        except OSError as e:
            raise TCLaunchError(f"cannot load the emulated kernels {library}: {e}") from None
        self._launches = []
        for k, (grid, block) in enumerate(launches):
            fn = getattr(self._lib, f"tc_launch_{k}")
            fn.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 2 + [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int),
            ]
            fn.restype = ctypes.c_int
            dims = (ctypes.c_longlong * 6)(*grid, *block)
            self._launches.append((fn, dims))

    def __call__(self, sizes: Sequence[int], buffers: Sequence[np.ndarray]) -> None:
        c_sizes = (ctypes.c_longlong * max(1, len(sizes)))(*sizes)
        c_buffers = (ctypes.c_void_p * max(1, len(buffers)))(*(b.ctypes.data for b in buffers))
        status = ctypes.c_int(0)
        for fn, dims in self._launches:
            fn(dims, c_sizes, c_buffers, ctypes.byref(status))
            check_status(status.value)
