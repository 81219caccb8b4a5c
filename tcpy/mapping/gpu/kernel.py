"""What the GPU mapping hands codegen: the mapped schedule and one `MappedKernel` per
kernel launch (its statement instances, grid and block)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from tcpy.naming import BLOCK_PARAMS, THREAD_PARAMS
from tcpy.poly.isl_helpers import read_set
from tcpy.poly.scop import Scop

Launch = tuple[tuple[int, int, int], tuple[int, int, int]]
"""A launch's grid and block, x, y, z each."""


@dataclass(frozen=True, eq=False, slots=True)
class MappedKernel:
    index: int
    domain: isl.UnionSet  # the statement instances this kernel runs
    grid: tuple[int, ...]  # blocks along x, y, then the dimensions folded into z
    block: tuple[int, ...]  # threads along x, y, z
    runs: int = 1  # adjacent outputs a thread computes along x (1: strided by the block)
    # its contraction runs on the tensor cores (`tcpy.mapping.gpu.matrix`): the operands'
    # tiles in shared memory have rows of whole 16-byte pieces, skewed, and zeros
    # outside the tensor
    matrix: bool = False
    # statements of later nests applied to each output as it is stored (a bias, an
    # activation: `tcpy.mapping.gpu.matrix.absorb_epilogues`), in order
    epilogue: tuple[str, ...] = ()
    # tensors its threads read several steps of a reduction at a time, along their rows
    # (`marks.ThreadRegisters.steps`): their copies' rows hold whole vectors
    stepped: tuple[str, ...] = ()
    # among them, tensors whose copies hold their tile's innermost dimension first (a
    # thread's rows of `A(k,m)`: the copy's rows then run along k)
    turned: tuple[str, ...] = ()

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)

    def launch_dims(self) -> Launch:
        grid = (*self.grid[:2], math.prod(self.grid[2:]), 1, 1)[:3]
        block = (*self.block, 1, 1, 1)[:3]
        return (grid[0], grid[1], grid[2]), (block[0], block[1], block[2])

    def block_index(self, j: int) -> str:
        """The CUDA expression of the block index along grid dimension `j`: x, y,
        and the folded dimensions decoded from z (the first varies fastest)."""
        if j < 2 or len(self.grid) == 3:
            return f"blockIdx.{'xyz'[j]}"
        index = "blockIdx.z"
        below = math.prod(self.grid[2:j])
        if below > 1:
            index = f"({index} / {below}u)"
        return index if j == len(self.grid) - 1 else f"({index} % {self.grid[j]}u)"


@dataclass(frozen=True, eq=False, slots=True)
class GpuMapping:
    schedule: isl.Schedule  # with the filters that bind loops to blocks and threads
    unbound: isl.Schedule  # the same schedule before binding (what `verify` can check)
    kernels: tuple[MappedKernel, ...]

    def context(self, scop: Scop, kernel: MappedKernel) -> isl.Set:
        """The AST build context of a kernel: the scop's, and the bounds of the block
        and thread parameters it uses."""
        names = [*BLOCK_PARAMS[: len(kernel.grid)], *THREAD_PARAMS[: len(kernel.block)]]
        sizes = [*kernel.grid, *kernel.block]
        params = (*scop.isl_params, *names)
        bounds = " and ".join(f"0 <= {n} < {s}" for n, s in zip(names, sizes, strict=True))
        extra = read_set(scop.ctx, params, ": " + (bounds or "true"))
        return extra.intersect(scop.context.align_params(extra.get_space()))
