"""Row kernels: a pipeline fused over its rows runs in one kernel, one warp per row.

With `Max` fusion, isl fuses a softmax or a layernorm into one nest: a band over the
rows (every member coincident, no dependence between rows), and below it each
statement's loops over the row's elements; row fusion (`tcpy.mapping.rows`, the GPU
mapping's first step) makes such a nest of an attention head, whose scores are a
contraction inside the rows. `map_rows` maps such a nest so that the row's
intermediate values never leave the chip:

    filter  rows on blocks                 b0 .. (the row band's tiles)
      band  row tiles
        mark shared:I                      operands read twice, copied in once
          mark scratch:maxVal,expDist      temporaries in shared memory
            filter  row mod R = t1         one warp per row, R rows a block
              band  rows
                mark warp_rows             __syncwarp() after each statement
                  sequence                 the statements in program order
                    filter I0              lane 0 runs a statement of the row
                      mark lane_zero
                    filter S0  d mod 32 = t0
                      mark lane_reduction  each lane reduces a 32nd, then shuffles
                        band d
                    filter S1  d mod 32 = t0
                      band d               the lanes share the row's elements
                    ...

Below the row band the schedule is rebuilt in program order (the statements one
after the other, each over its own remaining indices in their order): within a row
that is the definition's own order, so every dependence holds, and there is none
between rows. A statement with indices below the rows spreads one over the 32 lanes
(`row_statement`): a reduction over exactly those indices with shuffles
(`marks.Lanes`), another statement its last index it does not reduce over, as a
parallel loop, each lane reducing alone over its own reduction indices (a contraction
inside the row); a statement of the row alone runs in lane 0 (`marks.LaneZero`).
Lanes past a row shorter than a warp run nothing. The warp meets at a `__syncwarp()`
after each statement, which orders its memory accesses for the next one. A temporary
whose every use is in the kernel lives in shared memory (`scratch:`,
`tcpy.mapping.gpu.shared.row_tensors`), one slice per row, and so may an output,
stored once when the block is done; an operand several statements read, or the
block's rows share, is copied in once (`shared:`); the rows a block runs halve until
they fit.

Only where the lanes can do it: `reduce_across_threads`, the options leaving the
tiles to the mapping and the block's x a warp, every statement's row indices plain
indices of the band, every loop below the rows of known extent, a shuffled reduction
on a type the shuffles move, no statement reading what it writes other than at the
element it writes, and no lane index striding across global memory. Else the nest is
mapped as any other band (`tcpy.mapping.gpu`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.gpu.bind import bind_members, count_blocks, grid_sizes
from tcpy.mapping.gpu.device import SHUFFLED, WARP, DeviceProfile, shared_budget
from tcpy.mapping.gpu.shared import block_traffic, row_tensors
from tcpy.mapping.locality import strided_tensors
from tcpy.mapping.options import MappingOptions
from tcpy.naming import BLOCK_PARAMS, THREAD_PARAMS
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, Role
from tcpy.poly.isl_helpers import multi_val, statement_names
from tcpy.poly.schedule import identity_band, member_extent, member_variables
from tcpy.poly.scop import Kind, PolyStatement, Scop

ROWS = 8
"""The rows (warps) a block runs, halved while the grid would not fill the device
(down to `_fewest_rows`) or the block's shared memory would not fit."""
MOST_ROWS = 32
"""The most rows (warps) a block runs: where the operands its rows share dominate
their traffic (an attention's keys and values, read by every query row), a block
takes up to this many rows, the whole sequence where it is shorter."""
SHARED_OPERAND_SHARE = 0.25
"""The most that the operands all rows of a block read (a layernorm's `g` and `b`,
copied in once per block) may add to the traffic of the rows themselves: the rows
a block runs stop halving to fill the device before the copies of those operands,
one per block, would add more (a layernorm of rows as long as its `g` and `b` keeps
4 rows a block: 1.25x the bytes it must move at most, against 2x with one)."""


