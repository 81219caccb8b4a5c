"""TC text of the expressions and sizes of a backward, with the parentheses the grammar
needs and no more (`tcpy/grammar/tc.lark`: `?:` binds loosest, then `||`, `&&`, the
comparisons, `+ -`, `* / %`, the unary operators)."""

from __future__ import annotations

from tcpy.parser import ast
from tcpy.parser.symbolic import FloorDiv, MaxOf, MinOf, Sym

_LEVEL = {
    ast.BinaryOp.OR: 1,
    ast.BinaryOp.AND: 2,
    ast.BinaryOp.ADD: 4,
    ast.BinaryOp.SUB: 4,
    ast.BinaryOp.MUL: 5,
    ast.BinaryOp.DIV: 5,
    ast.BinaryOp.MOD: 5,
}
_COMPARISON, _UNARY, _PRIMARY = 3, 6, 7


def expr(e: ast.Expr) -> str:
    """`e` as TC text."""
    return _text(e, 0)


def _level(e: ast.Expr) -> int:
    match e:
        case ast.Ternary():
            return 0
        case ast.Binary(op=op) if op.is_comparison:
            return _COMPARISON
        case ast.Binary(op=op) if op in _LEVEL:
            return _LEVEL[op]
        case ast.Unary():
            return _UNARY
        case ast.IntLit(value=v) | ast.FloatLit(value=v) if v < 0:
            return _UNARY
    return _PRIMARY


def _text(e: ast.Expr, least: int) -> str:
    """`e` where the grammar expects an expression binding at least as tight as `least`."""
    level = _level(e)
    text = _bare(e, level)
    return f"({text})" if level < least else text


def _bare(e: ast.Expr, level: int) -> str:
    match e:
        case ast.IntLit(value=v):
            return str(v)
        case ast.FloatLit(value=v):
            return repr(float(v))
        case ast.Index(name=n) | ast.SizeRef(name=n) | ast.Ident(name=n):
            return n
        case ast.Access(tensor=t, args=args):
            return f"{t}({', '.join(expr(a) for a in args)})" if args else t
        case ast.Call(name=n, args=args):
            return f"{n}({', '.join(expr(a) for a in args)})"
        case ast.Cast(to=to, value=v):
            return f"{to.value}({expr(v)})"
        case ast.Unary(op=op, operand=v):
            return f"{op.value}{_text(v, _UNARY)}"
        case ast.Binary(op=ast.BinaryOp.MIN | ast.BinaryOp.MAX as op, lhs=a, rhs=b):
            return f"{op.value}({expr(a)}, {expr(b)})"
        case ast.Binary(op=op, lhs=a, rhs=b) if op.is_comparison:
            return f"{_text(a, _COMPARISON + 1)} {op.value} {_text(b, _COMPARISON + 1)}"
        case ast.Binary(op=op, lhs=a, rhs=b):
            return f"{_text(a, level)} {op.value} {_text(b, level + 1)}"
        case ast.Ternary(cond=c, then=t, orelse=o):
            return f"{_text(c, 1)} ? {_text(t, 0)} : {_text(o, 0)}"
    raise TypeError(type(e).__name__)


def size(s: Sym) -> str:
    """A size expression (a range bound, a dimension) as TC text."""
    parts: list[str] = []
    for atom, c in sorted(s.terms, key=lambda t: t[1] < 0):
        text = _atom(atom)
        scaled = text if abs(c) == 1 else f"{abs(c)}*{text}"
        parts.append(("- " if c < 0 else "+ ") + scaled)
    if s.const or not parts:
        parts.append(("- " if s.const < 0 else "+ ") + str(abs(s.const)))
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


def _atom(atom: str | FloorDiv | MinOf | MaxOf) -> str:
    match atom:
        case str():
            return atom
        case FloorDiv(num=n, den=d):
            inner = size(n)
            return f"({inner})/{d}" if len(n.terms) + (n.const != 0) > 1 else f"{inner}/{d}"
        case MinOf(args=args) | MaxOf(args=args):
            word = "min" if isinstance(atom, MinOf) else "max"
            text = size(args[0])
            for a in args[1:]:
                text = f"{word}({text}, {size(a)})"
            return text
    raise TypeError(type(atom).__name__)
