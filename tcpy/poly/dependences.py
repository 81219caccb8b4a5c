"""Dependences of a scop: read-after-write, write-after-read and write-after-write,
from isl's dataflow analysis against the original order.

Writes indexed by plain indices are exact and are must-sources; a scatter-add's may
over-approximate (a gathered subscript reaches its whole dimension), so they are
may-sources, as reads, which may over-approximate too, are of the anti dependences.
A reduction's self-dependences serialise its reduction loops and leave its left-hand
loops parallel, which is exactly TC's meaning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from tcpy.poly.isl_helpers import isl_errors, union_map_maps
from tcpy.poly.scop import Kind, PolyStatement, Scop


@dataclass(frozen=True, eq=False, slots=True)
class Dependences:
    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap
    reductions: isl.UnionMap  # between instances of one reduction statement
    _made: dict[str, isl.UnionMap] = field(default_factory=dict, compare=False, repr=False)

    @property
    def all(self) -> isl.UnionMap:
        if "all" not in self._made:
            self._made["all"] = _coalesced(self.raw.union(self.war).union(self.waw))
        return self._made["all"]

    @property
    def validity(self) -> isl.UnionMap:
        """What every schedule must respect. TC's reductions are associative and
        commutative, and a reduction never reads its target otherwise, so the order of
        a reduction's own updates is free: those dependences constrain parallelism
        (they stay coincidence constraints) but not order. (Made once.)"""
        if "validity" not in self._made:
            self._made["validity"] = _coalesced(self.all.subtract(self.reductions))
        return self._made["validity"]


def _coalesced(dependences: isl.UnionMap) -> isl.UnionMap:
    """`dependences` coalesced, or as they are where coalescing passes isl's operation
    budget (gathers make many pieces: a def of the fuzzer's took over 20 million
    operations): the same relation, in more pieces."""
    try:
        return dependences.coalesce()
    except isl.Error as e:
        if "maximal number of operations" not in str(e):
            raise
        dependences.get_ctx().reset_operations()
        return dependences


def compute_dependences(scop: Scop) -> Dependences:
    empty = isl.UnionMap.empty(scop.writes.get_space())

    def flow(sink: isl.UnionMap, must: isl.UnionMap, may: isl.UnionMap) -> isl.UnionMap:
        info = (
            isl.UnionAccessInfo.from_sink(sink)
            .set_must_source(must)
            .set_may_source(may)
            .set_schedule_map(scop.order)
        )
        return info.compute_flow().get_may_dependence()

    scop.ctx.reset_operations()
    with isl_errors(f"dependence analysis of {scop.cdef.name}"):
        scattered = isl.UnionSet.empty(scop.domain.get_space())
        for s in scop.statements:
            if s.kind is Kind.COMPUTE and s.source(scop.cdef).scatter:
                scattered = scattered.union(isl.UnionSet.from_set(s.domain))
        may = scop.writes.intersect_domain(scattered)
        must = scop.writes.subtract(may)
        raw = flow(scop.reads, must, may)
        war = flow(scop.writes, empty, scop.reads)
        waw = flow(scop.writes, must, may)
        reductions = isl.UnionMap.empty(raw.get_space())
        for s in scop.statements:
            if s.kind is Kind.COMPUTE and s.source(scop.cdef).op.is_reduction:
                own = isl.UnionSet.from_set(s.domain)
                every = raw.union(war).union(waw)
                reductions = reductions.union(every.intersect_domain(own).intersect_range(own))
        return Dependences(raw, war, waw, reductions)


def conservative_dependences(scop: Scop) -> Dependences:
    """Dependences that over-approximate the exact ones, without dataflow analysis (for
    when isl's runs out of time even at fixed sizes): every instance of a statement
    depends on every instance of each earlier statement that touches a tensor it
    touches, one of them writing; a reduction's instances depend on all its earlier
    instances (an order left free, as for the exact ones, but no loop of it is then
    parallel). A plain `=` writes each element once and reads its own tensor only where
    it writes, so it has no dependence on itself. Statements run together over tiles
    (`tcpy.poly.online`) depend on each other in the original order, both ways, within
    a row only: the rewrite makes them so that a row's instances write only that row's
    elements."""
    space = scop.writes.get_space()
    reads = [_tensors(scop.reads, s) for s in scop.statements]
    writes = [_tensors(scop.writes, s) for s in scop.statements]
    across = isl.UnionMap.empty(space)
    for q, later in enumerate(scop.statements):
        for p, earlier in enumerate(scop.statements[:q]):
            if writes[p] & (reads[q] | writes[q]) or reads[p] & writes[q]:
                across = across.union(_before(scop, earlier, later))
    own = isl.UnionMap.empty(space)
    for s in scop.statements:
        if s.kind is Kind.COMPUTE and s.source(scop.cdef).op.is_reduction:
            own = own.union(isl.UnionMap.from_map(s.domain.lex_lt_set(s.domain)))
    return Dependences(across, isl.UnionMap.empty(space), own, own)


def _before(scop: Scop, earlier: PolyStatement, later: PolyStatement) -> isl.UnionMap:
    """Every pair of their instances that the original order runs one before the other:
    all of `earlier`'s before all of `later`'s, but both ways within statements run
    together."""
    group = scop.cdef.group_of(earlier.index)
    if group is None or group is not scop.cdef.group_of(later.index):
        pair = isl.Map.from_domain_and_range(earlier.domain, later.domain)
        return isl.UnionMap.from_map(pair)
    one, other = (_order_of(scop, s) for s in (earlier, later))
    forward, backward = one.lex_lt_map(other), other.lex_lt_map(one)
    for row in range(group.rows):
        forward = forward.equate(isl.dim_type.in_, row, isl.dim_type.out, row)
        backward = backward.equate(isl.dim_type.in_, row, isl.dim_type.out, row)
    return isl.UnionMap.from_map(forward).union(isl.UnionMap.from_map(backward))


def _order_of(scop: Scop, s: PolyStatement) -> isl.Map:
    return next(
        m for m in union_map_maps(scop.order) if m.get_tuple_name(isl.dim_type.in_) == s.name
    )


def _tensors(accesses: isl.UnionMap, s: PolyStatement) -> set[str]:
    mine = accesses.intersect_domain(isl.UnionSet.from_set(s.domain))
    return {m.get_tuple_name(isl.dim_type.out) for m in union_map_maps(mine)}


def violations(schedule: isl.Schedule, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences whose sink `schedule` does not run strictly after their source.

    `Schedule.get_map()` orders the children of a `set` node as if they were a
    sequence, but a set promises no order (isl's AST generator may run its children in
    any order): a dependence between instances in two children of one set, at the same
    iteration of the loops above it, is a violation however the map orders them."""
    order = {m.get_tuple_name(isl.dim_type.in_): m for m in union_map_maps(schedule.get_map())}
    late = isl.UnionMap.empty(deps.get_space())
    for dep in union_map_maps(deps):
        source = order[dep.get_tuple_name(isl.dim_type.in_)]
        sink = order[dep.get_tuple_name(isl.dim_type.out)]
        late = late.union(isl.UnionMap.from_map(_late(dep, source, sink)))
    return late.union(deps.intersect(unordered_pairs(schedule))).coalesce()


def _late(dep: isl.Map, source: isl.Map, sink: isl.Map) -> isl.Map:
    """The pairs of `dep` whose sink is not scheduled strictly after its source: each
    pair goes with the pair of its schedule vectors, kept where they do not increase
    lexicographically. Working on the dependence's own pairs keeps this cheap; the order
    of all instance pairs (`lex_lt_union_map`) can take isl minutes when the schedule
    has many floor divisions, as tiled and mapped schedules do."""
    both = source.product(sink).intersect_domain(dep.wrap())
    not_after = isl.Map.lex_ge(source.get_space().range())
    return both.intersect_range(not_after.wrap()).domain().unwrap()


def unordered_pairs(schedule: isl.Schedule) -> isl.UnionMap:
    """Pairs of statement instances whose relative order the schedule leaves open:
    in different children of a `set` node, at the same values of its outer loops."""
    out = isl.UnionMap.empty(schedule.get_domain().get_space())
    stack = [schedule.get_root()]
    while stack:
        node = stack.pop()
        children = [node.child(i) for i in range(node.n_children())]
        stack.extend(children)
        if node.get_type() != isl.schedule_node_type.set:
            continue
        prefix = node.get_prefix_schedule_union_map()
        same = prefix.apply_range(prefix.reverse())
        filters = [c.filter_get_filter() for c in children]
        for i, a in enumerate(filters):
            for j, b in enumerate(filters):
                if i != j:
                    out = out.union(same.intersect_domain(a).intersect_range(b))
    return out


def respects(schedule: isl.Schedule, deps: isl.UnionMap) -> bool:
    return violations(schedule, deps).is_empty()
