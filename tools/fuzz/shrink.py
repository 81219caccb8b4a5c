"""Shrinking a failing case to a minimal one that fails the same way.

Greedy, first improvement: try every single simplification of the current case (drop a
statement or an input, replace an expression by one of its operands or by 0/1, make a
subscript a plain index, drop a where clause, shrink a size, reset an option to its
default), keep the first that still fails the same way, and start again; stop when none
does or the time is up. Program candidates must pass `program.analyze`, so a shrunk
program is still one whose values are exact (shrinking never trades the original bug
for an overflow).

`shrink_case` works on the IR; `shrink_text` is the fallback for a replay whose
program the generator cannot rebuild (one written by the tuner, or an older
generator): it drops statement lines and shrinks sizes and options.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tcpy import MappingOptions
from tools.fuzz.program import (
    FLOAT,
    INT,
    Bin,
    Call,
    Cast,
    Cond,
    Expr,
    Gather,
    Invalid,
    Lin,
    Neg,
    Num,
    Program,
    Read,
    Stmt,
    analyze,
    children,
    type_of,
)


@dataclass(frozen=True)
class Case:
    """What a failure depends on: the program and the options."""

    program: Program
    options: dict[str, Any]


def shrink_case(case: Case, fails: Callable[[Case], bool], seconds: float) -> Case:
    """The smallest case found within `seconds` for which `fails` still holds."""
    deadline = time.monotonic() + seconds
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for candidate in _candidates(case):
            if time.monotonic() >= deadline:
                break
            if _valid(candidate.program) and fails(candidate):
                case, improved = candidate, True
                break
    return case


def _valid(p: Program) -> bool:
    try:
        analyze(p)
    except (Invalid, KeyError):
        return False
    return bool(p.stmts) and bool(p.outputs)


def _candidates(case: Case) -> Iterator[Case]:
    p = case.program
    for k in range(len(p.stmts)):
        yield dataclasses.replace(case, program=_without_statement(p, k))
    for d in p.inputs:
        yield dataclasses.replace(case, program=dataclasses.replace(
            p, inputs=tuple(x for x in p.inputs if x is not d)))  # fmt: skip
    for name, value in p.sizes.items():
        for smaller in sorted({1, 2, value // 2, value - 1}):
            if 1 <= smaller < value:
                yield dataclasses.replace(
                    case, program=dataclasses.replace(p, sizes={**p.sizes, name: smaller})
                )
    for k, st in enumerate(p.stmts):
        for simpler in _simpler_statements(st, p):
            stmts = (*p.stmts[:k], simpler, *p.stmts[k + 1 :])
            yield dataclasses.replace(case, program=dataclasses.replace(p, stmts=stmts))
    yield from _simpler_options(case)


def _without_statement(p: Program, k: int) -> Program:
    stmts = p.stmts[:k] + p.stmts[k + 1 :]
    written = {s.tensor for s in stmts}
    return dataclasses.replace(p, stmts=stmts, outputs=tuple(o for o in p.outputs if o in written))


def _simpler_statements(st: Stmt, p: Program) -> Iterator[Stmt]:
    for k in range(len(st.where)):
        yield dataclasses.replace(st, where=st.where[:k] + st.where[k + 1 :])
    if st.op.endswith("!") or st.op != "=":
        for op in ("=", st.op.rstrip("!") + "!"):
            if op != st.op:
                yield dataclasses.replace(st, op=op)
    types = {d.name: d.ty for d in p.inputs}
    for s in p.stmts:
        types.setdefault(s.tensor, FLOAT)
    for rhs in _simpler_exprs(st.rhs, types):
        yield dataclasses.replace(st, rhs=rhs)


def _simpler_exprs(e: Expr, types: dict[str, str]) -> Iterator[Expr]:
    """Each expression one step simpler than `e`: a child in place of a node, a
    literal in place of a node, a plain index in place of a subscript."""
    if not isinstance(e, Num):
        try:
            ty = type_of(e, types)
        except KeyError:
            ty = FLOAT
        yield Num(0, ty if ty in (FLOAT, INT) else INT)
        yield Num(1, ty if ty in (FLOAT, INT) else INT)
    yield from children(e)
    match e:
        case Read(tensor=t, subs=subs):
            for k, sub in enumerate(subs):
                for plain in _simpler_subscripts(sub):
                    yield Read(t, (*subs[:k], plain, *subs[k + 1 :]))
        case Bin() | Call() | Neg() | Cast() | Cond():
            kids = children(e)
            for k, kid in enumerate(kids):
                for simpler in _simpler_exprs(kid, types):
                    yield _with_child(e, k, simpler)


def _simpler_subscripts(sub: Lin | Gather) -> Iterator[Lin]:
    if isinstance(sub, Gather):
        yield from (s for s in sub.subs if s.terms)
        yield Lin((), 0)
    elif len(sub.terms) > 1 or sub.const or any(c != 1 for _, c in sub.terms):
        for v, _ in sub.terms:
            yield Lin(((v, 1),))


def _with_child(e: Expr, k: int, child: Expr) -> Expr:
    kids = list(children(e))
    kids[k] = child
    match e:
        case Bin():
            return dataclasses.replace(e, a=kids[0], b=kids[1])
        case Call():
            return dataclasses.replace(e, args=tuple(kids))
        case Neg() | Cast():
            return dataclasses.replace(e, a=kids[0])
        case Cond():
            return dataclasses.replace(e, a=kids[0], b=kids[1], then=kids[2], orelse=kids[3])
    return e


def _simpler_options(case: Case) -> Iterator[Case]:
    default = MappingOptions().to_dict()
    for name, value in case.options.items():
        if value != default.get(name):
            yield dataclasses.replace(case, options={**case.options, name: default[name]})


# --- text fallback ----------------------------------------------------------------------


@dataclass(frozen=True)
class TextCase:
    source: str
    sizes: dict[str, int]
    options: dict[str, Any] | None


def shrink_text(case: TextCase, fails: Callable[[TextCase], bool], seconds: float) -> TextCase:
    """Like `shrink_case` for a program known only as text."""
    deadline = time.monotonic() + seconds
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for candidate in _text_candidates(case):
            if time.monotonic() >= deadline:
                break
            if fails(candidate):
                case, improved = candidate, True
                break
    return case


def _text_candidates(case: TextCase) -> Iterator[TextCase]:
    lines = case.source.splitlines(keepends=True)
    for k, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith(("def", "}", "#")):
            yield dataclasses.replace(case, source="".join(lines[:k] + lines[k + 1 :]))
    for name, value in case.sizes.items():
        for smaller in sorted({1, 2, value // 2, value - 1}):
            if 1 <= smaller < value:
                yield dataclasses.replace(case, sizes={**case.sizes, name: smaller})
    if case.options is not None:
        default = MappingOptions().to_dict()
        for name, value in case.options.items():
            if value != default.get(name):
                yield dataclasses.replace(case, options={**case.options, name: default[name]})
