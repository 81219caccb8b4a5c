"""The CPU's loop marks: the worksharing loop of each nest (`omp for`, with the loop
inside it where the two share out as one) and the vector loops (`omp simd`); and the
row loops a reduction shares with other statements, split so that the reduction gets
a loop of its own (`split_row_reductions`), which the code generator vectorises."""

from __future__ import annotations

import islpy as isl

from tcpy.mapping import marks
from tcpy.poly.dependences import Dependences, respects
from tcpy.poly.isl_helpers import schedule_children, statement_names, union_set_sets
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import is_band, map_innermost_bands


def _mark(node: isl.ScheduleNode, kind: type[marks.LoopMark], member: int) -> isl.ScheduleNode:
    """Mark band member `member` with a loop mark of `kind`, which names the member's
    schedule depth: the loop the pragma belongs to (isl drops loops of a single
    iteration, so the first loop under a mark may come from elsewhere). Returns the
    mark node."""
    depth = node.get_schedule_depth() + member
    return marks.insert(node, kind(depth)).parent()


def mark_simd(node: isl.ScheduleNode) -> isl.ScheduleNode:
    last = node.band_n_member() - 1
    if not node.band_member_get_coincident(last):
        return node
    return _mark(node, marks.Simd, last)


SHARED_LEAST = 1 << 12
"""The fewest loop iterations (the worksharing loop's and those inside it) a worksharing
loop nested in sequential loops must hold: each iteration of the sequential loops
ends in a barrier of the team. An embedding bag's backward, which scatters rows of 64
values at 1,024 sequential pairs of bag and position, spent its 0.3 ms in barriers;
on one thread it takes a tenth."""


def mark_parallel(node: isl.ScheduleNode, nested: bool = False) -> isl.ScheduleNode:
    """Mark the first coincident member of the outermost band of every nest (looking
    deeper where a band has none), and the member after it when that one is coincident
    too (`omp_collapse`: the printer shares both loops out as one where the second is
    directly inside the first and its bounds do not depend on it); returns the node at
    the position it was given. A member inside sequential loops (`nested`) is marked
    only where it and the loops inside it run `SHARED_LEAST` iterations or more, or an
    unknown number. A size-generic MLP of 256 rows made one tile of rows and ran on one
    thread without looking past a single tile."""
    if is_band(node):
        n = node.band_n_member()
        # a loop of one iteration (a single tile) is dropped by isl: look past it
        first = next(
            (
                k
                for k in range(n)
                if node.band_member_get_coincident(k) and member_extent(node, k) != 1
            ),
            None,
        )
        if first is not None:
            if nested and _few_iterations(node, first):
                return node
            marked = _mark(node, marks.Parallel, first)
            # the loop inside it as printed: isl drops those of one iteration (a batch
            # of 1 between a projection's Q/K/V and its heads left 3 iterations to share
            # between 2 cores, not 36: the layer's projection 1.3x slower)
            second = next((k for k in range(first + 1, n) if member_extent(node, k) != 1), None)
            if second is not None and node.band_member_get_coincident(second):
                marked = _mark(marked.child(0), marks.Collapse, second).parent()
            return marked
        nested = nested or any(member_extent(node, k) != 1 for k in range(n))
    for i in range(node.n_children()):
        node = mark_parallel(node.child(i), nested).parent()
    return node


def _few_iterations(band: isl.ScheduleNode, first: int) -> bool:
    """Whether `band`'s members from `first` on and the loops inside them run fewer
    than `SHARED_LEAST` iterations (False where a count is not known)."""
    count = _extents(band, range(first, band.band_n_member()), _iterations(band.child(0)))
    return count is not None and count < SHARED_LEAST


def _iterations(node: isl.ScheduleNode) -> int | None:
    """The iterations of the loops of `node`'s subtree, each band's members taken at
    their whole extent (None where one is not known)."""
    if node.get_type() == isl.schedule_node_type.leaf:
        return 1
    if is_band(node):
        return _extents(node, range(node.band_n_member()), _iterations(node.child(0)))
    counts = [_iterations(node.child(i)) for i in range(node.n_children())]
    return None if None in counts else sum(c for c in counts if c is not None)


def _extents(band: isl.ScheduleNode, members: range, inner: int | None) -> int | None:
    """`inner` times the extents of `band`'s `members` (None where one is not known)."""
    count = inner
    for k in members:
        extent = member_extent(band, k)
        count = None if extent is None or count is None else count * extent
    return count


