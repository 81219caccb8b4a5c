"""Contractions and the part each index plays in one, read from the accesses.

A statement `C(b,m,n) +=! A(b,m,k) * B(b,k,n)` is a contraction of two operands: a
sum over the reduction indices (k) of a product of two tensors, each read at plain
indices or sums of them (a convolution's window, `I(n,c,h+kh,w+kw)`: an implicit
matrix product). Its output indices split three ways: those only the left operand
reads (rows: m; n, h and w of a convolution), those only the right one reads
(columns: n; a convolution's filters) and those both read (batch: b). `classify`
finds them; the GPU mapping runs what it classifies on tensor cores
(`tcpy.mapping.gpu.matrix`), with the rows of a warp's tile from the left operand
and its columns from the right one. Casts of the operands (`float(A(m,k))`) are
allowed: the instruction's operands are the tensors' elements, widened exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement
from tcpy.types import ScalarType


@dataclass(frozen=True, slots=True)
class Operand:
    """One factor of a contraction's product: a tensor read at `subscripts`, each the
    sum of the indices it names (one for a plain index; no index in two), each index
    times its positive `strides` factor (a strided window's `2*h + kh`), maybe cast
    to a wider type."""

    tensor: str
    subscripts: tuple[tuple[str, ...], ...]
    strides: tuple[tuple[int, ...], ...]  # per subscript, each index's factor
    scalar: ScalarType  # the tensor's element type

    def stride(self, index: str) -> int:
        """The factor of `index` in its subscript."""
        d = self.dimension(index)
        return self.strides[d][self.subscripts[d].index(index)]

    @property
    def indices(self) -> tuple[str, ...]:
        """Every index the subscripts use, in order."""
        return tuple(i for sub in self.subscripts for i in sub)

    def plain(self, index: str) -> bool:
        """Whether some subscript is `index` alone (a factor of 1)."""
        return (index,) in self.subscripts and self.stride(index) == 1

    def dimension(self, index: str) -> int:
        """The dimension whose subscript uses `index`."""
        return next(d for d, sub in enumerate(self.subscripts) if index in sub)


@dataclass(frozen=True, slots=True)
class Contraction:
    """The roles of a contraction's indices (`classify`): `rows` read by the left
    operand only, `columns` by the right one only, `batch` by both and the output,
    `reduction` by both and not the output (each in the output's or the left
    operand's order)."""

    left: Operand
    right: Operand
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    batch: tuple[str, ...]
    reduction: tuple[str, ...]


def classify(st: CheckedStatement, cdef: CheckedDef) -> Contraction | None:
    """The contraction `st` is: a sum (`+=` or `+=!`) of a product of two reads of
    tensors at plain indices or sums of them, each maybe times a positive constant (a
    strided window `A(2*h+kh)`; maybe cast), over reduction indices both read, every
    output index read by one operand or both, and no other index; None for any other
    statement (a gather, a third factor, a scatter)."""
    if st.op.reduction is not ast.Reduction.SUM or st.scatter or not st.reduction_indices:
        return None
    rhs = st.rhs
    if not isinstance(rhs, ast.Binary) or rhs.op is not ast.BinaryOp.MUL:
        return None
    left, right = _operand(rhs.lhs, cdef), _operand(rhs.rhs, cdef)
    if left is None or right is None or left.tensor == st.tensor or right.tensor == st.tensor:
        return None
    reads_left, reads_right, out = set(left.indices), set(right.indices), set(st.indices)
    if not reads_left | reads_right >= out or len(out) != len(st.indices):
        return None
    reduction = tuple(st.reduction_indices)
    if not all(r in reads_left and r in reads_right for r in reduction):
        return None
    if (reads_left | reads_right) - out - set(reduction):
        return None
    rows = tuple(i for i in st.indices if i in reads_left and i not in reads_right)
    columns = tuple(i for i in st.indices if i in reads_right and i not in reads_left)
    batch = tuple(i for i in st.indices if i in reads_left and i in reads_right)
    return Contraction(left, right, rows, columns, batch, reduction)


def _operand(e: ast.Expr, cdef: CheckedDef) -> Operand | None:
    """`e` as a factor: a read at sums of distinct indices, maybe under a cast to a
    type at least as wide (a narrowing cast rounds: not the element itself)."""
    cast = None
    if isinstance(e, ast.Cast):
        cast, e = e.to, e.value
    if not isinstance(e, ast.Access) or not e.args:
        return None
    subscripts, strides = [], []
    for a in e.args:
        summed = _summed(a)
        if summed is None:
            return None
        subscripts.append(tuple(name for name, _ in summed))
        strides.append(tuple(factor for _, factor in summed))
    indices = [i for sub in subscripts for i in sub]
    if len(set(indices)) != len(indices):
        return None
    scalar = cdef.tensor(e.tensor).scalar
    if cast is not None and not _widens(scalar, cast):
        return None
    return Operand(e.tensor, tuple(subscripts), tuple(strides), scalar)


def _summed(e: ast.Expr) -> tuple[tuple[str, int], ...] | None:
    """The indices `e` adds up, each with its positive factor (`2*h + kh`: (h, 2),
    (kh, 1)), or None for anything else."""
    if isinstance(e, ast.Index):
        return ((e.name, 1),)
    if isinstance(e, ast.Binary) and e.op is ast.BinaryOp.ADD:
        left, right = _summed(e.lhs), _summed(e.rhs)
        return None if left is None or right is None else left + right
    if isinstance(e, ast.Binary) and e.op is ast.BinaryOp.MUL:
        for factor, index in ((e.lhs, e.rhs), (e.rhs, e.lhs)):
            if isinstance(factor, ast.IntLit) and factor.value > 0 and isinstance(index, ast.Index):
                return ((index.name, factor.value),)
    return None


_FLOATS = (ScalarType.FLOAT16, ScalarType.FLOAT32, ScalarType.FLOAT64)


def _widens(source: ScalarType, to: ScalarType) -> bool:
    """Whether every value of `source` is exactly a value of `to` (floats only)."""
    if source is to:
        return True
    if source is ScalarType.BFLOAT16:
        return to in (ScalarType.FLOAT32, ScalarType.FLOAT64)
    return source in _FLOATS and to in _FLOATS and _FLOATS.index(source) < _FLOATS.index(to)
