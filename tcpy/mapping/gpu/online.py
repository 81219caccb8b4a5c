"""Row kernels over tiles of a row: statements run together over tiles of a row
(`CheckedDef.together`, made by the online rewrite, `tcpy.poly.online`), with the
statements of each row just before and after them (`original_order(rows_first=True)`:
a chain's initialisations and its last statements), mapped as one kernel whose block
runs a block of rows, a warp a row:

    filter  row blocks on the grid        b, h, floor(i / R)
      band  row blocks
        mark shared:Q  scratch:A>,..      what every tile reads again; what lives
          sequence                        across the tiles (an output stored once)
            filter  i mod R = t1          the statements before the tiles,
              band  i mod R                 one warp per row
                mark warp_rows
                  sequence ...
            band  tiles                   a loop every thread of the block runs:
              mark shared:K,V             the tile of what the rows share, copied
                mark scratch:Sc,P,...     between two barriers; the tile's
                  filter  i mod R = t1    temporaries in shared memory
                    band  i mod R
                      mark warp_rows
                        sequence ...      each statement as in a row kernel
            filter  i mod R = t1          the statements after the tiles
              ...

So an attention's scores and probabilities live a tile at a time in shared memory,
the keys and values of a tile are read once per block of query rows, and the running
maximum, sum and output are updated in place, tile after tile: the score matrix
never reaches global memory, however long the row. The schedule rows-first runs a
row's statements in their order, which within a row is the order of the group's own
schedule; the rows share no dependence (checked when it is built). Where the lanes
cannot run a statement, or the lanes would read across global memory outside shared
memory, the nest is mapped as any other band.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.gpu.bind import bind_members, count_blocks, grid_sizes
from tcpy.mapping.gpu.device import WARP, DeviceProfile, shared_budget
from tcpy.mapping.gpu.rows import (
    ROWS,
    Rows,
    RowStatement,
    bind_lanes,
    lanes_share_rows,
    loops,
    row_statement,
    statement_band,
    strided_by_lanes,
)
from tcpy.mapping.gpu.shared import row_tensors
from tcpy.mapping.options import MappingOptions
from tcpy.mapping.promotion import box_at
from tcpy.naming import BLOCK_PARAMS, THREAD_PARAMS
from tcpy.parser import ast
from tcpy.parser.checked import Role, Together
from tcpy.poly.isl_helpers import schedule_children, statement_names, sym_str
from tcpy.poly.schedule import group_tiles, member_extent, partial_schedule, within_tile
from tcpy.poly.scop import Scop
from tcpy.poly.transforms import is_band

FEWEST_ROWS = 4
"""The rows a block keeps while it halves them to give every multiprocessor a block:
each block reads every tile of the operands its rows share (an attention's keys and
values), so fewer rows a block read those more times; one wave, not `FILL_WAVES`."""


@dataclass(frozen=True, slots=True)
class Part:
    """Statements of the kernel one after the other below the rows: the group's, over
    its tiles (`tiled`), or one before or after them."""

    statements: tuple[RowStatement, ...]
    tiled: bool


def map_online_rows(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    bind: bool,
    at: isl.Set | None = None,
    chosen: Rows | None = None,
) -> tuple[tuple[isl.ScheduleNode, tuple[int, ...], tuple[int, ...]], Rows] | None:
    """The band `node` of a group's rows mapped as in the module docstring, with what
    it chose (`chosen`: as chosen before; `Rows.across` the block's copies and
    scratch); the node at the band's position, the grid and the block; None when the
    nest is not one."""
    found = _parts(node, scop, options)
    if found is None:
        return None
    group, parts = found
    rows = chosen if chosen is not None else _choose(node, scop, options, device, group, parts)
    if rows is None:
        return None
    top = _rebuild(node, scop, group, parts, rows.rows)
    grid = grid_sizes(options, [member_extent(top, m, at) for m in reversed(range(group.rows))])
    if not bind:
        return (top, tuple(grid), (WARP, rows.rows)), rows
    top = bind_members(top, list(reversed(range(group.rows))), grid, BLOCK_PARAMS)
    sequence = top.child(0)
    for pos, part in enumerate(parts):
        child = sequence.child(pos).child(0)
        point = child.child(0) if part.tiled else child
        point = bind_members(point, [0], [rows.rows], THREAD_PARAMS[1:2])
        inner = point.child(0)
        if part.tiled:  # its own mark: the tile's body is a block of its own
            inner = marks.insert(inner, marks.Rows())
        inner = bind_lanes(inner, list(part.statements))
        at_thread = inner.ancestor(3 if part.tiled else 2)  # the thread filter
        if part.tiled:
            at_thread = _marked(at_thread, scop, rows.copied, rows.scratch)
        sequence = at_thread.ancestor(2 if part.tiled else 1).parent()
    # the warp meets after each statement of every part, the guards on the lanes sunk
    # to the statements (isl generates a part without a loop statement by statement)
    sequence = marks.insert(sequence, marks.Rows())
    top = _marked(sequence.parent(), scop, *rows.across).parent().parent()
    return (top, tuple(grid), (WARP, rows.rows)), rows


def _marked(
    node: isl.ScheduleNode, scop: Scop, copied: tuple[str, ...], scratch: tuple[str, ...]
) -> isl.ScheduleNode:
    """`node` with the marks of the tensors kept in shared memory above it (none where
    none is); returns the topmost node inserted (or `node`)."""
    stored = tuple(t for t in scratch if scop.cdef.tensor(t).role is not Role.TEMPORARY)
    for mark in (marks.Scratch(scratch, stored), marks.Shared(copied)):
        if mark.tensors:
            node = marks.insert(node, mark).parent()
    return node


def _parts(
    band: isl.ScheduleNode, scop: Scop, options: MappingOptions
) -> tuple[Together, list[Part]] | None:
    """The group whose rows band `band` runs first (`original_order(rows_first=True)`)
    and its parts, each statement as a row kernel's, when the options let the lanes
    share a row and the lanes can run every statement; else None."""
    if not lanes_share_rows(options) or not is_band(band):
        return None
    group = next((g for name in statement_names(band.get_domain())
                  if (g := scop.cdef.group_of(scop.statement(name).index))), None)  # fmt: skip
    if group is None or band.band_n_member() != group.rows or group.rows > len(BLOCK_PARAMS):
        return None
    sequence = band.child(0)
    if sequence.get_type() != isl.schedule_node_type.sequence:
        return None
    parts = []
    for child in schedule_children(sequence):
        names = statement_names(child.filter_get_filter())
        statements = sorted((scop.statement(n) for n in names), key=lambda s: s.index)
        tiled = scop.cdef.group_of(statements[0].index) is group
        found = []
        for s in statements:
            k = group.member(s.index)
            along = s.dims.index(group.along[k]) if k is not None else -1
            once = k is not None and group.once[k]
            dims = [d for d in range(group.rows, len(s.dims)) if not (once and d == along)]
            r = row_statement(s, loops(s, dims), scop)
            if r is None:
                return None
            found.append(r)
        parts.append(Part(tuple(found), tiled))
    if sum(p.tiled for p in parts) != 1:
        return None
    return group, parts


def _choose(
    band: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    group: Together,
    parts: list[Part],
) -> Rows | None:
    """The rows a block runs (the options', else the group's block or `ROWS`, halved
    while the grid would leave multiprocessors idle, to `FEWEST_ROWS`, then while what
    a tile or the block across its tiles keeps in shared memory would not fit), with
    what those keep; None where the lanes would read across global memory."""
    threads = options.map_to_threads
    extents = [member_extent(band, m) for m in range(group.rows)]
    wanted = threads[1] if len(threads) == 2 else group.block if group.block > 1 else ROWS
    rows = max(1, min(wanted, extents[-1] or wanted))

    def blocks(rows: int) -> int:
        return count_blocks(extents, [1] * (group.rows - 1) + [rows], list(range(group.rows)))

    while len(threads) != 2 and rows // 2 >= FEWEST_ROWS and blocks(rows) < device.sms:
        rows //= 2  # more blocks, each reading every tile of what its rows share
    while True:
        found, complete = _fit(band, scop, options, device, group, parts, rows)
        if found is None or complete or len(threads) == 2 or rows == 1:
            return found
        rows //= 2


def _fit(
    band: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    device: DeviceProfile,
    group: Together,
    parts: list[Part],
    rows: int,
) -> tuple[Rows | None, bool]:
    """What blocks of `rows` rows keep in shared memory: for a tile, the operands the
    lanes would read across memory and all else that fits the budget; across the
    tiles, what fits the rest (nothing where a tile's wants do not all fit); and
    whether all of both fit (else fewer rows are tried: an attention's queries read
    from global memory at every tile cost more than its keys read by more blocks).
    None where the lanes would read across global memory."""
    budget = shared_budget(options, device)
    top = _rebuild(band, scop, group, parts, rows)
    sequence = top.child(0)
    strided: set[str] = set()
    for pos, part in enumerate(parts):
        child = sequence.child(pos).child(0)
        inner = (child.child(0) if part.tiled else child).child(0)
        strided |= strided_by_lanes(inner, list(part.statements), scop)
    at_tile = next(sequence.child(pos).child(0).child(0)
                   for pos, p in enumerate(parts) if p.tiled)  # fmt: skip
    steady = _steady(scop, group, parts)  # copied once for all the tiles, if at all
    copied, scratch, complete = row_tensors(at_tile, scop, budget, strided, exclude=steady)
    if not strided <= {*copied, *scratch}:
        return None, False
    used = _bytes(at_tile, scop, copied, scratch)
    kept = (*copied, *scratch)
    across = row_tensors(sequence, scop, budget - used, (), exclude=kept)
    held = (tuple(across[0]), tuple(across[1])) if complete else ((), ())
    return Rows(rows, tuple(copied), tuple(scratch), group.rows - 1, held), (complete and across[2])


def _steady(scop: Scop, group: Together, parts: list[Part]) -> set[str]:
    """The tensors the group's statements read, none along its tiled index (an
    attention's queries): the same box at every tile."""
    read: set[str] = set()
    tiled: set[str] = set()
    for r in next(p for p in parts if p.tiled).statements:
        k = group.member(r.statement.index)
        assert k is not None
        for e in r.statement.source(scop.cdef).expressions:
            for a in ast.walk(e):
                if isinstance(a, ast.Access):
                    read.add(a.tensor)
                    names = {x.name for arg in a.args for x in ast.walk(arg)
                             if isinstance(x, ast.Index)}  # fmt: skip
                    if group.along[k] in names:
                        tiled.add(a.tensor)
    return read - tiled


def _bytes(node: isl.ScheduleNode, scop: Scop, copied: list[str], scratch: list[str]) -> int:
    """The bytes of the boxes at `node` of the copies (of their reads) and the scratch
    (of all their accesses)."""
    total = 0
    touched = scop.reads.union(scop.writes)
    for tensors, accesses in ((copied, None), (scratch, touched)):
        for t in tensors:
            b = box_at(node, t, scop, accesses)
            if b is not None:
                total += b.elements * scop.cdef.tensor(t).scalar.dtype.itemsize
    return total


def _rebuild(
    band: isl.ScheduleNode, scop: Scop, group: Together, parts: list[Part], rows: int
) -> isl.ScheduleNode:
    """The rows band replaced by a band over blocks of `rows` rows, then the parts in
    order, each a band over a row's place in its block (below a band over the tiles
    for the group's) above its statements in order, each over its own indices below
    the rows; returns the first band."""
    ctx = band.get_ctx()
    leaf = band.child(0).cut().parent().delete()
    filters = isl.UnionSetList.alloc(ctx, len(parts))
    for part in parts:
        filters = filters.add(_domain(part))
    node = leaf.insert_sequence(filters)
    for pos, part in enumerate(parts):
        child = node.child(pos).child(0)
        inner = isl.UnionSetList.alloc(ctx, len(part.statements))
        for r in part.statements:
            inner = inner.add(isl.UnionSet.from_set(r.statement.domain))
        child = child.insert_sequence(inner)
        for k, r in enumerate(part.statements):
            tiled = part.tiled and r.inner  # the cut index as its place in its tile
            within = within_tile(scop, r.statement, r.inner, group) if tiled else None
            child = statement_band(child.child(k).child(0), r, within).parent().parent()
        child = _parallel(child.insert_partial_schedule(_place(scop, group, part, rows)))
        if part.tiled:  # the tiles in order: a tile's sums feed the next
            statements = [r.statement for r in part.statements]
            child = child.insert_partial_schedule(group_tiles(scop, group, statements))
        node = child.parent().parent()
    return _parallel(node.insert_partial_schedule(_blocks(scop, group, parts, rows)))


def _parallel(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Band `node` permutable, every member coincident (rows share no dependence)."""
    node = node.band_set_permutable(1)
    for m in range(node.band_n_member()):
        node = node.band_member_set_coincident(m, 1)
    return node


def _domain(part: Part) -> isl.UnionSet:
    domain = isl.UnionSet.from_set(part.statements[0].statement.domain)
    for r in part.statements[1:]:
        domain = domain.union(isl.UnionSet.from_set(r.statement.domain))
    return domain


def _row(group: Together, names: list[str]) -> str:
    """The last row index of a statement (its indices `names`) from its first value."""
    return f"({names[group.rows - 1]} - ({sym_str(group.block_lo)}))"


def _blocks(scop: Scop, group: Together, parts: list[Part], rows: int) -> isl.MultiUnionPwAff:
    """Every statement -> [its rows, the last in blocks of `rows`]."""
    pieces = []
    for part in parts:
        for r in part.statements:
            s = r.statement
            names = [f"i{d}" for d in range(len(s.dims))]
            out = [*names[: group.rows - 1], f"floor({_row(group, names)} / {rows})"]
            pieces.append(f"{s.name}[{', '.join(names)}] -> [{', '.join(out)}]")
    return partial_schedule(scop, pieces)


def _place(scop: Scop, group: Together, part: Part, rows: int) -> isl.MultiUnionPwAff:
    """The part's statements -> [the place of their last row in its block]."""
    pieces = []
    for r in part.statements:
        s = r.statement
        names = [f"i{d}" for d in range(len(s.dims))]
        pieces.append(f"{s.name}[{', '.join(names)}] -> [{_row(group, names)} mod {rows}]")
    return partial_schedule(scop, pieces)
