"""Schedule-tree transforms. Each takes a schedule and returns a new one.

Every transform keeps the schedule valid for a TC program's dependences; `verify`
checks that claim (the tests run it after every pass).
"""

from __future__ import annotations

from collections.abc import Callable

import islpy as isl

from tcpy.errors import InternalError
from tcpy.poly.dependences import violations
from tcpy.poly.isl_helpers import multi_val, schedule_children, union_set_sets

Rewrite = Callable[[isl.ScheduleNode], isl.ScheduleNode]


def is_band(node: isl.ScheduleNode) -> bool:
    return node.get_type() == isl.schedule_node_type.band


def map_outermost_bands(schedule: isl.Schedule, rewrite: Rewrite) -> isl.Schedule:
    """Apply `rewrite` to every band that has no band above it; `rewrite` returns the
    node at the position of the band it was given."""
    return _map_bands(schedule.get_root(), rewrite, outermost=True).get_schedule()


def map_innermost_bands(schedule: isl.Schedule, rewrite: Rewrite) -> isl.Schedule:
    """Apply `rewrite` to every band that has no band below it."""
    return _map_bands(schedule.get_root(), rewrite, outermost=False).get_schedule()


def has_band_below(node: isl.ScheduleNode) -> bool:
    return any(is_band(c) or has_band_below(c) for c in schedule_children(node))


def _map_bands(node: isl.ScheduleNode, rewrite: Rewrite, outermost: bool) -> isl.ScheduleNode:
    """Walk the subtree at `node`, rewriting the chosen bands; returns the node at the
    same position in the rewritten tree."""
    if is_band(node) and (outermost or not has_band_below(node)):
        return rewrite(node)
    for i in range(node.n_children()):
        node = _map_bands(node.child(i), rewrite, outermost).parent()
    return node


# --- tiling ---------------------------------------------------------------------------


def tile_band(node: isl.ScheduleNode, sizes: tuple[int, ...]) -> isl.ScheduleNode:
    """Tile a permutable band: member k by sizes[k] (0 or missing: not tiled, the loop
    stays whole in the tile band). Returns the tile band; the point band is its child.
    Coincidence and permutability carry over to both bands."""
    n = node.band_n_member()
    padded = [sizes[k] if k < len(sizes) else 0 for k in range(n)]
    if not any(padded) or not node.band_get_permutable():
        return node
    values = [s if s > 0 else 1 for s in padded]
    return node.band_tile(multi_val(node.band_get_space(), values))


