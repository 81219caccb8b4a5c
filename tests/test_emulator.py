"""The CUDA emulator (`tcpy.runtime.emulator` and its header `emulator.h`), driven by
hand-written CUDA kernels rather than by generated code.

What is tested:

* the checks of an instrumented build, each on a kernel with the defect and on its
  fixed version (which must run and give the right answer): barrier divergence,
  shared-memory races (read/write, write/read, write/write), a read of shared memory
  no thread wrote, out-of-bounds loads,
  stores, vector loads and atomics on global memory and accesses of static and dynamic
  shared memory, warp operations whose mask leaves out the caller or names a lane that
  has exited or never arrives; that the plain build, and an instrumented one launched
  without `check`, run the defective kernels without complaint;
* warp semantics against a NumPy model of CUDA's documented rules: the four shuffles at
  widths 32, 16 and 8, votes under a partial mask, `__syncwarp`, bit-exact shuffles of
  int, unsigned, long long, float and double, a 48-thread block reduced per warp;
* a tree reduction in shared memory with barriers (blockDim 256 and 1024);
* atomics of every type on global memory from many blocks, a compare-and-swap
  maximum of floats and doubles, and an atomic counter in shared memory;
* dynamic shared memory and its bounds; float2/float4/int2/int4/double2 loads and make_*;
* the profile's counters, computed by hand, on small kernels (coalesced, strided and
  broadcast loads, a load site run in a loop, float4 loads, bank conflicts and shared
  broadcasts, shuffles, barriers, atomics), and each launch's distinct sectors loaded
  and stored (a vector every block reads is one footprint, moved once per block);
* the unflattening of 3-D thread and block indices.

Sources that several tests use are compiled once per module; most of them gather
several cases as `__device__` functions behind one kernel that picks a case by its
first size parameter, so that the file builds only a handful of libraries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tcpy.codegen.cuda import ACCESS_MACROS
from tcpy.errors import TCEmulationError, TCLaunchError
from tcpy.runtime import emulator
from tcpy.runtime.profile import dram_bytes, moved_bytes

Dim = int | tuple[int, int, int]
Counters = dict[str, Any]


# --- helpers -------------------------------------------------------------------------


def dim3(d: Dim) -> tuple[int, int, int]:
    return d if isinstance(d, tuple) else (d, 1, 1)


def build_library(
    directory: Path,
    source: str,
    params: Sequence[str],
    n_sizes: int,
    functions: Sequence[str] = ("tc_kernel_0",),
    instrumented: bool = True,
    prefix: str = "",
) -> Path:
    """Compiles `source` (after the access macros) with one launcher per function."""
    source = prefix + ACCESS_MACROS + source
    launchers = "".join(
        emulator.launcher(k, params, n_sizes, source, function=f) for k, f in enumerate(functions)
    )
    return emulator.build(source, launchers, directory, instrumented=instrumented)


def dispatcher(params: Sequence[str], cases: Sequence[str], args: str) -> str:
    """`tc_kernel_0(params)`: calls the device function `cases[s_case]` with `args`."""
    calls = "\n".join(f"    case {k}: {name}({args}); break;" for k, name in enumerate(cases))
    signature = ",\n    ".join(params)
    return f"""
extern "C" __global__ void tc_kernel_0(
    {signature}) {{
  switch (s_case) {{
{calls}
  }}
}}
"""


def emulated(
    library: Path,
    grid: Dim,
    block: Dim,
    kernel: str,
    *,
    names: Sequence[str] = ("input", "output"),
    check: bool = True,
    instrumented: bool = True,
    dynamic_shared: int = 0,
) -> emulator.EmulatedKernels:
    """One launch of `library`'s kernel 0, named `kernel` in messages."""
    return emulator.EmulatedKernels(
        library,
        [(dim3(grid), dim3(block))],
        names=names,
        kernels=[kernel],
        dynamic_shared=[dynamic_shared],
        instrumented=instrumented,
        check=check,
    )


def counters(**given: int) -> Counters:
    """Every counter of a profile: those given, the others zero."""
    unknown = set(given) - set(emulator.COUNTERS)
    assert not unknown, unknown
    return {name: given.get(name, 0) for name in emulator.COUNTERS}


def counted(profile: Counters) -> Counters:
    return {name: profile[name] for name in emulator.COUNTERS}


def shuffle_model(values: np.ndarray, op: str, arg: int, width: int) -> np.ndarray:
    """Each lane's result of a full-warp shuffle, by the CUDA programming guide: a
    warp is cut into segments of `width` lanes; `idx` reads lane `arg mod width` of the
    segment; `up`/`down` read `arg` lanes lower/higher and keep their own value when
    that leaves the segment; `xor` reads lane `lane ^ arg`, which may lie in an earlier
    segment but not in a later one (then the caller keeps its own value)."""
    position = np.arange(values.size)
    lane = position % 32
    start = lane - lane % width  # the first lane of the caller's segment
    if op == "idx":
        source = start + arg % width
    elif op == "up":
        source = np.where(lane - start >= arg, lane - arg, lane)
    elif op == "down":
        source = np.where(lane - start + arg < width, lane + arg, lane)
    else:
        partner = lane ^ arg
        source = np.where(partner < start + width, partner, lane)
    return values[position - lane + source]


# --- 1. the checks: each defect, and its fixed version -------------------------------

CHECK_PARAMS = [
    "long long s_case",
    "long long s_defect",
    "long long s_N",
    "const float *__restrict__ t_A",
    "float *__restrict__ t_O",
    "int *tc_status",
]

