"""Locality: how well running a band member innermost walks memory.

Shared by the CPU mapping (which loop becomes the vector loop) and the GPU mapping
(which loop goes on threadIdx.x, for coalescing).
"""

from __future__ import annotations

from collections.abc import Iterator

import islpy as isl

from tcpy.mapping.marks import EMPTY, Turns, innermost_first
from tcpy.parser import ast
from tcpy.parser.linear import Linear, linear_form
from tcpy.parser.symbolic import Sym
from tcpy.poly.schedule import member_variables
from tcpy.poly.scop import Kind, Scop


def stride_score(node: isl.ScheduleNode, member: int, scop: Scop, transposed: Turns = EMPTY) -> int:
    """How well running band member `member` innermost walks memory: +2 per access
    it walks with unit stride, -2 per access it strides across, 0 when invariant; +1
    when it is a reduction loop, whose accumulator then stays in a register. The
    tensors `transposed` names for a statement are read from copies with their
    innermost dimensions first, as many as it says
    (`tcpy.mapping.cpu.packing.transposed_operands`)."""
    score = 0
    for stmt_name, position in member_variables(node, member).items():
        if position is None:
            continue
        stmt = scop.statement(stmt_name)
        var = stmt.dims[position]
        for subscripts in _accesses(scop, stmt_name, transposed):
            score += _stride(subscripts, var)
        if stmt.kind is Kind.COMPUTE and var in stmt.source(scop.cdef).reduction_indices:
            score += 1
    return score


def worst_stride(node: isl.ScheduleNode, member: int, scop: Scop, transposed: Turns = EMPTY) -> int:
    """The worst way running band member `member` innermost walks any one access: 2
    when every access it moves along is walked with unit stride, 0 when some access
    stays put, -2 when it strides across one. A reduction's own element is left
    out: a register block loads and stores it once per block, so what counts is how
    the reduction reads its operands. A `+=` with no reduction index (or a
    scatter-add) has no block: its element counts as any access."""
    worst = 2
    for stmt_name, position in member_variables(node, member).items():
        if position is None:
            return -2
        stmt = scop.statement(stmt_name)
        var = stmt.dims[position]
        accesses = _accesses(scop, stmt_name, transposed)
        st = stmt.source(scop.cdef)
        reduces = st.op.reduction is not None and st.reduction_indices and not st.scatter
        if stmt.kind is Kind.COMPUTE and reduces:
            accesses = accesses[1:]
        for subscripts in accesses:
            worst = min(worst, _stride(subscripts, var))
    return worst


def strided_tensors(node: isl.ScheduleNode, member: int, scop: Scop) -> set[str]:
    """The tensors that some statement reads or writes across memory along band
    member `member` (`_stride` -2)."""
    found = set()
    for stmt_name, position in member_variables(node, member).items():
        stmt = scop.statement(stmt_name)
        if position is None:
            continue
        st = stmt.source(scop.cdef)
        var = stmt.dims[position]
        tensors = [st.tensor]
        if stmt.kind is Kind.COMPUTE:
            tensors += [a.tensor for a in ast.walk(st.rhs) if isinstance(a, ast.Access) and a.args]
        for tensor, subscripts in zip(tensors, _accesses(scop, stmt_name), strict=True):
            if _stride(subscripts, var) < 0:
                found.add(tensor)
    return found


def strided_reads(node: isl.ScheduleNode, member: int, scop: Scop) -> set[str]:
    """The tensors that some statement reads across memory along band member `member`
    (`_stride` -2: the member's index in a subscript other than the last, or in the
    last with a coefficient other than 1, as `I(n,c,2*h+kh,2*w+kw)` along `w`)."""
    return {t for t, subs, var, _ in _reads(node, member, scop) if _stride(subs, var) < 0}


def _reads(
    node: isl.ScheduleNode, member: int, scop: Scop, other: int | None = None
) -> Iterator[tuple[str, list[Subscript], str, str | None]]:
    """Each read of a computing statement under band member `member` (one walking a
    statement index; and `other`, where given, walking another): its tensor, its
    subscripts, the index `member` walks and the one `other` walks."""
    across = member_variables(node, other) if other is not None else {}
    for stmt_name, position in member_variables(node, member).items():
        stmt = scop.statement(stmt_name)
        second = across.get(stmt_name)
        if position is None or stmt.kind is not Kind.COMPUTE:
            continue
        if other is not None and second is None:
            continue
        var = stmt.dims[position]
        second_var = stmt.dims[second] if second is not None else None
        for access in ast.walk(stmt.source(scop.cdef).rhs):
            if isinstance(access, ast.Access) and access.args:
                yield access.tensor, [_subscript(a) for a in access.args], var, second_var


