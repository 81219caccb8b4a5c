"""The `reference` target: a vectorised NumPy interpreter of checked TC, with no isl.

It is the oracle every compiled kernel is tested against, so it follows TC's meaning
literally and independently of the polyhedral pipeline. Each statement is evaluated
over a grid of its indices (one array axis per index, left-hand indices first) with
NumPy broadcasting, then stored or reduced into its tensor. Reductions are split into
chunks along the reduction indices so that memory stays bounded.

Values are computed in the types sema assigned (float16 and bfloat16 in float32: the
interpreter holds a half tensor in float32 and rounds what a statement wrote once the
statement is done, so a reduction into it accumulates in float32), integer
`/` and `%` truncate as in C, and the branches of `?:` and the right operands of `&&`
and `||` are evaluated under a mask, so that an index or a divisor that C would never
evaluate raises no error. Every subscript is checked on the data: an out-of-range
gather or an integer division by zero is a `TCInputError` naming the indices.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tcpy.errors import TCInputError
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement, Role, TensorInfo
from tcpy.reference.builtins import IMPLEMENTATIONS
from tcpy.types import ScalarType, promote

CHUNK_ELEMENTS = 1 << 21
"""Largest index grid evaluated at once; reductions are chunked to stay below it."""

# np.minimum / np.maximum propagate NaN, which is what TC's min and max mean on every
# target (np.fmin / np.fmax, C's meaning, would drop it: they are the builtins fmin/fmax).
_UFUNCS = {
    ast.Reduction.SUM: np.add,
    ast.Reduction.PROD: np.multiply,
    ast.Reduction.MIN: np.minimum,
    ast.Reduction.MAX: np.maximum,
}


class Call(Protocol):
    """What a call gives the interpreter (`tcpy.binding.Binding` is one): its inputs
    in host memory, the values of the sizes, each tensor's shape and each statement's
    index ranges at those sizes, all checked."""

    @property
    def host_arrays(self) -> Sequence[np.ndarray]: ...

    @property
    def sizes(self) -> Mapping[str, int]: ...

    def shape_of(self, info: TensorInfo) -> tuple[int, ...]: ...

    def ranges(self, st: CheckedStatement) -> Mapping[str, tuple[int, int]]: ...


def run(cdef: CheckedDef, binding: Call) -> tuple[np.ndarray, ...]:
    """Evaluate `cdef` on checked inputs; returns the outputs in declaration order."""
    tensors: dict[str, np.ndarray] = {
        info.name: _widened(array, info.scalar)
        for info, array in zip(cdef.inputs, binding.host_arrays, strict=True)
    }
    for info in cdef.tensors:
        if info.role is not Role.INPUT:
            tensors[info.name] = np.zeros(binding.shape_of(info), dtype=info.scalar.compute.dtype)
    for st in cdef.statements:
        _Statement(st, tensors, binding.sizes, binding.ranges(st)).execute()
        scalar = cdef.tensor(st.tensor).scalar
        if scalar.is_half:  # rounded once, when the statement is done
            tensors[st.tensor] = rounded(tensors[st.tensor], scalar)
    return tuple(
        tensors[o.name].astype(o.scalar.dtype) if o.scalar.is_half else tensors[o.name]
        for o in cdef.outputs
    )


def rounded(values: np.ndarray, to: ScalarType) -> np.ndarray:
    """Float `values` rounded to the half type `to` (to nearest, ties to even), kept in
    float32. A float64 value goes through float32 first, on every target."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond the range: infinity
        return values.astype(np.float32).astype(to.dtype).astype(np.float32)


def _widened(array: np.ndarray, scalar: ScalarType) -> np.ndarray:
    """The values of a tensor as the interpreter holds them: a half type in float32
    (exactly), so that reductions into it accumulate in float32."""
    return array.astype(np.float32) if scalar.is_half else array


