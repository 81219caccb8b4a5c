"""Epilogue fusion on the CPU: the point-wise statements that follow a contraction over
its outputs (a bias, an activation, a residual) run in the contraction's tiles of
outputs, right after the tile's reduction, while the tile is in the cache.

Under `Min` fusion, `O(b,n) +=! I(b,k) * W(n,k)`, then `O(b,n) = O(b,n) + bias(n)` and
`O(b,n) = fmax(O(b,n), 0)` are a nest each, as is the reduction's initialisation: each
writes the whole output to memory and the next reads it back, after a barrier of the
team. `fuse_epilogues` rebuilds such a run as

    band  (b - b mod Tb, n - n mod Tn)     the contraction's tiles of outputs, in parallel
      sequence                             the statements in program order
        filter init   band (b mod Tb, n mod Tn)
        filter S      the contraction's tile band and point band, as `auto_tile` cuts them
        filter E1     band (b mod Tb, n mod Tn)
        ...

with the contraction's own tile sizes (`tiles.tile_sizes`): inside its tile, the
contraction is register-blocked and its operands copied as before (its tile loops over
`b` and `n` take one step there). A run qualifies when the contraction is the only
statement of its nest, each following nest is one statement that reduces nothing, over
the same outputs (its indices the contraction's outputs', the same values), every
dependence among the run's statements joins instances of the same output, and some
output dimension is tiled (one left whole, a batch's, is a loop of the outer band).
The band over the tiles is left non-permutable, so that tiling does not cut it again.
The schedule is kept only if it respects every dependence.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import islpy as isl

from tcpy.mapping.cpu.tiles import PLAIN, Block, auto_tile, tile_sizes
from tcpy.mapping.marks import EMPTY, Turns
from tcpy.mapping.rows import (
    Build,
    block_start,
    coincident_members,
    graft,
    in_order,
    index_of,
    joined,
    member_over,
    nests_in_order,
    rebuild_runs,
    same_rows,
    single,
    within_block,
    within_rows,
)
from tcpy.poly.dependences import Dependences, respects
from tcpy.poly.schedule import member_variables
from tcpy.poly.scop import Kind, PolyStatement, Scop


def fuse_epilogues(
    schedule: isl.Schedule,
    scop: Scop,
    deps: Dependences,
    transposed: Turns = EMPTY,
    block: Block = PLAIN,
) -> tuple[isl.Schedule, frozenset[str]]:
    """`schedule` with each qualifying run fused as the module docstring shows, and the
    contractions tiled inside a fused run (by statement name: their copies go above
    their point loops, `tcpy.mapping.cpu.packing.pack_operands`); unchanged where there
    is none, or where the fused schedule would not respect the dependences."""
    in_program_order = nests_in_order(schedule, scop)
    if in_program_order is None:
        return schedule, frozenset()
    children, nests = in_program_order
    runs = _runs(children, nests, scop, deps, transposed, block)
    if not runs:
        return schedule, frozenset()
    fused = _rebuild(schedule, children, nests, runs, scop, deps, transposed, block)
    if not respects(fused, deps.validity):
        return schedule, frozenset()
    return fused, frozenset(nests[run.contraction][0].name for run in runs)


class _Run(NamedTuple):
    """A run: its first nest, the nest after its last, the contraction's nest, and the
    tile size of each output dimension (0: left whole)."""

    start: int
    stop: int
    contraction: int
    tiles: tuple[int, ...]


def _runs(
    children: list[isl.ScheduleNode],
    nests: list[list[PolyStatement]],
    scop: Scop,
    deps: Dependences,
    transposed: Turns,
    block: Block,
) -> list[_Run]:
    """The qualifying runs: from each contraction, its initialisation's nest before it
    if that is the one just before, and the longest run of epilogues after it."""
    runs: list[_Run] = []
    for k, nest in enumerate(nests):
        tiles = _contraction_tiles(children[k], nest, scop, transposed, block)
        if tiles is None or (runs and k < runs[-1].stop):
            continue
        contraction = nest[0]
        start = k - 1 if k and _is_init_of(nests[k - 1], contraction) else k
        stop = k + 1
        while stop < len(nests) and _is_epilogue(nests[stop], contraction, scop):
            statements = [s for n in nests[start : stop + 1] for s in n]
            rank = len(tiles)
            if not (same_rows(statements, rank) and within_rows(statements, rank, deps)):
                break
            stop += 1
        if stop > k + 1:
            runs.append(_Run(start, stop, k, tiles))
    return runs


def _contraction_tiles(
    child: isl.ScheduleNode,
    nest: list[PolyStatement],
    scop: Scop,
    transposed: Turns,
    block: Block,
) -> tuple[int, ...] | None:
    """The tile size of each output dimension of the nest's contraction, as `auto_tile`
    would cut its band; None unless the nest is one reduction's (over reduction
    indices, not a scatter), its outputs (one or more) its first dimensions, each
    tiled."""
    if len(nest) != 1 or nest[0].kind is not Kind.COMPUTE:
        return None
    s = nest[0]
    source = s.source(scop.cdef)
    rank = len(source.indices)
    if (
        rank == 0
        or source.op.reduction is None
        or source.scatter
        or not source.reduction_indices
        or tuple(s.dims[:rank]) != tuple(source.indices)
    ):
        return None
    band = child.child(0)
    if band.get_type() != isl.schedule_node_type.band:
        return None
    sizes = tile_sizes(band, scop, transposed, block)
    if sizes is None:
        return None
    tiles = [0] * rank
    for m, size in enumerate(sizes):
        position = member_variables(band, m).get(s.name)
        if position is not None and position < rank:
            tiles[position] = size
    return tuple(tiles) if any(tiles) else None


def _is_init_of(nest: list[PolyStatement], contraction: PolyStatement) -> bool:
    return len(nest) == 1 and nest[0].kind is Kind.INIT and nest[0].index == contraction.index


def _is_epilogue(nest: list[PolyStatement], contraction: PolyStatement, scop: Scop) -> bool:
    """Whether `nest` is one statement that reduces nothing, over as many indices as
    the contraction's outputs (which rows the run's check then compares)."""
    if len(nest) != 1 or nest[0].kind is not Kind.COMPUTE:
        return False
    source = nest[0].source(scop.cdef)
    rank = len(contraction.source(scop.cdef).indices)
    return not source.reduction_indices and not source.scatter and len(nest[0].dims) == rank


def _rebuild(
    schedule: isl.Schedule,
    children: list[isl.ScheduleNode],
    nests: list[list[PolyStatement]],
    runs: list[_Run],
    scop: Scop,
    deps: Dependences,
    transposed: Turns,
    block: Block,
) -> isl.Schedule:
    """A schedule of the same domain: the nests in their order, each run fused."""

    def builder(run: _Run) -> Build:
        return lambda leaf: _fused(leaf, children, nests, run, scop, deps, transposed, block)

    return rebuild_runs(schedule, children, {r.start: (r.stop, builder(r)) for r in runs})


def _fused(
    leaf: isl.ScheduleNode,
    children: list[isl.ScheduleNode],
    nests: list[list[PolyStatement]],
    run: _Run,
    scop: Scop,
    deps: Dependences,
    transposed: Turns,
    block: Block,
) -> isl.ScheduleNode:
    """At `leaf`, the band over the contraction's tiles of outputs and each statement's
    loops below it; returns the node at `leaf`'s position."""
    start, stop, contraction, tiles = run
    statements = in_order([s for nest in nests[start:stop] for s in nest])
    outer = [
        member_over(statements, functools.partial(block_start, d=d, block=size))
        if size
        else member_over(statements, functools.partial(index_of, d=d))
        for d, size in enumerate(tiles)
    ]
    node = leaf.insert_partial_schedule(joined(outer)).band_set_permutable(0)
    for m in range(len(tiles)):
        node = node.band_member_set_coincident(m, 1)
    filters = isl.UnionSetList.alloc(scop.ctx, len(statements))
    for s in statements:
        filters = filters.add(isl.UnionSet.from_set(s.domain))
    node = node.child(0).insert_sequence(filters)
    for i, s in enumerate(statements):
        place = node.child(i).child(0)
        if s is nests[contraction][0]:
            tiled = auto_tile(children[contraction].child(0), scop, transposed, block)
            node = graft(tiled, place).parent().parent()
            continue
        points = [single(within_block(s, d, size)) for d, size in enumerate(tiles) if size]
        band = place.insert_partial_schedule(joined(points)).band_set_permutable(1)
        for m, flag in enumerate(coincident_members(band, deps.all)):
            band = band.band_member_set_coincident(m, int(flag))
        node = band.parent().parent()
    return node.parent()
