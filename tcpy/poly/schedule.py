"""Scheduling: isl's scheduler under a TC fusion strategy, and the fallback order.

Proximity and coincidence constraints are all the dependences. Under `Min` fusion,
validity leaves out the order among a reduction's own updates (TC reductions are
associative and commutative), which lets all of a reduction's loops form one
permutable band (a convolution's seven loops, for tiling and interchange); the fused
strategies keep every dependence as validity, which isl's fusion needs. Stock isl
has no fusion callback, so the three strategies are context options:

- `Min`: `schedule_serialize_sccs`: every statement gets its own loop nest over all
  its indices (softmax becomes five nests; a matmul's reduction keeps its three loops
  in one permutable band, ready for 3-D tiling).
- `Preserve3Coincident`: `schedule_outer_coincidence` with whole components: fuse
  only while the outer loops stay parallel (softmax fuses per row `n`, each statement
  keeping its own inner `d` loop; a matmul's initialisation joins the `m, n` loops).
- `Max`: whole components without the coincidence requirement: fuse as much as the
  dependences allow (an MLP layer's product, bias and ReLU share the `b, n` loops).

All three forbid constant shifts (`schedule_max_constant_term = 0`), so that fusion
never concatenates loops by offsetting them.

TC's `allow_skewing` and `positive_orthant` have no isl switch either: `acceptable`
tells whether a schedule combines indices in one loop (when skewing is not allowed) or
runs an index backwards (in the positive orthant); `tcpy.poly.analysis` then falls back
to the schedule that serialises every statement, and if that one breaks the rule too,
to `original_order`, which always respects the dependences of a TC program.
"""

from __future__ import annotations

import islpy as isl

from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser.checked import Together
from tcpy.poly.dependences import Dependences
from tcpy.poly.isl_helpers import list_items, schedule_children, sym_str, union_map_maps
from tcpy.poly.scop import PolyStatement, Scop, block_of, tile_of


def isl_schedule(scop: Scop, deps: Dependences, fusion: Fusion) -> isl.Schedule:
    """isl's schedule of `scop` under a fusion strategy (the caller bounds its time:
    `tcpy.poly.analysis`)."""
    ctx = scop.ctx
    ctx.reset_operations()
    ctx.set_schedule_serialize_sccs(1 if fusion is Fusion.MIN else 0)
    ctx.set_schedule_outer_coincidence(1 if fusion is Fusion.PRESERVE3_COINCIDENT else 0)
    ctx.set_schedule_maximize_band_depth(0)
    ctx.set_schedule_whole_component(0 if fusion is Fusion.MIN else 1)
    ctx.set_schedule_treat_coalescing(1)
    ctx.set_schedule_max_constant_term(0)
    every = deps.all
    # Freeing a reduction's update order lets its loops form one band; isl's fusion
    # heuristics, though, fuse per row only with the full constraints.
    validity = deps.validity if fusion is Fusion.MIN else every
    if scop.sizes is not None:
        return _without_sizes(scop, validity, every)
    constraints = (
        isl.ScheduleConstraints.on_domain(scop.domain)
        .set_context(scop.context)
        .set_validity(validity)
        .set_proximity(every)
        .set_coincidence(every)
    )
    return constraints.compute_schedule()


def _without_sizes(scop: Scop, validity: isl.UnionMap, every: isl.UnionMap) -> isl.Schedule:
    """isl's schedule of a scop whose sizes are fixed, computed with the sizes as the
    numbers they are rather than as parameters: a parameter fixed to 768 is a constant
    isl's bound on constant terms does not see, and the scheduler would otherwise fuse
    a layer norm's row loops by shifting each statement by a multiple of the row
    length (`n + 2*D`), one loop of three rows' lengths where there are three loops."""
    n = scop.context.dim(isl.dim_type.param)
    domain = scop.domain.project_out(isl.dim_type.param, 0, n)
    validity, every = (m.project_out(isl.dim_type.param, 0, n) for m in (validity, every))
    constraints = (
        isl.ScheduleConstraints.on_domain(domain)
        .set_validity(validity)
        .set_proximity(every)
        .set_coincidence(every)
    )
    schedule = constraints.compute_schedule()
    return schedule.align_params(scop.context.get_space()).intersect_domain(scop.domain)


