"""Every direct use of islpy that is more than one call lives here.

Objects are built from isl's own notation (readable, and parsed by isl itself) with
dimensions and parameters named after the TC program, under the internal names of
`tcpy.naming` (so that no TC name can be read as an isl keyword); they are compared with
`is_equal`, never through their printed form. Each compilation owns one
`isl.Context`, with its operation budget and scheduler options set once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import islpy as isl

from tcpy.errors import TCCompileError
from tcpy.naming import size_name
from tcpy.parser.symbolic import FloorDiv, MaxOf, MinOf, Sym

MAX_OPERATIONS = 20_000_000
"""isl's operation budget per compilation; beyond it compilation fails cleanly."""


def new_context() -> isl.Context:
    ctx = isl.Context()
    ctx.set_max_operations(MAX_OPERATIONS)
    return ctx


@contextmanager
def isl_errors(what: str) -> Iterator[None]:
    """Turn isl failures (its operation budget above all) into one clear TCCompileError."""
    try:
        yield
    except isl.Error as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "an isl error"
        raise TCCompileError(
            f"{what} failed in isl ({reason}); isl stops after {MAX_OPERATIONS} operations "
            "per stage, which a very large kernel can exceed"
        ) from None


def sym_str(e: Sym, rename: Mapping[str, str] | None = None) -> str:
    """A size expression in isl's notation (floor, min and max are isl's own), the
    sizes under their internal names (or as `rename` says)."""
    terms: list[tuple[int, str]] = []
    for atom, c in e.terms:
        match atom:
            case str():
                text = rename.get(atom, atom) if rename else size_name(atom)
            case FloorDiv(num=n, den=d):
                text = f"floor(({sym_str(n, rename)})/{d})"
            case MinOf(args=args):
                text = _nary("min", [sym_str(a, rename) for a in args])
            case MaxOf(args=args):
                text = _nary("max", [sym_str(a, rename) for a in args])
        terms.append((c, text))
    return linear_text(terms, e.const)


def linear_text(terms: list[tuple[int, str]], const: int) -> str:
    """`c1*t1 + c2*t2 + const` with the signs written out, as isl's parser wants it."""
    out = ""
    for c, text in terms:
        sign = "-" if c < 0 else "+"
        factor = text if abs(c) == 1 else f"{abs(c)}*{text}"
        out += f" {sign} {factor}" if out else (f"-{factor}" if c < 0 else factor)
    if const or not out:
        sign = "-" if const < 0 else "+"
        out += f" {sign} {abs(const)}" if out else str(const)
    return out


def _nary(fn: str, args: list[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return out


def params_prefix(params: tuple[str, ...]) -> str:
    """`[p, q] -> ` for parameters already under their internal names."""
    return "[" + ", ".join(params) + "] -> "


def read_set(ctx: isl.Context, params: tuple[str, ...], body: str) -> isl.Set:
    return isl.Set(params_prefix(params) + "{ " + body + " }", context=ctx)


def read_union_map(ctx: isl.Context, params: tuple[str, ...], body: str) -> isl.UnionMap:
    return isl.UnionMap(params_prefix(params) + "{ " + body + " }", context=ctx)


def list_items(lst: Any) -> list[Any]:
    """The elements of an isl list (UnionPwAffList, MapList, SetList, ...)."""
    count = next(getattr(lst, m) for m in dir(lst) if m.startswith("n_"))
    return [lst.get_at(i) for i in range(count())]


def union_set_sets(us: isl.UnionSet) -> list[isl.Set]:
    return list_items(us.get_set_list())


def statement_names(us: isl.UnionSet) -> set[str]:
    """The names of the statements (tuples) with instances in `us`."""
    return {s.get_tuple_name() for s in union_set_sets(us)}


def union_map_maps(um: isl.UnionMap) -> list[isl.Map]:
    return list_items(um.get_map_list())


def ast_children(node: isl.AstNode) -> Iterator[isl.AstNode]:
    """The children of an AST block node."""
    yield from list_items(node.block_get_children())


def schedule_children(node: isl.ScheduleNode) -> Iterator[isl.ScheduleNode]:
    for i in range(node.n_children()):
        yield node.child(i)


def multi_val(space: isl.Space, values: list[int]) -> isl.MultiVal:
    mv = isl.MultiVal.zero(space)
    ctx = space.get_ctx()
    for i, v in enumerate(values):
        mv = mv.set_val(i, isl.Val.int_from_si(ctx, v))
    return mv