class Rows(NamedTuple):
    """What a row kernel's block chose: the rows it runs, the operands it copies into
    shared memory and the temporaries it keeps there."""

    rows: int
    copied: tuple[str, ...]
    scratch: tuple[str, ...]
    member: int  # the row band's member whose consecutive rows a block runs
    # a row kernel over tiles (`tcpy.mapping.gpu.online`): what the block copies and
    # keeps in shared memory across its tiles (the others: for each tile)
    across: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())


@dataclass(frozen=True, slots=True)
class RowStatement:
    """A statement of a row kernel."""

    statement: PolyStatement
    inner: tuple[int, ...]  # the positions of its indices below the rows, its own
    # reduction indices last where it has others (each lane then reduces alone)
    lanes: bool  # a reduction over the lanes (else lane-parallel, or lane 0 alone)
    lane: int = -1  # the position in `inner` of the index on the lanes

    @property
    def sequential(self) -> int:
        """How many of its inner indices each lane walks alone, after the lanes' one:
        the reduction of a contraction inside the row (an attention's scores)."""
        return len(self.inner) - 1 - self.lane if self.inner else 0


def row_fusable(scop: Scop, options: MappingOptions) -> Callable[[list[PolyStatement], int], bool]:
    """Whether a row kernel can run statements fused over their first `k` indices
    (`tcpy.mapping.rows.fuse_rows`): the options let the lanes share a row, and each
    statement is one the lanes can run (`row_statement`)."""

    def accept(statements: list[PolyStatement], k: int) -> bool:
        if not lanes_share_rows(options) or k > len(BLOCK_PARAMS):
            return False
        return all(
            row_statement(s, loops(s, range(k, len(s.dims))), scop) is not None for s in statements
        )

    return accept


def lanes_share_rows(options: MappingOptions) -> bool:
    """Whether the options let a warp's lanes share a row: reductions across threads,
    tiles left to the mapping, and a block whose x is a warp, if given."""
    threads = options.map_to_threads
    if not options.reduce_across_threads or options.tile:
        return False
    return not threads or (threads[0] == WARP and len(threads) <= 2)


def map_rows(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    fill: int,
    bind: bool,
    at: isl.Set | None = None,
    chosen: Rows | None = None,
) -> tuple[tuple[isl.ScheduleNode, tuple[int, ...], tuple[int, ...]], Rows] | None:
    """Map the nest whose outermost band is `node` as a row kernel (see the module
    docstring) when it is one; `fill`: the blocks that fill the device; `at`: the
    launch's sizes, for the grid of a schedule for any size; `chosen`: the rows a
    block runs and the tensors it keeps in shared memory, as chosen before (else they
    are chosen here). Returns the node at the band's position, the grid and the
    block, with what was chosen; None when the nest is no row kernel."""
    if not lanes_share_rows(options):
        return None
    n = next((k for k in range(node.band_n_member()) if not node.band_member_get_coincident(k)),
             node.band_n_member())  # fmt: skip
    if n == 0 or n > len(BLOCK_PARAMS) or not node.band_get_permutable():
        return None
    if n < node.band_n_member():
        node = node.band_split(n)  # the rows, and the loops of their statements below
    statements = row_statements(node, scop)
    if statements is None:
        return None
    node = _rebuild(node, statements)
    members = list(reversed(range(n)))  # by grid dimension: x on the innermost

    member = chosen.member if chosen else _row_member(node, scop)

    tiles = _along(member, n)
    given = chosen is not None
    strided = strided_by_lanes(node.child(0), statements, scop)
    chosen = chosen or _rows(node, scop, options, device, fill, tiles, member, strided)
    coalesced = strided <= {*chosen.copied, *chosen.scratch}
    if not coalesced and not given:  # the outputs the lanes write across memory, stored
        chosen = _rows(node, scop, options, device, fill, tiles, member, strided, True)
        coalesced = strided <= {*chosen.copied, *chosen.scratch}
    if not coalesced:
        return None
    rows, copied, scratch = chosen.rows, chosen.copied, chosen.scratch
    node = node.band_tile(multi_val(node.band_get_space(), tiles(rows)))
    grid = grid_sizes(options, [member_extent(node, m, at) for m in members])
    if not bind:
        return (node, tuple(grid), (WARP, rows)), chosen
    node = bind_members(node, members, grid, BLOCK_PARAMS)
    point = bind_members(node.child(0), [member], [rows], THREAD_PARAMS[1:2])
    sequence = bind_lanes(marks.insert(point.child(0), marks.Rows()), statements)
    point = sequence.ancestor(3)  # above the mark and the rows' band: the thread filter
    stored = tuple(t for t in scratch if scop.cdef.tensor(t).role is not Role.TEMPORARY)
    for mark in (marks.Scratch(tuple(scratch), stored), marks.Shared(tuple(copied))):
        if mark.tensors:
            point = marks.insert(point, mark).parent()
    return (point.parent().parent(), tuple(grid), (WARP, rows)), chosen


