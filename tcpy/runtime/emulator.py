"""The `cuda-emu` runtime: the exact CUDA source of the `cuda` target, built by the host
C++ compiler with a header that provides CUDA's built-ins (`emulator.h`, then the
access hooks of `emulator_hooks.h`), and run on the CPU.

Execution: the blocks of a launch are spread over the cores; the threads of a block
run in one OS thread, in sequence when the source has no barrier and no warp
operation, else as cooperative fibers that switch at `__syncthreads()` (a real
barrier) and at warp operations (`__shfl*_sync`, `__ballot_sync`, `__any_sync`,
`__all_sync`, `__syncwarp`, with their masks and widths). `__shared__` storage is per
block, static or dynamic; atomics are real atomics. The CUDA math functions C lacks come
from the same C implementations the `cpu` target uses.

Instrumentation: built `instrumented`, every global and shared access of the source
(the `TC_LD`, `TC_ST`, `TC_SLD`, ... macros the CUDA printer emits, plain indexing
elsewhere) goes through a hook. A launch with `check` then stops at the first
out-of-bounds access, shared-memory race (a write and another thread's access of the
same word with no barrier between them) or divergent barrier, and raises
`TCEmulationError` naming the kernel, the array and the threads; a launch with
`count` runs the lanes of each warp together and returns its traffic (`COUNTERS`).
A warp-level request gathers the lanes that execute the same access site for the
same time; its sectors are the distinct 32-byte segments its lanes touch, and a
shared request's bank conflicts are the wavefronts it needs beyond one per 32 words.
A launch's footprint is counted apart from its requests: the distinct sectors it loads,
those it stores (an atomic both loads and stores its sector, though its traffic is not
in the request counts) and those it touches at all, over every warp and block
(`tcpy.runtime.profile.dram_bytes` reads them).

Each kernel gets a launcher, `tc_launch_<k>(grid_and_block, sizes, buffers, status,
launch)`, generated from the kernel's parameter list, which the Python side calls in
order.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tcpy import knobs
from tcpy.codegen.c_helpers import math_helpers
from tcpy.codegen.one_kernel import GRID_PARAMETER, GRID_WORDS
from tcpy.errors import TCCompileError, TCEmulationError, TCLaunchError
from tcpy.parser.builtins import BUILTINS
from tcpy.runtime import toolchain
from tcpy.runtime.loop_counts import loop_counters
from tcpy.runtime.status import check_status

FLAGS = ("-O1", "-fopenmp", "-shared", "-fPIC", "-std=gnu++17", "-w")
"""How emulated kernels are built. -O1: the emulator runs small launches under its
checks, where compiling is most of a kernel's time; against -O2, 160 of its tests took
53 against 71 s. Values are IEEE's at either level (no -ffast-math, and no FMA to
contract into without -march)."""
INSTRUMENT_FLAG = "-DTC_EMU_INSTRUMENT"

# what makes the threads of a block wait for one another
_SYNCHRONISING = re.compile(
    r"__syncthreads|__shfl\w*_sync|__ballot_sync|__any_sync|__all_sync|__syncwarp|TC_LDMATRIX|TC_MMA_"
    r"|tc_grid_sync"
)

COUNTERS = (
    "global_load_bytes",
    "global_store_bytes",
    "global_requests",
    "global_sectors",
    "shared_bytes",
    "bank_conflicts",
    "barriers",
    "shuffles",
    "atomics",
    "distinct_load_sectors",
    "distinct_store_sectors",
    "distinct_sectors",
    "async_copies",
    "async_groups",
    "mmas",
    "grid_barriers",
)

Launch = tuple[tuple[int, int, int], tuple[int, int, int]]

RESIDENT_BLOCKS = 3
"""The blocks a cooperative launch runs on here (fewer where it needs fewer): each is an
OS thread, all at once, so that the grid's barriers are real. A one kernel is right
on any number of blocks (`tcpy.codegen.one_kernel`); three leaves most parts' blocks
unevenly shared, which the tests want."""


def resident(launch: Launch) -> Launch:
    """A cooperative `launch` on the blocks the emulator runs at once."""
    (blocks, _, _), block = launch
    return (min(blocks, RESIDENT_BLOCKS), 1, 1), block


@functools.cache
def header() -> str:
    """The emulation header: built-ins, then every CUDA math function C lacks."""
    every = {name for name in BUILTINS} | {name + "f" for name in BUILTINS}
    here = Path(__file__).parent
    parts = [
        (here / name).read_text() for name in ("emulator.h", "emulator_hooks.h", "emulator_async.h")
    ]
    return "".join(parts) + math_helpers(every) + "\n"


def compiler() -> str:
    return toolchain.require(knobs.cxx_compiler(), "C++ compiler", "TCPY_CXX", "g++")


def compiler_identity(instrumented: bool = False) -> str:
    flags = [*FLAGS, INSTRUMENT_FLAG] if instrumented else FLAGS
    return f"{toolchain.version_line(compiler())} {' '.join(flags)}"


def launcher(
    index: int, parameters: Sequence[str], n_sizes: int, source: str, function: str | None = None
) -> str:
    """The host function that runs kernel `index` of `source` over its grid (C++).
    `parameters`: the kernel's, sizes first and the status pointer last; `function`:
    its name (`tc_kernel_<index>` by default)."""
    function = function or f"tc_kernel_{index}"
    synchronises = "true" if _SYNCHRONISING.search(source) else "false"
    cooperative = parameters[-2:-1] == [GRID_PARAMETER]  # the one kernel of a def
    args = []
    for k, param in enumerate(parameters):
        ctype, _, _name = param.rpartition(" ")
        if k < n_sizes:
            args.append(f"a->sizes[{k}]")
        elif k == len(parameters) - 1:  # the status pointer closes every parameter list
            args.append("a->status")
        elif cooperative and k == len(parameters) - 2:
            args.append("a->grid")
        else:
            pointer_type = ctype.replace("__restrict__", "").strip()
            args.append(f"({pointer_type})a->buffers[{k - n_sizes}]")
    return f"""