# Each case: `defect` non-zero runs the defective version, zero the fixed one; A has
# `n` elements; every block has 64 threads (two warps) unless the test says otherwise.
CHECK_SOURCE = r"""
#define FULL 0xffffffffu
#define TID (int)threadIdx.x
#define GID ((long long)blockIdx.x * blockDim.x + threadIdx.x)

/* reverses each block's 64 elements, the upper half doubled: the two halves of the
   block meet at two different barriers when defective */
__device__ void barrier_sites(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  if (TID < 32) {
    TC_SST(tile, TID) = TC_LD(A, GID);
    if (defect) __syncthreads();
  } else {
    TC_SST(tile, TID) = 2 * TC_LD(A, GID);
    if (defect) __syncthreads();
  }
  if (!defect) __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, 63 - TID);
}

/* the sum of each block's elements below n: threads past n return before the barrier
   when defective */
__device__ void barrier_exit(long long defect, long long n, const float *A, float *O) {
  __shared__ float part[64];
  if (defect) {
    if (GID >= n) return;
    TC_SST(part, TID) = TC_LD(A, GID);
  } else {
    TC_SST(part, TID) = GID < n ? TC_LD(A, GID) : 0.0f;
  }
  __syncthreads();
  if (TID == 0) {
    float s = 0;
    for (int k = 0; k < 64; k++) s += TC_SLD(part, k);
    TC_ST(O, blockIdx.x) = s;
  }
}

/* O[t] = A[t - 1] within a block: the left neighbour's element is read before it is
   written (thread 0 writes tile[0], thread 1 reads it) when defective */
__device__ void race_wr(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  if (!defect) __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, (TID + 63) % 64);
}

/* O[t] = A[t + 1] within a block: tile[63] is never written, and thread 62 reads it,
   when defective */
__device__ void unwritten(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  if (!defect || TID < 63) TC_SST(tile, TID) = TC_LD(A, GID);
  __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, (TID + 1) % 64);
}

/* O[t] = A[t + 1] within a block, shifted in place: thread 1 overwrites tile[1] that
   thread 0 has read, with no barrier between, when defective */
__device__ void race_rw(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  __syncthreads();
  float v = TC_SLD(tile, (TID + 1) % 64);
  if (!defect) __syncthreads();
  TC_SST(tile, TID) = v;
  __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, TID);
}

/* every odd thread overwrites its even neighbour's word: two writes to tile[0] by
   threads 0 and 1 in the same barrier interval when defective */
__device__ void race_ww(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  if (!defect) __syncthreads();
  if (TID % 2 == 1) TC_SST(tile, TID - 1) = TC_LD(A, GID);
  __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, TID);
}

/* a tile of 2-byte elements: threads 2k and 2k + 1 write the two halves of one word,
   which is no race; when defective, odd threads write their even neighbour's too */
__device__ void race_halves(long long defect, long long n, const float *A, float *O) {
  __shared__ __half tile[64];
  TC_SST(tile, TID) = tc_float_to_float16(TC_LD(A, GID));
  if (defect && TID % 2 == 1) TC_SST(tile, TID - 1) = tc_float_to_float16(TC_LD(A, GID));
  __syncthreads();
  TC_ST(O, GID) = tc_float16_to_float(TC_SLD(tile, TID));
}

/* O[i] = A[i + 1]: the last thread reads A[n] when defective */
__device__ void shift_left(long long defect, long long n, const float *A, float *O) {
  if (GID < (defect ? n : n - 1)) TC_ST(O, GID) = TC_LD(A, GID + 1);
}

/* O[i + 1] = A[i]: the last thread writes O[n] when defective */
__device__ void shift_right(long long defect, long long n, const float *A, float *O) {
  if (GID < (defect ? n : n - 1)) TC_ST(O, GID + 1) = TC_LD(A, GID);
}

/* O[q] = the sum of A's q-th float4, over whole float4s only; when defective the
   partial last one (2 of its 4 floats past the end) is read too */
__device__ void vector_sum(long long defect, long long n, const float *A, float *O) {
  if (GID < (defect ? (n + 3) / 4 : n / 4)) {
    float4 v = TC_LDV(float4, A, 4 * GID);
    TC_ST(O, GID) = v.x + v.y + v.z + v.w;
  }
}

/* O[q] = A[2q] + A[2q + 1] by float2 loads, for the first n/2 - 1 pairs; when
   defective the pairs start one float later, off the 8-byte alignment of a float2 */
__device__ void misaligned_pairs(long long defect, long long n, const float *A, float *O) {
  if (GID < n / 2 - 1) {
    float2 v = TC_LDV(float2, A, 2 * GID + defect);
    TC_ST(O, GID) = v.x + v.y;
  }
}

/* a histogram of A mod 16 by atomics; binned mod 17 when defective, so that A = 16
   lands one past the end */
__device__ void histogram(long long defect, long long n, const float *A, float *O) {
  if (GID < n) atomicAdd(TC_AT(O, (int)TC_LD(A, GID) % (defect ? 17 : 16)), 1.0f);
}

/* O[t] = A[t + 1] within a block, wrapped: reads tile[64] when defective */
__device__ void shared_bounds(long long defect, long long n, const float *A, float *O) {
  __shared__ float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  __syncthreads();
  TC_ST(O, GID) = TC_SLD(tile, defect ? TID + 1 : (TID + 1) % 64);
}

/* O[t] = tile[2t] + tile[2t + 1] by float2 reads of a block's tile, for its first 31
   threads (0 for the others); when defective the pairs start one float later, off
   the 8-byte alignment of a float2 */
__device__ void misaligned_shared_pairs(long long defect, long long n, const float *A, float *O) {
  __shared__ __align__(16) float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  __syncthreads();
  float2 v = TID < 31 ? TC_SLDV(float2, tile, 2 * TID + defect) : make_float2(0.0f, 0.0f);
  TC_ST(O, GID) = v.x + v.y;
}

/* reverses each block through dynamic shared memory: reads one past it when defective */
__device__ void dynamic_reverse(long long defect, long long n, const float *A, float *O) {
  TC_DYNAMIC_SHARED(float, smem);
  int b = (int)blockDim.x;
  TC_SST(smem, TID) = TC_LD(A, GID);
  __syncthreads();
  TC_ST(O, GID) = TC_SLD(smem, defect ? b - TID : b - 1 - TID);
}

/* each half-warp broadcasts its first lane; when defective the upper half names the
   lower half's mask, which leaves the callers out */
__device__ void mask_excludes_caller(long long defect, long long n, const float *A, float *O) {
  int lane = TID % 32;
  unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
  TC_ST(O, GID) = __shfl_sync(defect ? 0x0000ffffu : half, TC_LD(A, GID), 0, 16);
}

/* the sum of the lower 16 lanes of each warp, the upper 16 having returned: the mask
   names them when defective */
__device__ void mask_names_exited(long long defect, long long n, const float *A, float *O) {
  int lane = TID % 32;
  if (lane >= 16) return;
  float v = TC_LD(A, GID);
  for (int o = 8; o > 0; o /= 2) v += __shfl_down_sync(defect ? FULL : 0x0000ffffu, v, o);
  if (lane == 0) TC_ST(O, GID / 32) = v;
}

/* the lower half-warp broadcasts its first lane while the upper half goes on to a
   barrier: the mask names the upper half, which never arrives, when defective */
__device__ void never_reach(long long defect, long long n, const float *A, float *O) {
  int lane = TID % 32;
  float v = TC_LD(A, GID);
  if (lane < 16) v = __shfl_sync(defect ? FULL : 0x0000ffffu, v, 0, 16);
  __syncthreads();
  TC_ST(O, GID) = v;
}
"""


@dataclass(frozen=True)
class Defect:
    case: str  # the device function
    n: int  # elements of the input
    expected: Callable[[np.ndarray], np.ndarray]  # the fixed version's output (-1: unwritten)
    fragments: tuple[str, ...]  # what the error message of the defective one says
    dynamic_shared: int = 0


