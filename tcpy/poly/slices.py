"""Slices of an operand read apart: where statements run together over tiles of a row
(`CheckedDef.together`, the online rewrite's, `tcpy.poly.online`) read one tensor at
several constant values of one of its indices (an attention's queries, keys and values
from one input, `QKV(0, ..)`, `QKV(1, ..)`, `QKV(2, ..)`), each slice they read is
copied into a temporary of its own first of all (the def writes none of what is
sliced), and they read the slices.

For the GPU's row kernels over tiles (`tcpy.mapping.gpu.online`): a block copies a
tile of what its rows share into shared memory as one box per tensor, and a tile's
keys with the block's queries in one tensor make a box whose extent varies with both,
so that no copy is made and the chain cannot be one kernel. The slices cost a copy of
what the chain reads (a pass over it, in kernels of their own) and make each slice's
box a fixed one. The CPU's kernels take tiles of the one tensor as they are.
"""

from __future__ import annotations

from dataclasses import replace

from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, IndexRange, Role, TensorInfo
from tcpy.parser.printer import expr_text
from tcpy.parser.symbolic import Sym
from tcpy.poly.widen import assignment, fresh_name
from tcpy.types import ScalarType


def sliced_operands(cdef: CheckedDef) -> CheckedDef:
    """`cdef` with the tensors each group run together reads at several constant values
    of an index read from slices copied before the group (see the module); unchanged
    where there is none."""
    for k in range(len(cdef.together)):
        cdef = _sliced(cdef, k)
    return cdef


def _sliced(cdef: CheckedDef, k: int) -> CheckedDef:
    """`cdef` with group `k`'s operands read apart sliced."""
    group = cdef.together[k]
    members = cdef.statements[group.start : group.stop]
    copies: list[CheckedStatement] = []
    temporaries = list(cdef.temporaries)
    taken = {t.name for t in cdef.tensors} | set(cdef.size_symbols)
    taken |= {r.var for st in cdef.statements for r in st.ranges}
    for tensor, dim, values in _read_apart(cdef, members):
        info = cdef.tensor(tensor)
        names = {}
        for value in values:
            name = fresh_name(f"{tensor}_{value}", taken)
            names[value] = name
            shape = info.shape[:dim] + info.shape[dim + 1 :]
            temporaries.append(TensorInfo(name, Role.TEMPORARY, info.scalar, shape, info.span))
            copies.append(_copy(info, dim, value, name, members[0], taken))
        members = tuple(_reading(st, tensor, dim, names) for st in members)
    if not copies:
        return cdef
    n = len(copies)  # first of all: the def writes none of what they read
    statements = (
        *copies,
        *cdef.statements[: group.start],
        *members,
        *cdef.statements[group.stop :],
    )
    together = tuple(replace(g, start=g.start + n, stop=g.stop + n) for g in cdef.together)
    return replace(cdef, statements=statements, temporaries=tuple(temporaries), together=together)


def _read_apart(
    cdef: CheckedDef, members: tuple[CheckedStatement, ...]
) -> list[tuple[str, int, list[int]]]:
    """The tensors `members` read, each with the first index at which every read of it
    has a constant and the reads have two or more: (tensor, index, the constants)."""
    reads: dict[str, list[ast.Access]] = {}
    written = {st.tensor for st in cdef.statements}
    for st in members:
        for a in ast.walk(st.rhs):  # (no member is a scatter-add: no other reads)
            if isinstance(a, ast.Access) and a.args:
                reads.setdefault(a.tensor, []).append(a)
    found = []
    for tensor, accesses in reads.items():
        if tensor in written:
            continue  # what the def computes: its slices would be stale copies
        for dim in range(len(accesses[0].args)):
            args = [a.args[dim] for a in accesses]
            if all(isinstance(x, ast.IntLit) for x in args):
                values = sorted({x.value for x in args if isinstance(x, ast.IntLit)})
                if len(values) > 1:
                    found.append((tensor, dim, values))
                break
    return found


def _copy(
    info: TensorInfo, dim: int, value: int, name: str, at: CheckedStatement, taken: set[str]
) -> CheckedStatement:
    """`name(x0, ..) = tensor(x0, .., value, ..)` over the whole slice."""
    indices = tuple(fresh_name(f"x{d}", taken) for d in range(len(info.shape) - 1))
    span = at.span
    subscripts: list[ast.Expr] = [ast.Index(v, span, ScalarType.INT32) for v in indices]
    subscripts.insert(dim, ast.IntLit(value, span, ScalarType.INT32))
    rhs = ast.Access(info.name, tuple(subscripts), span, info.scalar)
    extents = info.shape[:dim] + info.shape[dim + 1 :]
    ranges = tuple(IndexRange(v, Sym.of(0), e) for v, e in zip(indices, extents, strict=True))
    return assignment(at, name, ranges, rhs, expr_text(rhs))


def _reading(
    st: CheckedStatement, tensor: str, dim: int, names: dict[int, str]
) -> CheckedStatement:
    """`st` reading `tensor`'s slices (by the constant at `dim`) instead of it."""

    def sliced(n: ast.Expr) -> ast.Expr | None:
        if not (isinstance(n, ast.Access) and n.tensor == tensor):
            return None
        at = n.args[dim]
        assert isinstance(at, ast.IntLit)
        return replace(n, tensor=names[at.value], args=n.args[:dim] + n.args[dim + 1 :])

    return replace(st, rhs=ast.transform(st.rhs, sliced))
