"""Reductions into half-precision tensors, accumulated in float32.

A `float16` or `bfloat16` tensor that a reduction writes is rounded once, when the
reduction is done (docs/language.md, "Types"), on every target. Compiled code gets
that from a float32 temporary: the reduction accumulates there (a thread's partial
sums, atomics and register accumulators all in float32) and a point-wise statement
stores it, rounded, into the half tensor. A reduction that adds to the tensor's
values (`+=`, a scatter-add) first copies them into the temporary. The `reference`
target holds half tensors in float32 instead and rounds after each statement.
"""

from __future__ import annotations

from dataclasses import replace

from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, IndexRange, Role, TensorInfo
from tcpy.parser.symbolic import Sym
from tcpy.types import ScalarType


def widen_half_reductions(cdef: CheckedDef, extrema: bool = True) -> CheckedDef:
    """`cdef` with each reduction into a half tensor accumulated in a float32
    temporary of its own and stored, rounded, by a statement after it; `cdef` itself
    where no reduction writes a half tensor. Without `extrema`, `min` and `max`
    reductions are left as they are: rounding is monotonic, so rounding after every
    step gives what rounding once does (the CPU's; the GPU has no 16-bit atomics)."""
    if not any(_widened(cdef, st, extrema) for st in cdef.statements):
        return cdef
    taken = {t.name for t in cdef.tensors}
    temporaries = list(cdef.temporaries)
    statements: list[CheckedStatement] = []
    for st in cdef.statements:
        if not _widened(cdef, st, extrema):
            statements.append(st)
            continue
        half = cdef.tensor(st.tensor)
        wide = replace(half, name=fresh_name(f"{half.name}_f32", taken), role=Role.TEMPORARY,
                       scalar=ScalarType.FLOAT32)  # fmt: skip
        temporaries.append(wide)
        whole = bool(st.scatter)  # a scatter-add may write any element of the tensor
        ranges = _whole(half) if whole else st.ranges[: len(st.indices)]
        if whole or not st.op.initializes:
            statements.append(_copy(st, half, wide.name, ranges))
        statements.append(replace(st, tensor=wide.name))
        statements.append(_copy(st, wide, half.name, ranges))
    return replace(cdef, temporaries=tuple(temporaries), statements=tuple(statements))


def _widened(cdef: CheckedDef, st: CheckedStatement, extrema: bool) -> bool:
    reduction = st.op.reduction
    if reduction is None or not cdef.tensor(st.tensor).scalar.is_half:
        return False
    return extrema or reduction in (ast.Reduction.SUM, ast.Reduction.PROD)


def fresh_name(name: str, taken: set[str]) -> str:
    """`name`, or `name` with underscores added, not in `taken` (which it joins)."""
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _whole(tensor: TensorInfo) -> tuple[IndexRange, ...]:
    """Ranges over every element of `tensor`."""
    return tuple(IndexRange(f"d{k}", Sym.of(0), n) for k, n in enumerate(tensor.shape))


def _copy(
    st: CheckedStatement, source: TensorInfo, target: str, ranges: tuple[IndexRange, ...]
) -> CheckedStatement:
    """`target(...) = source(...)` over `ranges` (one per dimension), located at `st`."""
    indices = tuple(r.var for r in ranges)
    args = tuple(ast.Index(i, st.span, ScalarType.INT32) for i in indices)
    read = ast.Access(source.name, args, st.span, source.scalar)
    return assignment(st, target, ranges, read, f"{source.name}({', '.join(indices)})")


def assignment(
    st: CheckedStatement, target: str, ranges: tuple[IndexRange, ...], rhs: ast.Expr, text: str
) -> CheckedStatement:
    """`target(...) = rhs` over `ranges` (one per dimension, its indices), located at
    `st`; `text` is the right-hand side as generated code's comments show it."""
    indices = tuple(r.var for r in ranges)
    return CheckedStatement(
        tensor=target,
        indices=indices,
        reduction_indices=(),
        op=ast.AssignOp.ASSIGN,
        rhs=rhs,
        ranges=ranges,
        checks=(),
        span=st.span,
        text=f"{target}({', '.join(indices)}) = {text}",
    )