def _per_block(a: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`f` applied to the rows of 64 (one block each), flattened."""
    return np.ascontiguousarray(f(a.reshape(-1, 64).copy())).ravel()


def _upper_doubled_reversed(rows: np.ndarray) -> np.ndarray:
    rows[:, 32:] *= 2
    return rows[:, ::-1]


def _even_from_odd(rows: np.ndarray) -> np.ndarray:
    rows[:, 0::2] = rows[:, 1::2]
    return rows


def _pair_sums(rows: np.ndarray) -> np.ndarray:
    out = np.zeros_like(rows)
    out[:, :31] = rows[:, 0:62:2] + rows[:, 1:62:2]
    return out


def _with_unwritten(values: np.ndarray, size: int, at: int) -> np.ndarray:
    """`values` laid out from `at` in an array of `size` that is -1 elsewhere."""
    out = np.full(size, -1, np.float32)
    out[at : at + values.size] = values
    return out


def _half_warp_broadcast(a: np.ndarray) -> np.ndarray:
    return np.repeat(a.reshape(-1, 16)[:, 0], 16)


def _lower_half_broadcast(a: np.ndarray) -> np.ndarray:
    warps = a.reshape(-1, 32).copy()
    warps[:, :16] = warps[:, :1]
    return warps.ravel()


DEFECTS = [
    Defect(
        "barrier_sites",
        128,
        lambda a: _per_block(a, _upper_doubled_reversed),
        ("barrier divergence", "different __syncthreads()"),
    ),
    Defect(
        "barrier_exit",
        100,
        lambda a: np.array([a[:64].sum(), a[64:].sum()], np.float32),
        ("barrier divergence", "exited"),
    ),
    Defect(
        "race_wr",
        128,
        lambda a: _per_block(a, lambda r: np.roll(r, 1, axis=1)),
        ("race", "tile", "a write by block", "thread (0, 0, 0) and a read by", "thread (1, 0, 0)"),
    ),
    Defect(
        "unwritten",
        128,
        lambda a: _per_block(a, lambda r: np.roll(r, -1, axis=1)),
        ("a read of shared tile by", "thread (62, 0, 0)", "no thread of the block has written"),
    ),
    Defect(
        "race_rw",
        128,
        lambda a: _per_block(a, lambda r: np.roll(r, -1, axis=1)),
        ("race", "tile", "a read by block", "thread (0, 0, 0) and a write by", "thread (1, 0, 0)"),
    ),
    Defect(
        "race_ww",
        128,
        lambda a: _per_block(a, _even_from_odd),
        ("race", "tile", "a write by block", "thread (0, 0, 0) and a write by", "thread (1, 0, 0)"),
    ),
    Defect(
        "race_halves",
        128,
        lambda a: a,
        ("race", "tile", "a write by block", "thread (0, 0, 0) and a write by", "thread (1, 0, 0)"),
    ),
    Defect(
        "shift_left",
        100,
        lambda a: _with_unwritten(a[1:], 100, 0),
        ("out of bounds", "input has 100 elements", "index 100"),
    ),
    Defect(
        "shift_right",
        100,
        lambda a: _with_unwritten(a[:-1], 100, 1),
        ("out of bounds", "output has 100 elements", "index 100"),
    ),
    Defect(
        "vector_sum",
        130,
        lambda a: _with_unwritten(a[:128].reshape(32, 4).sum(axis=1), 33, 0),
        ("out of bounds", "input has 130 elements", "index 128"),
    ),
    Defect(
        "histogram",
        100,
        lambda a: np.bincount(a.astype(int) % 16, minlength=16).astype(np.float32) - 1,
        ("out of bounds", "output has 16 elements", "index 16"),
    ),
    Defect(
        "shared_bounds",
        128,
        lambda a: _per_block(a, lambda r: np.roll(r, -1, axis=1)),
        ("out of bounds", "tile has 64 elements", "index 64"),
    ),
    Defect(
        "dynamic_reverse",
        128,
        lambda a: _per_block(a, lambda r: r[:, ::-1]),
        ("out of bounds", "smem has 64 elements", "index 64"),
        dynamic_shared=64 * 4,
    ),
    Defect(
        "misaligned_pairs",
        128,
        lambda a: a[0:126:2] + a[1:127:2],
        ("misaligned 8-byte access to input", "index 1"),
    ),
    Defect(
        "misaligned_shared_pairs",
        128,
        lambda a: _per_block(a, _pair_sums),
        ("misaligned 8-byte access to shared tile", "index 1"),
    ),
    Defect(
        "mask_excludes_caller",
        128,
        _half_warp_broadcast,
        ("__shfl_sync", "thread (16, 0, 0)", "not in its mask 0x0000ffff"),
    ),
    Defect(
        "mask_names_exited",
        128,
        lambda a: a.reshape(-1, 32)[:, :16].sum(axis=1),
        ("__shfl_down_sync", "names lane 16 in its mask 0xffffffff", "exited"),
    ),
    Defect(
        "never_reach",
        128,
        _lower_half_broadcast,
        ("__shfl_sync", "mask 0xffffffff", "never reach it"),
    ),
]
CHECK_CASES = [d.case for d in DEFECTS]
CHECK_SOURCE += dispatcher(CHECK_PARAMS, CHECK_CASES, "s_defect, s_N, t_A, t_O")


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("checks"), CHECK_SOURCE, CHECK_PARAMS, 3)


@pytest.fixture(scope="module")
def checks_plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("checks-plain")
    return build_library(directory, CHECK_SOURCE, CHECK_PARAMS, 3, instrumented=False)


def run_defect(
    library: Path,
    defect: Defect,
    defective: bool,
    *,
    check: bool = True,
    instrumented: bool = True,
    dynamic_shared: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Runs the case on two blocks of 64 threads: its input and output."""
    a = np.arange(1, defect.n + 1, dtype=np.float32)
    out = np.full(defect.expected(a).shape, -1, np.float32)
    shared = defect.dynamic_shared if dynamic_shared is None else dynamic_shared
    kernels = emulated(
        library, 2, 64, defect.case, check=check, instrumented=instrumented, dynamic_shared=shared
    )
    kernels([CHECK_CASES.index(defect.case), int(defective), defect.n], [a, out])
    return a, out


def test_kernels_read_the_header_precompiled_for_their_flags(tmp_path: Path) -> None:
    """One precompiled header per set of flags and process, which the compiler finds
    valid for a kernel of those flags (`-H` marks it `!`); where it is gone, the
    header's text is written beside the kernel, which still builds and runs right."""
    import subprocess

    plain = tuple(emulator.FLAGS)
    headers = emulator.precompiled_header(plain)
    assert headers is not None and (headers / "tc_emu.h.gch").exists()
    instrumented = emulator.precompiled_header((*plain, emulator.INSTRUMENT_FLAG))
    assert instrumented is not None and instrumented != headers
    unit = tmp_path / "unit.cpp"
    unit.write_text('#include "tc_emu.h"\n')
    for flags, directory in ((plain, headers), ((*plain, emulator.INSTRUMENT_FLAG), instrumented)):
        cmd = [emulator.compiler(), *flags, "-fsyntax-only", "-H", f"-I{directory}", str(unit)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert done.stderr.startswith(f"! {directory / 'tc_emu.h.gch'}"), done.stderr[:200]
    (headers / "tc_emu.h.gch").unlink()
    try:
        assert emulator.precompiled_header(plain) is None
        library = build_library(tmp_path, CHECK_SOURCE, CHECK_PARAMS, 3, instrumented=False)
        defect = DEFECTS[CHECK_CASES.index("race_ww")]
        a, out = run_defect(library, defect, defective=False, instrumented=False)
        np.testing.assert_array_equal(out, defect.expected(a))
    finally:
        emulator._precompiled.cache_clear()  # the next kernel makes a new one


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.case)
def test_defect_is_reported(checks: Path, defect: Defect) -> None:
    with pytest.raises(TCEmulationError) as caught:
        run_defect(checks, defect, defective=True)
    message = str(caught.value)
    for fragment in (defect.case, *defect.fragments):
        assert fragment in message, f"{fragment!r} not in {message!r}"


@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.case)
def test_fixed_version_runs_and_is_right(checks: Path, defect: Defect) -> None:
    a, out = run_defect(checks, defect, defective=False)
    np.testing.assert_array_equal(out, defect.expected(a))


def test_dynamic_shared_memory_smaller_than_the_block_uses_is_out_of_bounds(checks: Path) -> None:
    defect = DEFECTS[CHECK_CASES.index("dynamic_reverse")]
    with pytest.raises(TCEmulationError, match=r"smem has 32 elements, index 32"):
        run_defect(checks, defect, defective=False, dynamic_shared=32 * 4)


def test_plain_build_runs_a_racy_kernel_without_checking(checks_plain: Path) -> None:
    defect = DEFECTS[CHECK_CASES.index("race_ww")]
    run_defect(checks_plain, defect, defective=True, instrumented=False)
    kernels = emulated(checks_plain, 2, 64, defect.case, instrumented=False)
    a = np.zeros(defect.n, np.float32)
    with pytest.raises(TCLaunchError, match="instrumented"):
        kernels.profile([CHECK_CASES.index(defect.case), 1, defect.n], [a, a.copy()])


@pytest.mark.parametrize("case", ["race_ww", "barrier_sites"])
def test_instrumented_build_without_check_does_not_raise(checks: Path, case: str) -> None:
    run_defect(checks, DEFECTS[CHECK_CASES.index(case)], defective=True, check=False)


