"""What the front end hands to every target: checked, typed, ranged definitions.

A `CheckedDef` is a TC definition with every name resolved (`Index`, `SizeRef`,
`Access`, `Call` instead of `Ident`/`Apply`, lets inlined), every expression typed,
every tensor's element type and shape known (shapes as `Sym` in the size symbols),
and every index variable of every statement given a range. It is the input of the
`reference` interpreter and of the polyhedral core alike.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from tcpy.errors import Span, TCError
from tcpy.parser import ast
from tcpy.parser.symbolic import Sym
from tcpy.types import ScalarType


class Role(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    TEMPORARY = "temporary"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    role: Role
    scalar: ScalarType
    shape: tuple[Sym, ...]
    span: Span

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(frozen=True, slots=True)
class IndexRange:
    """`lo <= var < hi`, with bounds in the size symbols."""

    var: str
    lo: Sym
    hi: Sym

    def __str__(self) -> str:
        return f"{self.var} in {self.lo}:{self.hi}"


@dataclass(frozen=True, slots=True)
class BoundsCheck:
    """An affine subscript whose bounds were not proved at definition time: at each
    call, `lo <= subscript <= hi` over the ranges must lie within `0:extent`."""

    tensor: str
    dim: int
    lo: Sym
    hi: Sym
    extent: Sym
    span: Span


@dataclass(frozen=True, slots=True)
class StartCheck:
    """A dimension of a tensor whose shape this statement defines, written by an index
    whose inferred start depends on the sizes (`KH - 1` in a convolution gradient).
    The tensor is allocated from index 0 and sized by `hi`, so at each call `lo` must
    be 0: otherwise the statement would leave the first elements unwritten (start > 0)
    or write before the tensor (start < 0)."""

    tensor: str
    dim: int
    var: str
    lo: Sym
    hi: Sym
    span: Span  # the index on the left-hand side
    fix: str = ""  # the statement shifted to start at 0, when tcpy accepts it


@dataclass(frozen=True, slots=True)
class CheckedStatement:
    tensor: str
    indices: tuple[str, ...]  # left-hand side, in order: dimension k is indices[k]
    reduction_indices: tuple[str, ...]
    op: ast.AssignOp
    rhs: ast.Expr  # typed, names resolved
    ranges: tuple[IndexRange, ...]  # one per index, lhs indices first
    checks: tuple[BoundsCheck, ...]
    span: Span
    text: str  # the statement as written, for comments in generated code
    starts: tuple[StartCheck, ...] = ()  # ranges whose start must be 0 at each call
    # a scatter-add's left-hand subscripts (typed, in the statement's indices, which are
    # then all in `reduction_indices`): it adds into the element they compute
    scatter: tuple[ast.Expr, ...] = ()

    @property
    def target(self) -> ast.Access | None:
        """The element a scatter-add writes, as an access; None for other statements."""
        if not self.scatter:
            return None
        return ast.Access(self.tensor, self.scatter, self.span)

    @property
    def expressions(self) -> tuple[ast.Expr, ...]:
        """What the statement evaluates: its right-hand side, and a scatter's target
        (whose subscripts may read tensors too)."""
        target = self.target
        return (self.rhs,) if target is None else (self.rhs, target)

    def range_of(self, var: str) -> IndexRange:
        for r in self.ranges:
            if r.var == var:
                return r
        raise KeyError(var)

    @property
    def all_indices(self) -> tuple[str, ...]:
        return self.indices + self.reduction_indices


@dataclass(frozen=True, slots=True)
class Together:
    """Statements `start` to `stop` (exclusive) of a def that run, in the original
    order, inside loops they share (made by a rewrite, never written: see
    `tcpy.poly.online`): over their first `rows` indices, then over tiles of `width`
    consecutive values of one index of each (`along`, from `lo`), the statements in
    order inside each tile; the last of the rows in blocks of `block` (from
    `block_lo`), each statement over the block's rows before the next. A statement
    marked `once` runs at the first value of each tile only, its `along` index never
    read."""

    start: int
    stop: int
    rows: int
    along: tuple[str, ...]  # per statement, its index the tiles cut
    once: tuple[bool, ...]  # per statement
    lo: Sym
    width: int
    block: int = 1
    block_lo: Sym = Sym.of(0)  # noqa: RUF009 (a frozen value)

    def member(self, k: int) -> int | None:
        """The position among the shared statements of the def's statement `k`."""
        return k - self.start if self.start <= k < self.stop else None


@dataclass(frozen=True, slots=True)
class CheckedDef:
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    temporaries: tuple[TensorInfo, ...]
    statements: tuple[CheckedStatement, ...]
    size_symbols: tuple[str, ...]  # in order of first appearance in the inputs
    span: Span
    source: str
    filename: str | None = None  # as given to `define`, for errors raised at call time
    together: tuple[Together, ...] = ()  # statements sharing loops (`Together`)

    def group_of(self, k: int) -> Together | None:
        """The `Together` that statement `k` belongs to, if any."""
        return next((g for g in self.together if g.member(k) is not None), None)

    def __repr__(self) -> str:
        def param(t: TensorInfo) -> str:
            dims = ",".join(map(str, t.shape))
            return f"{t.scalar.value}({dims}) {t.name}" if dims else f"{t.scalar.value} {t.name}"

        inputs = ", ".join(param(t) for t in self.inputs)
        outputs = ", ".join(t.name for t in self.outputs)
        return f"CheckedDef(def {self.name}({inputs}) -> ({outputs}))"

    def located(self, error: TCError) -> TCError:
        """`error` with this def's source and file name, for a message with a caret."""
        return error.with_source(self.source, self.filename)

    def tensor(self, name: str) -> TensorInfo:
        for t in self.inputs + self.outputs + self.temporaries:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        return self.inputs + self.outputs + self.temporaries


def _shape(e: object) -> object:
    """`e` without its source positions and types: equal for equal expressions."""
    if isinstance(e, tuple):
        return tuple(_shape(x) for x in e)
    if dataclasses.is_dataclass(e) and not isinstance(e, type):
        kept = (f.name for f in dataclasses.fields(e) if f.name not in ("span", "ty"))
        return (type(e).__name__, *(_shape(getattr(e, name)) for name in kept))
    return e


def contraction(st: CheckedStatement) -> bool:
    """A reduction that combines two or more reads along its reduction indices (of
    different tensors, or of one at different elements: an attention's queries and
    keys in one tensor), not one read twice (a sum of squares)."""
    if st.op.reduction is None:
        return False
    along = {
        _shape(node)
        for node in ast.walk(st.rhs)
        if isinstance(node, ast.Access)
        and any(
            isinstance(i, ast.Index) and i.name in st.reduction_indices
            for a in node.args
            for i in ast.walk(a)
        )
    }
    return len(along) > 1