def tile_leading_members(node: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """Tile the first `len(sizes)` members of a permutable band by `sizes` (each at
    least 1); the members after them are not tiled and stay whole in the point band.
    Returns the tile band (`len(sizes)` members); the point band, of all the band's
    members, is its child. Both keep the band's coincidence flags and permutability.
    (Tiling such a member by a size no loop should reach instead is unsafe: a
    size-generic schedule that shifts a statement by a size makes the AST generator
    enumerate the whole sentinel range.)"""
    n, t = node.band_n_member(), len(sizes)
    if t == 0 or t > n or min(sizes) < 1 or not node.band_get_permutable():
        raise InternalError(f"tile_leading_members: {sizes} for a band of {n} members")
    if t < n:
        node = node.band_split(t)
    node = node.band_tile(multi_val(node.band_get_space(), sizes))
    if t < n:
        node = _join_child_band(node.child(0)).parent()
    return node


def _join_child_band(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Band `node` and the band that is its only child as one permutable band (the
    caller knows the two are permutable together); returns the joined band."""
    child = node.child(0)
    merged = node.band_get_partial_schedule().flat_range_product(child.band_get_partial_schedule())
    flags = [node.band_member_get_coincident(k) for k in range(node.band_n_member())]
    flags += [child.band_member_get_coincident(k) for k in range(child.band_n_member())]
    node = child.delete().parent().delete().insert_partial_schedule(merged)
    node = node.band_set_permutable(1)
    for k, flag in enumerate(flags):
        node = node.band_member_set_coincident(k, flag)
    return node


def tile_outermost_bands(schedule: isl.Schedule, sizes: tuple[int, ...]) -> isl.Schedule:
    """Tile the outermost band of every loop nest (contract: permutable bands only;
    the tile band keeps the band's coincidence flags, the point band is permutable)."""
    if not any(sizes):
        return schedule
    return map_outermost_bands(schedule, lambda n: tile_band(n, sizes))


# --- distribution, merging, permutation -------------------------------------------------


def distribute_point_bands(schedule: isl.Schedule, deps: isl.UnionMap) -> isl.Schedule:
    """Intra-tile `Min` fusion: a point band (the child of a tile band) whose child is a
    sequence or set is split into one copy per branch, the copies in a sequence, so
    every statement gets its own point loops under the shared tile loops.

    A set promises no order among its branches, but the point band above it may have
    ordered them (a statement at the band's last point after another's earlier
    points); the copies therefore run in an order that respects `deps` among the
    branches, and the band is left alone when no such order exists. The result can
    still break a dependence from a later branch back to an earlier one at a later
    point: the caller keeps it only if it verifies."""

    def sink(node: isl.ScheduleNode) -> isl.ScheduleNode:
        band = node.child(0)
        if not (is_band(band) and band.n_children() == 1):
            return node
        below = band.child(0)
        kind = below.get_type()
        if kind not in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
            return node
        filters = [c.filter_get_filter() for c in schedule_children(below)]
        if kind == isl.schedule_node_type.set:
            order = _dependence_order(filters, deps)
            if order is None:
                return node
            filters = [filters[k] for k in order]
        listed = isl.UnionSetList.alloc(band.get_ctx(), len(filters))
        for f in filters:
            listed = listed.add(f)
        return band.insert_sequence(listed).parent()

    return map_outermost_bands(schedule, sink)


def _dependence_order(filters: list[isl.UnionSet], deps: isl.UnionMap) -> list[int] | None:
    """An order of the branches (given by their filters) in which no dependence runs
    from a later branch to an earlier one, preferring the given order; None if the
    dependences between them form a cycle."""
    n = len(filters)
    after = {
        i: {j for j in range(n) if j != i and not deps.intersect_domain(filters[i])
            .intersect_range(filters[j]).is_empty()}
        for i in range(n)
    }  # fmt: skip
    order: list[int] = []
    waiting = set(range(n))
    while waiting:
        ready = [i for i in sorted(waiting) if not any(i in after[j] for j in waiting)]
        if not ready:
            return None
        order.append(ready[0])
        waiting.remove(ready[0])
    return order


def permute_band(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Reorder the members of a permutable band (member order[k] becomes member k).
    Any order of a permutable band respects the dependences."""
    n = node.band_n_member()
    if sorted(order) != list(range(n)):
        raise InternalError(f"permute_band needs a permutation of {n} members, got {order}")
    if order == list(range(n)):
        return node
    if not node.band_get_permutable():
        raise InternalError("permute_band on a band that is not permutable")
    mupa = node.band_get_partial_schedule()
    coincident = [node.band_member_get_coincident(k) for k in range(n)]
    upas = isl.UnionPwAffList.alloc(node.get_ctx(), n)
    for k in order:
        upas = upas.add(mupa.get_union_pw_aff(k))
    permuted = isl.MultiUnionPwAff.from_union_pw_aff_list(mupa.get_space(), upas)
    node = node.delete().insert_partial_schedule(permuted)
    node = node.band_set_permutable(1)
    for k, old in enumerate(order):
        node = node.band_member_set_coincident(k, coincident[old])
    return node


def merge_child_bands(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Merge into a band the bands directly below it (isl often splits a reduction's
    loops into a band per loop) as long as the combination stays permutable: every
    member runs every dependence that its outer loops leave inside forward. Returns the
    (possibly larger) band at the same position."""
    while node.band_get_permutable() and node.n_children() == 1 and is_band(node.child(0)):
        child = node.child(0)
        if not child.band_get_permutable():
            break
        merged = node.band_get_partial_schedule().flat_range_product(
            child.band_get_partial_schedule()
        )
        if not _forward_in_every_member(node, merged, deps):
            break
        node = _join_child_band(node)
    return node


def _forward_in_every_member(
    node: isl.ScheduleNode, members: isl.MultiUnionPwAff, deps: isl.UnionMap
) -> bool:
    domain = node.get_domain()
    prefix = node.get_prefix_schedule_union_map().intersect_domain(domain)
    local = deps.intersect_domain(domain).intersect_range(domain)
    local = local.intersect(prefix.apply_range(prefix.reverse()))
    if local.is_empty():
        return True
    for k in range(members.dim(isl.dim_type.set)):
        member = isl.UnionMap.from_union_pw_aff(members.get_union_pw_aff(k))
        steps = local.apply_domain(member).apply_range(member).deltas()
        for step in union_set_sets(steps):
            if not step.is_subset(
                isl.Set("{ [d] : d >= 0 }", context=node.get_ctx()).align_params(step.get_space())
            ):
                return False
    return True


# --- verification ----------------------------------------------------------------------


def verify(schedule: isl.Schedule, deps: isl.UnionMap, domain: isl.UnionSet) -> None:
    """Raise InternalError unless `schedule` covers `domain` and runs the source of
    every dependence before its sink."""
    if not schedule.get_domain().is_equal(domain):
        raise InternalError("the schedule does not cover the statement instances exactly")
    violated = violations(schedule, deps)
    if not violated.is_empty():
        raise InternalError(f"the schedule violates dependences: {violated}")
