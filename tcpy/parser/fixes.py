"""Suggested fixes: a statement as it would read fixed, and whether tcpy accepts it.

A hint that tells the user how to change a program is only worth giving when the
changed program compiles: "add `where i in 0:N + 3`" to a statement that then reads
before its input is worse than no hint. Each builder here returns the whole fixed
statement, made from the source text and the spans of the parsed and resolved
statement; `accepted` re-checks the def with that statement through the real parser
and sema. A hint whose fix is not accepted is not given.
"""

from __future__ import annotations

import contextvars
import functools
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from tcpy.errors import Span, TCError
from tcpy.parser import ast
from tcpy.parser.linear import Linear, linear_form
from tcpy.parser.symbolic import Sym

# Set while a fix is re-checked, so that checking it builds no fixes of its own.
_checking: contextvars.ContextVar[bool] = contextvars.ContextVar("checking_fix", default=False)


def offset(source: str, line: int, column: int) -> int:
    """The index in `source` of 1-based `line` and `column`."""
    return line_starts(source)[line - 1] + column - 1


@functools.lru_cache(maxsize=8)
def line_starts(source: str) -> tuple[int, ...]:
    """The index in `source` where each line starts (found once per source: the
    checks of a large source ask for many positions)."""
    return (0, *(m.end() for m in re.finditer("\n", source)))


def text(source: str, span: Span) -> str:
    return source[offset(source, span.line, span.column) : _end(source, span)]


def _end(source: str, span: Span) -> int:
    return offset(source, span.end_line, span.end_column)


def edited(source: str, span: Span, edits: Mapping[Span, str]) -> str | None:
    """The text of `span` with each of `edits` (spans inside it) replaced; None when
    two edits overlap."""
    start, out, at = offset(source, span.line, span.column), [], 0
    body = text(source, span)
    for s in sorted(edits, key=lambda s: (s.line, s.column)):
        lo = offset(source, s.line, s.column) - start
        hi = _end(source, s) - start
        if lo < at or hi > len(body):
            return None
        out += [body[at:lo], edits[s]]
        at = hi
    return "".join(out) + body[at:]