def _rows(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    fill: int,
    tiles: Callable[[int], list[int]],
    member: int,
    strided: set[str],
    every_output: bool = False,
) -> Rows:
    """The rows a block of the row band `node` runs (tiled by `tiles(rows)`): the
    options', else `ROWS` halved while the grid would not fill the device (`fill`
    blocks) down to `_fewest_rows`, and while the block's shared memory would not
    fit; with the operands it copies and the temporaries (and outputs: `every_output`,
    `shared.row_tensors`) it keeps there. `strided`: the tensors the lanes walk across
    memory (`strided_by_lanes`), the only operands of 2-byte elements worth a copy."""
    threads = options.map_to_threads
    members = list(reversed(range(node.band_n_member())))  # by grid dimension
    extents = [member_extent(node, m) for m in members]
    fixed = len(threads) == 2
    last = member_extent(node, member) or ROWS
    rows = threads[1] if fixed else max(1, min(ROWS, last))

    def blocks(rows: int) -> int:
        return count_blocks(extents, tiles(rows), members)

    fewest = rows if fixed else _fewest_rows(node, scop, tiles, blocks, device.sms)
    if fewest > rows:  # the operands a block's rows share dominate: more rows a block
        rows = fewest = min(fewest, last)
    while rows // 2 >= fewest and blocks(rows) < fill:
        rows //= 2
    if not options.use_shared_memory:
        return Rows(rows, (), (), member)

    def fit(rows: int) -> tuple[list[str], list[str], bool]:
        tiled = node.band_tile(multi_val(node.band_get_space(), tiles(rows)))
        budget = shared_budget(options, device)
        return row_tensors(tiled.child(0), scop, budget, strided, every_output)

    copied, scratch, complete = fit(rows)
    while not (complete or fixed or rows == 1):
        fewer = fit(rows // 2)
        if len(fewer[0]) + len(fewer[1]) <= len(copied) + len(scratch) and not fewer[2]:
            break  # what does not fit does not shrink with the rows (a head's keys)
        rows //= 2
        copied, scratch, complete = fewer
    return Rows(rows, tuple(copied), tuple(scratch), member)


def _row_member(band: isl.ScheduleNode, scop: Scop) -> int:
    """The member of the row band `band` whose consecutive rows a block runs: the one
    along which the rows share most of the operands they read (an attention's query
    rows share the head's keys and values, its heads do not), the innermost of
    those alike (its rows are adjacent in memory)."""
    n = band.band_n_member()
    best, most = n - 1, -1
    for m in reversed(range(n)):
        if member_extent(band, m) == 1:
            continue
        found = _traffic(band, scop, _along(m, n))
        if found is not None and found[0] > most:
            best, most = m, found[0]
    return best


def _along(member: int, n: int) -> Callable[[int], list[int]]:
    """Tiles of a band of `n` members: `rows` along `member`, 1 along the others."""
    return lambda rows: [rows if k == member else 1 for k in range(n)]


def _traffic(
    band: isl.ScheduleNode, scop: Scop, tiles: Callable[[int], list[int]]
) -> tuple[int, int] | None:
    """The global bytes a block of the row band `band` (tiled by `tiles(rows)`) moves
    whatever its rows, and per row (from the boxes of a block of one row and of
    two); None when a box is unknown."""
    space = band.band_get_space()
    one, two = (block_traffic(band.band_tile(multi_val(space, tiles(r))).child(0), scop)
                for r in (1, 2))  # fmt: skip
    if one is None or two is None:
        return None
    return 2 * one - two, two - one


def _fewest_rows(
    band: isl.ScheduleNode,
    scop: Scop,
    tiles: Callable[[int], list[int]],
    blocks: Callable[[int], int],
    sms: int,
) -> int:
    """The fewest rows (a power of two, at most `MOST_ROWS`) a block of the row band `band`
    may run, tiled by `tiles(rows)`: with fewer, the global traffic of the operands
    every row of the block reads, moved once per block, would exceed
    `SHARED_OPERAND_SHARE` of the traffic of the block's rows (`_traffic`). Fewer
    where those rows would leave multiprocessors (`sms`) without a block (`blocks(rows)`)
    and one row a block would not: a layernorm of 384 rows of 768 kept 4 rows a block
    for its `g` and `b`, 96 blocks; a wave of the device counts for more."""
    found = _traffic(band, scop, tiles)
    if found is None or found[1] <= 0:
        return 1
    shared, per_row = found
    rows = 1
    while rows < MOST_ROWS and shared > SHARED_OPERAND_SHARE * rows * per_row:
        rows *= 2
    while rows > 1 and blocks(rows) < sms <= blocks(1):
        rows //= 2
    return rows


def row_statements(band: isl.ScheduleNode, scop: Scop) -> list[RowStatement] | None:
    """The statements of a row kernel whose rows are the members of `band` (coincident
    and permutable), in program order; None when the nest is not one: some statement
    does not walk the rows with plain indices, or the lanes cannot run it, or it has
    a single statement (`tcpy.mapping.gpu` maps its lanes)."""
    n = band.band_n_member()
    names = statement_names(band.get_domain())
    if any(scop.cdef.group_of(scop.statement(name).index) for name in names):
        return None  # run together over tiles, in an order of their own (`online`)
    rows: dict[str, list[int]] = {name: [] for name in names}
    for k in range(n):
        if member_extent(band, k) == 1:
            continue  # a row index of one value (a batch of 1): no loop
        walked = member_variables(band, k)
        for name in names:
            position = walked.get(name)
            if position is None:
                return None
            rows[name].append(position)
    found = []
    for s in sorted(
        (scop.statement(name) for name in names),
        key=lambda s: (s.index, s.kind is Kind.COMPUTE),
    ):
        if len(set(rows[s.name])) != len(rows[s.name]):
            return None
        r = row_statement(
            s, loops(s, [d for d in range(len(s.dims)) if d not in rows[s.name]]), scop
        )
        if r is None:
            return None
        found.append(r)
    if not any(r.inner for r in found) or len({r.statement.index for r in found}) < 2:
        return None  # one band over every index, or one statement: a plain nest
    if max(_lane_extent(r) for r in found) < FEWEST_LANES:
        return None  # a window's few values (a pooling): a thread reduces them alone
    return found


FEWEST_LANES = WARP // 4
"""The fewest lanes some statement of a row kernel must keep busy: rows shorter (a
2x2 pooling window with its rounding to half precision) leave most of each warp
idle, and a thread per output reduces them faster (`strategy.window_reductions`)."""


def _lane_extent(r: RowStatement) -> int:
    """The values of row statement `r`'s index on the lanes (0: it runs in lane 0)."""
    if not r.inner:
        return 0
    d = r.inner[r.lane]
    domain = r.statement.domain
    return domain.dim_max_val(d).to_python() - domain.dim_min_val(d).to_python() + 1


def strided_by_lanes(
    sequence: isl.ScheduleNode, statements: list[RowStatement], scop: Scop
) -> set[str]:
    """The tensors some statement's lanes walk across rows of memory (the index on the
    lanes is member `lane` of the band below `sequence`'s child): the row kernel is
    coalesced only where the block keeps them in shared memory (a copy reads the
    rows whole)."""
    found: set[str] = set()
    for pos, r in enumerate(statements):
        if r.inner:
            found |= strided_tensors(sequence.child(pos).child(0), r.lane, scop)
    return found


def loops(s: PolyStatement, dims: Iterable[int]) -> tuple[int, ...]:
    """Those of statement `s`'s indices `dims` that take more than one value."""
    return tuple(d for d in dims if s.domain.dim_min_val(d) != s.domain.dim_max_val(d))


def row_statement(s: PolyStatement, inner: tuple[int, ...], scop: Scop) -> RowStatement | None:
    """Statement `s` of a row kernel, `inner` its indices below the rows: a reduction
    over exactly them reduces over the lanes (shuffles); another statement spreads
    its last index that it does not reduce over the lanes, each lane reducing alone
    over its own reduction indices, put last (a contraction inside the row: an
    attention's scores, walking the keys on the lanes); a statement without inner
    indices runs in lane 0. None when the lanes cannot run it: a scatter, a read of
    what it writes other than at the element it writes (a rewrite in place is
    element-wise), an inner loop of unknown extent, or a shuffle of a type the
    shuffles do not move."""
    st = s.source(scop.cdef)
    if not inner:
        return RowStatement(s, inner, False)
    if st.scatter or _reads_own_tensor(st):
        return None
    for d in inner:
        lo, hi = s.domain.dim_min_val(d), s.domain.dim_max_val(d)
        if not (lo.is_int() and hi.is_int()):
            return None
    reducing = set(st.reduction_indices) if s.kind is Kind.COMPUTE else set()
    own = tuple(d for d in inner if s.dims[d] in reducing)
    spread = tuple(d for d in inner if s.dims[d] not in reducing)
    if not spread:
        if scop.cdef.tensor(st.tensor).scalar.compute not in SHUFFLED:
            return None
        return RowStatement(s, inner, True, len(inner) - 1)
    return RowStatement(s, spread + own, False, len(spread) - 1)


def _reads_own_tensor(st: CheckedStatement) -> bool:
    """Whether `st` reads the tensor it writes other than at the element it writes."""
    return any(
        isinstance(a, ast.Access)
        and a.tensor == st.tensor
        and [x.name if isinstance(x, ast.Index) else None for x in a.args] != list(st.indices)
        for e in st.expressions
        for a in ast.walk(e)
    )


def _rebuild(band: isl.ScheduleNode, statements: list[RowStatement]) -> isl.ScheduleNode:
    """The row band with the schedule below it replaced by the statements in program
    order, each over its inner indices; returns the band."""
    domain = band.get_domain()
    ctx = band.get_ctx()
    filters = isl.UnionSetList.alloc(ctx, len(statements))
    for r in statements:
        filters = filters.add(domain.intersect(isl.UnionSet.from_set(r.statement.domain)))
    node = band.child(0).cut().insert_sequence(filters)
    for pos, r in enumerate(statements):
        node = statement_band(node.child(pos).child(0), r).parent().parent()
    return node.parent()


def statement_band(
    node: isl.ScheduleNode, r: RowStatement, band: isl.MultiUnionPwAff | None = None
) -> isl.ScheduleNode:
    """Row statement `r`'s band over its inner indices (or `band`, over functions of
    them) inserted at `node` (the leaf below its filter; none without inner indices);
    returns the node at `node`'s position."""
    if not r.inner:
        return node
    node = node.insert_partial_schedule(band or identity_band(r.statement, r.inner))
    node = node.band_set_permutable(1)
    for k in range(len(r.inner)):
        node = node.band_member_set_coincident(k, int(not r.lanes and k <= r.lane))
    return node


def bind_lanes(node: isl.ScheduleNode, statements: list[RowStatement]) -> isl.ScheduleNode:
    """Below the rows' mark (`node` is its sequence): each statement's last inner index
    on the lanes, a lane reduction marked; lane 0 for a statement without one.
    Returns the sequence."""
    lane = THREAD_PARAMS[0]
    for pos, r in enumerate(statements):
        child = node.child(pos).child(0)
        if not r.inner:
            node = marks.insert(child, marks.LaneZero()).ancestor(3)
            continue
        child = bind_members(child, [r.lane], [WARP], (lane,))
        if r.lanes:
            child = marks.insert(child, marks.Lanes()).parent()
        node = child.ancestor(3)
    return node