# --- 2, 3, 8. warps, block reductions and indices -------------------------------------

WARP_PARAMS = [
    "long long s_case",
    "long long s_op",
    "long long s_arg",
    "long long s_width",
    "const float *__restrict__ t_A",
    "float *__restrict__ t_O",
    "int *tc_status",
]

WARP_SOURCE = r"""
#define FULL 0xffffffffu
#define TID (int)threadIdx.x
#define GID ((long long)blockIdx.x * blockDim.x + threadIdx.x)

/* one shuffle of A (op 0: __shfl_sync, 1: up, 2: down, 3: xor) at width `width` */
__device__ void shuffle(long long op, long long arg, long long width, const float *A,
                        float *O) {
  float v = TC_LD(A, GID), r;
  int w = (int)width;
  if (op == 0) r = __shfl_sync(FULL, v, (int)arg, w);
  else if (op == 1) r = __shfl_up_sync(FULL, v, (unsigned)arg, w);
  else if (op == 2) r = __shfl_down_sync(FULL, v, (unsigned)arg, w);
  else r = __shfl_xor_sync(FULL, v, (int)arg, w);
  TC_ST(O, GID) = r;
}

/* ballot, any and all of A != 0 over the lower half-warp, which calls them with its
   own mask; the upper half votes likewise under its mask if `op`, else not at all */
__device__ void votes(long long op, long long arg, long long width, const float *A,
                      float *O) {
  int p = TC_LD(A, GID) != 0.0f;
  bool lower = TID % 32 < 16;
  if (lower || op) {
    unsigned mask = lower ? 0x0000ffffu : 0xffff0000u;
    unsigned ballot = __ballot_sync(mask, p);
    int any = __any_sync(mask, p), all = __all_sync(mask, p);
    TC_ST(O, 3 * GID) = (float)ballot;
    TC_ST(O, 3 * GID + 1) = any != 0;
    TC_ST(O, 3 * GID + 2) = all != 0;
  }
}

/* lanes swap their elements with a neighbour through shared memory, then read the
   swapped tile mirrored within their half-warp: right only if __syncwarp orders the
   accesses (the first one with a separate mask per half-warp) */
__device__ void syncwarp_exchange(long long op, long long arg, long long width,
                                  const float *A, float *O) {
  __shared__ float tile[64];
  TC_SST(tile, TID) = TC_LD(A, GID);
  __syncwarp(TID % 32 < 16 ? 0x0000ffffu : 0xffff0000u);
  float v = TC_SLD(tile, TID ^ 1);
  __syncwarp();
  TC_SST(tile, TID) = v;
  __syncwarp();
  TC_ST(O, GID) = TC_SLD(tile, TID ^ 15);
}

/* the sum of each warp's elements in a block whose last warp is partial: the mask
   names the live lanes only */
__device__ void partial_warp_sum(long long op, long long arg, long long width,
                                 const float *A, float *O) {
  int lane = TID % 32, warp = TID / 32;
  int rest = (int)blockDim.x - warp * 32, live = rest < 32 ? rest : 32;
  unsigned mask = live == 32 ? FULL : (1u << live) - 1u;
  float v = TC_LD(A, GID);
  for (int o = 16; o > 0; o /= 2) {
    float other = __shfl_down_sync(mask, v, o);
    if (lane + o < live) v += other;
  }
  if (lane == 0) TC_ST(O, blockIdx.x * ((blockDim.x + 31) / 32) + warp) = v;
}

/* each block's sum by a tree in shared memory */
__device__ void block_sum(long long op, long long arg, long long width, const float *A,
                          float *O) {
  __shared__ float part[1024];
  TC_SST(part, TID) = TC_LD(A, GID);
  __syncthreads();
  for (int s = (int)blockDim.x / 2; s > 0; s /= 2) {
    if (TID < s) TC_SST(part, TID) = TC_SLD(part, TID) + TC_SLD(part, TID + s);
    __syncthreads();
  }
  if (TID == 0) TC_ST(O, blockIdx.x) = TC_SLD(part, 0);
}

/* per thread: threadIdx, blockIdx, the linear id of lane 0 of its warp and the x of
   the lane below it (its own for lane 0) */
__device__ void indices(long long op, long long arg, long long width, const float *A,
                        float *O) {
  int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  long long g = (long long)block * (blockDim.x * blockDim.y * blockDim.z) + thread;
  int first = __shfl_sync(FULL, thread, 0);
  int below = __shfl_up_sync(FULL, (int)threadIdx.x, 1);
  TC_ST(O, 8 * g + 0) = threadIdx.x;
  TC_ST(O, 8 * g + 1) = threadIdx.y;
  TC_ST(O, 8 * g + 2) = threadIdx.z;
  TC_ST(O, 8 * g + 3) = blockIdx.x;
  TC_ST(O, 8 * g + 4) = blockIdx.y;
  TC_ST(O, 8 * g + 5) = blockIdx.z;
  TC_ST(O, 8 * g + 6) = first;
  TC_ST(O, 8 * g + 7) = below;
}
"""
WARP_CASES = ["shuffle", "votes", "syncwarp_exchange", "partial_warp_sum", "block_sum", "indices"]
WARP_SOURCE += dispatcher(WARP_PARAMS, WARP_CASES, "s_op, s_arg, s_width, t_A, t_O")
SHUFFLE_OPS = ["idx", "up", "down", "xor"]


@pytest.fixture(scope="module")
def warps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("warps"), WARP_SOURCE, WARP_PARAMS, 4)


def warp_case(
    library: Path,
    case: str,
    grid: Dim,
    block: Dim,
    a: np.ndarray,
    out_size: int,
    *,
    op: int = 0,
    arg: int = 0,
    width: int = 32,
    check: bool = True,
) -> tuple[np.ndarray, Counters]:
    """Runs the case, then profiles it: its output (-1 where unwritten) and counters."""
    kernels = emulated(library, grid, block, case, check=check)
    sizes = [WARP_CASES.index(case), op, arg, width]
    out = np.full(out_size, -1, np.float32)
    kernels(sizes, [a, out])
    profile = kernels.profile(sizes, [a, np.full(out_size, -1, np.float32)])
    return out, counted(profile[0])


def distinct_values(n: int) -> np.ndarray:
    return np.random.default_rng(n).permutation(n).astype(np.float32) + 1


SHUFFLES = [
    ("idx", 3, 32),
    ("idx", -1, 32),
    ("idx", 13, 8),  # lane 13 of a segment of 8: lane 5 of the caller's segment
    ("idx", 0, 8),
    ("up", 1, 32),
    ("up", 5, 32),
    ("up", 3, 8),
    ("up", 9, 8),  # past every segment: each lane keeps its own value
    ("down", 1, 32),
    ("down", 16, 32),
    ("down", 4, 16),
    ("down", 3, 8),
    ("down", 9, 8),
    ("xor", 1, 32),
    ("xor", 16, 32),
    ("xor", 31, 32),
    ("xor", 2, 8),
    ("xor", 8, 8),  # the next segment: the lower one keeps, the upper one reads down
    ("xor", 24, 8),
]


@pytest.mark.parametrize(("op", "arg", "width"), SHUFFLES)
def test_shuffle_matches_cuda_semantics(warps: Path, op: str, arg: int, width: int) -> None:
    a = distinct_values(128)
    out, profile = warp_case(
        warps, "shuffle", 2, 64, a, 128, op=SHUFFLE_OPS.index(op), arg=arg, width=width
    )
    np.testing.assert_array_equal(out, shuffle_model(a, op, arg, width))
    assert profile["shuffles"] == 4  # one per warp


