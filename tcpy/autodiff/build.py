"""Expressions of a backward, built as TC AST nodes (`tcpy.parser.ast`): arithmetic that
folds the zeros and ones the chain rule makes, casts and constants in the type of the
value they scale, substitution of indices and renaming of reads.

The nodes carry the span of the forward statement they come from and no types: a
backward is printed as TC text and checked again by the front end as any def is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tcpy.autodiff.text import expr
from tcpy.errors import Span
from tcpy.parser import ast
from tcpy.parser.linear import Linear, linear_form
from tcpy.parser.symbolic import FloorDiv, MaxOf, MinOf, Sym
from tcpy.types import ScalarType

B = ast.BinaryOp


def is_zero(e: ast.Expr) -> bool:
    return isinstance(e, ast.IntLit | ast.FloatLit) and e.value == 0


def is_one(e: ast.Expr) -> bool:
    return isinstance(e, ast.IntLit | ast.FloatLit) and e.value == 1


def num(value: int | float, span: Span) -> ast.Expr:
    """A literal: an integer where the value is one (exact in every type), else a float
    literal (TC reads it as float32: only values exact there are written so)."""
    if float(value).is_integer():
        return ast.IntLit(int(value), span)
    return ast.FloatLit(float(value), span)


def add(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_zero(a):
        return b
    if is_zero(b):
        return a
    if isinstance(a, ast.Ternary) and isinstance(b, ast.Ternary) and a.cond == b.cond:
        return select(a.cond, add(a.then, b.then), add(a.orelse, b.orelse))
    if isinstance(b, ast.Unary) and b.op is ast.UnaryOp.NEG:
        return sub(a, b.operand)
    if expr(a) == expr(b):  # a read twice, as `(X - m) * (X - m)`: its two adjoints, once
        return mul(num(2, a.span), a)
    return ast.Binary(B.ADD, a, b, a.span)


def sub(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_zero(b):
        return a
    if is_zero(a):
        return neg(b)
    if isinstance(a, ast.Unary) and a.op is ast.UnaryOp.NEG and expr(a.operand) == expr(b):
        return neg(mul(num(2, b.span), b))  # `-x - x`; doubling is exact
    return ast.Binary(B.SUB, a, b, a.span)


def neg(a: ast.Expr) -> ast.Expr:
    if is_zero(a):
        return a
    if isinstance(a, ast.Unary) and a.op is ast.UnaryOp.NEG:
        return a.operand
    return ast.Unary(ast.UnaryOp.NEG, a, a.span)


def mul(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_zero(a) or is_zero(b):
        return num(0, a.span)
    if is_one(a):
        return b
    if is_one(b):
        return a
    if isinstance(a, ast.Unary) and a.op is ast.UnaryOp.NEG:
        return neg(mul(a.operand, b))
    if isinstance(b, ast.Unary) and b.op is ast.UnaryOp.NEG:
        return neg(mul(a, b.operand))
    return ast.Binary(B.MUL, a, b, a.span)


def div(a: ast.Expr, b: ast.Expr) -> ast.Expr:
    if is_zero(a) or is_one(b):
        return a
    if isinstance(a, ast.Unary) and a.op is ast.UnaryOp.NEG:
        return neg(div(a.operand, b))
    return ast.Binary(B.DIV, a, b, a.span)


def binary(op: ast.BinaryOp, a: ast.Expr, b: ast.Expr) -> ast.Expr:
    return ast.Binary(op, a, b, a.span)


def both(a: ast.Expr | None, b: ast.Expr) -> ast.Expr:
    """`a && b`, or `b` alone without `a`; chained to the left, so that it prints
    without parentheses."""
    if a is None:
        return b
    if isinstance(b, ast.Binary) and b.op is B.AND:
        return both(both(a, b.lhs), b.rhs)
    return ast.Binary(B.AND, a, b, b.span)


def either(a: ast.Expr | None, b: ast.Expr) -> ast.Expr:
    """`a || b`, or `b` alone without `a`."""
    return b if a is None else ast.Binary(B.OR, a, b, b.span)


def select(cond: ast.Expr, then: ast.Expr, orelse: ast.Expr) -> ast.Expr:
    """`cond ? then : orelse`, folded where both branches are zero."""
    if is_zero(then) and is_zero(orelse):
        return then
    if is_zero(orelse) and isinstance(then, ast.Ternary) and is_zero(then.orelse):
        return select(both(cond, then.cond), then.then, orelse)  # `a ? (b ? x : 0) : 0`
    return ast.Ternary(cond, then, orelse, cond.span)


def call(name: str, *args: ast.Expr) -> ast.Expr:
    return ast.Call(name, tuple(args), args[0].span)


def cast(ty: ScalarType, e: ast.Expr) -> ast.Expr:
    return ast.Cast(ty, e, e.span)


def constant(ty: ScalarType, make: Callable[[ast.Expr], ast.Expr], value: int) -> ast.Expr:
    """A transcendental constant in type `ty` (a float literal would be float32):
    `make` applied to the integer `value` cast to `ty`, as `log(double(10))` is ln 10."""
    return make(cast(ty, num(value, Span(1, 1, 1, 2))))


def square(a: ast.Expr) -> ast.Expr:
    return mul(a, a)


def substitute(e: ast.Expr, values: Mapping[str, ast.Expr]) -> ast.Expr:
    """`e` with each index of `values` replaced by its value."""
    return ast.transform(e, lambda n: values.get(n.name) if isinstance(n, ast.Index) else None)


def rename(e: ast.Expr, names: Callable[[ast.Access], str]) -> ast.Expr:
    """`e` with each read's tensor renamed by `names`."""

    def one(n: ast.Expr) -> ast.Expr | None:
        if isinstance(n, ast.Access):
            args = tuple(rename(a, names) for a in n.args)
            return ast.Access(names(n), args, n.span, n.ty)
        return None

    return ast.transform(e, one)


