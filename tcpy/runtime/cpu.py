"""CPU runtime: build generated C with the system compiler and call it through ctypes.

`cc -O3 -march=native -fopenmp -shared -fPIC` (with the rest of `FLAGS`) builds a
shared library; ctypes releases the GIL for the duration of the call. A compiler
failure is a `TCCompileError` with the compiler's message and the path of the kept
source.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tcpy import knobs
from tcpy.codegen.c import CONSERVATIVE_MACRO, KERNEL_SYMBOL
from tcpy.errors import TCCompileError, TCLaunchError, TCWarning
from tcpy.mapping.cpu.registers import DEFAULT_VECTOR_BYTES
from tcpy.runtime import openmp, toolchain
from tcpy.runtime.loop_counts import loop_counters
from tcpy.runtime.status import check_status
from tcpy.runtime.threads import Trials, threads_now

FLAGS = (
    "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-w",
    # libm calls need not set errno: they vectorise, and stay IEEE (NaN and infinities
    # as before); this is not -ffast-math
    "-fno-math-errno",
    # no operation traps (nor does any here: the exception flags are never read), so
    # one under a condition may be computed for every lane and the lanes chosen: a
    # max pool's backward, `x == m ? g / t : 0`, was scalar, 2x slower; the values
    # are IEEE's as before
    "-fno-trapping-math",
)  # fmt: skip
CONSERVATIVE_FLAGS = (
    "-O1", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-w", "-fno-math-errno",
    f"-D{CONSERVATIVE_MACRO}",
)  # fmt: skip
"""What a build that made the compiler fail is tried again with: no vector math
declarations, no target-specific code, little optimisation."""


def compiler() -> str:
    return toolchain.c_compiler()


def compiler_identity() -> str:
    """The compiler's version line and flags: part of every CPU cache key."""
    return (
        f"{toolchain.version_line(compiler())} {' '.join(flags())} libmvec={vector_math()} "
        f"{openmp.identity()}"
    )


@functools.cache
def device_identity() -> str:
    """The CPU the kernels are built for (-march=native): model and feature flags."""
    model, flags = platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == platform.machine():
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = hashlib.sha256(value.strip().encode()).hexdigest()[:12]
    except OSError:
        pass
    return f"{model} {flags}".strip()


