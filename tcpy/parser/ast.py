"""The TC abstract syntax tree: frozen dataclasses, every node with a source span.

Abstract grammar (what the parser builds; sema fills `ty` and resolves names):

    Program    = (Def*)
    Def        = (name, Param*, Output*, Statement*)
    Param      = (name, TensorType | None)          # None: written without a type
    Output     = (name, TensorType | None)          # None: type and shape inferred
    TensorType = (ScalarType, Dim*)                 # no dims: a 0-d (scalar) tensor
    Dim        = SizeDim(name) | ConstDim(value)
    Statement  = (tensor, index names, AssignOp, rhs: Expr, equivalent: Equivalent | None,
                  where: Clause*)
    Clause     = RangeClause(var, lo, hi)           # lo <= var < hi
               | LetClause(var, value)              # inlined where var is used
               | ExistsClause(expr)                 # accesses used for ranges only
    Expr       = IntLit(value) | FloatLit(value) | Ident(name)
               | Access(tensor, Expr*)              # a read; written T(...) or, 0-d, T
               | Index(name) | SizeRef(name)        # made by sema from Ident
               | Call(builtin, Expr*) | Cast(ScalarType, Expr)
               | Unary(UnaryOp, Expr) | Binary(BinaryOp, Expr, Expr)
               | Ternary(cond, then, else)

`Apply` is what the parser makes of `NAME(args)`; sema turns it into an `Access` or a
`Call`. Every expression carries `ty`, `None` until sema has typed it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from tcpy.errors import Span
from tcpy.types import ScalarType


class AssignOp(enum.Enum):
    ASSIGN = "="
    SUM = "+="
    PROD = "*="
    MIN = "min="
    MAX = "max="
    SUM_INIT = "+=!"
    PROD_INIT = "*=!"
    MIN_INIT = "min=!"
    MAX_INIT = "max=!"

    @property
    def is_reduction(self) -> bool:
        return self is not AssignOp.ASSIGN

    @property
    def initializes(self) -> bool:
        """The `!` forms set the written range to the identity before reducing."""
        return self.value.endswith("!")

    @property
    def reduction(self) -> Reduction | None:
        return None if self is AssignOp.ASSIGN else Reduction(self.value.rstrip("!")[:-1])


class Reduction(enum.Enum):
    SUM = "+"
    PROD = "*"
    MIN = "min"
    MAX = "max"

    def neutral(self, ty: ScalarType) -> int | float | bool:
        """The identity of the reduction, which a `!` reduction starts from: 0, 1, and
        for min/max the infinities on floats (a row of -inf reduces to -inf under
        `max=!`, as `np.max` gives; a finite start would not) and the extreme values
        of the type on integers."""
        if self is Reduction.SUM:
            return 0
        if self is Reduction.PROD:
            return 1
        if ty.is_bool:
            return self is Reduction.MIN
        if ty.is_float:
            return math.inf if self is Reduction.MIN else -math.inf
        limits = np.iinfo(ty.dtype)
        return int(limits.max if self is Reduction.MIN else limits.min)


class BinaryOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    MOD = "%"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="
    AND = "&&"
    OR = "||"
    MIN = "min"
    MAX = "max"

    @property
    def is_comparison(self) -> bool:
        return self in _COMPARISONS

    @property
    def is_logical(self) -> bool:
        return self in (BinaryOp.AND, BinaryOp.OR)


_COMPARISONS = frozenset(
    {BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE, BinaryOp.EQ, BinaryOp.NE}
)


class UnaryOp(enum.Enum):
    NEG = "-"
    NOT = "!"


# --- declarations -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SizeDim:
    name: str
    span: Span


@dataclass(frozen=True, slots=True)
class ConstDim:
    value: int
    span: Span


Dim = SizeDim | ConstDim


@dataclass(frozen=True, slots=True)
class TensorType:
    scalar: ScalarType
    dims: tuple[Dim, ...]
    span: Span

    @property
    def rank(self) -> int:
        return len(self.dims)


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: TensorType | None
    span: Span


@dataclass(frozen=True, slots=True)
class Output:
    name: str
    type: TensorType | None
    span: Span


# --- expressions --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IntLit:
    value: int
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class FloatLit:
    value: float
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Ident:
    """A bare name, before sema decides what it names."""

    name: str
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Apply:
    """`NAME(args)`, before sema decides between a tensor access and a builtin call."""

    name: str
    args: tuple[Expr, ...]
    span: Span
    name_span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Index:
    """An index variable used as a value (always int32)."""

    name: str
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class SizeRef:
    """A size symbol used as a value (always int32)."""

    name: str
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Access:
    """A read of a tensor element; no subscripts for a 0-d tensor."""

    tensor: str
    args: tuple[Expr, ...]
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """A call of a builtin math function."""

    name: str
    args: tuple[Expr, ...]
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Cast:
    to: ScalarType
    value: Expr
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Unary:
    op: UnaryOp
    operand: Expr
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Binary:
    op: BinaryOp
    lhs: Expr
    rhs: Expr
    span: Span
    ty: ScalarType | None = None


@dataclass(frozen=True, slots=True)
class Ternary:
    cond: Expr
    then: Expr
    orelse: Expr
    span: Span
    ty: ScalarType | None = None


Expr = (
    IntLit
    | FloatLit
    | Ident
    | Apply
    | Index
    | SizeRef
    | Access
    | Call
    | Cast
    | Unary
    | Binary
    | Ternary
)


# --- statements ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RangeClause:
    var: str
    lo: Expr
    hi: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class LetClause:
    var: str
    value: Expr
    span: Span


@dataclass(frozen=True, slots=True)
class ExistsClause:
    expr: Expr
    span: Span


Clause = RangeClause | LetClause | ExistsClause


@dataclass(frozen=True, slots=True)
class Equivalent:
    """The `<=> name(args)` annotation: checked, then ignored."""

    name: str
    args: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True, slots=True)
class Statement:
    tensor: str
    indices: tuple[str, ...]
    index_spans: tuple[Span, ...]
    op: AssignOp
    rhs: Expr
    equivalent: Equivalent | None
    where: tuple[Clause, ...]
    span: Span
    lhs_span: Span
    # the left-hand subscripts of a scatter-add (`E(idx(b), d) += ...`): set when one
    # is more than an index alone; `indices` is then empty
    scatter: tuple[Expr, ...] | None = None


@dataclass(frozen=True, slots=True)
class Def:
    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    statements: tuple[Statement, ...]
    span: Span
    name_span: Span


@dataclass(frozen=True, slots=True)
class Program:
    defs: tuple[Def, ...]
    source: str


# --- traversal ----------------------------------------------------------------------


def children(e: Expr) -> tuple[Expr, ...]:
    match e:
        case Apply(args=args) | Access(args=args) | Call(args=args):
            return args
        case Cast(value=v) | Unary(operand=v):
            return (v,)
        case Binary(lhs=a, rhs=b):
            return (a, b)
        case Ternary(cond=c, then=t, orelse=o):
            return (c, t, o)
    return ()


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of an expression, parents before children."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


def transform(e: Expr, replace: Callable[[Expr], Expr | None]) -> Expr:
    """`e` rebuilt bottom-up where `replace` gives a node for a node (taken as is)."""
    done = replace(e)
    if done is not None:
        return done
    match e:
        case Access(tensor=t, args=args, span=s, ty=ty):
            return Access(t, tuple(transform(a, replace) for a in args), s, ty)
        case Call(name=n, args=args, span=s, ty=ty):
            return Call(n, tuple(transform(a, replace) for a in args), s, ty)
        case Cast(to=to, value=v, span=s, ty=ty):
            return Cast(to, transform(v, replace), s, ty)
        case Unary(op=op, operand=v, span=s, ty=ty):
            return Unary(op, transform(v, replace), s, ty)
        case Binary(op=op, lhs=a, rhs=b, span=s, ty=ty):
            return Binary(op, transform(a, replace), transform(b, replace), s, ty)
        case Ternary(cond=c, then=t, orelse=o, span=s, ty=ty):
            return Ternary(
                transform(c, replace), transform(t, replace), transform(o, replace), s, ty
            )
    return e
