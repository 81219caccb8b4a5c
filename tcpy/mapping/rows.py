"""Row fusion: consecutive nests that share their outer rows, and that a row
reduction needs whole, run as one nest over blocks of rows (the CPU) or over the
rows (the GPU, whose row kernels take blocks of rows themselves).

A softmax, a layer norm or an attention head, as isl's `Min` fusion schedules them,
is a nest per statement, each temporary written whole to memory and read back (an
attention's score matrix: 7 MB at BERT-base's sizes). `fuse_rows` finds runs of
consecutive nests of the top-level sequence whose statements share their first `k`
indices (the rows: an attention's `b, h, i`) and rebuilds each such run as

    band  (b, h, i - i mod R)          blocks of R rows, in parallel
      sequence                         the statements in program order
        filter S0   band (i mod R, j, e)   each over the block's rows and its own
        filter S1   band (i mod R, j)      remaining indices
        ...

so that one block's rows go through every statement before the next block starts,
and a temporary that lives in the run (the scores, their exponentials) stays in a
thread's buffer (`scratch:`, `tcpy.mapping.cpu.packing`), never in memory. For the
GPU (`tiled=False`) the band is over the rows themselves, `(b, h, i)`, permutable,
each statement over its own remaining indices below: `tcpy.mapping.gpu.rows` maps
it as a row kernel, a warp per row, a block per tile of rows, the temporaries in
shared memory; a run it cannot map that way is not fused (`accept`).

A run qualifies when every dependence among its statements joins instances of the
same row (so rows are independent and, within a row, program order is a valid
order: the order of the definition), every statement has the same rows, some
statement reduces a row into one value per row (a maximum, a sum: the reason the
row must be whole before the next statement), and each operand the block's rows
share (read without the innermost row index, as an attention's keys) is small enough
to be read again for every block from the cache (`SHARED_OPERAND_BYTES`): an output
projection's weights, read again for every block of 32 rows, would make the fused
nest slower than the matmul it replaces. The CPU's band over the blocks of rows
is left non-permutable so that tiling does not cut it again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from tcpy.errors import InternalError
from tcpy.mapping.promotion import PACK_BYTES, box
from tcpy.naming import tensor_name
from tcpy.parser.checked import Role
from tcpy.poly.dependences import Dependences, respects
from tcpy.poly.isl_helpers import (
    schedule_children,
    statement_names,
    union_map_maps,
    union_set_sets,
)
from tcpy.poly.scop import Kind, PolyStatement, Scop

ROWS = 32
"""Rows of a block at most: halved while the block's temporaries would not fit a
thread's buffers (`PACK_BYTES`; a statement's operand tiles below take their own)."""
SHARED_OPERAND_BYTES = 512 * 1024
"""The most bytes an operand that the rows of a block share may take: it is read
again for every block, from the cache (half of a Zen 4 core's L2)."""


@dataclass(frozen=True)
class _Run:
    """Consecutive children `start` to `stop` (exclusive) of the top-level sequence,
    fused over their first `rows` indices, `block` of the innermost at a time (None:
    the rows untiled, for the GPU)."""

    start: int
    stop: int
    rows: int
    block: int | None


Accept = Callable[[list[PolyStatement], int], bool]
"""Whether a target can run these statements fused over their first `k` indices."""


def fuse_rows(
    schedule: isl.Schedule,
    scop: Scop,
    deps: Dependences,
    tiled: bool = True,
    accept: Accept | None = None,
) -> isl.Schedule:
    """`schedule` with its qualifying runs of nests fused over their rows (see the
    module docstring), in blocks of rows (`tiled`, the CPU) or over the rows alone
    (the GPU), each run also accepted by `accept`; unchanged where there is none, or
    where the fused schedule would not respect the dependences."""
    in_program_order = nests_in_order(schedule, scop)
    if in_program_order is None:
        return schedule
    children, nests = in_program_order
    runs = _runs(nests, scop, deps, tiled, accept)
    if not runs:
        return schedule
    fused = _rebuild(schedule, children, nests, runs, scop, deps)
    return fused if respects(fused, deps.validity) else schedule


def nests_in_order(
    schedule: isl.Schedule, scop: Scop
) -> tuple[list[isl.ScheduleNode], list[list[PolyStatement]]] | None:
    """The children of the schedule's top-level sequence and their statements, in
    program order (isl may have hoisted initialisations ahead: a row's statements are
    then consecutive); None where the root's child is no sequence."""
    sequence = schedule.get_root().child(0)
    if sequence.get_type() != isl.schedule_node_type.sequence:
        return None
    found = sorted(
        ((c, statements_of(c, scop)) for c in schedule_children(sequence)),
        key=lambda pair: program_position(pair[1]),
    )
    return [c for c, _ in found], [n for _, n in found]


def program_position(statements: list[PolyStatement]) -> tuple[int, bool]:
    """Where the first of `statements` comes in program order."""
    return min((s.index, s.kind is not Kind.INIT) for s in statements)


def statements_of(child: isl.ScheduleNode, scop: Scop) -> list[PolyStatement]:
    names = statement_names(child.filter_get_filter())
    return sorted((scop.statement(n) for n in names), key=lambda s: s.name)


def _runs(
    nests: list[list[PolyStatement]],
    scop: Scop,
    deps: Dependences,
    tiled: bool,
    accept: Accept | None,
) -> list[_Run]:
    """The qualifying runs, greedily: from each nest, the longest run that qualifies."""
    runs: list[_Run] = []
    start = 0
    while start < len(nests):
        found: _Run | None = None
        for stop in range(start + 2, len(nests) + 1):
            statements = [s for nest in nests[start:stop] for s in nest]
            if any(scop.cdef.group_of(s.index) is not None for s in statements):
                break  # run together over tiles already (`tcpy.poly.online`)
            rows = _shared_rows(statements, scop, deps)
            if rows == 0:
                break
            if (
                _whole(statements, scop)
                and _reduces_rows(statements, rows, scop)
                and (accept is None or accept(in_order(statements), rows))
            ):
                block = _block(statements, rows, scop) if tiled else None
                found = _Run(start, stop, rows, block)
        if found is None:
            start += 1
        else:
            runs.append(found)
            start = found.stop
    return runs


def _whole(statements: list[PolyStatement], scop: Scop) -> bool:
    """Whether `statements` hold each of their reductions whole: its initialisation
    and its updates (what the buffers of a thread hold, and what later nests read,
    is decided per statement of the definition)."""
    names = {s.name for s in statements}
    indices = {s.index for s in statements}
    return all(s.name in names for s in scop.statements if s.index in indices)


def _shared_rows(statements: list[PolyStatement], scop: Scop, deps: Dependences) -> int:
    """The most leading indices all `statements` share as rows (0: none): the same
    values in each, every dependence among them within a row, and each operand the
    rows of a block share small enough."""
    most = min(_row_rank(s, scop) for s in statements)
    for k in range(most, 0, -1):
        if (
            same_rows(statements, k)
            and within_rows(statements, k, deps)
            and _shared_operands_fit(statements, k, scop)
        ):
            return k
    return 0


def _row_rank(s: PolyStatement, scop: Scop) -> int:
    """How many leading indices of `s` can be rows: its left-hand indices."""
    return len(s.source(scop.cdef).indices)


def _rows_of(s: PolyStatement, k: int, name: str = "R") -> isl.Map:
    """`s`'s instances -> their first `k` indices, in a space named `name`."""
    n = len(s.dims)
    identity = isl.Map.identity(s.domain.get_space().map_from_set()).intersect_domain(s.domain)
    projection = identity.project_out(isl.dim_type.out, k, n - k)
    return projection.set_tuple_name(isl.dim_type.out, name)


def same_rows(statements: list[PolyStatement], k: int) -> bool:
    sets = [_rows_of(s, k).range() for s in statements]
    return all(s.is_equal(sets[0]) for s in sets[1:])


def within_rows(statements: list[PolyStatement], k: int, deps: Dependences) -> bool:
    """Whether every dependence among `statements` joins two instances of one row."""
    rows = isl.UnionMap.empty(deps.all.get_space())
    domain = isl.UnionSet.empty(deps.all.get_space().domain())
    for s in statements:
        rows = rows.union(isl.UnionMap.from_map(_rows_of(s, k)))
        domain = domain.union(isl.UnionSet.from_set(s.domain))
    among = deps.all.intersect_domain(domain).intersect_range(domain)
    joined = among.apply_domain(rows).apply_range(rows)
    return all(m.is_subset(isl.Map.identity(m.get_space())) for m in union_map_maps(joined))


def _shared_operands_fit(statements: list[PolyStatement], k: int, scop: Scop) -> bool:
    """Whether each tensor the statements only read that the rows of a block share
    (read without the innermost row index: an attention's keys) fits
    `SHARED_OPERAND_BYTES` over the block's outer rows: it is read again for every
    block. A tensor read along the rows (a layer norm's input) is read once."""
    written = {s.source(scop.cdef).tensor for s in statements}
    outer, rows = _footprints(statements, k - 1, scop), _footprints(statements, k, scop)
    for tensor, found in outer.items():
        if tensor in written:
            continue
        shared, per_row = box(found, tensor), box(rows[tensor], tensor)
        if shared is None or per_row is None:
            return False
        itemsize = scop.cdef.tensor(tensor).scalar.dtype.itemsize
        along_rows = shared.elements > per_row.elements
        if not along_rows and shared.elements * itemsize > SHARED_OPERAND_BYTES:
            return False
    return True


def _footprints(statements: list[PolyStatement], k: int, scop: Scop) -> dict[str, isl.Map]:
    """The first `k` rows -> the elements of each tensor the statements read there."""
    prefix = isl.UnionMap.empty(scop.reads.get_space())
    for s in statements:
        prefix = prefix.union(isl.UnionMap.from_map(_rows_of(s, k, "O")))
    found = {}
    for m in union_map_maps(prefix.reverse().apply_range(scop.reads)):
        tensor = _tensor(m.get_tuple_name(isl.dim_type.out), scop)
        if tensor is not None:
            found[tensor] = m
    return found


def _tensor(array: str, scop: Scop) -> str | None:
    """The tensor whose elements are the array `array` of the access relations."""
    return next((t.name for t in scop.cdef.tensors if tensor_name(t.name) == array), None)


def _reduces_rows(statements: list[PolyStatement], k: int, scop: Scop) -> bool:
    """Whether one of `statements` reduces each row to values of the row alone (a
    row's maximum or sum: its left-hand indices are the rows) while another computes
    the row's elements (more left-hand indices than the rows): a matmul alone, whose
    every output is a row, does not qualify."""
    reduces = elements = False
    for s in statements:
        st = s.source(scop.cdef)
        reduction = st.op.reduction is not None and not st.scatter and bool(st.reduction_indices)
        reduces |= s.kind is Kind.COMPUTE and reduction and len(st.indices) == k
        elements |= len(st.indices) > k
    return reduces and elements


def _block(statements: list[PolyStatement], k: int, scop: Scop) -> int:
    """Rows of a block: `ROWS`, halved while the temporaries of one block's rows
    would take more than a thread's buffers (`PACK_BYTES`)."""
    row_bytes = 0
    for t in {s.source(scop.cdef).tensor for s in statements}:
        info = scop.cdef.tensor(t)
        if info.role is Role.TEMPORARY:
            row_bytes += _row_elements(t, statements, k, scop) * info.scalar.dtype.itemsize
    block = ROWS
    while block > 1 and block * row_bytes > PACK_BYTES:
        block //= 2
    return block


def _row_elements(tensor: str, statements: list[PolyStatement], k: int, scop: Scop) -> int:
    """How many elements of `tensor` one row of the statements writes (a large number
    where isl cannot bound them)."""
    rows = isl.UnionMap.empty(scop.writes.get_space())
    for s in statements:
        rows = rows.union(isl.UnionMap.from_map(_rows_of(s, k)))
    for found in union_map_maps(rows.reverse().apply_range(scop.writes)):
        if _tensor(found.get_tuple_name(isl.dim_type.out), scop) == tensor:
            b = box(found, tensor)
            return PACK_BYTES if b is None else b.elements
    return 0


# --- the rebuilt tree -------------------------------------------------------------------


def _rebuild(
    schedule: isl.Schedule,
    children: list[isl.ScheduleNode],
    nests: list[list[PolyStatement]],
    runs: list[_Run],
    scop: Scop,
    deps: Dependences,
) -> isl.Schedule:
    """A schedule of the same domain: the nests `children` in their order, the runs
    fused, every other nest as it was."""

    def builder(run: _Run) -> Callable[[isl.ScheduleNode], isl.ScheduleNode]:
        statements = in_order([s for nest in nests[run.start : run.stop] for s in nest])
        return lambda leaf: _fused(leaf, statements, run, deps.all)

    return rebuild_runs(schedule, children, {r.start: (r.stop, builder(r)) for r in runs})


Build = Callable[[isl.ScheduleNode], isl.ScheduleNode]
"""What builds a fused run at a leaf of the new tree, returning the node at its place."""


def rebuild_runs(
    schedule: isl.Schedule, children: list[isl.ScheduleNode], runs: dict[int, tuple[int, Build]]
) -> isl.Schedule:
    """A schedule of the same domain: the top-level nests `children` in their order,
    each run (by its first nest: the nest after its last, and what builds it) one child
    of the sequence, every other nest as it was."""
    parts: list[tuple[list[isl.ScheduleNode], Build | None]] = []  # nests, and a run's build
    k = 0
    while k < len(children):
        stop, build = runs.get(k, (k + 1, None))
        parts.append((children[k:stop], build))
        k = stop
    filters = isl.UnionSetList.alloc(schedule.get_ctx(), len(parts))
    for nests, _ in parts:
        joined_filter = nests[0].filter_get_filter()
        for c in nests[1:]:
            joined_filter = joined_filter.union(c.filter_get_filter())
        filters = filters.add(joined_filter)
    root = isl.Schedule.from_domain(schedule.get_domain()).get_root().child(0)
    node = root.insert_sequence(filters)
    for i, (nests, build) in enumerate(parts):
        leaf = node.child(i).child(0)
        node = (graft(nests[0].child(0), leaf) if build is None else build(leaf)).parent()
        node = node.parent()
    return node.get_schedule()


def in_order(statements: list[PolyStatement]) -> list[PolyStatement]:
    """Program order: by position in the definition, an initialisation first."""
    return sorted(statements, key=lambda s: (s.index, s.kind is not Kind.INIT))


def graft(source: isl.ScheduleNode, leaf: isl.ScheduleNode) -> isl.ScheduleNode:
    """The subtree at `source` copied at `leaf` (bands, marks, sequences and sets, the
    nodes isl's scheduler makes); returns the node at `leaf`'s position."""
    kind = source.get_type()
    if kind == isl.schedule_node_type.leaf:
        return leaf
    if kind == isl.schedule_node_type.band:
        node = leaf.insert_partial_schedule(source.band_get_partial_schedule())
        node = node.band_set_permutable(source.band_get_permutable())
        for m in range(source.band_n_member()):
            node = node.band_member_set_coincident(m, source.band_member_get_coincident(m))
        return graft(source.child(0), node.child(0)).parent()
    if kind == isl.schedule_node_type.mark:
        node = leaf.insert_mark(source.mark_get_id())
        return graft(source.child(0), node.child(0)).parent()
    if kind in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        filters = isl.UnionSetList.alloc(leaf.get_ctx(), source.n_children())
        for c in schedule_children(source):
            filters = filters.add(c.filter_get_filter())
        insert = (
            leaf.insert_sequence if kind == isl.schedule_node_type.sequence else leaf.insert_set
        )
        node = insert(filters)
        for i in range(source.n_children()):
            node = graft(source.child(i).child(0), node.child(i).child(0)).parent().parent()
        return node
    # isl's scheduler makes no context, guard, extension or expansion node
    raise InternalError(f"row fusion met a {kind} node in isl's schedule")


def _fused(
    leaf: isl.ScheduleNode, statements: list[PolyStatement], run: _Run, deps: isl.UnionMap
) -> isl.ScheduleNode:
    """At `leaf`, the band over the blocks of rows (or the rows) and the statements'
    bands below it (see the module docstring); returns the node at `leaf`'s position."""
    ctx = leaf.get_ctx()
    outer = run.rows - 1 if run.block is not None else run.rows
    blocks = [member_over(statements, functools.partial(index_of, d=d)) for d in range(outer)]
    if run.block is not None:
        block = run.block
        blocks.append(member_over(statements, lambda s: block_start(s, run.rows - 1, block)))
    node = leaf.insert_partial_schedule(joined(blocks))
    node = node.band_set_permutable(int(run.block is None))
    for m in range(run.rows):
        node = node.band_member_set_coincident(m, 1)
    filters = isl.UnionSetList.alloc(ctx, len(statements))
    for s in statements:
        filters = filters.add(isl.UnionSet.from_set(s.domain))
    node = node.child(0).insert_sequence(filters)
    for i, s in enumerate(statements):
        inner = [within_block(s, run.rows - 1, run.block)] if run.block is not None else []
        inner += [index_of(s, d) for d in range(run.rows, len(s.dims))]
        if not inner:
            continue  # a statement of the row alone
        band = node.child(i).child(0).insert_partial_schedule(joined([single(a) for a in inner]))
        band = band.band_set_permutable(1)
        for m, flag in enumerate(coincident_members(band, deps)):
            band = band.band_member_set_coincident(m, int(flag))
        node = band.parent().parent()
    return node.parent()


def coincident_members(band: isl.ScheduleNode, deps: isl.UnionMap) -> list[bool]:
    """For each member of `band`, whether no dependence among the instances below it
    joins two instances in the same iteration of the loops outside the member at
    different values of it."""
    domain = band.get_domain()
    prefix = band.get_prefix_schedule_union_map().intersect_domain(domain)
    full = prefix.flat_range_product(band.band_get_partial_schedule_union_map())
    among = deps.intersect_domain(domain).intersect_range(domain)
    steps = union_set_sets(among.apply_domain(full).apply_range(full).deltas())
    n = band.band_n_member()
    return [
        all(_zero_at(step, step.dim(isl.dim_type.set) - n + m) for step in steps) for m in range(n)
    ]


def _zero_at(step: isl.Set, d: int) -> bool:
    """Whether every vector of `step` that is zero before position `d` is zero there."""
    outer = step.copy()
    for k in range(d):
        outer = outer.fix_val(isl.dim_type.set, k, 0)
    return outer.is_subset(outer.copy().fix_val(isl.dim_type.set, d, 0))


def index_of(s: PolyStatement, d: int) -> isl.PwAff:
    """Index `d` of statement `s`, on its domain."""
    space = isl.LocalSpace.from_space(s.domain.get_space())
    return isl.PwAff.var_on_domain(space, isl.dim_type.set, d).intersect_domain(s.domain)


def block_start(s: PolyStatement, d: int, block: int) -> isl.PwAff:
    """The first row of index `d`'s block of `block` rows."""
    v = index_of(s, d)
    return v.sub(v.mod_val(isl.Val.int_from_si(s.domain.get_ctx(), block)))


def within_block(s: PolyStatement, d: int, block: int) -> isl.PwAff:
    """The row of index `d` within its block of `block` rows."""
    return index_of(s, d).mod_val(isl.Val.int_from_si(s.domain.get_ctx(), block))


def member_over(
    statements: list[PolyStatement], member: Callable[[PolyStatement], isl.PwAff]
) -> isl.MultiUnionPwAff:
    """A band member over `statements`: `member` of each."""
    upa = isl.UnionPwAff.from_pw_aff(member(statements[0]))
    for s in statements[1:]:
        upa = upa.union_add(isl.UnionPwAff.from_pw_aff(member(s)))
    return isl.MultiUnionPwAff.from_union_pw_aff(upa)


def single(pa: isl.PwAff) -> isl.MultiUnionPwAff:
    return isl.MultiUnionPwAff.from_union_pw_aff(isl.UnionPwAff.from_pw_aff(pa))


def joined(members: list[isl.MultiUnionPwAff]) -> isl.MultiUnionPwAff:
    out = members[0]
    for m in members[1:]:
        out = out.flat_range_product(m)
    return out
