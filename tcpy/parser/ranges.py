"""Range inference (docs/language.md, "Range inference") and bounds proofs.

Every tensor read (and `exists` access, and the write of a tensor whose shape is
already known) gives, per dimension, the condition `0 <= subscript < extent`. Rounds
then solve every index that some affine condition bounds on its own, replacing the
indices solved in earlier rounds by their whole range, so that the range found is
valid for every value of them; an index's range is the largest interval that
satisfies all its conditions. `where i in lo:hi` fixes a range outright.

After inference each affine subscript is proved in bounds over the ranges where the
proof is symbolic (`A(i + 1)` with `i in 0:N-1`); what cannot be decided for every size
becomes a `BoundsCheck` evaluated at call time, and what is false for every size is
an error now. The same holds for the start of a range that defines a tensor's shape:
it must be 0, and a start that depends on the sizes becomes a `StartCheck`.
Non-affine subscripts (gathers, `%`, products of indices and sizes) give
no condition; the targets check them on the data.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tcpy.errors import Span, TCRangeError, TCSemanticError, TCWarning, warn
from tcpy.parser import ast
from tcpy.parser.checked import BoundsCheck, IndexRange, StartCheck
from tcpy.parser.linear import Linear, linear_form
from tcpy.parser.symbolic import Sym, provably_le, provably_positive, sym_max, sym_min

if TYPE_CHECKING:  # fixes re-checks statements with the whole front end
    from tcpy.parser.fixes import StatementSource


@dataclass(frozen=True, slots=True)
class StatementShape:
    """What range inference needs of one resolved statement."""

    tensor: str
    indices: tuple[str, ...]
    index_spans: tuple[Span, ...]
    reduction_indices: tuple[str, ...]
    rhs: ast.Expr
    exists: tuple[ast.Expr, ...]
    fixed: Mapping[str, tuple[Sym, Sym]]  # from `where i in lo:hi`
    span: Span
    lhs_span: Span
    fixes: StatementSource | None = None  # the statement's text, for fixes and warnings
    filename: str | None = None
    scatter: ast.Access | None = None  # the element a scatter-add writes


@dataclass(frozen=True, slots=True)
class InferredRanges:
    ranges: tuple[IndexRange, ...]
    checks: tuple[BoundsCheck, ...]
    lhs_shape: tuple[Sym, ...]
    starts: tuple[StartCheck, ...]


@dataclass(frozen=True, slots=True)
class _Condition:
    """0 <= subscript < extent, for one dimension of one access."""

    linear: Linear
    extent: Sym
    tensor: str
    dim: int
    span: Span
    proved: bool  # False for accesses only read under a condition, or in `exists`
    guarded: bool = False  # read only under a condition (?: branch, right of && or ||)


def infer_ranges(st: StatementShape, shapes: Mapping[str, tuple[Sym, ...]]) -> InferredRanges:
    """Ranges of every index of `st`; `shapes` holds the tensors whose shape is known."""
    conditions = _conditions(st, shapes)
    solved = _solve(st, conditions)
    if st.scatter is not None:
        conditions, solved = _scatter_conditions(st, shapes, conditions, solved)
    _warn_guarded_narrowing(st, conditions, solved)
    variables = st.indices + st.reduction_indices
    missing = [v for v in variables if v not in solved]
    if missing:
        names = ", ".join(missing)
        which = "index" if len(missing) == 1 else "indices"
        lhs = [v for v in missing if v in st.indices]
        role = "of the left-hand side" if lhs else "of the reduction"
        raise TCRangeError(
            f"cannot infer the range of {which} {names} {role}: no access bounds "
            f"{'it' if len(missing) == 1 else 'them'} on its own; {_range_hint(st, missing)}",
            st.span,
        )
    ranges = tuple(IndexRange(v, *solved[v]) for v in variables)
    for r, span in zip(
        ranges, [*st.index_spans, *([st.span] * len(st.reduction_indices))], strict=True
    ):
        if provably_le(r.hi, r.lo):
            raise TCRangeError(f"index {r.var} has an empty range {r.lo}:{r.hi}", span)

    starts: tuple[StartCheck, ...] = ()
    if st.tensor in shapes:
        # The tensor's own shape bounds every written index from 0: nothing to check.
        lhs_shape = shapes[st.tensor]
    else:
        starts = _deferred_starts(st, ranges)
        lhs_shape = tuple(r.hi for r in ranges[: len(st.indices)])
    return InferredRanges(ranges, _bounds_checks(conditions, solved), lhs_shape, starts)


def _scatter_conditions(
    st: StatementShape,
    shapes: Mapping[str, tuple[Sym, ...]],
    conditions: list[_Condition],
    solved: dict[str, tuple[Sym, Sym]],
) -> tuple[list[_Condition], dict[str, tuple[Sym, Sym]]]:
    """A scatter-add's conditions with those of the element it writes, and its ranges.
    That element bounds only the indices nothing else does (`d` in `E(idx(b), d) +=
    w(b)`): an index the right-hand side bounds keeps its range, and the subscripts are
    then proved in bounds over it or checked at each call, never narrowing the sum."""
    assert st.scatter is not None
    shape = shapes[st.scatter.tensor]
    own = [
        _Condition(lin, shape[k], st.scatter.tensor, k, arg.span, True)
        for k, arg in enumerate(st.scatter.args)
        if (lin := linear_form(arg)) is not None
    ]
    if all(v in solved for v in st.reduction_indices):
        return [*conditions, *own], solved
    return [*conditions, *own], _solve(st, [*conditions, *own], start=solved)


def _range_hint(st: StatementShape, missing: list[str]) -> str:
    """A where clause for each index without a range: with a size of the def standing
    for the one meant, when the statement is accepted with it."""
    fixed = None
    if st.fixes and st.fixes.sizes:
        size = st.fixes.sizes[0]
        fixed = st.fixes.with_ranges({v: ("0", size) for v in missing})
    clauses = ", ".join(f"{v} in 0:<size>" for v in missing)
    if fixed is None:
        return f"give {'it' if len(missing) == 1 else 'them'} a range: where {clauses}"
    return (
        f"give {'it' if len(missing) == 1 else 'them'} a range, e.g. {fixed} (with the size meant)"
    )


def _deferred_starts(st: StatementShape, ranges: tuple[IndexRange, ...]) -> tuple[StartCheck, ...]:
    """The left-hand indices of a statement that defines its tensor's shape must start
    at 0, since the tensor is allocated from 0. A start that is non-zero for every size
    (`O(i) = I(i - 1)`) is an error now; one that depends on the sizes (`KH - 1` in a
    convolution gradient, 0 for the 1x1 filters TC ran it with) is checked at each call.
    The fix offered shifts every such index to start at 0 (`O(i) = I(i)`)."""
    lhs = list(zip(ranges, st.index_spans, strict=False))
    shifts = {r.var: (r.lo, r.hi) for r, _ in lhs if r.lo != Sym()}
    if not shifts:
        return ()
    fix = (st.fixes.shifted(shifts) if st.fixes else None) or ""
    starts = []
    for dim, (r, span) in enumerate(lhs):
        if r.lo == Sym():
            continue
        if provably_positive(r.lo) or provably_positive(-r.lo):
            raise TCRangeError(start_message(st.tensor, dim, r, r.lo, fix=fix), span)
        starts.append(StartCheck(st.tensor, dim, r.var, r.lo, r.hi, span, fix))
    return tuple(starts)


def start_message(
    tensor: str, dim: int, r: IndexRange, start: Sym | int, at: str = "", fix: str = ""
) -> str:
    """Why an output cannot start where its range does, shared by define and call;
    `fix`, the statement shifted to start at 0, when tcpy accepts it."""
    how = f": {fix}" if fix else f" (run {r.var} over 0:{r.hi - r.lo}, reading at {r.var} + {r.lo})"
    return (
        f"{tensor} would start at index {start}, not 0, in its dimension {dim} written by "
        f"{r.var} (inferred {r.var} in {r.lo}:{r.hi}{at}); shift the subscripts so that "
        f"{r.var} starts at 0{how}"
    )


def _conditions(st: StatementShape, shapes: Mapping[str, tuple[Sym, ...]]) -> list[_Condition]:
    out: list[_Condition] = []
    if st.tensor in shapes:
        for k, (var, span) in enumerate(zip(st.indices, st.index_spans, strict=True)):
            own = Linear(((var, 1),), Sym())
            out.append(_Condition(own, shapes[st.tensor][k], st.tensor, k, span, True))
    reads = [(a, g, False) for a, g in guarded_accesses(st.rhs)]
    if st.scatter is not None:  # the reads in a scatter's subscripts (`idx(b)`)
        reads += [(a, g, False) for e in st.scatter.args for a, g in guarded_accesses(e)]
    reads += [(a, False, True) for e in st.exists for a, _ in guarded_accesses(e)]
    for node, guarded, exists in reads:
        if node.tensor not in shapes:
            continue
        for k, arg in enumerate(node.args):
            lin = linear_form(arg)
            if lin is not None:
                extent = shapes[node.tensor][k]
                proved = not (guarded or exists)
                out.append(_Condition(lin, extent, node.tensor, k, arg.span, proved, guarded))
    return out


def affine_span(value: ast.Expr, ranges: Iterable[IndexRange]) -> tuple[Sym, Sym] | None:
    """The values an affine `value` takes over `ranges` (of every index it uses), as
    `lo:hi` (hi exclusive); None where it is not affine or uses an index without a
    range there."""
    form = linear_form(value)
    if form is None:
        return None
    by_var = {r.var: r for r in ranges}
    lo = hi = form.rest
    for v, c in form.coeffs:
        r = by_var.get(v)
        if r is None:
            return None
        first, last = r.lo * c, (r.hi - 1) * c
        lo, hi = (lo + first, hi + last) if c > 0 else (lo + last, hi + first)
    return lo, hi + 1


def stays_within(
    arg: ast.Expr,
    ranges: Sequence[IndexRange],
    extent: Sym,
    sizes: Mapping[str, int] | None = None,
    known: Sequence[ast.Expr] = (),
) -> bool:
    """Whether the affine subscript `arg` lies in `0:extent` over the whole of `ranges`
    (each index it uses): at `sizes` where given (a kernel built for them), else for
    every size. A read under a condition whose subscripts do is in bounds wherever
    the condition lets it be read. At `sizes`, the comparisons in `known` (true where
    the read is made: the condition it is read under) bound `arg` too, where one
    compares `arg` itself, up to a constant (`k - 2 >= 0 && k - 2 < H - 2 ? d_O(k - 2)
    : 0`, a padded copy)."""
    span = affine_span(arg, ranges)
    if span is None:
        return False
    lo, hi = span
    if sizes is None:
        return provably_le(Sym(), lo) is True and provably_le(hi, extent) is True
    try:
        low, high = lo.evaluate(sizes), hi.evaluate(sizes)
        for bound_low, bound_high in (_bounds(arg, c, sizes) for c in known):
            low = low if bound_low is None else max(low, bound_low)
            high = high if bound_high is None else min(high, bound_high)
        return low >= 0 and high <= extent.evaluate(sizes)
    except KeyError:
        return False


def _bounds(
    arg: ast.Expr, comparison: ast.Expr, sizes: Mapping[str, int]
) -> tuple[int | None, int | None]:
    """The bounds `lo:hi` (hi exclusive; None: none) a true `comparison` gives the
    affine `arg`, where it compares `arg` plus a constant with another constant."""
    if not isinstance(comparison, ast.Binary) or comparison.op not in _BOUNDING:
        return None, None
    form, lhs, rhs = linear_form(arg), linear_form(comparison.lhs), linear_form(comparison.rhs)
    if form is None or lhs is None or rhs is None:
        return None, None
    diff = lhs + rhs.scale(-1)  # diff op 0
    op = comparison.op
    if diff.coeffs == form.scale(-1).coeffs:  # -arg + c op 0: arg flip(op) c
        diff, op = diff.scale(-1), _FLIPPED[op]
    if diff.coeffs != form.coeffs:
        return None, None
    c = (diff.rest - form.rest).evaluate(sizes)  # arg + c op 0
    return {
        ast.BinaryOp.GE: (-c, None),
        ast.BinaryOp.GT: (-c + 1, None),
        ast.BinaryOp.LE: (None, -c + 1),
        ast.BinaryOp.LT: (None, -c),
    }[op]


_BOUNDING = (ast.BinaryOp.GE, ast.BinaryOp.GT, ast.BinaryOp.LE, ast.BinaryOp.LT)
_FLIPPED = {
    ast.BinaryOp.GE: ast.BinaryOp.LE,
    ast.BinaryOp.GT: ast.BinaryOp.LT,
    ast.BinaryOp.LE: ast.BinaryOp.GE,
    ast.BinaryOp.LT: ast.BinaryOp.GT,
}


def known_conditions(e: ast.Expr) -> dict[int, tuple[ast.Expr, ...]]:
    """For each access of `e` (by `id`) read under a condition, the conjuncts known
    true where C evaluates it: the test of each `?:` whose first branch holds it, the
    left operand of each `&&` whose right one does (split at their own `&&`s)."""
    found: dict[int, tuple[ast.Expr, ...]] = {}
    stack: list[tuple[ast.Expr, tuple[ast.Expr, ...]]] = [(e, ())]
    while stack:
        node, known = stack.pop()
        if isinstance(node, ast.Access) and known:
            found[id(node)] = known
        match node:
            case ast.Ternary(cond=c, then=t, orelse=o):
                stack += [(c, known), (t, (*known, *_conjuncts(c))), (o, known)]
            case ast.Binary(op=ast.BinaryOp.AND, lhs=a, rhs=b):
                stack += [(a, known), (b, (*known, *_conjuncts(a)))]
            case _:
                stack += [(c, known) for c in ast.children(node)]
    return found


def _conjuncts(e: ast.Expr) -> tuple[ast.Expr, ...]:
    if isinstance(e, ast.Binary) and e.op is ast.BinaryOp.AND:
        return (*_conjuncts(e.lhs), *_conjuncts(e.rhs))
    return (e,)


def guarded_accesses(e: ast.Expr) -> Iterator[tuple[ast.Access, bool]]:
    """Every access of an expression, and whether it is read only under a condition
    (a branch of ?:, the right operand of && or ||), where C evaluates it lazily."""
    stack = [(e, False)]
    while stack:
        node, guarded = stack.pop()
        if isinstance(node, ast.Access):
            yield node, guarded
        match node:
            case ast.Ternary(cond=c, then=t, orelse=o):
                stack += [(c, guarded), (t, True), (o, True)]
            case ast.Binary(op=ast.BinaryOp.AND | ast.BinaryOp.OR, lhs=a, rhs=b):
                stack += [(a, guarded), (b, True)]
            case _:
                stack += [(c, guarded) for c in ast.children(node)]


def _solve(
    st: StatementShape,
    conditions: list[_Condition],
    start: Mapping[str, tuple[Sym, Sym]] | None = None,
) -> dict[str, tuple[Sym, Sym]]:
    """The ranges `conditions` give, from the where clauses' (and `start`'s)."""
    solved = {**st.fixed, **(start or {})}
    variables = st.indices + st.reduction_indices
    while True:
        found: dict[str, tuple[Sym, Sym]] = {}
        for v in variables:
            if v in solved:
                continue
            lows, highs = [], []
            for cond in conditions:
                a = cond.linear.coeff(v)
                others = [u for u in cond.linear.variables if u != v]
                if a == 0 or any(u not in solved for u in others):
                    continue
                lo, hi = _bound_one(v, cond, solved)
                lows.append(lo)
                highs.append(hi)
            if lows:
                found[v] = (sym_max(lows), sym_min(highs))
        if not found:
            return solved
        solved.update(found)


def _warn_guarded_narrowing(
    st: StatementShape, conditions: list[_Condition], solved: Mapping[str, tuple[Sym, Sym]]
) -> None:
    """TC infers ranges from every read, guarded or not; a guard written to pad a
    convolution then silently narrows the reduction instead. Say so, once per
    statement, with the where clause that gives every narrowed index its full range."""
    wide: dict[str, tuple[Sym, Sym]] = {}
    first: _Condition | None = None
    for cond in conditions:
        if not cond.guarded or len(cond.linear.variables) < 2:
            continue
        without = _solve(st, [c for c in conditions if c is not cond])
        for var in cond.linear.variables:
            if var in st.fixed or var in wide or var not in without:
                continue
            if without[var] != solved[var]:
                wide[var] = without[var]
                first = first or cond
    if first is None:
        return
    fixed = None
    if st.fixes:
        fixed = st.fixes.with_ranges({v: (str(lo), str(hi)) for v, (lo, hi) in wide.items()})
    clauses = ", ".join(f"{v} in {lo}:{hi}" for v, (lo, hi) in wide.items())
    narrowed = ", ".join(
        f"{v} to {solved[v][0]}:{solved[v][1]} (from {lo}:{hi})" for v, (lo, hi) in wide.items()
    )
    message = (
        f"a read of {first.tensor} under a condition narrows the range of {narrowed}; if "
        "the condition pads the read, give the full range"
        + (f": {fixed}" if fixed else f" with where {clauses}")
    )
    warn(TCWarning(message, first.span, st.fixes.source if st.fixes else None, st.filename))


def _extremes(
    lin: Linear, ranges: Mapping[str, tuple[Sym, Sym]], skip: str = ""
) -> tuple[Sym, Sym]:
    """Least and greatest value of `lin` over the box `ranges` (ignoring `skip`)."""
    lo, hi = lin.rest, lin.rest
    for u, c in lin.coeffs:
        if u == skip:
            continue
        first, last = ranges[u][0], ranges[u][1] - 1
        lo = lo + (first * c if c > 0 else last * c)
        hi = hi + (last * c if c > 0 else first * c)
    return lo, hi


def _bound_one(v: str, cond: _Condition, solved: Mapping[str, tuple[Sym, Sym]]) -> tuple[Sym, Sym]:
    """The interval [lo, hi) of `v` for which 0 <= a*v + r <= extent-1 holds for every
    value r of the rest of the subscript."""
    a = cond.linear.coeff(v)
    rmin, rmax = _extremes(cond.linear, solved, skip=v)
    top = cond.extent - 1
    if a > 0:
        return (-rmin).ceildiv(a), (top - rmax).floordiv(a) + 1
    b = -a
    return (rmax - top).ceildiv(b), rmin.floordiv(b) + 1


def _bounds_checks(
    conditions: list[_Condition], ranges: Mapping[str, tuple[Sym, Sym]]
) -> tuple[BoundsCheck, ...]:
    checks = []
    for cond in conditions:
        if not cond.proved:
            continue
        lo, hi = _extremes(cond.linear, ranges)
        low_ok = provably_le(Sym(), lo)
        high_ok = provably_le(hi, cond.extent - 1)
        if low_ok is False or high_ok is False:
            index = lo if low_ok is False else hi
            raise TCRangeError(
                f"this subscript of {cond.tensor} reaches index {index}, outside 0:"
                f"{cond.extent} of its dimension {cond.dim}, for every size",
                cond.span,
            )
        if not (low_ok and high_ok):
            checks.append(BoundsCheck(cond.tensor, cond.dim, lo, hi, cond.extent, cond.span))
    return tuple(checks)


def sym_of_bound(e: ast.Expr, sizes: Mapping[str, object], tensors: Mapping[str, object]) -> Sym:
    """A `where` bound as an expression in the sizes (`/` is floor division)."""

    def fail(msg: str, span: Span) -> TCSemanticError:
        return TCSemanticError(msg, span)

    match e:
        case ast.IntLit(value=v):
            return Sym.of(v)
        case ast.Ident(name=n, span=span):
            if n in sizes:
                return Sym.of(n)
            what = "a tensor" if n in tensors else "not a size"
            raise fail(f"a range bound may use only sizes and integers, and {n} is {what}", span)
        case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
            return -sym_of_bound(v, sizes, tensors)
        case ast.Binary(op=op, lhs=a, rhs=b, span=span):
            x, y = sym_of_bound(a, sizes, tensors), sym_of_bound(b, sizes, tensors)
            match op:
                case ast.BinaryOp.ADD:
                    return x + y
                case ast.BinaryOp.SUB:
                    return x - y
                case ast.BinaryOp.MUL if x.is_const or y.is_const:
                    return y * x.const if x.is_const else x * y.const
                case ast.BinaryOp.DIV if y.is_const and y.const > 0:
                    return x.floordiv(y.const)
                case ast.BinaryOp.MIN:
                    return sym_min([x, y])
                case ast.BinaryOp.MAX:
                    return sym_max([x, y])
            raise fail(
                f"a range bound must be affine in the sizes; {op.value} is not allowed here "
                "(products need a constant factor, division a positive constant)",
                span,
            )
    raise fail("a range bound may use only sizes, integers, + - * / min max", e.span)
