"""Factors of a contraction that do not move along all of its output indices, computed
once into a temporary (the CPU's).

`D(i,j) += alpha * A(i,k) * B(k,j)` reads as `(alpha * A(i,k)) * B(k,j)`: the left
factor depends on `i` and `k` only, yet a register-blocked matmul evaluates it for
every `j` again, a multiply and a broadcast from a register beside each row's
multiply-adds (37% slower than `A(i,k) * B(k,j)` at 1000 x 1200 x 1100). As the
statements `P(i,k) = alpha * A(i,k)` and `D(i,j) += P(i,k) * B(k,j)` it is a plain
matmul after one pass over `A`, and the same bits: each term is the same rounded
product of the same rounded factor.
"""

from __future__ import annotations

from dataclasses import replace

from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, IndexRange, Role, TensorInfo
from tcpy.parser.printer import expr_text
from tcpy.parser.symbolic import Sym
from tcpy.poly.widen import assignment, fresh_name
from tcpy.types import ScalarType

MIN_REUSE = 8
"""A factor is hoisted unless the output indices it does not depend on are known to
run fewer times than this (a constant range): it is then reused too little to pay
for its pass over memory."""

_HOISTED = (ScalarType.FLOAT32, ScalarType.FLOAT64)  # no half: its rounding is deferred


def hoist_invariant_factors(cdef: CheckedDef) -> CheckedDef:
    """`cdef` with each hoistable factor (`_factor`) of a sum's product computed by a
    statement of its own, just before the sum, into a temporary over its indices;
    `cdef` itself where there is none. The decision reads the def only, never the
    sizes, so that every call of a size-generic kernel agrees with its build."""
    taken = {t.name for t in cdef.tensors}
    temporaries = list(cdef.temporaries)
    statements: list[CheckedStatement] = []
    for st in cdef.statements:
        rhs = st.rhs
        if not _candidate(st) or not isinstance(rhs, ast.Binary):
            statements.append(st)
            continue
        made = (taken, temporaries, statements)
        lhs, rhs_ = _hoisted(st, rhs.lhs, *made), _hoisted(st, rhs.rhs, *made)
        unchanged = lhs is rhs.lhs and rhs_ is rhs.rhs
        statements.append(st if unchanged else replace(st, rhs=replace(rhs, lhs=lhs, rhs=rhs_)))
    if len(statements) == len(cdef.statements):
        return cdef
    return replace(cdef, temporaries=tuple(temporaries), statements=tuple(statements))


def _hoisted(
    st: CheckedStatement,
    factor: ast.Expr,
    taken: set[str],
    temporaries: list[TensorInfo],
    statements: list[CheckedStatement],
) -> ast.Expr:
    """`factor` of `st`'s product, or, where it is worth a temporary (`_factor`), the
    read of that temporary, whose tensor and statement are added to `temporaries` and
    `statements`."""
    indices = _factor(st, factor)
    if indices is None:
        return factor
    ranges = tuple(st.range_of(i) for i in indices)
    name = fresh_name(f"{st.tensor}_factor", taken)
    scalar = factor.ty or ScalarType.FLOAT32
    shape = tuple(r.hi for r in ranges)
    temporaries.append(TensorInfo(name, Role.TEMPORARY, scalar, shape, st.span))
    statements.append(assignment(st, name, ranges, factor, expr_text(factor)))
    args = tuple(ast.Index(i, st.span, ScalarType.INT32) for i in indices)
    return ast.Access(name, args, factor.span, scalar)


def _candidate(st: CheckedStatement) -> bool:
    """A sum (`+=`, `+=!`) over reduction indices of a product of two factors, with no
    scatter and no run-time checks of its own."""
    rhs = st.rhs
    return (
        st.op.reduction is ast.Reduction.SUM
        and bool(st.reduction_indices)
        and not st.scatter
        and not st.checks
        and not st.starts
        and isinstance(rhs, ast.Binary)
        and rhs.op is ast.BinaryOp.MUL
    )


def _factor(st: CheckedStatement, factor: ast.Expr) -> tuple[str, ...] | None:
    """The indices of `factor` (in the order its reads use them) where it is worth a
    temporary: a product of several reads and constants (not one read alone), of a
    float32 or float64 value, whose reads are at plain indices (a reduction never
    reads the tensor it writes: sema), which does not depend on some output index of a range
    starting at 0 and not known to be short (`MIN_REUSE`). None otherwise."""
    leaves = _product_leaves(factor)
    if leaves is None or len(leaves) < 2 or factor.ty not in _HOISTED:
        return None
    used: dict[str, None] = {}  # in the order the reads use them: a layout they walk
    for leaf in leaves:
        if isinstance(leaf, ast.Access):
            if not all(isinstance(a, ast.Index) for a in leaf.args):
                return None
            used.update((a.name, None) for a in leaf.args if isinstance(a, ast.Index))
        elif not isinstance(leaf, (ast.FloatLit, ast.IntLit)):
            return None
    if not used:
        return None  # a scalar: nothing to reuse
    missing = [st.range_of(i) for i in st.indices if i not in used]
    if not missing or any(st.range_of(i).lo != Sym.of(0) for i in used):
        return None
    if all(_short(r) for r in missing):
        return None
    return tuple(used)


def _product_leaves(e: ast.Expr) -> list[ast.Expr] | None:
    """The factors of a tree of multiplications, or None for any other operation."""
    if isinstance(e, ast.Binary):
        if e.op is not ast.BinaryOp.MUL:
            return None
        left, right = _product_leaves(e.lhs), _product_leaves(e.rhs)
        return None if left is None or right is None else left + right
    return [e]


def _short(r: IndexRange) -> bool:
    span = r.hi - r.lo
    return span.is_const and span.evaluate({}) < MIN_REUSE