def acceptable(schedule: isl.Schedule, options: MappingOptions) -> bool:
    """Whether `schedule` obeys the skewing and positive-orthant options."""
    if options.allow_skewing and not options.positive_orthant:
        return True
    for node in bands(schedule):
        for member in range(node.band_n_member()):
            upa = node.band_get_partial_schedule().get_union_pw_aff(member)
            for _name, coefficients in pieces(upa):
                nonzero = [c for c in coefficients if c != 0]
                if not options.allow_skewing and len(nonzero) > 1:
                    return False
                if options.positive_orthant and any(c < 0 for c in nonzero):
                    return False
    return True


def pieces(upa: isl.UnionPwAff) -> list[tuple[str, list[int]]]:
    """Each piece of a union of affine functions as (statement name, coefficients of
    the statement's indices). No isl callbacks: they would swallow exceptions."""
    out = []
    for pa in list_items(upa.get_pw_aff_list()):
        for _set, aff in pa.get_pieces():
            name = aff.get_domain_space().get_tuple_name(isl.dim_type.set)
            n = aff.dim(isl.dim_type.in_)
            coefficients = [
                aff.get_coefficient_val(isl.dim_type.in_, i).to_python() for i in range(n)
            ]
            out.append((name, coefficients))
    return out


def member_variables(node: isl.ScheduleNode, member: int) -> dict[str, int | None]:
    """For each statement under a band, the position of the statement index that band
    member `member` walks (a unit coefficient on one index, nothing else varying),
    or None when the member combines indices or is constant."""
    out: dict[str, int | None] = {}
    upa = node.band_get_partial_schedule().get_union_pw_aff(member)
    for name, coefficients in pieces(upa):
        used = [i for i, c in enumerate(coefficients) if c != 0]
        found = used[0] if len(used) == 1 and abs(coefficients[used[0]]) == 1 else None
        out[name] = found if out.get(name, found) == found else None
    return out


def member_extent(node: isl.ScheduleNode, member: int, at: isl.Set | None = None) -> int | None:
    """How many values band member `member` takes over the instances reaching the band
    (max - min + 1), when the sizes are fixed, or at the sizes `at` (a set of the
    parameters); None when it depends on them."""
    upa = node.band_get_partial_schedule().get_union_pw_aff(member)
    domain = node.get_domain()
    if at is not None:
        domain = domain.intersect_params(at.align_params(domain.get_space()))
    upa = upa.intersect_domain(domain)
    lo, hi = upa.min_val(), upa.max_val()
    if not (lo.is_int() and hi.is_int()):
        return None
    return int(hi.to_python()) - int(lo.to_python()) + 1


def bands(schedule: isl.Schedule) -> list[isl.ScheduleNode]:
    """Every band node of a schedule tree, outermost first."""
    found: list[isl.ScheduleNode] = []
    stack = [schedule.get_root()]
    while stack:
        node = stack.pop()
        if node.get_type() == isl.schedule_node_type.band:
            found.append(node)
        stack.extend(reversed(list(schedule_children(node))))
    return found


def original_order(scop: Scop, deps: Dependences, rows_first: bool = False) -> isl.Schedule:
    """Statements in source order, each with one band over its own indices in their
    original order (lhs indices, then reductions). A member is coincident when no
    dependence of the statement on itself changes its index, whatever the others do:
    the band is permutable, and tiling or reordering it must not make a member
    parallel that only an outer one kept in order (a scatter-add's `h` and `k` in
    `Y(2*h + k) += ...`). Statements run together (`CheckedDef.together`) are one
    child: a band over their rows and tiles, then each of them in order (`_together`);
    with `rows_first` (the GPU's row kernels over tiles), a band over their rows alone,
    taking in the statements of each row just before and after them (`_rows_first`)."""
    scop.ctx.reset_operations()
    every = deps.raw.union(deps.war).union(deps.waw)  # not coalesced: that can pass the budget
    children = _children(scop)
    if rows_first:
        children = _absorbed(scop, every, children)
    schedule = isl.Schedule.from_domain(scop.domain)
    root = schedule.get_root().child(0)
    filters = isl.UnionSetList.alloc(scop.ctx, len(children))
    for members in children:
        filters = filters.add(_union(members))
    node = root.insert_sequence(filters)
    for pos, members in enumerate(children):
        child = node.child(pos).child(0)
        if len(members) == 1 and scop.cdef.group_of(members[0].index) is None:
            child = _own_band(scop, every, members[0], child, tuple(range(len(members[0].dims))))
        elif rows_first and _rows_apart(scop, every, members, _group_rows(scop, members)):
            child = _rows_first(scop, every, members, child)
        else:
            child = _together(scop, every, members, child)
        node = child.parent().parent()
    return node.get_schedule()


