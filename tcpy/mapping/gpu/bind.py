"""Binding band members to the grid and the threads of a CUDA kernel.

A member is bound by a filter `member mod size = parameter` above its band, where the
parameter (`b0`.., `t0`..) stands for a block or thread index: a grid or block smaller
than the loop gives a strided loop, never a wrong result. The grid's sizes come from
the loop extents, within CUDA's limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import islpy as isl

from tcpy.mapping.options import MappingOptions

MAX_GRID = (2**31 - 1, 65535, 65535)
UNKNOWN_GRID = (256, 32, 8)  # blocks per dimension when the loop extents are not known


def bind_members(
    node: isl.ScheduleNode,
    members: list[int],
    sizes: list[int],
    params: tuple[str, ...],
    runs: tuple[int, ...] = (),
) -> isl.ScheduleNode:
    """Insert above band `node` the filter `member_j mod sizes[j] = params[j]`; returns
    the band node (now below the filter). With `runs[j]` > 1, runs of that many
    consecutive values go to each index instead (`floor(member_j / runs[j]) mod
    sizes[j] = params[j]`): a thread's values along the member are then adjacent."""
    if not members:
        return node
    ctx = node.get_ctx()
    mupa = node.band_get_partial_schedule()
    exprs = isl.UnionPwAffList.alloc(ctx, len(members))
    ids = isl.IdList.alloc(ctx, len(members))
    for j, member in enumerate(members):
        upa = mupa.get_union_pw_aff(member)
        if j < len(runs) and runs[j] > 1:
            upa = upa.scale_down_val(isl.Val.int_from_si(ctx, runs[j])).floor()
        upa = upa.mod_val(isl.Val.int_from_si(ctx, sizes[j]))
        exprs = exprs.add(upa)
        # parameters must be read from text: an isl.Id made in Python is another id
        ids = ids.add(isl.Id.read_from_str(ctx, params[j]))
    space = isl.Space.set_alloc(ctx, 0, len(members)).align_params(mupa.get_space().params())
    values = isl.MultiUnionPwAff.from_union_pw_aff_list(space, exprs)
    filter_ = values.bind(isl.MultiId.from_id_list(space, ids))
    return node.insert_filter(filter_).child(0)


def pin(node: isl.ScheduleNode, param: str, value: int) -> isl.ScheduleNode:
    """Insert above `node` the filter `param = value` on the instances reaching it (the
    statements run by one thread along that axis); returns `node`."""
    ctx = node.get_ctx()
    fixed = isl.Set.read_from_str(ctx, f"[{param}] -> {{ : {param} = {value} }}")
    return node.insert_filter(node.get_domain().intersect_params(fixed)).child(0)


def grid_sizes(options: MappingOptions, extents: list[int | None]) -> list[int]:
    """Blocks along each grid dimension (x, y, then the folded ones): the options'
    sizes, else the loop's extent, else `UNKNOWN_GRID`. The folded dimensions (the
    third on) multiply into z, so they shrink, the largest first, until z fits; a
    grid smaller than its loop makes the loop strided, never wrong."""
    grid = []
    for j, e in enumerate(extents):
        limit = MAX_GRID[min(j, 2)]
        size = options.map_to_blocks[j] if j < len(options.map_to_blocks) else limit
        grid.append(min(size, limit, e) if e is not None else min(size, UNKNOWN_GRID[min(j, 2)]))
    while len(grid) > 2 and math.prod(grid[2:]) > MAX_GRID[2]:
        largest = max(range(2, len(grid)), key=lambda j: grid[j])
        grid[largest] = -(-grid[largest] // 2)
    return grid


def count_blocks(extents: list[int | None], tile: Sequence[int | None], members: list[int]) -> int:
    """How many blocks tiles of these sizes make (a loop of unknown extent counts as
    large; a tile of 0 or None, an untiled member, as one)."""
    total = 1
    for e, m in zip(extents, members, strict=True):
        total *= -(-e // max(tile[m] or 1, 1)) if e is not None else 1 << 20
    return total