def runs_along(node: isl.ScheduleNode, member: int, scop: Scop) -> set[str] | None:
    """The tensors read along band member `member` when every access of every
    statement below either stays put along it or walks it in its last subscript with
    coefficient 1 and no reduction index there (`C(m,n)`, `B(k,n)` along `n`), so
    that each thread may take a run of consecutive values of the member and access
    them as one vector at a place that does not move with the reduction; None
    otherwise (a stride, a window, a member that combines indices)."""
    read: set[str] = set()
    for stmt_name, position in member_variables(node, member).items():
        stmt = scop.statement(stmt_name)
        if position is None or stmt.kind is not Kind.COMPUTE:
            return None
        st = stmt.source(scop.cdef)
        var = stmt.dims[position]
        tensors = [st.tensor] + [
            a.tensor for a in ast.walk(st.rhs) if isinstance(a, ast.Access) and a.args
        ]
        accesses = zip(tensors, _accesses(scop, stmt_name), strict=True)
        for k, (tensor, subscripts) in enumerate(accesses):
            stride = _stride(subscripts, var)
            last = subscripts[-1] if subscripts else None
            if stride < 0 or (
                stride
                and not (
                    isinstance(last, Linear)
                    and last.coeff(var) == 1
                    and not any(last.coeff(r) for r in st.reduction_indices)
                )
            ):
                return None
            if stride and k:  # not the statement's own element
                read.add(tensor)
    return read


def walked_reads(node: isl.ScheduleNode, member: int, scop: Scop) -> set[str]:
    """The tensors some statement reads along band member `member` in their last
    subscript alone, with coefficient 1 (`A(m,k)` along `k`): consecutive values of
    it reach adjacent elements, which a thread may read as one vector."""
    return {
        t
        for t, subscripts, var, _ in _reads(node, member, scop)
        if _stride(subscripts, var) > 0 and _alone(subscripts[-1], var)
    }


def turned_reads(node: isl.ScheduleNode, member: int, rows: int, scop: Scop) -> set[str]:
    """The tensors some statement reads with band member `member` in their
    second-to-last subscript and `rows` in their last, each with coefficient 1,
    `member`'s index in no other subscript (`A(k,m)` along `k`, a thread's rows
    `m`): a copy of their tile holding its innermost dimension first has
    `member`'s consecutive values adjacent (`walked_reads` of the copy)."""
    return {
        t
        for t, subscripts, var, row_var in _reads(node, member, scop, rows)
        if len(subscripts) > 1
        and row_var is not None
        and _alone(subscripts[-2], var)
        and _alone(subscripts[-1], row_var)
        and _used(subscripts, var) == 1
    }


def _alone(s: Subscript, var: str) -> bool:
    """Whether subscript `s` is `var` plus terms of other indices or sizes, `var`'s
    coefficient 1."""
    return isinstance(s, Linear) and s.coeff(var) == 1


def _used(subscripts: list[Subscript], var: str) -> int:
    """How many of `subscripts` use `var`."""
    return sum(var in s if isinstance(s, frozenset) else bool(s.coeff(var)) for s in subscripts)


def is_window_member(node: isl.ScheduleNode, member: int, scop: Scop) -> bool:
    """Whether band member `member` walks a window: a reduction index that some
    subscript adds to an output index (`kh` in a convolution's `I(n,c,h+kh,w+kw)`, or
    a pooling's). Windows are short, and each step of one shifts what it reads by one."""
    for stmt_name, position in member_variables(node, member).items():
        stmt = scop.statement(stmt_name)
        if position is None or stmt.kind is not Kind.COMPUTE:
            continue
        st = stmt.source(scop.cdef)
        var = stmt.dims[position]
        if var not in st.reduction_indices:
            continue
        for access in ast.walk(st.rhs):
            if not isinstance(access, ast.Access):
                continue
            for arg in access.args:
                form = linear_form(arg)
                if form is not None and form.coeff(var) and any(form.coeff(i) for i in st.indices):
                    return True
    return False


def is_reduction_member(node: isl.ScheduleNode, member: int, scop: Scop) -> bool:
    """Whether band member `member` walks a reduction index of some statement."""
    for stmt_name, position in member_variables(node, member).items():
        stmt = scop.statement(stmt_name)
        if (
            position is not None
            and stmt.kind is Kind.COMPUTE
            and stmt.dims[position] in stmt.source(scop.cdef).reduction_indices
        ):
            return True
    return False


Subscript = Linear | frozenset[str]  # affine, or the indices a non-affine one uses


def _accesses(scop: Scop, stmt_name: str, transposed: Turns = EMPTY) -> list[list[Subscript]]:
    stmt = scop.statement(stmt_name)
    st = stmt.source(scop.cdef)
    lhs: list[Subscript] = [Linear(((v, 1),), Sym()) for v in st.indices]
    if st.scatter:
        lhs = [_subscript(a) for a in st.scatter]
    out = [lhs]
    if stmt.kind is Kind.COMPUTE:
        for node in ast.walk(st.rhs):
            if isinstance(node, ast.Access) and node.args:
                subscripts = [_subscript(a) for a in node.args]
                turns = transposed.get((stmt.index, node.tensor), 0)
                out.append(innermost_first(subscripts, turns) if turns else subscripts)
    return out


def _subscript(e: ast.Expr) -> Subscript:
    lin = linear_form(e)
    if lin is not None:
        return lin
    return frozenset(n.name for n in ast.walk(e) if isinstance(n, ast.Index))


def _stride(subscripts: list[Subscript], var: str) -> int:
    uses = [
        k
        for k, s in enumerate(subscripts)
        if (var in s if isinstance(s, frozenset) else s.coeff(var))
    ]
    if not uses:
        return 0
    last = len(subscripts) - 1
    s = subscripts[last]
    if uses == [last] and isinstance(s, Linear) and abs(s.coeff(var)) == 1:
        return 2
    return -2
