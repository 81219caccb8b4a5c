"""The polyhedral model of a checked definition (a "scop").

Every TC statement becomes one isl statement `S<k>` whose domain is the box of its
inferred index ranges (lhs indices first, then reduction indices), parametric in the
size symbols; a `!` reduction also gets an initialisation statement `I<k>` over its
left-hand indices, ordered just before it. Accesses are isl maps from statement
instances to tensor elements: exact for affine subscripts, and for any other
subscript (a gather, `%`, an index times a size) every element along that dimension,
which over-approximates safely. A reduction reads the element it updates.

The original order (statements in source order, each over its loops in index order)
is the schedule the dependences are computed against. Statements a rewrite runs
together (`CheckedDef.together`, `tcpy.poly.online`) are ordered inside their shared
loops instead: over their rows, then over the tiles of their `along` index, then in
source order; a statement that runs once per tile has only the tiles' first values in
its domain.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.naming import index_name, size_name, tensor_name
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, Together
from tcpy.parser.linear import Linear, linear_form
from tcpy.poly.isl_helpers import (
    isl_errors,
    linear_text,
    new_context,
    read_set,
    read_union_map,
    sym_str,
)


class Kind(enum.Enum):
    INIT = "init"  # T(lhs) = identity, for the `!` reductions
    COMPUTE = "compute"


@dataclass(frozen=True, eq=False, slots=True)
class PolyStatement:
    name: str  # the isl tuple name: S<k> or I<k>
    kind: Kind
    index: int  # position of the TC statement in the definition
    dims: tuple[str, ...]  # TC index names, in the order of the domain's dimensions
    domain: isl.Set

    def source(self, cdef: CheckedDef) -> CheckedStatement:
        return cdef.statements[self.index]


@dataclass(frozen=True, eq=False, slots=True)
class Scop:
    cdef: CheckedDef
    ctx: isl.Context
    params: tuple[str, ...]  # the size symbols, as TC names them
    context: isl.Set  # what holds of the sizes at every call
    statements: tuple[PolyStatement, ...]
    domain: isl.UnionSet
    reads: isl.UnionMap
    writes: isl.UnionMap
    order: isl.UnionMap  # the original (source-order) schedule
    sizes: Mapping[str, int] | None  # the sizes fixed before scheduling, if any

    @property
    def isl_params(self) -> tuple[str, ...]:
        """The size symbols as isl's parameters are named."""
        return tuple(size_name(p) for p in self.params)

    def statement(self, name: str) -> PolyStatement:
        for s in self.statements:
            if s.name == name:
                return s
        raise KeyError(name)


def build_scop(cdef: CheckedDef, sizes: Mapping[str, int] | None = None) -> Scop:
    """The scop of `cdef`; with `sizes`, every size symbol is fixed to its value."""
    ctx = new_context()
    params = tuple(size_name(p) for p in cdef.size_symbols)
    with isl_errors(f"building the polyhedral model of {cdef.name}"):
        statements: list[PolyStatement] = []
        reads: list[str] = []
        writes: list[str] = []
        for k, st in enumerate(cdef.statements):
            if st.op.initializes:
                assert cdef.group_of(k) is None, "a statement run together has no `!`"
                statements.append(_statement(ctx, params, f"I{k}", Kind.INIT, k, st, st.indices))
                writes.append(_lhs_access(cdef, f"I{k}", st))
            compute = _statement(ctx, params, f"S{k}", Kind.COMPUTE, k, st, st.all_indices)
            statements.append(_once_per_tile(cdef, compute, params))
            writes.append(_lhs_access(cdef, f"S{k}", st))
            if st.op.is_reduction:
                reads.append(_lhs_access(cdef, f"S{k}", st))
            reads.extend(_read_accesses(cdef, f"S{k}", st))

        context = read_set(ctx, params, ": " + _context_constraints(cdef))
        if sizes is not None:
            values = " and ".join(f"{size_name(p)} = {sizes[p]}" for p in cdef.size_symbols)
            context = context.intersect(read_set(ctx, params, ": " + (values or "true")))
        domain = isl.UnionSet.empty(context.get_space())
        for s in statements:
            domain = domain.union(isl.UnionSet.from_set(s.domain.intersect_params(context)))
        depth = max((len(s.dims) for s in statements), default=0)
        first = _first_positions(cdef, statements)
        order = read_union_map(
            ctx, params,
            "; ".join(_order(pos, s, depth, cdef, first) for pos, s in enumerate(statements)),
        )  # fmt: skip
        read_map = read_union_map(ctx, params, "; ".join(reads)).intersect_domain(domain)
        write_map = read_union_map(ctx, params, "; ".join(writes)).intersect_domain(domain)
    return Scop(
        cdef=cdef,
        ctx=ctx,
        params=cdef.size_symbols,
        context=context,
        statements=tuple(
            PolyStatement(s.name, s.kind, s.index, s.dims, s.domain.intersect_params(context))
            for s in statements
        ),
        domain=domain,
        reads=read_map,
        writes=write_map,
        order=order.intersect_domain(domain),
        sizes=dict(sizes) if sizes is not None else None,
    )


