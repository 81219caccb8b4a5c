"""Where a read's adjoint goes: the forward's indices solved for the read's subscripts.

The adjoint of a read `X(a_1, ..., a_m)` in a statement over indices V is
`dX(x_1, ..., x_m) += sum over the instances of V where a_k = x_k of its adjoint`. The
backward writes it as a gather, with no race (the rule of Halide's autodiff): each
subscript that is an index alone names its dimension (`A(m, k)` gives `dA(m, k)`); of
an affine subscript, an index of coefficient +-1 is solved for (`h + kh = y` gives
`h = y - kh`, preferring the indices of the statement's left-hand side, so that the
sum stays over the short window `kh`); a subscript with nothing left to solve, or
not affine (a gather `E(idx(b), d)`, a stride `2*h + kh`), becomes an equality. The
indices left over are the backward statement's reductions, over their forward ranges;
each solved index must lie in its forward range, and each equality hold: a guard (`?:`)
zeroes the instances where they do not, so no read leaves its tensor."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tcpy.autodiff import build as b
from tcpy.errors import Span
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, IndexRange
from tcpy.parser.linear import Linear, linear_form
from tcpy.parser.symbolic import Sym

FRESH = ("y", "x", "z", "u", "v", "w", "p", "q", "r", "s", "t")
"""Names for the indices of an adjoint's dimensions that no forward index names."""


@dataclass(frozen=True)
class Solved:
    """Where the adjoint of a read goes: the indices of its dimensions, the value of
    each forward index in them and the indices left over (`values`), the ranges of
    the left-over indices, and the guard the instances must pass (None: all do)."""

    dims: tuple[str, ...]
    values: dict[str, ast.Expr]
    free: tuple[IndexRange, ...]
    guard: ast.Expr | None
    unsolved: bool = False  # the guard holds an equality or a stride's divisibility
    bounded: tuple[str, ...] = ()  # the forward indices the guard keeps in their ranges


def solve(
    st: CheckedStatement, args: tuple[ast.Expr, ...], shape: tuple[Sym, ...], taken: set[str]
) -> Solved:
    """The read of subscripts `args` in `st`, of a tensor of `shape`, solved for its
    dimensions (see the module). `taken`: names an index must not have."""
    span = st.span
    dims = _dim_names(st, args, taken)
    forms = [linear_form(a) for a in args]
    values: dict[str, Linear] = {d: _var(d) for d in dims if d in st.all_indices}
    divided: dict[str, ast.Expr] = {}  # indices solved by a division: `(y - kh) / 2`
    conditions: list[ast.Expr] = []  # equalities and divisibility, before substitution
    for k in _by_ease(forms, dims, values):
        form = forms[k]
        here = None if form is None else _apply(form, values)
        if here is None or set(here.variables) & set(divided):  # not affine (a gather)
            target = b.substitute(args[k], {v: b.linear(f, span) for v, f in values.items()})
            conditions.append(b.binary(ast.BinaryOp.EQ, ast.Index(dims[k], span), target))
            continue
        unknown = _pick(here, {*values, *divided}, st)
        if unknown is None:
            equal = b.binary(ast.BinaryOp.EQ, ast.Index(dims[k], span), b.linear(here, span))
            conditions.append(equal)
            continue
        c = here.coeff(unknown)
        rest = here + _var(unknown).scale(-c)
        offset = _var(dims[k]) + rest.scale(-1)  # c * unknown
        if abs(c) == 1:
            solved = offset.scale(c)
            values = {v: _apply(f, {unknown: solved}) for v, f in values.items()}
            values[unknown] = solved
        else:  # a stride: the instances where c divides the offset
            numerator = b.linear(offset, span)
            zero = b.num(0, span)
            remainder = b.binary(ast.BinaryOp.MOD, numerator, b.num(c, span))
            conditions.append(b.binary(ast.BinaryOp.EQ, remainder, zero))
            divided[unknown] = b.binary(ast.BinaryOp.DIV, numerator, b.num(c, span))
    exprs = _resolved(values, divided, span)
    guard = None
    bounded = []
    for var in [*values, *divided]:
        at = dims.index(var) if var in dims else None
        r = st.range_of(var)
        form = values.get(var)
        whole = at is not None and form == _var(var) and r.lo == Sym.of(0) and r.hi == shape[at]
        if not whole:
            guard = b.both(guard, _within(exprs[var], r))
            bounded.append(var)
    # the equalities last: a gathered subscript's read is then made only where every
    # solved index is in its range (`&&` stops before it)
    for e in conditions:  # in the indices left over, where some were solved since
        guard = b.both(guard, b.simplified(b.substitute(e, exprs)))
    free = tuple(r for r in st.ranges if r.var not in exprs)
    return Solved(tuple(dims), exprs, free, guard, bool(conditions), tuple(bounded))


