"""Shared-memory promotion on the GPU: the tensors a block copies into its shared
memory, for a tile of an ordinary nest (`shared_tensors`, the `shared:` mark of
`tcpy.mapping.gpu`) and for the block of a row kernel (`row_tensors`,
`tcpy.mapping.gpu.rows`), and the traffic a block's rows move (`block_traffic`).

The footprint boxes and the reuse they are judged by are those of
`tcpy.mapping.promotion`, the same analysis that packs tiles on the CPU: only the
place of the copy differs (the block's shared memory, copied by all its threads and
fenced by barriers, `tcpy.codegen.cuda`).
"""

from __future__ import annotations

from collections.abc import Collection

import islpy as isl

from tcpy.mapping.locality import strided_reads
from tcpy.mapping.promotion import (
    Box,
    box,
    box_at,
    candidates,
    extent_value,
    footprint,
    kernel_local,
    reuse,
    statements_below,
    stays_along,
    subscript_indices,
    within_budget,
)
from tcpy.parser.checked import CheckedStatement, Role
from tcpy.parser.linear import linear_form
from tcpy.parser.ranges import guarded_accesses
from tcpy.poly.isl_helpers import union_map_maps
from tcpy.poly.schedule import member_extent
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import is_band


def shared_tensors(
    node: isl.ScheduleNode, scop: Scop, budget: int, x_member: int | None = None
) -> list[str]:
    """The tensors to copy into a block's shared memory at `node` (above the thread
    filter of a tile: its footprint is the whole block's): those of 4-byte or wider
    elements read affinely and not written below it that are either reused inside
    the tile or read uncoalesced, smallest box first, as long as the boxes fit
    `budget` bytes together. Reused: some loop below leaves every access in place
    (`reuse` of 2 or more), or the reads below outnumber the box's elements twice
    over (`reads_per_element`: the overlapping windows of a convolution, which
    neighbouring threads read again). Uncoalesced: band member `x_member` of the
    point band below `node`, the one on threadIdx.x, strides across some read of it (a
    strided convolution's or a pooling's `I(.., 2*w+kw)`), so a warp's reads span
    twice the sectors they use; the copy reads the box's rows whole instead.
    Narrower elements are left in global memory: threads copying neighbours would
    write to one 4-byte word of a bank."""
    return within_budget(node, worth_sharing(node, scop, x_member), scop, budget)


def worth_sharing(node: isl.ScheduleNode, scop: Scop, x_member: int | None = None) -> list[str]:
    """The tensors `shared_tensors` copies at `node` when the budget allows them all."""
    strided = set() if x_member is None else strided_reads(_point_band(node), x_member, scop)
    return [
        t
        for t in candidates(node, scop)
        if scop.cdef.tensor(t).scalar.dtype.itemsize >= 2
        and (t in strided or reuse(node, t, scop) >= 2 or reads_per_element(node, t, scop) >= 2)
    ]


def reads_per_element(node: isl.ScheduleNode, tensor: str, scop: Scop) -> float:
    """How often the statements below `node` read each element of the box of `tensor`
    there, on average: their instances for one iteration of the loops above `node`
    (the box of each statement's, an upper bound) times the reads of `tensor` each
    makes, over the box's elements. 0 when a box is unknown."""
    b = box_at(node, tensor, scop)
    prefix = node.get_prefix_schedule_union_map().intersect_domain(node.get_domain())
    reads = 0
    for instances in union_map_maps(prefix.reverse()):
        stmt = scop.statement(instances.get_tuple_name(isl.dim_type.out))
        if stmt.kind is not Kind.COMPUTE:
            continue
        source = stmt.source(scop.cdef)
        count = sum(a.tensor == tensor for a, _guarded in guarded_accesses(source.rhs))
        found = box(instances, stmt.name) if count else None
        if count and found is None:
            return 0
        reads += count * (found.elements if found else 0)
    return reads / b.elements if b is not None and b.elements else 0


