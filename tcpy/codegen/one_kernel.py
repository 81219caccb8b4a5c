"""A def's kernels as one persistent cooperative kernel (`MappingOptions.one_kernel`).

Each kernel's code becomes a device function, `tc_part_<k>`, printed as the kernel
is, but with `blockIdx`, `threadIdx`, `blockDim` and `gridDim` of its own: the block
and thread it plays, and its kernel's grid and block. One `__global__` function,
`tc_kernel_0`, launched cooperatively on as many blocks as the device holds at once
(`tcpy.runtime.cooperative`), runs the parts in the kernels' order with a grid-wide
barrier between two parts (`tc_grid_sync`). Each block plays a part's blocks
`blockIdx.x`, `blockIdx.x + gridDim.x`, ..., so any grid is right, down to one block.

The launch's block has as many threads as the largest kernel's (`block_threads`). A
part whose threads work in step (`in_step`: its kernel copies into shared memory,
shares a warp's rows or a reduction over lanes, or runs on the tensor cores) runs on
the first threads of the block, one for each thread of its kernel; where those are
fewer than the block's, its barriers are `bar.sync 1, n` among them (`tc_bar_sync`,
which counts whole warps). A part whose threads are independent runs its kernel's
threads in turns, the block's thread `t` playing `t`, `t + threads`, .... After each
block a part plays, the block waits for all its threads (the next block rewrites its
shared memory); after each part, the grid waits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tcpy.mapping.gpu import MappedKernel
from tcpy.mapping.gpu.device import WARP
from tcpy.mapping.gpu.kernel import Launch

STATIC_SHARED = 48 * 1024
"""The static shared memory of one kernel, in bytes (CUDA's limit)."""

GRID_INSTRUCTIONS = r"""#ifndef TC_GRID_INSTRUCTIONS
#define TC_GRID_INSTRUCTIONS
/* the block's barrier after each block of a part it plays (the emulator's makes the
   block's shared memory new) */
static __device__ __forceinline__ void tc_block_sync() { __syncthreads(); }
/* a barrier of the first n threads of the block (whole warps), not barrier 0's */
static __device__ __forceinline__ void tc_bar_sync(unsigned n) {
  asm volatile("bar.sync 1, %0;\n" ::"r"(n) : "memory");
}
/* every block of a cooperative launch waits here for the others: tc_grid[0] counts the
   blocks arrived, tc_grid[1] the barriers passed (both zero at the launch); the last
   block to arrive resets the count, then lets the others go */
static __device__ __forceinline__ void tc_grid_sync(unsigned *tc_grid) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned *passed = tc_grid + 1;
    const unsigned seen = *passed;
    __threadfence();
    if (atomicAdd(tc_grid, 1u) == gridDim.x - 1u) {
      atomicExch(tc_grid, 0u);
      __threadfence();
      atomicAdd(tc_grid + 1, 1u);
    } else {
      while (*passed == seen) __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
}
#endif
"""
"""The barriers of a cooperative kernel (sm_70 and later); the emulator defines
`TC_GRID_INSTRUCTIONS` and its own, which check that every thread reaches them."""

GRID_WORDS = 2
"""The unsigned words `tc_grid_sync` keeps in device memory, zero at each launch."""

GRID_PARAMETER = "unsigned *__restrict__ tc_grid"


@dataclass(frozen=True)
class Part:
    """A kernel as a part of the one kernel: whether its threads work in step, and
    the bytes of shared memory its code places in the pool."""

    kernel: MappedKernel
    in_step: bool
    shared_bytes: int


def block_threads(kernels: Sequence[MappedKernel]) -> int:
    """The threads of the one kernel's block: the most any kernel uses."""
    return max(max(1, k.threads) for k in kernels)


def launch(kernels: Sequence[MappedKernel], threads: int) -> Launch:
    """The one kernel's grid and block before the device's limit: a block for each
    block of the largest part (the runtime takes the blocks the device holds at once,
    `tcpy.runtime.cooperative`)."""
    return (max(k.blocks for k in kernels), 1, 1), (threads, 1, 1)


def barrier(kernel: MappedKernel, threads: int) -> str:
    """The barrier of `kernel`'s threads when it runs in a block of `threads`."""
    n = max(1, kernel.threads)
    return "__syncthreads();" if n == threads else f"tc_bar_sync({n}u);"


def refusal(parts: Sequence[Part], threads: int) -> str | None:
    """Why the parts cannot run as one kernel of `threads` a block, or None."""
    for part in parts:
        n = max(1, part.kernel.threads)
        if part.in_step and n != threads and n % WARP:
            return (
                f"kernel {part.kernel.index} works in step on {n} threads, not whole "
                f"warps, and the one kernel's blocks have {threads}"
            )
    shared = pool_bytes(parts)
    if shared > STATIC_SHARED:
        return f"a kernel's shared memory ({shared} bytes) is past {STATIC_SHARED}"
    return None


def pool_bytes(parts: Sequence[Part]) -> int:
    """The bytes of the one kernel's shared memory: the most any part uses (each part
    places its arrays from the start of `tc_pool`; parts are separated by barriers)."""
    return max(p.shared_bytes for p in parts)


def pool(parts: Sequence[Part]) -> str:
    """The declaration of the one kernel's shared memory, at file scope."""
    return f"__shared__ __align__(16) unsigned char tc_pool[{max(16, pool_bytes(parts))}];"


def part_function(kernel: MappedKernel, parameters: Sequence[str], body: Sequence[str]) -> str:
    """The device function of `kernel`'s code (`body`, printed as the kernel's)."""
    grid, block = kernel.launch_dims()
    signature = ", ".join([*parameters, "const dim3 blockIdx", "const dim3 threadIdx"])
    return "\n".join([
        f"static __device__ __noinline__ void tc_part_{kernel.index}({signature}) {{",
        f"  const dim3 gridDim{{{grid[0]}u, {grid[1]}u, {grid[2]}u}};",
        f"  const dim3 blockDim{{{block[0]}u, {block[1]}u, {block[2]}u}};",
        "  (void)gridDim;",
        "  (void)blockDim;",
        *body,
        "}",
    ])  # fmt: skip


def parameters(kernels: Sequence[str]) -> list[str]:
    """The one kernel's parameters, from the kernels' (`tcpy.codegen.cuda.
    kernel_parameters`): the grid barrier's words before the status word."""
    return [*kernels[:-1], GRID_PARAMETER, kernels[-1]]


def driver(parts: Sequence[Part], kernels: Sequence[str], threads: int) -> str:
    """The `__global__` function that runs the parts, cooperatively; `kernels`: the
    parameters of each part."""
    names = [p.rpartition(" ")[2].lstrip("*") for p in kernels]
    own = parameters(kernels)
    lines = [
        f'extern "C" __global__ void __launch_bounds__({threads}) tc_kernel_0({", ".join(own)}) {{',
        "  const unsigned tc_thread = threadIdx.x;",
    ]
    for k, part in enumerate(parts):
        if k:
            lines.append("  tc_grid_sync(tc_grid);")
        lines += _play(part, names, threads)
    return "\n".join([*lines, "}"])


def _play(part: Part, names: Sequence[str], threads: int) -> list[str]:
    """The loop over the blocks of a part that a block of the one kernel plays; for a
    part of independent threads, over its blocks' threads, `threads` at a time."""
    kernel = part.kernel
    grid, block = kernel.launch_dims()
    n = max(1, kernel.threads)
    blocks = math.prod(grid)
    step = "in step" if part.in_step else "independent"
    lines = [f"  /* kernel {kernel.index}: {blocks} blocks of {n} threads, {step} */"]
    if part.in_step:
        guard = f"if (tc_thread < {n}u) " if n < threads else ""
        call = _call(kernel, names, _unflatten("tc_block", grid), _unflatten("tc_thread", block))
        return [
            *lines,
            f"  for (unsigned tc_block = blockIdx.x; tc_block < {blocks}u; "
            "tc_block += gridDim.x) {",
            f"    {guard}{call}",
            "    tc_block_sync();",
            "  }",
        ]
    call = _call(kernel, names, _unflatten(f"tc_i / {n}u", grid), _unflatten(f"tc_i % {n}u", block))
    return [
        *lines,
        f"  for (unsigned long long tc_i = blockIdx.x * {threads}ull + tc_thread; "
        f"tc_i < {blocks * n}ull; tc_i += gridDim.x * {threads}ull) {{",
        f"    {call}",
        "  }",
    ]


def _call(kernel: MappedKernel, names: Sequence[str], block: str, thread: str) -> str:
    """The call of `kernel`'s part on the parameters `names`, playing `block` and
    `thread` (`dim3` expressions)."""
    return f"tc_part_{kernel.index}({', '.join([*names, block, thread])});"


def _unflatten(index: str, dims: tuple[int, int, int]) -> str:
    """The `dim3` that the flat `index` stands for in `dims` (x fastest)."""
    x, y, _ = dims
    flat = f"(unsigned)({index})"
    return f"dim3{{{flat} % {x}u, {flat} / {x}u % {y}u, {flat} / {x * y}u}}"