@pytest.mark.parametrize("upper_votes", [False, True], ids=["lower-only", "both-halves"])
def test_votes_with_a_partial_mask(warps: Path, upper_votes: bool) -> None:
    predicates = np.zeros((4, 32), np.float32)  # one row per warp
    predicates[1, :16] = 1  # every lane of the lower mask
    predicates[2, :16] = [2.5, 0, -1, 1, 0, 0, 7, 0, 1, 1, 0, 1, 0, 0, 0, -3]
    predicates[2, 16:] = 1
    predicates[3, 15] = 1  # only the top lane of the lower mask
    predicates[3, 16:] = [0, 1] * 8
    a = predicates.ravel()
    out, profile = warp_case(warps, "votes", 2, 64, a, 3 * 128, op=int(upper_votes))

    expected = np.full((4, 32, 3), -1, np.float32)
    for lanes in [slice(0, 16), slice(16, 32)] if upper_votes else [slice(0, 16)]:
        inside = predicates[:, lanes] != 0
        ballot = inside.astype(np.int64) @ (1 << np.arange(32)[lanes])
        expected[:, lanes, 0] = ballot[:, None]
        expected[:, lanes, 1] = inside.any(axis=1)[:, None]
        expected[:, lanes, 2] = inside.all(axis=1)[:, None]
    np.testing.assert_array_equal(out.reshape(4, 32, 3), expected)
    assert list(expected[:, 0, 0]) == [0, 0xFFFF, 0b1000101101001101, 0x8000]
    assert profile["shuffles"] == 0  # votes are no shuffles


def test_syncwarp_orders_shared_memory_within_a_warp(warps: Path) -> None:
    a = distinct_values(128)
    out, profile = warp_case(warps, "syncwarp_exchange", 2, 64, a, 128, check=False)
    lanes = np.arange(128)
    np.testing.assert_array_equal(out, a[lanes - lanes % 32 + (lanes % 32 ^ 14)])
    assert (profile["shuffles"], profile["barriers"]) == (0, 0)


def test_syncwarp_ordered_accesses_are_no_race(warps: Path) -> None:
    a = distinct_values(128)
    out, _ = warp_case(warps, "syncwarp_exchange", 2, 64, a, 128, check=True)
    lanes = np.arange(128)
    np.testing.assert_array_equal(out, a[lanes - lanes % 32 + (lanes % 32 ^ 14)])


def test_warp_sum_in_a_block_of_48_threads(warps: Path) -> None:
    a = distinct_values(3 * 48)
    out, profile = warp_case(warps, "partial_warp_sum", 3, 48, a, 6)
    blocks = a.reshape(3, 48)
    expected = np.stack([blocks[:, :32].sum(axis=1), blocks[:, 32:].sum(axis=1)], axis=1)
    np.testing.assert_array_equal(out, expected.ravel())
    assert profile["shuffles"] == 3 * 2 * 5  # 5 per warp, the partial one too


@pytest.mark.parametrize("block", [256, 1024])
def test_tree_reduction_in_shared_memory(warps: Path, block: int) -> None:
    grid = 3
    a = np.random.default_rng(block).integers(0, 16, grid * block).astype(np.float32)
    out, profile = warp_case(warps, "block_sum", grid, block, a, grid)
    np.testing.assert_array_equal(out, a.reshape(grid, block).sum(axis=1))
    rounds = block.bit_length() - 1  # log2(block)
    assert profile["barriers"] == grid * (1 + rounds)
    # per block: block stores, 2 loads and 1 store by s threads for s = block/2 .. 1
    # (block - 1 in all), then one load; 4 bytes each, linear: no bank conflict
    assert profile["shared_bytes"] == grid * 4 * (block + 3 * (block - 1) + 1)
    assert profile["bank_conflicts"] == 0


def test_3d_thread_and_block_indices(warps: Path) -> None:
    grid, block = (3, 2, 2), (8, 4, 2)
    n = 12 * 64
    kernels = emulated(warps, grid, block, "indices")
    out = np.full(8 * n, -1, np.float32)
    kernels([WARP_CASES.index("indices"), 0, 0, 32], [np.zeros(1, np.float32), out])

    # threads in launch order: blockIdx z, y, x, then threadIdx z, y, x, x fastest
    bz, by, bx, tz, ty, tx = np.indices((2, 2, 3, 2, 4, 8)).reshape(6, -1)
    linear = (tz * 4 + ty) * 8 + tx
    lane = linear % 32
    below = np.where(lane > 0, (linear - 1) % 8, tx)
    expected = np.stack([tx, ty, tz, bx, by, bz, linear - lane, below], axis=1)
    np.testing.assert_array_equal(out.reshape(n, 8), expected)


# --- 2. bit-exact shuffles of each type ----------------------------------------------

SHUFFLE_TYPES = {
    "int": np.int32,
    "unsigned": np.uint32,
    "long long": np.int64,
    "float": np.float32,
    "double": np.float64,
}
TYPED_SHUFFLES = [("idx", 7, 32), ("up", 3, 8), ("down", 5, 16), ("xor", 12, 8)]


def _typed_shuffle_source() -> tuple[str, list[str]]:
    params = ["long long s_N"]
    calls = []
    for k, ctype in enumerate(SHUFFLE_TYPES):
        params += [f"const {ctype} *__restrict__ t_in{k}", f"{ctype} *__restrict__ t_out{k}"]
        calls.append(f"  exchange(t_in{k}, t_out{k});")
    params.append("int *tc_status")
    signature = ",\n    ".join(params)
    body = "\n".join(calls)
    source = rf"""
#define FULL 0xffffffffu
template <class T> __device__ void exchange(const T *in, T *out) {{
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  T v = TC_LD(in, i);
  TC_ST(out, 4 * i) = __shfl_sync(FULL, v, 7);
  TC_ST(out, 4 * i + 1) = __shfl_up_sync(FULL, v, 3, 8);
  TC_ST(out, 4 * i + 2) = __shfl_down_sync(FULL, v, 5, 16);
  TC_ST(out, 4 * i + 3) = __shfl_xor_sync(FULL, v, 12, 8);
}}
extern "C" __global__ void tc_kernel_0(
    {signature}) {{
{body}
}}
"""
    return source, params


def test_shuffles_of_each_type_are_bit_exact(tmp_path: Path) -> None:
    source, params = _typed_shuffle_source()
    library = build_library(tmp_path, source, params, 1)
    n = 128
    rng = np.random.default_rng(7)
    inputs = [np.frombuffer(rng.bytes(n * 8), t)[:n].copy() for t in SHUFFLE_TYPES.values()]
    specials = [-0.0, 5e-324, np.inf, -np.inf, np.pi, -1e300]
    inputs[-1][: len(specials)] = specials
    inputs[-1].view(np.uint64)[len(specials)] = 0x7FF0_0000_0000_0ABC  # a signalling NaN
    outputs = [np.zeros(4 * n, a.dtype) for a in inputs]
    buffers = [b for pair in zip(inputs, outputs, strict=True) for b in pair]
    emulated(library, 2, 64, "exchange", names=())([n], buffers)
    for ctype, a, out in zip(SHUFFLE_TYPES, inputs, outputs, strict=True):
        bits = f"u{a.itemsize}"
        for k, (op, arg, width) in enumerate(TYPED_SHUFFLES):
            expected = shuffle_model(a.view(bits), op, arg, width)
            np.testing.assert_array_equal(out.view(bits)[k::4], expected, err_msg=f"{ctype} {op}")


# --- vector types ---------------------------------------------------------------------