@functools.cache
def _target_report() -> str:
    """What the compiler enables with -march=native (`-Q --help=target`); "" when it
    cannot say."""
    try:
        return subprocess.run(
            [compiler(), "-march=native", "-Q", "--help=target"],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def vector_bytes() -> int:
    """The width in bytes of the vectors kernels are built for: `TCPY_VECTOR_BITS` where
    the compiler takes a width (x86), else the widest the CPU has. GCC itself prefers
    256 bits on most AVX-512 CPUs, which halves what a core with two 512-bit FMA units
    can do: on one (an Ice Lake Xeon) a 512x512 matmul ran 1.5x and a softmax 1.25x
    faster at 512 bits. 16 when the compiler does not say."""
    report = _target_report()
    if "-mprefer-vector-width=" in report:
        chosen = knobs.vector_bits()
        if chosen is not None:
            return chosen // 8
    if re.search(r"-mavx512f\s+\[enabled\]", report):
        return 64
    if re.search(r"-mavx2?\s+\[enabled\]", report):
        return 32
    return DEFAULT_VECTOR_BYTES


GCC_FLAGS = (
    "--param=vect-max-version-for-alias-checks=0",
    "-fno-tree-loop-distribution",
    "-fno-tree-loop-distribute-patterns",
)
"""GCC's flags beyond `FLAGS`: no loop is vectorised behind a run-time check that its
arrays do not overlap. GCC 12.2 at -O3 -march=native (Rocket Lake tuning) vectorises
such a loop wrongly when its trip count is a division of an outer index and 1 or 2
(a register block's last, partial run: `c8 <= 2 - (c4 + 6) / 5`), computing some
elements twice. The kernels declare their arrays `restrict`, but GCC does not trust
that of a local pointer or in an OpenMP region; in the suite's kernels only the
transposing copies of two packed operands were vectorised so. And no loop is
distributed: GCC 12.2's loop distribution at -O3 moved a reduction's update of
`Y[c0 + c2]` past the loop that also initialises `Y[c4]` under a condition (fuzzer
pair 3601011155, `tests/test_regressions.py`), a wrong result that -O2 and this flag
do not give. Nor is a copy or zeroing loop made a call of `memcpy` or `memset`: GCC
12.2 turned a register block's load of its 8 x 32 outputs into a copy by 256-bit
moves onto the stack, which the block's 512-bit loads then read back, each a stalled
store forwarding; without it the loads go to the registers, and on a Xeon with AVX-512
the suite's and users' kernels ran 1.03x faster on the geometric mean (matmul 1.12x,
mlp 1.11x, 3mm 1.10x, none slower beyond 0.97x), timed side by side."""


def flags() -> tuple[str, ...]:
    """`FLAGS`, GCC's (`GCC_FLAGS`, where `-Q --help=target` says it is GCC), and the
    vector width where the compiler takes one."""
    report = _target_report()
    chosen = FLAGS + (GCC_FLAGS if report else ())
    if "-mprefer-vector-width=" not in report:
        return chosen
    return (*chosen, f"-mprefer-vector-width={vector_bytes() * 8}")


@functools.cache
def vector_math() -> bool:
    """Whether glibc's vector math library (libmvec, glibc 2.35+) can be linked, so that
    loops calling exp, tanh, ... vectorise."""
    try:
        lib = ctypes.CDLL("libmvec.so.1")
        return hasattr(lib, "_ZGVdN8v_tanhf")
    except OSError:
        return False


def build(source_path: Path, library_path: Path) -> None:
    """Compile `source_path` into the shared library `library_path`. A compiler that
    fails on generated code (an internal error, a rejected pragma) is a tcpy bug; the
    build is then tried once more with conservative flags, with a warning that keeps
    the source for a report, before it raises."""
    libs = [*openmp.link_flags(), *(["-lmvec", "-lm"] if vector_math() else ["-lm"])]
    failed = _compile(flags(), source_path, library_path, libs)
    if failed is None:
        return
    kept = Path(tempfile.mkdtemp(prefix="tcpy-failed-")) / source_path.name
    shutil.copy(source_path, kept)
    log = failed.replace(str(source_path), str(kept))
    if _compile(CONSERVATIVE_FLAGS, source_path, library_path, libs) is None:
        first = log.splitlines()[0] if log else "no message"
        warnings.warn(
            TCWarning(
                f"the C compiler failed on generated code with the usual flags ({first}); "
                f"built with conservative flags instead, which run slower. This is a tcpy "
                f"bug: please report it with the source kept at {kept}"
            ),
            stacklevel=2,
        )
        return
    raise TCCompileError(f"the C compiler failed on the generated source (kept at {kept}):\n{log}")


def _compile(
    flags: tuple[str, ...], source_path: Path, library_path: Path, libs: list[str]
) -> str | None:
    """None when the compiler succeeds, else its message."""
    cmd = [compiler(), *flags, "-o", str(library_path), str(source_path), *libs]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "the C compiler ran for over 10 minutes"
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"


class CpuKernel:
    """A loaded kernel: call it with the sizes and the buffers in kernel order; it runs
    on `threads` threads, or as many as `threads_now` says at each call (`work`: the
    statement instances at given sizes, which it weighs)."""

    def __init__(
        self,
        library_path: Path,
        threads: int = 0,
        work: Callable[[Sequence[int]], int] | None = None,
    ) -> None:
        try:
            self._lib = openmp.load(library_path)
            fn = getattr(self._lib, KERNEL_SYMBOL)
        except (OSError, AttributeError) as e:
            raise TCLaunchError(f"cannot load the compiled kernel {library_path}: {e}") from None
        fn.argtypes = [
            ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
        ]  # fmt: skip
        fn.restype = ctypes.c_int
        self._fn = fn
        self.path = library_path
        self.threads = threads
        self.counters = loop_counters(self._lib)  # a counting build's (`Compiled.iterations`)
        self._work = work
        # by the sizes' values: the statement instances, and the thread counts' trials
        self._at: dict[tuple[int, ...], tuple[int | None, Trials]] = {}

    def __call__(self, sizes: Sequence[int], buffers: Sequence[np.ndarray]) -> None:
        c_sizes = _array_type(ctypes.c_int64, len(sizes))(*sizes)
        c_buffers = _array_type(ctypes.c_void_p, len(buffers))(*map(address, buffers))
        work, trials = self._at_sizes(sizes)
        count = threads_now(self.threads, work, trials)
        check_status(_timed(self._fn, trials, c_sizes, c_buffers, count))

    def at(self, sizes: Sequence[int], count: int) -> Callable[[Sequence[int]], None]:
        """The kernel at fixed `sizes`, called with the addresses of its `count`
        buffers (a caller that holds its buffers as addresses, `tcpy.torch`)."""
        c_sizes = _array_type(ctypes.c_int64, len(sizes))(*sizes)
        buffers, fn, threads = _array_type(ctypes.c_void_p, count), self._fn, self.threads
        work, trials = self._at_sizes(sizes)
        held = threading.local()  # each calling thread's array of addresses

        def call(addresses: Sequence[int]) -> None:
            chosen = threads_now(threads, work, trials)
            try:
                c_buffers = held.buffers
            except AttributeError:
                c_buffers = held.buffers = buffers()
            c_buffers[:] = addresses
            if trials.chosen is None:  # a quiet machine: nothing to time
                status = fn(c_sizes, c_buffers, chosen)
            else:
                status = _timed(fn, trials, c_sizes, c_buffers, chosen)
            if status:
                check_status(status)

        return call

    def work(self, sizes: Sequence[int]) -> int | None:
        """The statement instances a call at `sizes` runs (None: not known)."""
        return self._at_sizes(sizes)[0]

    def _at_sizes(self, sizes: Sequence[int]) -> tuple[int | None, Trials]:
        """The statement instances at `sizes` and the trials of thread counts there."""
        key = tuple(sizes)
        if key not in self._at:
            if len(self._at) >= 256:
                self._at.clear()
            self._at[key] = (None if self._work is None else self._work(sizes), Trials())
        return self._at[key]


def _timed(fn: Any, trials: Trials, *args: Any) -> int:
    """`fn(*args)`, its time recorded in `trials`."""
    start = time.perf_counter()
    status: int = fn(*args)
    trials.record(time.perf_counter() - start)
    return status


@functools.cache
def _array_type(element: Any, length: int) -> Any:
    """The ctypes array type of `length` elements (at least one), made once."""
    return element * max(1, length)


def addresses(arrays: Sequence[np.ndarray]) -> list[int]:
    """`address` of each of `arrays`, without a call of it per array where all are
    writable (a tenth of a microsecond each)."""
    try:
        return [_ADDRESS_OF(_FROM_BUFFER(a)) for a in arrays]  # type: ignore[arg-type]
    except (TypeError, ValueError):  # one read-only, or empty
        return [address(a) for a in arrays]


_ADDRESS_OF, _FROM_BUFFER = ctypes.addressof, ctypes.c_char.from_buffer


def address(array: np.ndarray) -> int:
    """Where `array`'s data starts (a third of the time of `array.ctypes.data` for a
    writable array, which all but a few inputs are)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError):  # read-only, or empty
        return int(array.ctypes.data)