@dataclass
class _Statement:
    st: CheckedStatement
    tensors: dict[str, np.ndarray]
    sizes: Mapping[str, int]
    ranges: Mapping[str, tuple[int, int]]

    def execute(self) -> None:
        st = self.st
        target = self.tensors[st.tensor]
        region = tuple(slice(*self.ranges[v]) for v in st.indices)
        reduction = st.op.reduction
        if reduction is not None and st.op.initializes:
            target[region] = reduction.neutral(_scalar(target))
        if any(hi <= lo for lo, hi in self.ranges.values()):
            return  # an empty range: nothing more to evaluate
        lhs_shape = tuple(hi - lo for lo, hi in (self.ranges[v] for v in st.indices))
        n_lhs = len(st.indices)
        for chunk in self._chunks(math.prod(lhs_shape)):
            grid = _Grid(self, chunk)
            value = grid.eval(st.rhs, None)
            full = lhs_shape + tuple(hi - lo for lo, hi in (chunk[v] for v in st.reduction_indices))
            compute = _scalar(target).compute.dtype
            value = np.broadcast_to(np.asarray(value).astype(compute), full)
            if reduction is None:
                target[region] = value
                continue
            if st.scatter:
                grid.scatter_add(target, value)
                continue
            ufunc = _UFUNCS[reduction]
            axes = tuple(range(n_lhs, len(full)))
            partial = ufunc.reduce(value, axis=axes, dtype=compute) if axes else value
            target[region] = ufunc(target[region].astype(compute), partial)

    def _chunks(self, lhs_size: int) -> list[dict[str, tuple[int, int]]]:
        """Splits of the reduction ranges whose grids hold at most CHUNK_ELEMENTS."""
        budget = max(1, CHUNK_ELEMENTS // max(1, lhs_size))
        pieces: list[list[tuple[int, int]]] = []
        for v in reversed(self.st.reduction_indices):
            lo, hi = self.ranges[v]
            step = max(1, min(hi - lo, budget))
            budget = max(1, budget // step)
            pieces.append([(s, min(s + step, hi)) for s in range(lo, hi, step)])
        pieces.reverse()
        chunks = []
        for combo in itertools.product(*pieces):
            chunk = {v: self.ranges[v] for v in self.st.indices}
            chunk.update(zip(self.st.reduction_indices, combo, strict=True))
            chunks.append(chunk)
        return chunks


def _scalar(array: np.ndarray) -> ScalarType:
    ty = ScalarType.from_dtype(array.dtype)
    assert ty is not None
    return ty


class _Grid:
    """Evaluates expressions over the index grid of one chunk of a statement."""

    def __init__(self, stmt: _Statement, chunk: Mapping[str, tuple[int, int]]):
        self.stmt = stmt
        self.chunk = chunk
        variables = stmt.st.all_indices
        self.axis = {v: k for k, v in enumerate(variables)}
        self.ndim = len(variables)

    def index(self, var: str) -> np.ndarray:
        lo, hi = self.chunk[var]
        shape = [1] * self.ndim
        shape[self.axis[var]] = hi - lo
        return np.arange(lo, hi, dtype=np.int32).reshape(shape)

    def eval(self, e: ast.Expr, mask: np.ndarray | None) -> np.ndarray:
        ty = e.ty.compute.dtype if e.ty is not None else None
        match e:
            case ast.IntLit(value=v) | ast.FloatLit(value=v):
                return np.asarray(v, dtype=ty)
            case ast.Index(name=n):
                return self.index(n)
            case ast.SizeRef(name=n):
                return np.asarray(self.stmt.sizes[n], dtype=np.int32)
            case ast.Access():
                return self.access(e, mask)
            case ast.Cast(to=to, value=v) if to.is_half:
                return rounded(self.eval(v, mask), to)
            case ast.Cast(to=to, value=v):
                return self.eval(v, mask).astype(to.compute.dtype)
            case ast.Call(name=name, args=args):
                values = [self.eval(a, mask).astype(ty) for a in args]
                with np.errstate(all="ignore"):
                    return np.asarray(IMPLEMENTATIONS[name](*values)).astype(ty)
            case ast.Unary(op=ast.UnaryOp.NOT, operand=v):
                return np.logical_not(self.eval(v, mask))
            case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
                return np.negative(self.eval(v, mask).astype(ty))
            case ast.Binary():
                return self.binary(e, mask)
            case ast.Ternary(cond=c, then=t, orelse=o):
                cond = self.eval(c, mask)
                then = self.eval(t, _and(mask, cond)).astype(ty)
                orelse = self.eval(o, _and(mask, np.logical_not(cond))).astype(ty)
                return np.where(cond, then, orelse)
        raise TypeError(f"unexpected node {type(e).__name__}")

    def binary(self, e: ast.Binary, mask: np.ndarray | None) -> np.ndarray:
        op = e.op
        a = self.eval(e.lhs, mask)
        if op is ast.BinaryOp.AND:
            return np.logical_and(a, self.eval(e.rhs, _and(mask, a)))
        if op is ast.BinaryOp.OR:
            return np.logical_or(a, self.eval(e.rhs, _and(mask, np.logical_not(a))))
        b = self.eval(e.rhs, mask)
        if op.is_comparison:
            assert e.lhs.ty is not None and e.rhs.ty is not None
            common = promote(e.lhs.ty, e.rhs.ty).compute.dtype
            return _COMPARE[op](a.astype(common), b.astype(common))
        assert e.ty is not None
        ty = e.ty.compute.dtype
        a, b = a.astype(ty), b.astype(ty)
        with np.errstate(all="ignore"):
            match op:
                case ast.BinaryOp.ADD:
                    return a + b
                case ast.BinaryOp.SUB:
                    return a - b
                case ast.BinaryOp.MUL:
                    return a * b
                case ast.BinaryOp.MIN:
                    return np.minimum(a, b)
                case ast.BinaryOp.MAX:
                    return np.maximum(a, b)
                case ast.BinaryOp.DIV if e.ty.is_float:
                    return a / b
                case ast.BinaryOp.DIV | ast.BinaryOp.MOD:
                    self.check_divisor(e, b, mask)
                    safe = np.where(b == 0, 1, b).astype(ty)
                    remainder = np.fmod(a, safe)
                    if op is ast.BinaryOp.MOD:
                        return remainder
                    return ((a - remainder) // safe).astype(ty)
        raise TypeError(op)

    def check_divisor(self, e: ast.Binary, b: np.ndarray, mask: np.ndarray | None) -> None:
        zero = _and(mask, b == 0)
        if np.any(zero):
            raise TCInputError(f"integer division by zero at {self.describe(zero)}", e.span)

    def access(self, e: ast.Access, mask: np.ndarray | None) -> np.ndarray:
        array = self.stmt.tensors[e.tensor]
        if not e.args:
            return np.asarray(array[()])
        return array[self.subscripts(e, array.shape, mask, "read")]

    def subscripts(
        self, e: ast.Access, shape: tuple[int, ...], mask: np.ndarray | None, verb: str
    ) -> tuple[np.ndarray, ...]:
        """The subscripts of `e` over the grid, each checked within its dimension."""
        subscripts = []
        for k, arg in enumerate(e.args):
            idx = self.eval(arg, mask).astype(np.int64)
            extent = shape[k]
            bad = _and(mask, (idx < 0) | (idx >= extent))
            if np.any(bad):
                values, where = np.broadcast_arrays(idx, bad)
                first = values[where].flat[0]
                raise TCInputError(
                    f"{e.tensor} is {verb} at index {first} of its dimension {k}, outside "
                    f"0:{extent}, at {self.describe(bad)}",
                    arg.span,
                )
            subscripts.append(np.clip(idx, 0, extent - 1))
        return tuple(subscripts)

    def scatter_add(self, target: np.ndarray, value: np.ndarray) -> None:
        """Add `value`, over the grid, into the elements of `target` the scatter-add's
        subscripts compute, in the grid's order (repeated elements add up)."""
        st = self.stmt.st
        access = st.target
        assert access is not None
        full = value.shape
        places = self.subscripts(access, target.shape, None, "written")
        places = tuple(np.broadcast_to(p, full).reshape(-1) for p in places)
        total = target.astype(value.dtype)
        np.add.at(total, places, value.reshape(-1))
        target[...] = total

    def describe(self, where: np.ndarray) -> str:
        """The index values of the first point of the grid where `where` holds."""
        full = np.broadcast_to(where, tuple(self._extent(v) for v in self.axis))
        if full.ndim == 0:
            return "the only point of the statement"
        point = [int(p[0]) for p in np.nonzero(full)]
        return ", ".join(
            f"{v}={self.chunk[v][0] + p}" for v, p in zip(self.axis, point, strict=True)
        )

    def _extent(self, var: str) -> int:
        lo, hi = self.chunk[var]
        return hi - lo


def _and(mask: np.ndarray | None, cond: np.ndarray) -> np.ndarray:
    return cond if mask is None else np.logical_and(mask, cond)


_COMPARE = {
    ast.BinaryOp.LT: np.less,
    ast.BinaryOp.LE: np.less_equal,
    ast.BinaryOp.GT: np.greater,
    ast.BinaryOp.GE: np.greater_equal,
    ast.BinaryOp.EQ: np.equal,
    ast.BinaryOp.NE: np.not_equal,
}