def _statement(
    ctx: isl.Context,
    params: tuple[str, ...],
    name: str,
    kind: Kind,
    index: int,
    st: CheckedStatement,
    dims: tuple[str, ...],
) -> PolyStatement:
    constraints = []
    for v in dims:
        r = st.range_of(v)
        constraints.append(f"{sym_str(r.lo)} <= {index_name(v)} < {sym_str(r.hi)}")
    body = f"{name}[{', '.join(map(index_name, dims))}]"
    if constraints:
        body += " : " + " and ".join(constraints)
    return PolyStatement(name, kind, index, dims, read_set(ctx, params, body))


def _tuple(name: str, dims: tuple[str, ...]) -> str:
    return f"{name}[{', '.join(map(index_name, dims))}]"


def _lhs_access(cdef: CheckedDef, stmt: str, st: CheckedStatement) -> str:
    target = st.target
    if target is not None:  # a scatter-add: affine, or anywhere along a gathered subscript
        return _access(cdef, stmt, st, target)
    dims = st.indices if stmt.startswith("I") else st.all_indices
    lhs = ", ".join(map(index_name, st.indices))
    return f"{_tuple(stmt, dims)} -> {tensor_name(st.tensor)}[{lhs}]"


def linear_str(lin: Linear) -> str:
    rest = sym_str(lin.rest)
    text = linear_text([(c, index_name(v)) for v, c in lin.coeffs], 0)
    if not lin.coeffs:
        return rest
    return text if rest == "0" else f"{text} + {rest}"


def _read_accesses(cdef: CheckedDef, stmt: str, st: CheckedStatement) -> list[str]:
    """The reads of `st` (a scatter-add's target is read as a reduction's, apart)."""
    nodes = [n for e in (st.rhs, *st.scatter) for n in ast.walk(e) if isinstance(n, ast.Access)]
    return [_access(cdef, stmt, st, n) for n in nodes]


def _access(cdef: CheckedDef, stmt: str, st: CheckedStatement, node: ast.Access) -> str:
    """The elements `node` reaches from each instance of `st`: a subscript that is
    not affine (a gather) may reach any element of its dimension."""
    subscripts, free = [], []
    for k, arg in enumerate(node.args):
        lin = linear_form(arg)
        if lin is None:
            name = f"_o{k}"
            extent = cdef.tensor(node.tensor).shape[k]
            subscripts.append(name)
            free.append(f"0 <= {name} < {sym_str(extent)}")
        else:
            subscripts.append(linear_str(lin))
    target = f"{tensor_name(node.tensor)}[{', '.join(subscripts)}]"
    text = f"{_tuple(stmt, st.all_indices)} -> {target}"
    if free:
        text += " : " + " and ".join(free)
    return text


