"""What a band offers the GPU's grid and threads: its parallel members, the order they
go on the grid in, a reduction member to spread over a warp's lanes, and whether its
reduction may be split across blocks. Questions about the band; nothing here changes
the schedule tree."""

from __future__ import annotations

import math

import islpy as isl

from tcpy.mapping.gpu.device import SHUFFLED, WARP, DeviceProfile
from tcpy.mapping.gpu.sizes import FILL_WAVES, NARROWEST_SHARED_TILE
from tcpy.mapping.locality import stride_score, worst_stride
from tcpy.mapping.options import MappingOptions
from tcpy.mapping.promotion import candidates, stays_along
from tcpy.parser import ast
from tcpy.poly.isl_helpers import union_set_sets
from tcpy.poly.schedule import member_extent
from tcpy.poly.scop import Kind, Scop
from tcpy.types import ScalarType

ATOMICS = {
    (ast.Reduction(op), ScalarType(ty))
    for op, types in (
        ("+", ("float32", "float64", "int32", "uint32")),
        ("max", ("int32", "uint32")),
        ("min", ("int32", "uint32")),
    )
    for ty in types
}  # fmt: skip
"""The reductions and element types CUDA has a native atomic for (`atomicAdd`,
`atomicMax`, `atomicMin`): float max and min have none, and would lose NaN."""


def parallel_prefix(node: isl.ScheduleNode) -> int:
    """How many of the band's outermost members are parallel (coincident); of a band
    that is not permutable, at most its first."""
    n = node.band_n_member()
    prefix = next((k for k in range(n) if not node.band_member_get_coincident(k)), n)
    return prefix if node.band_get_permutable() else min(prefix, 1)


def lane_member(
    node: isl.ScheduleNode, scop: Scop, options: MappingOptions, prefix: int, device: DeviceProfile
) -> int | None:
    """The reduction member of a permutable band to spread over the lanes of a warp
    (each lane reduces every 32nd value into a register, the warp then combines its
    lanes with shuffles): one that reads some operand with unit stride and none
    across rows, when no parallel member reads every operand with unit stride
    (threadIdx.x on it would not coalesce). Only where it is
    safe and whole: the band runs one reduction statement (`+ * min max` on a type
    the shuffles move) over a rectangular domain, the member runs at least a warp of
    values, and the options leave the tiles and the block's x to the mapping."""
    if not options.reduce_across_threads or options.tile:
        return None
    if options.map_to_threads and options.map_to_threads[0] != WARP:
        return None
    n = node.band_n_member()
    found = reduction_statement(node, scop)
    if found is None or found[1].compute not in SHUFFLED:
        return None
    if (
        options.use_shared_memory
        and prefix >= 2
        and operands_reused(node, scop, prefix)
        and shared_tiles_fill(node, prefix, device)
    ):
        return None  # a contraction (A * B^T): tiles in shared memory reuse its operands
    if any(worst_stride(node, m, scop) == 2 for m in range(prefix)):
        return None
    for m in range(prefix, n):
        e = member_extent(node, m)
        unit = worst_stride(node, m, scop) >= 0 and stride_score(node, m, scop) >= 2
        if e is not None and e >= WARP and unit:  # some operand walked, none strided
            return m
    return None


def operands_reused(node: isl.ScheduleNode, scop: Scop, prefix: int) -> bool:
    """Whether every tensor the band reads stays put along one of its `prefix` parallel
    members (the operands of a matrix product, each invariant in one of the output's
    indices): tiles of them in shared memory then save global reads, which a warp per
    output does not."""
    tensors = candidates(node, scop)
    return bool(tensors) and all(
        any(stays_along(node, m, t, scop) for m in range(prefix)) for t in tensors
    )


def shared_tiles_fill(node: isl.ScheduleNode, prefix: int, device: DeviceProfile) -> bool:
    """Whether the band's parallel members make enough of the narrowest shared-memory
    tiles (`NARROWEST_SHARED_TILE`) to give the device `FILL_WAVES` blocks per SM:
    where they do not, a warp per output keeps more of it busy."""
    outputs = math.prod(member_extent(node, m) or 1 << 20 for m in range(prefix))
    return outputs // NARROWEST_SHARED_TILE >= FILL_WAVES * device.sms


def reduction_statement(
    node: isl.ScheduleNode, scop: Scop
) -> tuple[ast.Reduction, ScalarType] | None:
    """The operator and element type of the one reduction statement a band runs,
    over a rectangular domain; None when it runs anything else."""
    sets = union_set_sets(node.get_domain())
    if len(sets) != 1 or not sets[0].is_box():
        return None
    stmt = scop.statement(sets[0].get_tuple_name())
    source = stmt.source(scop.cdef)
    if stmt.kind is not Kind.COMPUTE or source.op.reduction is None or source.scatter:
        return None
    return source.op.reduction, scop.cdef.tensor(source.tensor).scalar


def atomic_reduction(node: isl.ScheduleNode, scop: Scop, options: MappingOptions) -> bool:
    """Whether the band's reduction may be split across blocks, combined by atomics:
    one reduction statement whose operator and element type CUDA has a native atomic
    for (`ATOMICS`), with the options' `split_reductions` and no tiles or grid of
    their own."""
    if not options.split_reductions or options.tile or options.map_to_blocks:
        return False
    found = reduction_statement(node, scop)
    return found is not None and found in ATOMICS


def grid_order(node: isl.ScheduleNode, scop: Scop, prefix: int, mapped: int) -> list[int]:
    """The parallel members of a permutable band reordered for the grid, outermost
    first: innermost the member that walks memory best with unit stride (it goes on
    threadIdx.x, for coalescing), before it the next best (threadIdx.y); ties keep
    the band's order. The `mapped` innermost are those bound to blocks."""
    ranked = sorted(range(prefix), key=lambda m: (stride_score(node, m, scop), m))
    x, y = ranked[-1], (ranked[-2] if prefix > 1 else None)
    rest = [m for m in range(prefix) if m not in (x, y)]
    return [*rest, *([y] if y is not None else []), x]
