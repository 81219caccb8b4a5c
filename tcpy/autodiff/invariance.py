"""Adjoints that are zero whatever the values: the versions no output depends on.

A softmax written in TC shifts each row by its maximum before `exp`, then divides by
the row's sum:

    mx(n) max=! X(n, d)
    e(n, d) = exp(X(n, d) - mx(n))
    s(n) +=! e(n, d)
    Y(n, d) = e(n, d) / s(n)

`Y` does not depend on `mx`: moving `mx(n)` scales row `n` of `e` and `s(n)` by the same
factor, which the division cancels. Its adjoint is therefore zero, and with it every
term the reverse mode would send through it (a row sum, and a pass over the maximum's
ties: half of a softmax's backward), terms that would only round to zero.

`invariant(versions, v)` decides it by carrying forward, statement by statement, the
derivative of each later version with respect to one element `v(i)`, as a form that
reads it off the version's own value: `T'(j) = [j matches i] * (alpha * T(j) + beta)`,
`alpha` and `beta` exact rationals, from a shift of `v(i)` (`v' = 1`) and, where that
finds a form it cannot follow, from a scale (`v' = v`, which shows the derivative zero
wherever `v(i)` is not: `X * t / t`). `exp` turns a shift (`alpha = 0`) into a scale,
`log` a scale into a shift; sums of one form, products and quotients of scales, and a
maximum of shifts keep their form; a sum over the dimension matched with `v`'s, or any
other operation on a version that depends on `v`, gives up (the adjoint is computed as
usual). `v` is invariant when every output's form is zero. The rule is exact calculus
(no pattern of "softmax" is looked for): log-sum-exp, cross-entropy and attention's
softmax fall under it; a layer norm's mean does not (its output depends on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tcpy.autodiff import text
from tcpy.autodiff.versions import Version, Versions
from tcpy.parser import ast

A = ast.AssignOp
Op = ast.BinaryOp
_FOLLOWED = (A.ASSIGN, A.SUM_INIT, A.MAX_INIT, A.MIN_INIT)


class _Unknown(Exception):
    """The derivative has none of the forms followed: `v` is not shown invariant."""


@dataclass(frozen=True)
class _Form:
    """The derivative of a value with respect to `v(i)`: `alpha * value + beta` where
    the value's subscripts at `at` (one per dimension of `v`: a statement's index
    expressions as text, or a version's dimensions) match `i`, zero elsewhere."""

    alpha: Fraction
    beta: Fraction
    at: tuple[str, ...] | tuple[int, ...]


Form = _Form | None  # None: zero


def invariant(vs: Versions, v: Version) -> bool:
    """Whether no output of the def depends on any element of version `v` (written by a
    statement): its adjoint is zero (see the module)."""
    if v.statement is None or vs.is_final_output(v):
        return False
    dims = tuple(range(len(vs.tensor(v).shape)))
    one, zero = Fraction(1), Fraction(0)
    return _unmoved(vs, v, _Form(zero, one, dims)) or _unmoved(vs, v, _Form(one, zero, dims))


def _unmoved(vs: Versions, v: Version, seed: _Form) -> bool:
    """Whether every output's derivative is zero along `seed`, a move of one element
    of `v`: a shift (`v' = 1`), or a scale (`v' = v`: zero wherever `v` is not)."""
    assert v.statement is not None
    forms: dict[str, Form] = {v.name: seed}
    try:
        for s in range(v.statement + 1, len(vs.written)):
            forms[vs.written[s].name] = _statement(vs, s, forms)
    except _Unknown:
        return False
    outputs = [vs.last(t.name).name for t in vs.cdef.outputs]
    return all(forms.get(name) is None for name in outputs)