struct tc_args_{index} {{
  const long long *sizes; void *const *buffers; int *status; unsigned grid[{GRID_WORDS}];
}};
static void tc_body_{index}(void *p) {{
  tc_args_{index} *a = (tc_args_{index} *)p;
  {function}({", ".join(args)});
}}
extern "C" int tc_launch_{index}(const long long *dims, const long long *sizes,
                                  void *const *buffers, int *status, tc_emu_launch *launch) {{
  tc_args_{index} a = {{sizes, buffers, status, {{}}}};
  return tc_emu::run(dims, tc_body_{index}, &a, launch, {synchronises}, __COUNTER__ + 1,
                     {"true" if cooperative else "false"});
}}
"""


def build(source: str, launchers: str, directory: Path, instrumented: bool = False) -> Path:
    """Compile the CUDA source and its launchers into `directory/kernel-emu.so` (the
    intermediate C++ files are removed once it is built)."""
    flags = [*FLAGS, INSTRUMENT_FLAG] if instrumented else list(FLAGS)
    headers = precompiled_header(tuple(flags))
    if headers is None:
        headers = directory
        (directory / "tc_emu.h").write_text(header())
    unit = directory / "kernel-emu.cpp"
    unit.write_text(f'#include "tc_emu.h"\n{source}\n{launchers}')
    library = directory / "kernel-emu.so"
    cmd = [compiler(), *flags, f"-I{headers}", "-o", str(library), str(unit), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise TCCompileError(f"the C++ compiler ran for over 10 minutes on {unit}") from None
    if done.returncode != 0:
        kept = Path(tempfile.mkdtemp(prefix="tcpy-failed-"))
        shutil.copy(unit, kept / unit.name)
        shutil.copy(headers / "tc_emu.h", kept / "tc_emu.h")
        log = (done.stderr or done.stdout).strip().replace(str(directory), str(kept))
        raise TCCompileError(
            f"the C++ compiler failed on the emulated CUDA source (kept at {kept}):\n{log}"
        )
    unit.unlink()
    (directory / "tc_emu.h").unlink(missing_ok=True)
    return library


_HEADER_LOCK = threading.Lock()


def precompiled_header(flags: tuple[str, ...]) -> Path | None:
    """A directory of this process's holding `tc_emu.h` and its precompiled form for
    `flags` (a kernel built with them reads the header's 1,600 lines parsed once: 0.62
    against 0.82 s per kernel at -O2); None where it cannot be made, and a kernel includes
    the header's text. The compiler checks that the precompiled form matches a
    kernel's flags, and reads the text where it does not."""
    with _HEADER_LOCK:
        headers = _precompiled(flags)
    if headers is None or not (headers / "tc_emu.h.gch").exists():
        return None  # or removed by a cleaner of the temporary directory
    return headers


@functools.cache
def _precompiled(flags: tuple[str, ...]) -> Path | None:
    try:
        headers = toolchain.scratch_directory("tcpy-emu-")
        (headers / "tc_emu.h").write_text(header())
    except OSError:
        return None
    own = [f for f in flags if f != "-shared"]
    text, precompiled = headers / "tc_emu.h", headers / "tc_emu.h.gch"
    cmd = [compiler(), *own, "-x", "c++-header", str(text), "-o", str(precompiled)]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return None
    return headers if done.returncode == 0 else None