VECTOR_PARAMS = [
    "long long s_N",
    "const float *__restrict__ t_F",
    "const int *__restrict__ t_I",
    "const double *__restrict__ t_D",
    "float *__restrict__ t_OF",
    "int *__restrict__ t_OI",
    "double *__restrict__ t_OD",
    "int *tc_status",
]
VECTOR_SOURCE = rf"""
extern "C" __global__ void tc_kernel_0(
    {", ".join(VECTOR_PARAMS)}) {{"""
VECTOR_SOURCE += r"""
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  /* 4 floats and ints */
  float4 f = TC_LDV(float4, t_F, 4 * i);
  float2 g = TC_LDV(float2, t_F, 4 * i + 2);
  int4 n = TC_LDV(int4, t_I, 4 * i);
  int2 m = TC_LDV(int2, t_I, 4 * i);
  double2 d = TC_LDV(double2, t_D, 2 * i);
  float4 rf = make_float4(f.w, f.z, f.y, f.x);
  float2 rg = make_float2(g.y, g.x);
  int4 rn = make_int4(n.w, n.z, n.y, n.x);
  int2 rm = make_int2(m.y, m.x);
  double2 rd = make_double2(d.y, d.x);
  TC_ST(t_OF, 6 * i) = rf.x;
  TC_ST(t_OF, 6 * i + 1) = rf.y;
  TC_ST(t_OF, 6 * i + 2) = rf.z;
  TC_ST(t_OF, 6 * i + 3) = rf.w;
  TC_ST(t_OF, 6 * i + 4) = rg.x;
  TC_ST(t_OF, 6 * i + 5) = rg.y;
  TC_ST(t_OI, 6 * i) = rn.x;
  TC_ST(t_OI, 6 * i + 1) = rn.y;
  TC_ST(t_OI, 6 * i + 2) = rn.z;
  TC_ST(t_OI, 6 * i + 3) = rn.w;
  TC_ST(t_OI, 6 * i + 4) = rm.x;
  TC_ST(t_OI, 6 * i + 5) = rm.y;
  TC_ST(t_OD, 2 * i) = rd.x;
  TC_ST(t_OD, 2 * i + 1) = rd.y;
}
"""