def _statement(vs: Versions, s: int, forms: dict[str, Form]) -> Form:
    """The form of the version statement `s` writes."""
    st = vs.cdef.statements[s]
    f = _expr(vs.rhs[s], forms)
    kept = forms.get(vs.before[s].name) if vs.keeps[s] else None
    if f is None and kept is None:
        return None
    # a version that keeps values of the one before (a `+=`, a write of part of the
    # tensor) is two values, whose derivatives need not share a form
    if f is None or vs.keeps[s] or vs.places[s] or st.op not in _FOLLOWED:
        raise _Unknown
    if st.op is A.SUM_INIT and f.beta != 0:  # a shift summed: times the count
        raise _Unknown
    if st.op in (A.MAX_INIT, A.MIN_INIT) and f.alpha != 0:  # a scale may flip the order
        raise _Unknown
    if not all(a in st.indices for a in f.at):  # along a dimension reduced
        raise _Unknown
    return _Form(f.alpha, f.beta, tuple(st.indices.index(str(a)) for a in f.at))


def _expr(e: ast.Expr, forms: dict[str, Form]) -> Form:
    """The form of expression `e` (a statement's right-hand side, reading versions)."""
    if isinstance(e, ast.Access):
        if any(_expr(a, forms) is not None for a in e.args):
            raise _Unknown
        f = forms.get(e.tensor)
        if f is None:
            return None
        return _Form(f.alpha, f.beta, tuple(text.expr(e.args[int(d)]) for d in f.at))
    if isinstance(e, ast.Unary):
        f = _expr(e.operand, forms)
        if f is None or e.op is ast.UnaryOp.NEG:
            return None if f is None else _Form(f.alpha, -f.beta, f.at)
        raise _Unknown
    if isinstance(e, ast.Binary):
        return _binary(e.op, _expr(e.lhs, forms), _expr(e.rhs, forms))
    if isinstance(e, ast.Call) and len(e.args) == 1:
        f = _expr(e.args[0], forms)
        if f is None:
            return None
        if e.name == "exp" and f.alpha == 0:  # (exp u)' = exp u * beta
            return _form(f.beta, Fraction(0), f.at)
        if e.name == "log" and f.beta == 0:  # (log u)' = alpha
            return _form(Fraction(0), f.alpha, f.at)
        raise _Unknown
    if isinstance(e, ast.Cast) and e.to.is_float:
        return _expr(e.value, forms)
    if any(_expr(c, forms) is not None for c in _children(e)):
        raise _Unknown
    return None


def _binary(op: ast.BinaryOp, a: Form, b: Form) -> Form:
    """The form of `a op b` from its operands' forms."""
    if a is None and b is None:
        return None
    if a is not None and b is not None and a.at != b.at:
        raise _Unknown
    zero, at = Fraction(0), (a or b).at  # type: ignore[union-attr]
    sa = a or _Form(zero, zero, at)
    sb = b or _Form(zero, zero, at)
    if op in (Op.ADD, Op.SUB):
        sign = 1 if op is Op.ADD else -1
        # (u + v)' = alpha u + alpha v + ...: one scale for both, or shifts only
        if (a is None or b is None) and (sa.alpha or sb.alpha):
            raise _Unknown
        if a is not None and b is not None and sa.alpha != sb.alpha:
            raise _Unknown
        return _form(sa.alpha or sb.alpha, sa.beta + sign * sb.beta, at)
    if op in (Op.MUL, Op.DIV) and sa.beta == 0 and sb.beta == 0:
        # (u v)' = (alpha_u + alpha_v) u v; (u / v)' = (alpha_u - alpha_v) u / v
        sign = 1 if op is Op.MUL else -1
        return _form(sa.alpha + sign * sb.alpha, zero, at)
    raise _Unknown


def _form(alpha: Fraction, beta: Fraction, at: tuple[str, ...] | tuple[int, ...]) -> Form:
    return None if alpha == 0 and beta == 0 else _Form(alpha, beta, at)


def _children(e: ast.Expr) -> list[ast.Expr]:
    if isinstance(e, ast.Ternary):
        return [e.cond, e.then, e.orelse]
    if isinstance(e, ast.Call | ast.Apply):
        return list(e.args)
    if isinstance(e, ast.Cast):
        return [e.value]
    return []