def _resolved(
    values: dict[str, Linear], divided: dict[str, ast.Expr], span: Span
) -> dict[str, ast.Expr]:
    """The value of every solved index in the indices left over and the dimensions'
    (each solution substituted into those made before it)."""
    raw = {v: b.linear(f, span) for v, f in values.items()} | divided
    out: dict[str, ast.Expr] = {}

    def value(v: str, depth: int = 0) -> ast.Expr:
        if v not in out:
            uses = {n.name for n in ast.walk(raw[v]) if isinstance(n, ast.Index)}
            inner = {u: value(u, depth + 1) for u in uses & raw.keys() - {v}}
            out[v] = b.simplified(b.substitute(raw[v], inner)) if inner else raw[v]
        return out[v]

    for v in raw:
        value(v)
    return out


def _dim_names(st: CheckedStatement, args: tuple[ast.Expr, ...], taken: set[str]) -> list[str]:
    """A name for each dimension of the adjoint: the index a subscript is alone (its
    first such dimension), else a fresh one."""
    used = set(taken) | set(st.all_indices)
    names: list[str] = []
    for a in args:
        if isinstance(a, ast.Index) and a.name not in names:
            names.append(a.name)
            continue
        fresh = next((n for n in FRESH if n not in used), None)
        if fresh is None:
            fresh = next(f"i{k}" for k in range(len(used) + 1) if f"i{k}" not in used)
        used.add(fresh)
        names.append(fresh)
    return names


def _by_ease(forms: list[Linear | None], dims: list[str], values: dict[str, Linear]) -> list[int]:
    """The dimensions whose subscripts are not their own index alone, affine ones with
    fewer indices first."""
    rest = [k for k in range(len(forms)) if not (dims[k] in values and forms[k] == _var(dims[k]))]

    def ease(k: int) -> tuple[bool, int]:
        form = forms[k]
        return (form is None, 0 if form is None else len(form.coeffs))

    return sorted(rest, key=ease)


def _pick(form: Linear, solved: set[str], st: CheckedStatement) -> str | None:
    """The index of `form` to solve for, not solved yet: one of the left-hand side's
    first (the sum then stays over a window, not over the outputs), of coefficient +-1
    among those."""
    unknowns = [v for v, _ in form.coeffs if v not in solved and v in st.all_indices]
    ranked = sorted(unknowns, key=lambda v: (v not in st.indices, abs(form.coeff(v)) != 1))
    return ranked[0] if ranked else None


def _var(name: str) -> Linear:
    return Linear(((name, 1),), Sym())


def _apply(form: Linear, values: dict[str, Linear]) -> Linear:
    """`form` with each index of `values` replaced by its value."""
    out = Linear((), form.rest)
    for v, c in form.coeffs:
        out = out + (
            values[v].scale(c) if v in values and values[v] != _var(v) else _var(v).scale(c)
        )
    return out


def _within(value: ast.Expr, r: IndexRange) -> ast.Expr:
    lo = b.binary(ast.BinaryOp.GE, value, b.size(r.lo, value.span))
    hi = b.binary(ast.BinaryOp.LT, value, b.size(r.hi, value.span))
    return b.both(lo, hi)


def names_in(exprs: Iterable[ast.Expr]) -> set[str]:
    """The indices `exprs` use."""
    return {n.name for e in exprs for n in ast.walk(e) if isinstance(n, ast.Index)}