def _absorbed(
    scop: Scop, every: isl.UnionMap, children: list[list[PolyStatement]]
) -> list[list[PolyStatement]]:
    """`children` with each group run together joined by the statements alone just
    before and after it that run over its rows (a chain's initialisations, its last
    statements), as long as no dependence among them all crosses rows."""
    out = list(children)
    for group in scop.cdef.together:
        g = next(k for k, c in enumerate(out) if scop.cdef.group_of(c[0].index) is group)
        lo, hi = g, g + 1
        while lo > 0 and _over_rows(scop, out[lo - 1], group.rows):
            lo -= 1
        while hi < len(out) and _over_rows(scop, out[hi], group.rows):
            hi += 1
        while (lo, hi) != (g, g + 1):
            joined = [s for c in out[lo:hi] for s in c]
            if _rows_apart(scop, every, joined, group.rows):
                break
            lo, hi = (lo + 1, hi) if lo < g else (lo, hi - 1)  # the farthest let go first
        out[lo:hi] = [[s for c in out[lo:hi] for s in c]]
    return out


def _group_rows(scop: Scop, members: list[PolyStatement]) -> int:
    """The rows of the group among `members`."""
    return next(g.rows for s in members if (g := scop.cdef.group_of(s.index)) is not None)


def _over_rows(scop: Scop, child: list[PolyStatement], rows: int) -> bool:
    """Whether `child` is one statement alone with at least `rows` indices."""
    return (
        len(child) == 1
        and scop.cdef.group_of(child[0].index) is None
        and (len(child[0].dims) >= rows)
    )


def _rows_apart(
    scop: Scop, every: isl.UnionMap, statements: list[PolyStatement], rows: int
) -> bool:
    """Whether no dependence among `statements` joins instances of different rows
    (their first `rows` indices)."""
    found = _distances(every, _leading(scop, statements, rows), statements)
    zero = isl.Set.universe(found.get_space())
    for k in range(rows):
        zero = zero.fix_val(isl.dim_type.set, k, isl.Val.zero(scop.ctx))
    return found.is_subset(zero)


def _rows_first(
    scop: Scop, every: isl.UnionMap, members: list[PolyStatement], node: isl.ScheduleNode
) -> isl.ScheduleNode:
    """`node` (the child of a group run together with the statements it took in,
    `_absorbed`) with a band over their rows (coincident: no dependence crosses them),
    then in order: each statement taken in over its other indices, and the group, a
    band over its tiles, then each of its statements over its indices but the rows
    (and but its tile's index where it runs once per tile), the tiled index as its
    place in its tile."""
    group = next(g for s in members if (g := scop.cdef.group_of(s.index)) is not None)
    rows = group.rows
    node = node.insert_partial_schedule(_leading(scop, members, rows))
    node = node.band_set_permutable(1)
    for k in range(rows):
        node = node.band_member_set_coincident(k, 1)
    parts = [[s] for s in members if group.member(s.index) is None]
    inside = [s for s in members if group.member(s.index) is not None]
    parts.insert(sum(s.index < group.start for s in members), inside)
    filters = isl.UnionSetList.alloc(scop.ctx, len(parts))
    for part in parts:
        filters = filters.add(_union(part))
    node = node.child(0).insert_sequence(filters)
    for pos, part in enumerate(parts):
        child = node.child(pos).child(0)
        if part is inside:
            child = _tiles(scop, every, inside, child, group)
        else:
            child = _own_band(scop, every, part[0], child, tuple(range(rows, len(part[0].dims))))
        node = child.parent().parent()
    return node.parent()


def _leading(scop: Scop, statements: list[PolyStatement], rows: int) -> isl.MultiUnionPwAff:
    """The statements -> their first `rows` indices."""
    pieces = []
    for s in statements:
        names = [f"i{d}" for d in range(len(s.dims))]
        pieces.append(f"{s.name}[{', '.join(names)}] -> [{', '.join(names[:rows])}]")
    return partial_schedule(scop, pieces)


def partial_schedule(scop: Scop, pieces: list[str]) -> isl.MultiUnionPwAff:
    """The partial schedule of maps `pieces` (`S[i0, ..] -> [..]`, one per statement)."""
    params = ", ".join(scop.isl_params)
    text = f"[{params}] -> {{ {'; '.join(pieces)} }}"
    return isl.MultiUnionPwAff.from_union_map(isl.UnionMap.read_from_str(scop.ctx, text))