def size(s: Sym, span: Span) -> ast.Expr:
    """A size expression as an integer expression of the size symbols."""
    out: ast.Expr | None = None
    for atom, c in sorted(s.terms, key=lambda t: t[1] < 0):  # the positive terms first
        term = _atom(atom, span)
        term = term if abs(c) == 1 else ast.Binary(B.MUL, num(abs(c), span), term, span)
        if out is None:
            out = term if c > 0 else neg(term)
        else:
            out = add(out, term) if c > 0 else sub(out, term)
    if out is None:
        return num(s.const, span)
    return add(out, num(s.const, span)) if s.const > 0 else sub(out, num(-s.const, span))


def _atom(atom: str | FloorDiv | MinOf | MaxOf, span: Span) -> ast.Expr:
    match atom:
        case str():
            return ast.SizeRef(atom, span)
        case FloorDiv(num=n, den=d):
            return ast.Binary(B.DIV, size(n, span), num(d, span), span)
        case MinOf(args=args) | MaxOf(args=args):
            op = B.MIN if isinstance(atom, MinOf) else B.MAX
            out = size(args[0], span)
            for a in args[1:]:
                out = ast.Binary(op, out, size(a, span), span)
            return out
    raise TypeError(type(atom).__name__)


def linear(form: Linear, span: Span) -> ast.Expr:
    """An affine form (`tcpy.parser.linear.Linear`) as an integer expression, its
    indices first."""
    out: ast.Expr | None = None
    for var, c in sorted(form.coeffs, key=lambda t: t[1] < 0):  # the positive terms first
        term: ast.Expr = ast.Index(var, span)
        term = term if abs(c) == 1 else ast.Binary(B.MUL, num(abs(c), span), term, span)
        if out is None:
            out = term if c > 0 else neg(term)
        else:
            out = add(out, term) if c > 0 else sub(out, term)
    rest = form.rest
    if out is None:
        return size(rest, span)
    if rest.is_const:
        c = rest.const
        return add(out, num(c, span)) if c >= 0 else sub(out, num(-c, span))
    return add(out, size(rest, span))


def simplified(e: ast.Expr) -> ast.Expr:
    """`e` with each integer expression of indices and sizes in its affine form, as
    few terms as it has (`y - kh + 1 + kh` is `y + 1`)."""

    def one(n: ast.Expr) -> ast.Expr | None:
        if isinstance(n, ast.Index | ast.SizeRef | ast.IntLit):
            return n
        form = linear_form(n)
        if form is None:
            return None
        leaves = [m for m in ast.walk(n) if isinstance(m, ast.Index | ast.SizeRef | ast.IntLit)]
        terms = len(form.coeffs) + len(form.rest.terms) + (form.rest.const != 0)
        return linear(form, n.span) if terms < len(leaves) else None  # some cancel or fold

    return ast.transform(e, one)


def reads_at(e: ast.Expr, tensor: str, indices: Sequence[str]) -> bool:
    """Whether `e` is a read of `tensor` at exactly `indices`, each an index alone."""
    return (
        isinstance(e, ast.Access)
        and e.tensor == tensor
        and [a.name if isinstance(a, ast.Index) else None for a in e.args] == list(indices)
    )