def split_row_reductions(schedule: isl.Schedule, scop: Scop, deps: Dependences) -> isl.Schedule:
    """`schedule` with each innermost one-member band below the rows (a parallel loop)
    that a sum or min/max runs along beside other statements (a layer norm's `Y(s,n)
    = ...` then `mean(s) +=! Y(s,n)`, a softmax's exponentials and their sum), or
    that other statements run at one point of (a cross-entropy backward's `d_s(b)`
    beside its row `d_X(b, k) = d_s(b) * ...`), split, in order, into a loop for each
    such reduction, one for the statements between them that it walks, and one for
    those at a point, where that respects the dependences; each new loop is parallel
    where no dependence runs along it. Fused, the reduction's partial results form one
    chain of dependent additions through memory (a layer norm's rows ran 10x slower
    than the copy bandwidth); alone in its loop, its accumulator is kept in vector
    lanes (`tcpy.codegen`), at the price of reading the row once more, from the cache.
    A loop beside a statement at one of its points carries the dependence on it, and
    was not vectorised (the cross-entropy's backward: 0.50 ms against 0.06)."""

    def split(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if node.band_n_member() != 1 or node.n_children() != 1 or not _rows_above(node):
            return node
        below = node.child(0)
        if below.get_type() not in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
            return node
        branches = [c.filter_get_filter() for c in schedule_children(below)]
        groups: list[isl.UnionSet] = []
        kinds: list[str] = []
        for f in branches:  # a reduction alone, the statements between them by kind
            kind = (
                "reduction"
                if _reduces_along(node, f, scop)
                else "point"
                if _fixed_along(node, f)
                else "loop"
            )
            if kinds and kind != "reduction" and kinds[-1] == kind:
                groups[-1] = groups[-1].union(f)
            else:
                groups.append(f)
                kinds.append(kind)
        if len(groups) == 1:
            return node
        filters = isl.UnionSetList.alloc(node.get_ctx(), len(groups))
        for group in groups:
            filters = filters.add(group)
        sequence = node.insert_sequence(filters)
        if not respects(sequence.get_schedule(), deps.validity):
            return node
        for k in range(len(groups)):
            band = sequence.child(k).child(0)
            parallel = not _carried(band, deps.all)
            sequence = band.band_member_set_coincident(0, int(parallel)).parent().parent()
        return sequence

    return map_innermost_bands(schedule, split)


def _rows_above(node: isl.ScheduleNode) -> bool:
    """Whether a band above `node` has a parallel member (the rows the threads share:
    a loop split below them is not shared out itself)."""
    while node.has_parent():
        node = node.parent()
        if is_band(node) and any(
            node.band_member_get_coincident(k) for k in range(node.band_n_member())
        ):
            return True
    return False


def _carried(band: isl.ScheduleNode, deps: isl.UnionMap) -> bool:
    """Whether one-member `band` carries a dependence among the instances below it:
    two of them in the same iteration of the loops above, at different points."""
    domain = band.get_domain()
    prefix = band.get_prefix_schedule_union_map().intersect_domain(domain)
    inner = prefix.flat_range_product(band.band_get_partial_schedule_union_map())
    among = deps.intersect_domain(domain).intersect_range(domain)
    steps = among.apply_domain(inner).apply_range(inner).deltas()
    for step in union_set_sets(steps):
        n = step.dim(isl.dim_type.set)
        same_outer = step
        for d in range(n - 1):
            same_outer = same_outer.fix_val(isl.dim_type.set, d, 0)
        at_zero = same_outer.fix_val(isl.dim_type.set, n - 1, 0)
        if not same_outer.is_subset(at_zero):
            return True
    return False


def _fixed_along(band: isl.ScheduleNode, statements: isl.UnionSet) -> bool:
    """Whether the instances of `statements` (one branch below one-member `band`) in
    each iteration of the loops above run at one point of the band's member."""
    domain = band.get_domain().intersect(statements)
    prefix = band.get_prefix_schedule_union_map().intersect_domain(domain)
    member = band.band_get_partial_schedule_union_map().intersect_domain(domain)
    return bool(prefix.reverse().apply_range(member).is_single_valued())


def _reduces_along(band: isl.ScheduleNode, statements: isl.UnionSet, scop: Scop) -> bool:
    """Whether a statement of `statements` (one branch below `band`) is a reduction
    that band member 0 walks along one of its reduction indices."""
    walked = member_variables(band, 0)
    for name in statement_names(statements):
        stmt = scop.statement(name)
        position = walked.get(name)
        if stmt.kind is not Kind.COMPUTE or position is None:
            continue
        source = stmt.source(scop.cdef)
        reduces = source.op.reduction is not None and not source.scatter
        if reduces and stmt.dims[position] in source.reduction_indices:
            return True
    return False