def _tiles(
    scop: Scop,
    every: isl.UnionMap,
    inside: list[PolyStatement],
    node: isl.ScheduleNode,
    group: Together,
) -> isl.ScheduleNode:
    """`node` (below the rows, the group's child) with a band over the group's tiles,
    then each of its statements in order over its indices but the rows."""
    # in order: a tile's sums feed the next
    node = node.insert_partial_schedule(group_tiles(scop, group, inside))
    filters = isl.UnionSetList.alloc(scop.ctx, len(inside))
    for s in inside:
        filters = filters.add(isl.UnionSet.from_set(s.domain))
    node = node.child(0).insert_sequence(filters)
    for pos, s in enumerate(inside):
        node = _member_band(scop, every, s, group, group.rows, node.child(pos).child(0))
        node = node.parent().parent()
    return node.parent()


def _children(scop: Scop) -> list[list[PolyStatement]]:
    """The statements in source order, those run together in one list."""
    children: list[list[PolyStatement]] = []
    last = None
    for s in scop.statements:
        group = scop.cdef.group_of(s.index)
        if group is not None and group is last:
            children[-1].append(s)
        else:
            children.append([s])
        last = group
    return children


def _union(statements: list[PolyStatement]) -> isl.UnionSet:
    domain = isl.UnionSet.from_set(statements[0].domain)
    for s in statements[1:]:
        domain = domain.union(isl.UnionSet.from_set(s.domain))
    return domain


def _own_band(
    scop: Scop, every: isl.UnionMap, s: PolyStatement, node: isl.ScheduleNode, dims: tuple[int, ...]
) -> isl.ScheduleNode:
    """`node` with a band over `s`'s indices at `dims` inserted (none: unchanged)."""
    if not dims:
        return node
    return _permutable_band(scop, every, s, node, identity_band(s, dims), dims)


def _permutable_band(
    scop: Scop,
    every: isl.UnionMap,
    s: PolyStatement,
    node: isl.ScheduleNode,
    band: isl.MultiUnionPwAff,
    dims: tuple[int, ...],
) -> isl.ScheduleNode:
    """`node` with `band` (over `s`'s indices at `dims`) inserted, permutable, each
    member coincident unless a dependence of `every` is carried along its index."""
    node = node.insert_partial_schedule(band)
    node = node.band_set_permutable(1)
    for member, d in enumerate(dims):
        carried = _carries(scop.ctx, every, s.name, d)
        node = node.band_member_set_coincident(member, 0 if carried else 1)
    return node


def _together(
    scop: Scop, every: isl.UnionMap, members: list[PolyStatement], node: isl.ScheduleNode
) -> isl.ScheduleNode:
    """`node` (the child of statements run together) with a band over their rows and
    tiles, its rows coincident, and below it each statement in order with a band over
    its indices but the rows (and but its tile's index where it runs once per tile);
    the last row in blocks where the group says so, the block's rows then the first
    member of each statement's band."""
    group = scop.cdef.group_of(members[0].index)
    assert group is not None
    band = _rows_and_tiles(scop, members)
    node = node.insert_partial_schedule(band)  # not permutable: the tiles stay inside
    distances = _distances(every, band, members)
    for position in range(group.rows + 1):
        fixed = distances.is_subset(_zero_at(distances.get_space(), position))
        node = node.band_member_set_coincident(position, 1 if fixed else 0)
    filters = isl.UnionSetList.alloc(scop.ctx, len(members))
    for s in members:
        filters = filters.add(isl.UnionSet.from_set(s.domain))
    node = node.child(0).insert_sequence(filters)
    first = group.rows - 1 if group.block > 1 else group.rows  # a block's rows
    for pos, s in enumerate(members):
        node = _member_band(scop, every, s, group, first, node.child(pos).child(0))
        node = node.parent().parent()
    return node.parent()


def _member_band(
    scop: Scop,
    every: isl.UnionMap,
    s: PolyStatement,
    group: Together,
    first: int,
    node: isl.ScheduleNode,
) -> isl.ScheduleNode:
    """`node` (the leaf of group member `s`) with a band over its indices from `first`
    on, but its tile's index where it runs once per tile, each as its place within its
    tile and block (`within_tile`); returns the node at `node`'s position."""
    member = group.member(s.index)
    assert member is not None
    along = s.dims.index(group.along[member])
    dims = tuple(d for d in range(first, len(s.dims)) if not (group.once[member] and d == along))
    if dims:
        node = _permutable_band(scop, every, s, node, within_tile(scop, s, dims, group), dims)
    return node