def _point_band(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """The band of a tile's point loops below `node`: the first band along the first
    children past a filter (the threads'), or the first band if none follows."""
    passed, first = False, None
    while node.n_children():
        if is_band(node):
            if passed:
                return node
            first = first or node
        passed = passed or node.get_type() == isl.schedule_node_type.filter
        node = node.child(0)
    assert first is not None, "no band below a tile"
    return first


def row_tensors(
    node: isl.ScheduleNode,
    scop: Scop,
    budget: int,
    strided: Collection[str] = (),
    every_output: bool = False,
    exclude: Collection[str] = (),
) -> tuple[list[str], list[str], bool]:
    """At the block of a row kernel (`tcpy.mapping.gpu.rows`, above its thread filter):
    the operands to copy into shared memory (read by several statements below, or
    reused across the block's rows, as a layernorm's `g`), the temporaries to keep
    there instead of in global memory and the outputs to compute there and store
    once (`scratch`: `written_by_block`; `every_output`: those written once too,
    which the lanes would write across memory), and whether every one wanted fits
    `budget` bytes (smallest boxes first). An operand of 2-byte elements read twice
    by a row is not copied (its copy moves 2 bytes a lane, no faster than the second
    read it saves: a bfloat16 softmax's rows ran 1.3x slower copied), only one the
    block's rows share (an attention's values) or the lanes would read across memory
    (among `strided`: its keys). Tensors in `exclude` (kept elsewhere) are not wanted."""
    operands = [
        t
        for t in candidates(node, scop, min_rank=1)
        if t not in exclude and _row_copied(node, t, scop, strided)
    ]
    local = [t for t in scop.cdef.tensors if kernel_local(node, t.name, scop)]
    local += [t for t in scop.cdef.tensors if written_by_block(node, t.name, scop, every_output)]
    wanted = operands + [t.name for t in local if t.name not in exclude]
    accesses = scop.reads.union(scop.writes)
    chosen = within_budget(node, wanted, scop, budget, accesses)
    complete = len(chosen) == len(wanted)
    return [t for t in operands if t in chosen], [t for t in chosen if t not in operands], complete


def _row_copied(node: isl.ScheduleNode, tensor: str, scop: Scop, strided: Collection[str]) -> bool:
    """Whether a row kernel copies operand `tensor` (`row_tensors`): one of 4-byte or
    wider elements that several statements read or the block's rows share; one of 2
    bytes only where the rows share it or the lanes would read it across memory."""
    itemsize = scop.cdef.tensor(tensor).scalar.dtype.itemsize
    if itemsize == 2:
        return tensor in strided or _rows_share(node, tensor, scop)
    return itemsize >= 4 and (reuse(node, tensor, scop) >= 2 or _readers(node, tensor, scop) >= 2)


def _rows_share(band: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether the rows of a row kernel's block (the members of `band`) read the same
    elements of `tensor`: its accesses stay put along some member of several rows."""
    return is_band(band) and any(
        member_extent(band, k) != 1 and stays_along(band, k, tensor, scop)
        for k in range(band.band_n_member())
    )


def written_by_block(
    node: isl.ScheduleNode, tensor: str, scop: Scop, every_output: bool = False
) -> bool:
    """Whether output `tensor` can be computed in shared memory by each block at `node`
    (the block of a row kernel) and its box stored once when the block is done (an
    attention's output, initialised, accumulated and divided in place): every
    statement writing it runs below `node`, the first of them initialises it (`=`,
    or a reduction's `!`), none reads it before that one nor elsewhere than where it
    writes it (`kernel_local`'s rules), every element of the tensor is written, and
    at each block the elements written are the whole of their box inside the tensor
    (so a block stores exactly the elements it computed, and no other block does);
    unless `every_output`, only where the kernel touches it more than once (a
    reduction, or several statements): an output written once is stored where it
    is computed."""
    info = scop.cdef.tensor(tensor)
    if info.role is Role.TEMPORARY or info.role is Role.INPUT:
        return False
    touching = [st for st in scop.cdef.statements if tensor in _touched(st)]
    once = len(touching) < 2 and not any(st.op.is_reduction for st in touching)
    if once and not every_output:
        return False  # written once and not read: stored where it is computed
    if not kernel_local(node, tensor, scop, outputs=True):
        return False
    extents = [extent_value(scop, e) for e in info.shape]
    if any(e is None for e in extents):
        return False
    prefix = node.get_prefix_schedule_union_map().intersect_domain(node.get_domain())
    written = footprint(prefix, scop.writes, tensor)
    found = None if written is None else box(written, tensor)
    if written is None or found is None:
        return False
    whole = _shape_set(written.get_space().range(), [e or 0 for e in extents])
    whole = whole.intersect_params(written.params())
    if not written.range().is_equal(whole):
        return False
    return written.is_equal(_hull(written, found).intersect_range(whole))


def _touched(st: CheckedStatement) -> set[str]:
    """The tensors statement `st` writes or reads."""
    return {st.tensor} | {a.tensor for e in st.expressions for a, _ in guarded_accesses(e)}


def _shape_set(space: isl.Space, extents: list[int]) -> isl.Set:
    """The elements of a tensor of these extents, in `space`."""
    out = isl.Set.universe(space)
    for d, n in enumerate(extents):
        out = out.lower_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(space.get_ctx(), 0))
        out = out.upper_bound_val(isl.dim_type.set, d, isl.Val.int_from_si(space.get_ctx(), n - 1))
    return out


def _hull(footprint: isl.Map, b: Box) -> isl.Map:
    """Outer loop values -> every element of the box `b` of `footprint` there."""
    space = footprint.get_space()
    wrapped = isl.LocalSpace.from_space(space.wrap())
    outer = isl.MultiAff.domain_map(space)
    n = space.dim(isl.dim_type.in_)
    hull = isl.Set.universe(space.wrap())
    for d, (lo, size) in enumerate(zip(b.offsets, b.sizes, strict=True)):
        x = isl.PwAff.var_on_domain(wrapped, isl.dim_type.set, n + d)
        first = lo.pullback_multi_aff(outer)
        hull = hull.intersect(x.ge_set(first)).intersect(
            x.lt_set(first.add_constant_val(isl.Val.int_from_si(space.get_ctx(), size)))
        )
    return hull.unwrap().intersect_domain(footprint.domain())


def block_traffic(node: isl.ScheduleNode, scop: Scop) -> int | None:
    """The bytes of global memory a block moves at `node` (above its thread filter):
    the boxes of every input and output the statements below access, each read or
    written once (its temporaries are taken to stay on the chip); None when a box is
    unknown."""
    accesses = scop.reads.union(scop.writes)
    total = 0
    for t in scop.cdef.tensors:
        if t.role is Role.TEMPORARY:
            continue
        b = box_at(node, t.name, scop, accesses)
        if b is None:
            return None
        total += b.elements * t.scalar.dtype.itemsize
    return total


def _readers(node: isl.ScheduleNode, tensor: str, scop: Scop) -> int:
    """How many statements below `node` read `tensor`."""
    return sum(subscript_indices(st, tensor) is not None for st in statements_below(node, scop))


def gathers(node: isl.ScheduleNode, scop: Scop) -> bool:
    """Whether a statement below `node` reads a tensor at a subscript that is not
    affine (a gather, as in an embedding lookup): such reads stay in global memory,
    and usually dominate."""
    return any(
        linear_form(a) is None
        for st in statements_below(node, scop)
        for e in st.expressions
        for access, _guarded in guarded_accesses(e)
        for a in access.args
    )