def _context_constraints(cdef: CheckedDef) -> str:
    """Sizes are positive and every range is non-empty: the call-time checks ensure it."""
    facts = [f"{size_name(p)} >= 1" for p in cdef.size_symbols]
    for st in cdef.statements:
        for r in st.ranges:
            if r.lo.symbols() or r.hi.symbols():
                facts.append(f"{sym_str(r.hi)} > {sym_str(r.lo)}")
    return " and ".join(facts) or "true"


def _once_per_tile(cdef: CheckedDef, s: PolyStatement, params: tuple[str, ...]) -> PolyStatement:
    """`s`, its domain cut to the first value of each tile where it runs once per
    tile of the statements it runs together with."""
    group = cdef.group_of(s.index)
    member = None if group is None else group.member(s.index)
    if group is None or member is None or not group.once[member]:
        return s
    along = index_name(group.along[member])
    tuple_ = _tuple(s.name, s.dims)
    first = f"{{ {tuple_} : exists e: {along} = {sym_str(group.lo)} + {group.width} * e }}"
    tiles = isl.Set.read_from_str(s.domain.get_ctx(), f"[{', '.join(params)}] -> {first}")
    return PolyStatement(s.name, s.kind, s.index, s.dims, s.domain.intersect(tiles))


def tile_of(group: Together, along: str) -> str:
    """The tile of `group` that the value of index `along` (as isl names it) is in."""
    return f"floor(({along} - ({sym_str(group.lo)})) / {group.width})"


def block_of(group: Together, row: str) -> str:
    """The block of `group`'s rows that the value of its last row `row` is in."""
    return f"floor(({row} - ({sym_str(group.block_lo)})) / {group.block})"


def _first_positions(cdef: CheckedDef, statements: list[PolyStatement]) -> dict[int, int]:
    """The position in `statements` of the first of each group run together, by the
    group's first statement."""
    first: dict[int, int] = {}
    for pos, s in enumerate(statements):
        group = cdef.group_of(s.index)
        if group is not None:
            first.setdefault(group.start, pos)
    return first


def _order(
    pos: int, s: PolyStatement, depth: int, cdef: CheckedDef, first: Mapping[int, int]
) -> str:
    """`s`'s instances -> their place in the original order: [its position, its indices]
    or, run together with others, [the group's position, rows, tile, its position,
    its other indices], padded to one length (`depth` indices, and 2 more where some
    statements run together)."""
    group = cdef.group_of(s.index)
    names = [index_name(d) for d in s.dims]
    if group is None:
        dims = [str(pos), *names]
    else:
        along = index_name(group.along[s.index - group.start])
        rows, rest = names[: group.rows], names[group.rows :]
        dims = [str(first[group.start]), *rows, tile_of(group, along), str(pos), *rest]
    dims += ["0"] * (depth + (3 if cdef.together else 1) - len(dims))
    return f"{_tuple(s.name, s.dims)} -> [{', '.join(dims)}]"


def instances(cdef: CheckedDef, sizes: Mapping[str, int]) -> int:
    """How many statement instances `cdef` runs at `sizes` (an initialisation's
    included): the work its iteration domains hold. Each domain is the box of its
    statement's ranges (`build_scop`), so its size is the product of their extents,
    counted so rather than by isl, whose count of a domain of five or more dimensions
    can pass the context's operation budget; a statement that runs once per tile
    (`_once_per_tile`) counts one value of its tiled index per tile."""
    total = 0
    for k, st in enumerate(cdef.statements):
        extent = {r.var: max(0, r.hi.evaluate(sizes) - r.lo.evaluate(sizes)) for r in st.ranges}
        group = cdef.group_of(k)
        member = None if group is None else group.member(k)
        if group is not None and member is not None and group.once[member]:
            along = group.along[member]
            extent[along] = -(-extent[along] // group.width)
        if st.op.initializes:
            total += math.prod(extent[v] for v in st.indices)
        total += math.prod(extent[v] for v in st.all_indices)
    return total