def group_tiles(
    scop: Scop, group: Together, statements: list[PolyStatement]
) -> isl.MultiUnionPwAff:
    """Group members `statements` -> [the tile of their index the tiles cut]."""
    pieces = []
    for s in statements:
        k = group.member(s.index)
        assert k is not None
        names = [f"i{d}" for d in range(len(s.dims))]
        along = names[s.dims.index(group.along[k])]
        pieces.append(f"{s.name}[{', '.join(names)}] -> [{tile_of(group, along)}]")
    return partial_schedule(scop, pieces)


def within_tile(
    scop: Scop, s: PolyStatement, dims: tuple[int, ...], group: Together
) -> isl.MultiUnionPwAff:
    """`s` -> its indices at `dims`, the tiled one and a blocked row as their place
    within their tile and block (loops of constant bounds, the tile's origin in the
    subscripts, as a block of rows fused over them has)."""
    names = [f"i{d}" for d in range(len(s.dims))]
    member = group.member(s.index)
    assert member is not None
    along = s.dims.index(group.along[member])
    out = []
    for d in dims:
        if d == along:
            out.append(f"({names[d]} - ({sym_str(group.lo)})) mod {group.width}")
        elif group.block > 1 and d == group.rows - 1:
            out.append(f"({names[d]} - ({sym_str(group.block_lo)})) mod {group.block}")
        else:
            out.append(names[d])
    return partial_schedule(scop, [f"{s.name}[{', '.join(names)}] -> [{', '.join(out)}]"])


def _rows_and_tiles(scop: Scop, members: list[PolyStatement]) -> isl.MultiUnionPwAff:
    """The statements -> [their rows, the tile of their `along` index]."""
    group = scop.cdef.group_of(members[0].index)
    assert group is not None
    pieces = []
    for s in members:
        member = group.member(s.index)
        assert member is not None
        names = [f"i{d}" for d in range(len(s.dims))]
        along = names[s.dims.index(group.along[member])]
        rows = names[: group.rows]
        if group.block > 1:
            rows[-1] = block_of(group, rows[-1])
        out = [*rows, tile_of(group, along)]
        pieces.append(f"{s.name}[{', '.join(names)}] -> [{', '.join(out)}]")
    params = ", ".join(scop.isl_params)
    text = f"[{params}] -> {{ {'; '.join(pieces)} }}"
    return isl.MultiUnionPwAff.from_union_map(isl.UnionMap.read_from_str(scop.ctx, text))


def _distances(
    every: isl.UnionMap, band: isl.MultiUnionPwAff, members: list[PolyStatement]
) -> isl.Set:
    """The differences of `band`'s values between the ends of each dependence among
    `members`."""
    domain = _union(members)
    among = every.intersect_domain(domain).intersect_range(domain)
    as_map = isl.UnionMap.from_multi_union_pw_aff(band)
    deltas = among.apply_domain(as_map).apply_range(as_map).deltas()
    found = deltas.extract_set(isl.Space.set_alloc(band.get_ctx(), 0, band.dim(isl.dim_type.set)))
    return found


def _zero_at(space: isl.Space, member: int) -> isl.Set:
    return isl.Set.universe(space).fix_val(isl.dim_type.set, member, isl.Val.zero(space.get_ctx()))


def identity_band(s: PolyStatement, dims: tuple[int, ...] | None = None) -> isl.MultiUnionPwAff:
    """Statement `s` -> its indices at positions `dims` (default: all), in order: the
    partial schedule of a band over them."""
    space = s.domain.get_space()
    maff = isl.MultiAff.identity(space.map_from_set())
    for d in reversed(range(len(s.dims))):
        if dims is not None and d not in dims:
            maff = maff.drop_dims(isl.dim_type.out, d, 1)
    return isl.MultiUnionPwAff.from_multi_pw_aff(isl.MultiPwAff.from_multi_aff(maff))


def _carries(ctx: isl.Context, deps: isl.UnionMap, stmt: str, member: int) -> bool:
    """Whether some dependence from `stmt` to itself changes index `member`; taken to,
    when isl cannot tell within its operation budget (this is the schedule of last
    resort, which must not fail)."""
    try:
        for m in union_map_maps(deps):
            same = m.get_tuple_name(isl.dim_type.in_) == m.get_tuple_name(isl.dim_type.out)
            if not same or m.get_tuple_name(isl.dim_type.in_) != stmt:
                continue
            kept = isl.Map.universe(m.get_space()).equate(
                isl.dim_type.in_, member, isl.dim_type.out, member
            )
            if not m.is_subset(kept):
                return True
        return False
    except isl.Error:
        ctx.reset_operations()
        return True