def test_vector_types_and_loads(tmp_path: Path) -> None:
    """float4, float2, int4, int2 and double2 loads, rebuilt reversed by make_*."""
    library = build_library(tmp_path, VECTOR_SOURCE, VECTOR_PARAMS, 1)
    lanes = 64
    f = distinct_values(4 * lanes)
    i = np.arange(4 * lanes, dtype=np.int32) * -3
    d = distinct_values(2 * lanes).astype(np.float64) / 7
    of, oi = np.zeros((lanes, 6), np.float32), np.zeros((lanes, 6), np.int32)
    od = np.zeros((lanes, 2), np.float64)
    kernels = emulated(library, 2, lanes // 2, "vectors", names=())
    profile = kernels.profile([lanes], [f, i, d, of, oi, od])[0]
    f4, i4 = f.reshape(lanes, 4), i.reshape(lanes, 4)
    np.testing.assert_array_equal(of, np.hstack([f4[:, ::-1], f4[:, 3:1:-1]]))
    np.testing.assert_array_equal(oi, np.hstack([i4[:, ::-1], i4[:, 1::-1]]))
    np.testing.assert_array_equal(od, d.reshape(lanes, 2)[:, ::-1])
    # a lane loads float4 + float2 + int4 + int2 + double2 and stores 14 scalars
    assert profile["global_load_bytes"] == lanes * (16 + 8 + 16 + 8 + 16)
    assert profile["global_store_bytes"] == lanes * (6 * 4 + 6 * 4 + 2 * 8)


# --- 4. atomics ----------------------------------------------------------------------

ATOMIC_BUFFERS = [
    ("const int", "V", "values"),
    ("const float", "F", "floats"),
    ("int", "I", "int: sum, max, min"),
    ("unsigned", "U", "unsigned: sum, max, min"),
    ("long long", "L", "long long: sum, max, min"),
    ("unsigned long long", "UL", "unsigned long long: sum, max, min"),
    ("float", "Fs", "float: sum, max by compare-and-swap"),
    ("double", "D", "double: sum, max by compare-and-swap"),
    ("int", "Old", "what each exchange returned"),
    ("int", "X", "the exchanged slot"),
    ("int", "Hits", "per block: floats above 0.5, counted in shared memory"),
    ("long long", "Cas", "a slot per thread for compare-and-swap"),
    ("long long", "CasOld", "what each thread's two compare-and-swaps returned"),
]
ATOMIC_PARAMS = [
    "long long s_N",
    *(f"{ctype} *__restrict__ t_{name}" for ctype, name, _ in ATOMIC_BUFFERS),
    "int *tc_status",
]

ATOMIC_SOURCE = r"""
#ifdef TC_TEST_INTRINSICS  /* CUDA's reinterpreting intrinsics */
#define AS_INT(f) __float_as_int(f)
#define AS_FLOAT(i) __int_as_float(i)
#define AS_BITS(d) ((unsigned long long)__double_as_longlong(d))
#define AS_DOUBLE(u) __longlong_as_double((long long)(u))
#else  /* the same through a union */
template <class To, class From> __device__ To reinterpret(From v) {
  union { From from; To to; } u;
  u.from = v;
  return u.to;
}
#define AS_INT(f) reinterpret<int>(f)
#define AS_FLOAT(i) reinterpret<float>(i)
#define AS_BITS(d) reinterpret<unsigned long long>(d)
#define AS_DOUBLE(u) reinterpret<double>(u)
#endif

/* lock-free maxima by compare-and-swap on the bits */
__device__ void float_max(float *p, float v) {
  int *q = (int *)p;
  int old = *(volatile int *)q;
  while (AS_FLOAT(old) < v) {
    int seen = atomicCAS(q, old, AS_INT(v));
    if (seen == old) break;
    old = seen;
  }
}
__device__ void double_max(double *p, double v) {
  unsigned long long *q = (unsigned long long *)p;
  unsigned long long old = *(volatile unsigned long long *)q;
  while (AS_DOUBLE(old) < v) {
    unsigned long long seen = atomicCAS(q, old, AS_BITS(v));
    if (seen == old) break;
    old = seen;
  }
}
"""
ATOMIC_SOURCE += f"""
extern "C" __global__ void tc_kernel_0(
    {", ".join(ATOMIC_PARAMS)}) {{"""
ATOMIC_SOURCE += r"""
  __shared__ int hits[1];
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0) TC_SST(hits, 0) = 0;
  __syncthreads();
  int v = TC_LD(t_V, i);
  float f = TC_LD(t_F, i);
  unsigned u = (unsigned)v * 2654435761u;
  long long l = (long long)v * 1000000007LL;
  unsigned long long ul = (unsigned long long)u << 24;
  atomicAdd(TC_AT(t_I, 0), v);
  atomicMax(TC_AT(t_I, 1), v);
  atomicMin(TC_AT(t_I, 2), v);
  atomicAdd(TC_AT(t_U, 0), u);
  atomicMax(TC_AT(t_U, 1), u);
  atomicMin(TC_AT(t_U, 2), u);
  atomicAdd(TC_AT(t_L, 0), l);
  atomicMax(TC_AT(t_L, 1), l);
  atomicMin(TC_AT(t_L, 2), l);
  atomicAdd(TC_AT(t_UL, 0), ul);
  atomicMax(TC_AT(t_UL, 1), ul);
  atomicMin(TC_AT(t_UL, 2), ul);
  atomicAdd(TC_AT(t_Fs, 0), f);
  float_max(TC_AT(t_Fs, 1), f);
  atomicAdd(TC_AT(t_D, 0), (double)f);
  double_max(TC_AT(t_D, 1), (double)f);
  TC_ST(t_Old, i) = atomicExch(TC_AT(t_X, 0), (int)i + 1);
  /* a swap that matches, then one that no longer does: each returns the old value */
  TC_ST(t_CasOld, 2 * i) = atomicCAS(TC_AT(t_Cas, i), i, ~i);
  TC_ST(t_CasOld, 2 * i + 1) = atomicCAS(TC_AT(t_Cas, i), i, 7LL);
  if (f > 0.5f) atomicAdd(TC_SAT(hits, 0), 1);
  __syncthreads();
  if (threadIdx.x == 0) TC_ST(t_Hits, blockIdx.x) = TC_SLD(hits, 0);
}
"""
ATOMIC_GRID, ATOMIC_BLOCK = 64, 128


def _extremes(dtype: type[np.generic]) -> np.ndarray:
    """A sum's zero, a maximum's and a minimum's starting values."""
    info = np.iinfo(dtype)
    return np.array([0, info.min, info.max], dtype)


def check_atomics(library: Path) -> None:
    """Runs the atomics kernel over 64 blocks (spread over the cores, so that updates of
    the same element contend) and checks every result against NumPy."""
    n = ATOMIC_GRID * ATOMIC_BLOCK
    rng = np.random.default_rng(3)
    v = rng.integers(-1000, 1000, n).astype(np.int32)
    f = rng.uniform(-1, 1, n).astype(np.float32)
    buffers = {
        "V": v,
        "F": f,
        "I": _extremes(np.int32),
        "U": _extremes(np.uint32),
        "L": _extremes(np.int64),
        "UL": _extremes(np.uint64),
        "Fs": np.array([0, -np.inf], np.float32),
        "D": np.array([0, -np.inf], np.float64),
        "Old": np.full(n, -1, np.int32),
        "X": np.zeros(1, np.int32),
        "Hits": np.full(ATOMIC_GRID, -1, np.int32),
        "Cas": np.arange(n, dtype=np.int64),
        "CasOld": np.full(2 * n, -1, np.int64),
    }
    assert list(buffers) == [name for _, name, _ in ATOMIC_BUFFERS]
    names = [name for _, name, _ in ATOMIC_BUFFERS]
    kernels = emulated(library, ATOMIC_GRID, ATOMIC_BLOCK, "atomics", names=names)
    kernels([n], list(buffers.values()))

    u = v.astype(np.uint32) * np.uint32(2654435761)
    l64 = v.astype(np.int64) * 1000000007
    ul = u.astype(np.uint64) << np.uint64(24)
    assert list(buffers["I"]) == [v.sum(), v.max(), v.min()]
    assert list(buffers["U"]) == [sum(map(int, u)) % 2**32, u.max(), u.min()]
    assert list(buffers["L"]) == [l64.sum(), l64.max(), l64.min()]
    assert list(buffers["UL"]) == [sum(map(int, ul)) % 2**64, ul.max(), ul.min()]
    exact = f.astype(np.float64).sum()
    np.testing.assert_allclose(buffers["Fs"][0], exact, rtol=0, atol=1e-3)
    assert buffers["Fs"][1] == f.max()
    np.testing.assert_allclose(buffers["D"][0], exact, rtol=1e-12)
    assert buffers["D"][1] == f.max()
    # the exchanges pass the slot along: every value 0..n appears once
    seen = np.sort(np.append(buffers["Old"], buffers["X"]))
    np.testing.assert_array_equal(seen, np.arange(n + 1))
    np.testing.assert_array_equal(buffers["Hits"], (f > 0.5).reshape(ATOMIC_GRID, -1).sum(axis=1))
    index = np.arange(n, dtype=np.int64)
    np.testing.assert_array_equal(buffers["Cas"], ~index)
    np.testing.assert_array_equal(buffers["CasOld"].reshape(n, 2), np.stack([index, ~index], 1))


def test_atomics_from_many_blocks(tmp_path: Path) -> None:
    check_atomics(build_library(tmp_path, ATOMIC_SOURCE, ATOMIC_PARAMS, 1))


def test_atomic_compare_and_swap_with_cuda_bit_casts(tmp_path: Path) -> None:
    library = build_library(
        tmp_path, ATOMIC_SOURCE, ATOMIC_PARAMS, 1, prefix="#define TC_TEST_INTRINSICS 1\n"
    )
    check_atomics(library)


# --- 6, 7. counters ------------------------------------------------------------------

COUNTER_SOURCE = r"""
#define KERNEL(name) extern "C" __global__ void name(long long s_N, \
    const float *__restrict__ t_A, float *__restrict__ t_O, int *tc_status)
#define TID (int)threadIdx.x
#define GID ((long long)blockIdx.x * blockDim.x + threadIdx.x)

KERNEL(k_copy) { TC_ST(t_O, GID) = TC_LD(t_A, GID); }
KERNEL(k_strided) { TC_ST(t_O, GID) = TC_LD(t_A, GID * 32); }
KERNEL(k_broadcast) { TC_ST(t_O, GID) = TC_LD(t_A, 0); }
KERNEL(k_loop) {  /* one load site run 4 times: 4 requests */
  float s = 0;
  for (int k = 0; k < 4; k++) s += TC_LD(t_A, GID + 128 * k);
  TC_ST(t_O, GID) = s;
}
KERNEL(k_lane0_loop) {  /* lane 0 stores 4 times while its warp waits at the barrier */
  if (TID % 32 == 0)
    for (int k = 0; k < 4; k++) TC_ST(t_O, 4 * (GID / 32) + k) = (float)k;
  __syncthreads();
}

KERNEL(k_shared_stride2) {
  __shared__ float tile[128];
  TC_SST(tile, 2 * TID) = TC_LD(t_A, GID);
  __syncthreads();
  TC_ST(t_O, GID) = TC_SLD(tile, 2 * TID);
}
KERNEL(k_shared_column) {  /* a warp's lanes 32 words apart: all in one bank */
  __shared__ float tile[32 * 32];
  TC_SST(tile, TID % 32 * 32 + TID / 32) = TC_LD(t_A, GID);
  __syncthreads();
  TC_ST(t_O, GID) = TC_SLD(tile, TID % 32 * 32 + TID / 32);
}
KERNEL(k_shared_padded) {  /* 33 words apart: every lane in its own bank */
  __shared__ float tile[32 * 33];
  TC_SST(tile, TID % 32 * 33 + TID / 32) = TC_LD(t_A, GID);
  __syncthreads();
  TC_ST(t_O, GID) = TC_SLD(tile, TID % 32 * 33 + TID / 32);
}

KERNEL(k_shared_broadcast) {  /* warp 0 fills the tile; every lane reads one word */
  __shared__ float tile[32];
  if (TID < 32) TC_SST(tile, TID) = TC_LD(t_A, GID);
  __syncthreads();
  TC_ST(t_O, GID) = TC_SLD(tile, 5);
}

KERNEL(k_warp_sum) {
  float v = TC_LD(t_A, GID);
  for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
  if (TID % 32 == 0) TC_ST(t_O, GID / 32) = v;
}
KERNEL(k_barriers) {
  for (int k = 0; k < 3; k++) __syncthreads();
}
KERNEL(k_atomics) {
  atomicAdd(TC_AT(t_O, TID % 4), TC_LD(t_A, GID));
  if (TID < 16) atomicAdd(TC_AT(t_O, 4), 1.0f);
}
KERNEL(k_same_vector) {  /* every block reads the same 64 floats */
  TC_ST(t_O, GID) = TC_LD(t_A, TID);
}
KERNEL(k_vector_copy) {  /* a float4 per thread */
  float4 v = TC_LDV(float4, t_A, 4 * GID);
  TC_ST(t_O, 4 * GID) = v.x;
  TC_ST(t_O, 4 * GID + 1) = v.y;
  TC_ST(t_O, 4 * GID + 2) = v.z;
  TC_ST(t_O, 4 * GID + 3) = v.w;
}
"""
COUNTER_PARAMS = [
    "long long s_N",
    "const float *__restrict__ t_A",
    "float *__restrict__ t_O",
    "int *tc_status",
]

# every kernel: 2 blocks of 64 threads, 4 full warps; 32-byte sectors, 4-byte floats
LANES, WARPS, BLOCKS = 128, 4, 2
# a float per lane, read and written linearly: 128 bytes, 4 sectors per request; the
# footprint: 512 bytes of A loaded and of O stored, 16 distinct sectors each
COPY = {
    "global_load_bytes": LANES * 4,
    "global_store_bytes": LANES * 4,
    "global_requests": 2 * WARPS,
    "global_sectors": 2 * WARPS * 4,
    "distinct_load_sectors": 16,
    "distinct_store_sectors": 16,
    "distinct_sectors": 32,
}


def footprint(loads: int, stores: int, shared: int = 0) -> dict[str, int]:
    """The distinct sectors a launch loads and stores (`shared`: in both)."""
    return {
        "distinct_load_sectors": loads,
        "distinct_store_sectors": stores,
        "distinct_sectors": loads + stores - shared,
    }


EXPECTED_COUNTERS = {
    "copy": counters(**COPY),
    # each lane's read 128 bytes from the next: 32 sectors per load
    "strided": counters(**{**COPY, "global_sectors": WARPS * (32 + 4), **footprint(128, 16)}),
    # every lane reads A[0]: 32 lanes x 4 bytes counted, from 1 sector
    "broadcast": counters(**{**COPY, "global_sectors": WARPS * (1 + 4), **footprint(1, 16)}),
    # each block reads A[0..63]: 8 sectors a block, 2 x 8 moved, 8 distinct
    "same_vector": counters(**{**COPY, "global_sectors": WARPS * (4 + 4), **footprint(8, 16)}),
    # each pass of the loop is a request of its own: 4 coalesced loads, 1 store per warp
    "loop": counters(
        global_load_bytes=4 * LANES * 4,
        global_store_bytes=LANES * 4,
        global_requests=WARPS * (4 + 1),
        global_sectors=WARPS * (4 + 1) * 4,
        **footprint(64, 16),
    ),
    # 4 store instructions of one lane are 4 requests (4 bytes, 1 sector each), even
    # though they share a site and a sector
    "lane0_loop": counters(
        global_store_bytes=WARPS * 4 * 4,
        global_requests=WARPS * 4,
        global_sectors=WARPS * 4,
        barriers=BLOCKS,
        **footprint(0, 2),  # O[0..15]
    ),
    # lanes 2 words apart: 64 words over 16 banks, 2 per bank, 1 wavefront more than
    # 32 words need, for the store and the load of each warp
    "shared_stride2": counters(
        **COPY, shared_bytes=2 * LANES * 4, bank_conflicts=2 * WARPS, barriers=BLOCKS
    ),
    # 32 words in one bank: 32 wavefronts for what 1 could do
    "shared_column": counters(
        **COPY, shared_bytes=2 * LANES * 4, bank_conflicts=2 * WARPS * 31, barriers=BLOCKS
    ),
    "shared_padded": counters(**COPY, shared_bytes=2 * LANES * 4, barriers=BLOCKS),
    # only the first warp of each block loads and stores to the tile; 32 lanes reading
    # one word is a broadcast, no conflict
    "shared_broadcast": counters(
        global_load_bytes=BLOCKS * 32 * 4,
        global_store_bytes=LANES * 4,
        global_requests=BLOCKS + WARPS,
        global_sectors=(BLOCKS + WARPS) * 4,
        shared_bytes=(BLOCKS * 32 + LANES) * 4,
        barriers=BLOCKS,
        **footprint(BLOCKS * 4, 16),
    ),
    # 5 shuffles per warp; lane 0 alone stores: 4 bytes, 1 sector per warp
    "warp_sum": counters(
        global_load_bytes=LANES * 4,
        global_store_bytes=WARPS * 4,
        global_requests=2 * WARPS,
        global_sectors=WARPS * (4 + 1),
        shuffles=5 * WARPS,
        **footprint(16, 1),  # O[0..3]
    ),
    "barriers": counters(barriers=3 * BLOCKS),
    # one atomic per lane, one more for threads 0-15 of each block; atomics are no
    # global requests
    "atomics": counters(
        global_load_bytes=LANES * 4,
        global_requests=WARPS,
        global_sectors=WARPS * 4,
        atomics=LANES + 16 * BLOCKS,
        **footprint(16 + 1, 1, shared=1),  # the atomics' O[0..4] loaded and stored
    ),
    # 16 bytes per lane read: 512 bytes, 16 sectors per load; each of the 4 stores
    # writes a float every 16 bytes: 512 bytes spanned, 16 sectors
    "vector_copy": counters(
        global_load_bytes=LANES * 16,
        global_store_bytes=LANES * 16,
        global_requests=WARPS * (1 + 4),
        global_sectors=WARPS * (16 + 4 * 16),
        **footprint(64, 64),
    ),
}


@pytest.fixture(scope="module")
def profiled(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Counters], np.ndarray, np.ndarray]:
    """Every counter kernel profiled in one run (checked too): the profiles by kernel,
    the input and the output after the last kernel (the float4 copy)."""
    functions = [f"k_{name}" for name in EXPECTED_COUNTERS]
    library = build_library(
        tmp_path_factory.mktemp("counters"), COUNTER_SOURCE, COUNTER_PARAMS, 1, functions
    )
    launches = [((BLOCKS, 1, 1), (LANES // BLOCKS, 1, 1))] * len(functions)
    kernels = emulator.EmulatedKernels(
        library, launches, names=["A", "O"], kernels=list(EXPECTED_COUNTERS),
        instrumented=True, check=True,
    )  # fmt: skip
    a = distinct_values(LANES * 32)
    out = np.zeros_like(a)
    profiles = kernels.profile([a.size], [a, out])
    return {p["kernel"]: p for p in profiles}, a, out


@pytest.mark.parametrize("kernel", EXPECTED_COUNTERS)
def test_counters(profiled: tuple[dict[str, Counters], Any, Any], kernel: str) -> None:
    profile = profiled[0][kernel]
    assert (profile["grid"], profile["block"]) == ((BLOCKS, 1, 1), (LANES // BLOCKS, 1, 1))
    assert counted(profile) == EXPECTED_COUNTERS[kernel]


def test_dram_bytes_count_a_vector_every_block_reads_once(
    profiled: tuple[dict[str, Counters], Any, Any],
) -> None:
    """Both blocks read the same 256 bytes of A: moved twice (2 x 8 sectors), loaded from
    DRAM once when the launch's footprint (8 + 16 sectors) fits the L2, twice when not."""
    launch = profiled[0]["same_vector"]
    assert moved_bytes(launch) == (2 * 8 + 16) * 32
    assert dram_bytes(launch, l2_bytes=24 * 32) == (8 + 16) * 32
    assert dram_bytes(launch, l2_bytes=24 * 32 - 1) == moved_bytes(launch)


def test_vector_copy_copies(profiled: tuple[Any, np.ndarray, np.ndarray]) -> None:
    _, a, out = profiled
    np.testing.assert_array_equal(out[: 4 * LANES], a[: 4 * LANES])