@dataclass(frozen=True, slots=True)
class StatementSource:
    """One statement of a def as sema sees it: enough to rewrite and re-check it."""

    source: str
    def_span: Span
    statement: ast.Statement
    check: Callable[[str], object]  # the whole front end, to re-check a fixed def with
    sizes: tuple[str, ...] = ()  # the def's sizes, to show a range in
    resolved: tuple[ast.Expr, ...] = ()  # the right-hand side, then the exists clauses

    def fixed(self, edits: Mapping[Span, str], region: tuple[int, int] | None = None) -> str | None:
        """The statement with `edits` made, if tcpy accepts the def with it."""
        if _checking.get():
            return None
        new = edited(self.source, self.statement.span, edits)
        return new if new is not None and self.accepted(new, region) else None

    def accepted(self, new: str, region: tuple[int, int] | None = None) -> bool:
        """Whether the def, with this statement written as `new`, checks up to and
        including the statement (a later statement may still be wrong on its own); with
        `region` (offsets in `new`), whether no error is found there."""
        src, st = self.source, self.statement.span
        first, last = offset(src, self.def_span.line, self.def_span.column), _end(src, st)
        begin = offset(src, st.line, st.column)
        program = src[first:begin] + new + src[last : _end(src, self.def_span)]
        lo, hi = begin - first, begin - first + len(new)
        if region is not None:
            lo, hi = lo + region[0], lo + region[1]
        token = _checking.set(True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.check(program)
        except TCError as e:
            if e.span is None:
                return False
            where = offset(program, e.span.line, e.span.column)
            return not lo <= where <= hi
        finally:
            _checking.reset(token)
        return True

    # --- the fixes --------------------------------------------------------------------
    def with_op(self, op: str) -> str | None:
        """The statement with its assignment operator replaced by `op`."""
        return self.fixed({_op_span(self.source, self.statement): op})

    def renamed(self, span: Span, name: str) -> str | None:
        """The statement with the name at `span` replaced, if no error is found at the
        new name (another mistake elsewhere in the statement is not this fix's)."""
        st = self.statement.span
        at = offset(self.source, span.line, span.column) - offset(self.source, st.line, st.column)
        return self.fixed({span: name}, (at, at + len(name)))

    def with_ranges(self, ranges: Mapping[str, tuple[str, str]]) -> str | None:
        """The statement with `where v in lo:hi` for each of `ranges` (text bounds),
        replacing a range clause of `v` it already has."""
        st, edits = self.statement, {}
        extra = dict(ranges)
        for c in st.where:
            if isinstance(c, ast.RangeClause) and c.var in extra:
                lo, hi = extra.pop(c.var)
                edits[c.span] = f"{c.var} in {lo}:{hi}"
        if extra:
            clauses = ", ".join(f"{v} in {lo}:{hi}" for v, (lo, hi) in extra.items())
            end = Span(st.span.end_line, st.span.end_column, st.span.end_line, st.span.end_column)
            edits[end] = f", {clauses}" if st.where else f" where {clauses}"
        return self.fixed(edits)

    def shifted(self, shifts: Mapping[str, tuple[Sym, Sym]]) -> str | None:
        """The statement with each left-hand index `v` of `shifts` (its inferred range
        `lo:hi`) running over `0:hi - lo` instead: `v` becomes `v + lo` on the right,
        and the affine subscripts that use it are simplified."""
        st, edits = self.statement, {}
        for c in st.where:
            if isinstance(c, ast.RangeClause) and c.var in shifts:
                lo, hi = shifts[c.var]
                edits[c.span] = f"{c.var} in 0:{hi - lo}"
        done: list[Span] = []
        for arg in _subscripts(self.resolved):
            lin = linear_form(arg)
            if lin is None or not set(lin.variables) & set(shifts):
                continue
            moved = lin + Linear(
                (), sum((shifts[v][0] * k for v, k in lin.coeffs if v in shifts), Sym())
            )
            edits[arg.span] = _linear_text(moved)
            done.append(arg.span)
        for e in self.resolved:
            for n in ast.walk(e):
                if (
                    isinstance(n, ast.Index)
                    and n.name in shifts
                    and not any(_inside(n.span, s) for s in done)
                ):
                    moved = Linear(((n.name, 1),), shifts[n.name][0])
                    edits[n.span] = f"({_linear_text(moved)})"
        return self.fixed(edits)


def _subscripts(exprs: tuple[ast.Expr, ...]) -> Iterator[ast.Expr]:
    for e in exprs:
        for n in ast.walk(e):
            if isinstance(n, ast.Access):
                yield from n.args


def _inside(a: Span, b: Span) -> bool:
    return (b.line, b.column) <= (a.line, a.column) and (a.end_line, a.end_column) <= (
        b.end_line,
        b.end_column,
    )


def _linear_text(lin: Linear) -> str:
    """`lin` as TC source: indices added first, then subtracted, then the sizes (the
    sizes first when no index is added: `I - 1 - i`)."""
    terms = sorted(lin.coeffs, key=lambda t: t[1] < 0)
    parts = [f"{'-' if k < 0 else '+'} {v if abs(k) == 1 else f'{abs(k)}*{v}'}" for v, k in terms]
    if lin.rest != Sym() or not parts:
        rest = str(lin.rest)
        signed = f"- {rest[1:]}" if rest.startswith("-") else f"+ {rest}"
        first = signed.startswith("+") and not any(k > 0 for _, k in terms)
        parts = [signed, *parts] if first else [*parts, signed]
    joined = " ".join(parts)
    return joined[2:] if joined.startswith("+ ") else "-" + joined[2:]


def _op_span(source: str, st: ast.Statement) -> Span:
    """The span of the assignment operator, the first text after the left-hand side."""
    lhs = st.lhs_span
    after = source[_end(source, lhs) :]
    line, column = lhs.end_line, lhs.end_column
    for ch in after[: len(after) - len(after.lstrip())]:
        line, column = (line + 1, 1) if ch == "\n" else (line, column + 1)
    return Span(line, column, line, column + len(st.op.value))