class _Buffer(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("bytes", ctypes.c_longlong), ("name", ctypes.c_char_p)]


class _Launch(ctypes.Structure):
    _fields_ = [
        ("check", ctypes.c_int),
        ("count", ctypes.c_int),
        ("n_buffers", ctypes.c_int),
        ("buffers", ctypes.POINTER(_Buffer)),
        ("kernel", ctypes.c_char_p),
        ("dynamic_shared", ctypes.c_longlong),
        ("counters", ctypes.c_longlong * len(COUNTERS)),
        ("error", ctypes.c_char * 1024),
    ]


class EmulatedKernels:
    """The launchers of one compiled definition, run in order.

    `names`: the buffers' tensor names (for messages); `kernels`: each launch's name;
    `dynamic_shared`: each launch's dynamic shared memory in bytes; `instrumented`:
    the library was built with the hooks, which `check` (bounds, races, barriers) and
    `profile` need."""

    def __init__(
        self,
        library: Path,
        launches: Sequence[Launch],
        names: Sequence[str] = (),
        kernels: Sequence[str] = (),
        dynamic_shared: Sequence[int] = (),
        instrumented: bool = False,
        check: bool = False,
    ):
        try:
            self._lib = ctypes.CDLL(os.fspath(library))
        except OSError as e:
            raise TCLaunchError(f"cannot load the emulated kernels {library}: {e}") from None
        self.launches = list(launches)
        self.instrumented = instrumented
        self.check = check and instrumented
        self._names = [n.encode() for n in names]
        n = len(self.launches)
        named = [kernels[k] if k < len(kernels) else f"kernel {k}" for k in range(n)]
        self._kernels = [name.encode() for name in named]
        self._shared = [dynamic_shared[k] if k < len(dynamic_shared) else 0 for k in range(n)]
        self._functions = []
        for k in range(len(self.launches)):
            fn = getattr(self._lib, f"tc_launch_{k}")
            fn.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 2 + [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(_Launch),
            ]
            fn.restype = ctypes.c_int
            self._functions.append(fn)
        self._lock = threading.Lock()  # a launch sets the library's globals (gridDim, ...)
        self.counters = loop_counters(self._lib)  # a counting build's (`Compiled.iterations`)

    def __call__(self, sizes: Sequence[int], buffers: Sequence[np.ndarray]) -> None:
        self._run(sizes, buffers, count=False)

    def profile(self, sizes: Sequence[int], buffers: Sequence[np.ndarray]) -> list[dict[str, Any]]:
        """Run once, counting: one dict per launch (`kernel`, `grid`, `block` and the
        `COUNTERS`)."""
        if not self.instrumented:
            raise TCLaunchError("profiling needs the instrumented build of the emulated kernels")
        # at the alignment of GPU allocations, so that sectors are counted as they would be
        aligned = [_aligned_copy(b) for b in buffers]
        profiles = self._run(sizes, aligned, count=True)
        for b, a in zip(buffers, aligned, strict=True):
            b[...] = a
        return profiles

    def _run(
        self, sizes: Sequence[int], buffers: Sequence[np.ndarray], count: bool
    ) -> list[dict[str, Any]]:
        c_sizes = (ctypes.c_longlong * max(1, len(sizes)))(*sizes)
        c_buffers = (ctypes.c_void_p * max(1, len(buffers)))(*(b.ctypes.data for b in buffers))
        table = (_Buffer * max(1, len(buffers)))()
        for k, b in enumerate(buffers):
            name = self._names[k] if k < len(self._names) else f"buffer {k}".encode()
            table[k] = _Buffer(b.ctypes.data, b.nbytes, name)
        status = ctypes.c_int(0)
        profiles = []
        with self._lock:
            for k, fn in enumerate(self._functions):
                grid, block = self.launches[k]
                dims = (ctypes.c_longlong * 6)(*grid, *block)
                launch = _Launch(
                    check=int(self.check), count=int(count), n_buffers=len(buffers),
                    buffers=table, kernel=self._kernels[k], dynamic_shared=self._shared[k],
                )  # fmt: skip
                if fn(dims, c_sizes, c_buffers, ctypes.byref(status), ctypes.byref(launch)):
                    raise TCEmulationError(launch.error.decode(errors="replace"))
                check_status(status.value)
                if count:
                    counted = dict(zip(COUNTERS, launch.counters, strict=True))
                    shape = {"kernel": self._kernels[k].decode(), "grid": grid, "block": block}
                    profiles.append({**shape, **counted})
        return profiles


ALIGNMENT = 256  # of a cudaMalloc allocation


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    """A copy of `array` that starts on an `ALIGNMENT`-byte boundary."""
    raw = np.empty(array.nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    copy = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy
