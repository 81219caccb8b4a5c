"""Readable dumps of the front end's results: S-expressions of the AST (without spans)
and a summary of a checked definition (tensor types and shapes, index ranges). Used by
golden tests and by `tcpy check --verbose`."""

from __future__ import annotations

import dataclasses
import enum

from tcpy.errors import Span
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef
from tcpy.types import ScalarType


def dump(node: object, indent: int = 0) -> str:
    """An S-expression of an AST node, one child per line, spans left out."""
    pad = "  " * indent
    match node:
        case tuple() | list():
            if not node:
                return pad + "()"
            return "\n".join(dump(n, indent) for n in node)
        case ScalarType() | enum.Enum():
            return pad + str(node.value)
        case str() | int() | float() | None:
            return pad + repr(node)
    assert dataclasses.is_dataclass(node)
    fields = [
        f
        for f in dataclasses.fields(node)
        if f.name not in ("span", "name_span", "lhs_span", "index_spans", "source")
    ]
    atoms, nested = [], []
    for f in fields:
        value = getattr(node, f.name)
        if _is_atom(value):
            atoms.append(f"{f.name}={_atom(value)}")
        else:
            nested.append((f.name, value))
    head = f"{pad}({type(node).__name__}" + "".join(" " + a for a in atoms)
    if not nested:
        return head + ")"
    lines = [head]
    for name, value in nested:
        lines.append(f"{pad}  :{name}")
        lines.append(dump(value, indent + 2))
    return "\n".join(lines) + ")"


def _is_atom(value: object) -> bool:
    if isinstance(value, tuple):
        return all(isinstance(v, str) for v in value)
    return value is None or isinstance(value, str | int | float | enum.Enum | Span)


def _atom(value: object) -> str:
    match value:
        case tuple():
            return "(" + " ".join(value) + ")"
        case ScalarType():
            return value.value
        case enum.Enum():
            return repr(value.value)
    return repr(value)


def summary(cdef: CheckedDef) -> str:
    """Tensors with their types and shapes, then each statement with its index ranges."""
    lines = [f"def {cdef.name}  sizes: {' '.join(cdef.size_symbols) or '-'}"]
    for t in cdef.tensors:
        shape = ", ".join(map(str, t.shape))
        lines.append(f"  {t.role.value:9} {t.name}: {t.scalar.value}[{shape}]")
    for st in cdef.statements:
        lines.append(f"  {st.text}")
        for r in st.ranges:
            kind = "reduction" if r.var in st.reduction_indices else "index"
            lines.append(f"    {kind:9} {r}")
        for s in st.starts:
            lines.append(
                f"    start     {s.tensor} dim {s.dim}: {s.var} from {s.lo}, 0 at each call"
            )
        for c in st.checks:
            lines.append(
                f"    check     {c.tensor} dim {c.dim}: {c.lo} .. {c.hi} within 0:{c.extent}"
            )
    return "\n".join(lines)


def expr_text(e: ast.Expr) -> str:
    """A typed expression as TC text, fully parenthesised, with its types."""
    match e:
        case ast.IntLit(value=v) | ast.FloatLit(value=v):
            return repr(v)
        case ast.Index(name=n) | ast.SizeRef(name=n) | ast.Ident(name=n):
            return n
        case ast.Access(tensor=t, args=args):
            return f"{t}({', '.join(map(expr_text, args))})" if args else t
        case ast.Call(name=n, args=args) | ast.Apply(name=n, args=args):
            return f"{n}({', '.join(map(expr_text, args))})"
        case ast.Cast(to=to, value=v):
            return f"{to.value}({expr_text(v)})"
        case ast.Unary(op=op, operand=v):
            return f"({op.value}{expr_text(v)})"
        case ast.Binary(op=op, lhs=a, rhs=b) if op in (ast.BinaryOp.MIN, ast.BinaryOp.MAX):
            return f"{op.value}({expr_text(a)}, {expr_text(b)})"
        case ast.Binary(op=op, lhs=a, rhs=b):
            return f"({expr_text(a)} {op.value} {expr_text(b)})"
        case ast.Ternary(cond=c, then=t, orelse=o):
            return f"({expr_text(c)} ? {expr_text(t)} : {expr_text(o)})"
    raise TypeError(type(e).__name__)


def canonical(cdef: CheckedDef) -> str:
    """The definition in one canonical form: formatting, comments and the def's own
    name do not matter; tensors, sizes, indices, types and ranges do."""
    parts = []
    for t in cdef.tensors:
        parts.append(f"{t.role.value} {t.scalar.value}({', '.join(map(str, t.shape))}) {t.name}")
    for st in cdef.statements:
        ranges = ", ".join(str(r) for r in st.ranges)
        places = [expr_text(e) for e in st.scatter] if st.scatter else st.indices
        parts.append(
            f"{st.tensor}({', '.join(places)}) {st.op.value} {expr_text(st.rhs)} where {ranges}"
        )
    return "; ".join(parts)
