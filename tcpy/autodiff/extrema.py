"""The rules of `max=!`, `min=!` and `*=!` (and their forms without `!`): the adjoints
their reads get, written with the temporaries they need (ties, zero counts) into a
backward's `Writer`."""

from __future__ import annotations

from tcpy.autodiff import build as b
from tcpy.autodiff.rules import read_adjoints
from tcpy.autodiff.versions import Version
from tcpy.autodiff.writer import Writer
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement
from tcpy.types import ScalarType

A = ast.AssignOp


def extremum(
    out: Writer,
    st: CheckedStatement,
    f: ast.Expr,
    w: Version,
    seed: ast.Expr,
    old: ast.Expr | None,
    reuse: bool,
) -> tuple[ast.Expr, ast.Expr | None]:
    """`max=!`/`min=!` (and without `!`, `old` the value reduced into): the adjoint of
    an instance equal to the result, shared evenly with the others equal to it
    (`ties`, counting `old` among them); and the adjoint of `old`. The result is
    recomputed beside the values compared with it, not read from the forward: equality
    needs both computed alike to the last bit, and a C compiler's fused multiply-adds
    or a GPU's order of a sum may differ between the forward's kernel and the
    backward's. `reuse`: the version `w` the backward has anyway is that result."""
    here = tuple(ast.Index(i, st.span) for i in st.indices)
    result = ast.Access(w.name, here, st.span) if reuse else _result(out, st, f, w, old)
    equal = b.binary(ast.BinaryOp.EQ, f, result)
    ties = out.temporary(f"{w.tensor}_ties", ScalarType.INT32)
    one, zero = b.num(1, st.span), b.num(0, st.span)
    out.emit(ties, st.indices, A.SUM_INIT, b.select(equal, one, zero), st.ranges)
    count: ast.Expr = ast.Access(ties, here, st.span)
    if old is None:
        return b.select(equal, b.div(seed, count), zero), None
    old_equal = b.binary(ast.BinaryOp.EQ, old, result)
    count = b.add(count, b.select(old_equal, one, zero))
    share = b.div(seed, count)
    return b.select(equal, share, zero), b.select(old_equal, share, zero)


def _result(
    out: Writer, st: CheckedStatement, f: ast.Expr, w: Version, old: ast.Expr | None
) -> ast.Access:
    """The result of the extremum `st` (of right-hand side `f`, into `old` without
    `!`), recomputed by the backward into a temporary of its own."""
    here = tuple(ast.Index(i, st.span) for i in st.indices)
    kind = "max" if st.op.reduction is ast.Reduction.MAX else "min"
    if old is None:
        assert f.ty is not None
        name = out.temporary(f"{w.tensor}_{kind}", f.ty)
        out.emit(name, st.indices, st.op, f, st.ranges)
    else:
        scalar = out.cdef.tensor(st.tensor).scalar
        name = out.temporary(f"{w.tensor}_{kind}", scalar)
        start = old if old.ty is scalar else b.cast(scalar, old)  # `0` is an int32
        out.emit(name, st.indices, A.ASSIGN, start, st.ranges[: len(st.indices)])
        out.emit(name, st.indices, st.op, f, st.ranges)
    return ast.Access(name, here, st.span)


def product(
    out: Writer, st: CheckedStatement, f: ast.Expr, seed: ast.Expr, old: ast.Expr | None
) -> tuple[list[tuple[ast.Access, ast.Expr]], ast.Expr | None]:
    """`*=!` (and `*=`, `old` the value multiplied into, one more factor): the adjoint
    of each factor is the product of the others: the product of the nonzero factors
    divided by it where none is zero, that product where it is the one zero, else 0.
    Returns the reads' adjoints and `old`'s."""
    here = tuple(ast.Index(i, st.span) for i in st.indices)
    one, zero = b.num(1, st.span), b.num(0, st.span)
    zeros = out.temporary(f"{st.tensor}_zeros", ScalarType.INT32)
    nonzero = out.temporary(f"{st.tensor}_nonzero", out.cdef.tensor(st.tensor).scalar)
    f_zero = b.binary(ast.BinaryOp.EQ, f, zero)
    out.emit(zeros, st.indices, A.SUM_INIT, b.select(f_zero, one, zero), st.ranges)
    out.emit(nonzero, st.indices, A.PROD_INIT, b.select(f_zero, one, f), st.ranges)
    z: ast.Expr = ast.Access(zeros, here, st.span)
    p: ast.Expr = ast.Access(nonzero, here, st.span)
    if old is not None:
        old_zero = b.binary(ast.BinaryOp.EQ, old, zero)
        z = b.add(z, b.select(old_zero, one, zero))
        p = b.mul(p, b.select(old_zero, one, old))

    def others(factor: ast.Expr, is_zero: ast.Expr) -> ast.Expr:
        alone = b.both(b.binary(ast.BinaryOp.EQ, z, one), is_zero)
        none = b.binary(ast.BinaryOp.EQ, z, zero)
        return b.select(none, b.div(p, factor), b.select(alone, p, zero))

    reads = read_adjoints(f, b.mul(seed, others(f, f_zero)))
    if old is None:
        return reads, None
    return reads, b.mul(seed, others(old, b.binary(ast.BinaryOp.EQ, old, zero)))
