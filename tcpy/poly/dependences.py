"""Dependences of a scop: read-after-write, write-after-read and write-after-write,
from isl's dataflow analysis against the original order.

Writes are exact (the left-hand side is indexed by plain indices) and are must-sources;
reads may over-approximate (gathers), so they are may-sources of the anti dependences.
A reduction's self-dependences serialise its reduction loops and leave its left-hand
loops parallel, which is exactly TC's meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.poly.isl_helpers import isl_errors
from tcpy.poly.scop import Kind, Scop


@dataclass(frozen=True, eq=False, slots=True)
class Dependences:
    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap
    reductions: isl.UnionMap  # between instances of one reduction statement

    @property
    def all(self) -> isl.UnionMap:
        return self.raw.union(self.war).union(self.waw).coalesce()

    @property
    def validity(self) -> isl.UnionMap:
        """What every schedule must respect. TC's reductions are associative and
        commutative, and a reduction never reads its target otherwise, so the order of
        a reduction's own updates is free: those dependences constrain parallelism
        (they stay coincidence constraints) but not order."""
        return self.all.subtract(self.reductions).coalesce()


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
        raw = flow(scop.reads, scop.writes, empty)
        war = flow(scop.writes, empty, scop.reads)
        waw = flow(scop.writes, scop.writes, empty)
        reductions = isl.UnionMap.empty(raw.get_space())
        for s in scop.statements:
            if s.kind is Kind.COMPUTE and s.source(scop.cdef).op.is_reduction:
                own = isl.UnionSet.from_set(s.domain)
                every = raw.union(war).union(waw)
                reductions = reductions.union(every.intersect_domain(own).intersect_range(own))
        return Dependences(raw, war, waw, reductions)


def violations(schedule: isl.Schedule, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences whose sink `schedule` does not run strictly after their source.

    `Schedule.get_map()` orders the children of a `set` node as if they were a
    sequence, but a set promises no order (isl's AST generator may run its children in
    any order): a dependence between instances in two children of one set, at the same
    iteration of the loops above it, is a violation however the map orders them."""
    order = schedule.get_map()
    late = deps.subtract(order.lex_lt_union_map(order))
    return late.union(deps.intersect(unordered_pairs(schedule))).coalesce()


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
