"""TC text -> `Program` AST.

The grammar is `grammar/tc.lark` (LALR, positions on). Lark's failures are turned into
TC-specific `TCSyntaxError`s: the parser's stack tells which construct is still open
(`expected ')' to close the access of A`), and terminal names become the characters a
user types. Nesting is bounded, so that no input can exhaust the recursion of the
passes after the parser.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import lark
import numpy as np
from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from tcpy import knobs
from tcpy.errors import Span, TCError, TCSemanticError, TCSyntaxError
from tcpy.parser import ast
from tcpy.parser.builtins import BUILTINS
from tcpy.types import TYPE_KEYWORDS, ScalarType

MAX_NESTING = 100
"""Deepest nesting of expressions accepted; deeper programs are rejected with an error."""

_INT32_MAX = 2**31 - 1

KEYWORDS = frozenset({"def", "in", "where", "exists", "min", "max", *TYPE_KEYWORDS})


@functools.cache
def _parser() -> lark.Lark:
    text = resources.files("tcpy.grammar").joinpath("tc.lark").read_text()
    return lark.Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True)


def parse(source: str, filename: str | None = None) -> ast.Program:
    """Parse TC source into a `Program`; raises `TCSyntaxError` with a caret. What can
    be told of the whole source without parsing it is checked first, in moments
    whatever its size: its size (`knobs.max_source_bytes`), its nesting, and that no
    two defs share a name."""
    try:
        _check_size(source)
        _check_nesting(source)
        _check_unique_defs(source)
        tree = _parser().parse(source)
        defs = tuple(_Builder(source).tc_def(d) for d in _kids(tree))
    except UnexpectedInput as e:
        raise _syntax_error(e, source).with_source(source, filename) from None
    except TCError as e:
        raise e.with_source(source, filename) from None
    return ast.Program(defs, source)


# --- tree -> AST --------------------------------------------------------------------


def _tok_span(tok: Token) -> Span:
    return Span(tok.line or 1, tok.column or 1, tok.end_line or 1, tok.end_column or 1)


def _kids(tree: Tree) -> list[Any]:
    """A lark node's children: tokens and subtrees, as the grammar rule lays them out."""
    return tree.children


def _tree_span(tree: Tree) -> Span:
    m = tree.meta
    return Span(m.line, m.column, m.end_line, m.end_column)


class _Builder:
    """Builds AST nodes from lark trees, one method per grammar rule."""

    def __init__(self, source: str) -> None:
        self.source = source

    def tc_def(self, t: Tree) -> ast.Def:
        name, *rest = _kids(t)
        params, outputs, statements = [], [], []
        for child in rest:
            if not isinstance(child, Tree):
                continue  # placeholders of empty lists, and the arrow
            match child.data:
                case "typed_param" | "untyped_param":
                    params.append(self.param(child))
                case "typed_output" | "untyped_output":
                    outputs.append(self.output(child))
                case "statement":
                    statements.append(self.statement(child))
        return ast.Def(
            self.name(name),
            tuple(params),
            tuple(outputs),
            tuple(statements),
            _tree_span(t),
            _tok_span(name),
        )

    def tensor_type(self, type_tok: Token, dims: Tree | None, span: Span) -> ast.TensorType:
        scalar = ScalarType.from_name(str(type_tok))
        return ast.TensorType(scalar, self.dims(dims), span)

    def dims(self, dims: Tree | None) -> tuple[ast.Dim, ...]:
        if dims is None:
            return ()
        out: list[ast.Dim] = []
        for d in _kids(dims):
            tok = _kids(d)[0]
            if d.data == "size_dim":
                out.append(ast.SizeDim(self.name(tok), _tok_span(tok)))
            else:
                out.append(ast.ConstDim(self.integer(tok), _tok_span(tok)))
        return tuple(out)

    def param(self, t: Tree) -> ast.Param:
        if t.data == "untyped_param":
            name, _dims = _kids(t)
            return ast.Param(self.name(name), None, _tree_span(t))
        type_tok, dims, name = _kids(t)
        return ast.Param(
            self.name(name), self.tensor_type(type_tok, dims, _tree_span(t)), _tree_span(t)
        )

    def output(self, t: Tree) -> ast.Output:
        if t.data == "untyped_output":
            (name,) = _kids(t)
            return ast.Output(self.name(name), None, _tree_span(t))
        type_tok, dims, name = _kids(t)
        return ast.Output(
            self.name(name), self.tensor_type(type_tok, dims, _tree_span(t)), _tree_span(t)
        )

    def statement(self, t: Tree) -> ast.Statement:
        name, indices, op, rhs, equivalent, where = _kids(t)
        subscripts = [self.expr(i) for i in _kids(indices)] if indices is not None else []
        lhs_span = _tok_span(name)
        if indices is not None:
            lhs_span = lhs_span.merge(_tree_span(indices))
        plain = all(isinstance(e, ast.Ident) for e in subscripts)
        return ast.Statement(
            tensor=self.name(name),
            indices=tuple(e.name for e in subscripts if isinstance(e, ast.Ident)) if plain else (),
            index_spans=tuple(e.span for e in subscripts) if plain else (),
            scatter=None if plain else tuple(subscripts),
            op=ast.AssignOp(str(op)),
            rhs=self.expr(rhs),
            equivalent=self.equivalent(equivalent) if equivalent is not None else None,
            where=tuple(self.clause(c) for c in _kids(where)) if where is not None else (),
            span=_tree_span(t),
            lhs_span=lhs_span,
        )

    def equivalent(self, t: Tree) -> ast.Equivalent:
        name, *args = _kids(t)
        return ast.Equivalent(
            self.name(name), tuple(self.expr(a) for a in args if a is not None), _tree_span(t)
        )

    def clause(self, t: Tree) -> ast.Clause:
        span = _tree_span(t)
        match t.data:
            case "range_clause":
                var, lo, hi = _kids(t)
                return ast.RangeClause(self.name(var), self.expr(lo), self.expr(hi), span)
            case "let_clause":
                var, value = _kids(t)
                return ast.LetClause(self.name(var), self.expr(value), span)
            case "exists_clause":
                return ast.ExistsClause(self.expr(_kids(t)[0]), span)
        raise AssertionError(t.data)

    def expr(self, t: Tree) -> ast.Expr:
        span = _tree_span(t)
        match t.data:
            case "int_lit":
                return ast.IntLit(self.integer(_kids(t)[0]), span)
            case "float_lit":
                return ast.FloatLit(self.floating(_kids(t)[0]), span)
            case "ident":
                return ast.Ident(self.name(_kids(t)[0]), span)
            case "apply":
                name, *args = _kids(t)
                return ast.Apply(
                    self.name(name), tuple(map(self.expr, args)), span, _tok_span(name)
                )
            case "cast":
                type_tok, value = _kids(t)
                return ast.Cast(ScalarType.from_name(str(type_tok)), self.expr(value), span)
            case "minmax":
                which, a, b = _kids(t)
                return ast.Binary(ast.BinaryOp(str(which)), self.expr(a), self.expr(b), span)
            case "unary":
                op, operand = _kids(t)
                return ast.Unary(ast.UnaryOp(str(op)), self.expr(operand), span)
            case "binary":
                lhs, op, rhs = _kids(t)
                return ast.Binary(ast.BinaryOp(str(op)), self.expr(lhs), self.expr(rhs), span)
            case "ternary":
                cond, then, orelse = _kids(t)
                return ast.Ternary(self.expr(cond), self.expr(then), self.expr(orelse), span)
        raise AssertionError(t.data)

    def name(self, tok: Token) -> str:
        """A NAME token as a name; the contextual lexer lets keywords through as NAME
        where the keyword cannot appear, and TC reserves them everywhere."""
        if str(tok) in KEYWORDS:
            raise TCSyntaxError(
                f"'{tok}' is a keyword and cannot be used as a name", _tok_span(tok)
            )
        return str(tok)

    def integer(self, tok: Token) -> int:
        value = int(str(tok))
        if value > _INT32_MAX:
            raise TCSyntaxError(
                f"integer literal {tok} does not fit in int32 (largest is {_INT32_MAX})",
                _tok_span(tok),
            )
        return value

    def floating(self, tok: Token) -> float:
        value = float(str(tok))
        with np.errstate(over="ignore", under="ignore"):
            single = np.float32(value)
        if not np.isfinite(single) or (value != 0 and single == 0):
            raise TCSyntaxError(
                f"float literal {tok} is outside the range of float32; "
                "write the value differently or use a double tensor",
                _tok_span(tok),
            )
        return value


# --- the whole source, before parsing --------------------------------------------


def _check_size(source: str) -> None:
    """Refuse a source over the size limit at once: lark's parser reads about 100 KB
    a second here, and a TC program is a few kilobytes."""
    limit = knobs.max_source_bytes()
    if len(source) <= limit and len(source.encode(errors="replace")) <= limit:
        return
    at = min(len(source), limit)
    line = source.count("\n", 0, at) + 1
    column = at - (source.rfind("\n", 0, at) + 1) + 1
    raise TCSyntaxError(
        f"the source is {len(source.encode(errors='replace')):,} bytes, over the limit of "
        f"{limit:,} ({knobs.MAX_SOURCE_KNOB}); TC programs are a few kilobytes",
        Span(line, column, line, column + 1),
    )


_TOP_LEVEL = re.compile(r"#[^\n]*|[{}]|\bdef\s+([A-Za-z_][A-Za-z0-9_]*)")


def _check_unique_defs(source: str) -> None:
    """The second def of a name, found by a scan of the defs' headers (outside braces
    and comments), reported before any def is parsed."""
    seen: set[str] = set()
    depth = 0
    for m in _TOP_LEVEL.finditer(source):
        token = m.group(0)
        if token == "{":
            depth += 1
        elif token == "}":
            depth = max(0, depth - 1)
        elif m.group(1) is not None and depth == 0 and m.group(1) not in KEYWORDS:
            name = m.group(1)
            if name in seen:
                start = m.start(1)
                line = source.count("\n", 0, start) + 1
                column = start - (source.rfind("\n", 0, start) + 1) + 1
                span = Span(line, column, line, column + len(name))
                raise TCSemanticError(f"def {name} is defined twice in this source", span)
            seen.add(name)


# --- nesting ------------------------------------------------------------------------


def _check_nesting(source: str) -> None:
    depth = 0
    line, col = 1, 0
    in_comment = False
    for ch in source:
        col += 1
        if ch == "\n":
            line, col, in_comment = line + 1, 0, False
        elif in_comment:
            continue
        elif ch == "#":
            in_comment = True
        elif ch == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise TCSyntaxError(
                    f"parentheses nest more than {MAX_NESTING} deep; split the expression",
                    Span(line, col, line, col + 1),
                )
        elif ch == ")":
            depth = max(0, depth - 1)


def check_depth(program: ast.Program) -> None:
    """Reject expressions deeper than MAX_NESTING (long operator chains nest too),
    so that the recursive passes after the parser stay within Python's stack."""
    for d in program.defs:
        for st in d.statements:
            for e in _statement_exprs(st):
                _check_expr_depth(e)


def _statement_exprs(st: ast.Statement) -> Iterator[ast.Expr]:
    yield st.rhs
    for c in st.where:
        match c:
            case ast.RangeClause(lo=lo, hi=hi):
                yield lo
                yield hi
            case ast.LetClause(value=v):
                yield v
            case ast.ExistsClause(expr=e):
                yield e


def _check_expr_depth(root: ast.Expr) -> None:
    stack = [(root, 1)]
    while stack:
        e, depth = stack.pop()
        if depth > MAX_NESTING:
            raise TCSyntaxError(
                f"expression nests more than {MAX_NESTING} operations deep; "
                "split it into several statements",
                e.span,
            )
        stack.extend((c, depth + 1) for c in ast.children(e))


# --- lark errors -> TC messages -----------------------------------------------------

_TERMINAL_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "TYPE": "a type",
    "MINMAX": "min or max",
    "ASSIGN": "an assignment (=, +=, +=!, ...)",
    "COMPARE": "a comparison",
    "ADDOP": "'+' or '-'",
    "MULOP": "'*', '/' or '%'",
    "UNOP": "an expression",
    "OROR": "'||'",
    "ANDAND": "'&&'",
    "$END": "the end of the text",
}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name.lower()
    if isinstance(pattern, lark.lexer.PatternStr):
        return f"'{pattern.value}'"
    return name.lower()


def _describe_expected(expected: set[str]) -> str:
    if {"NAME", "INT", "FLOAT", "LPAR"} <= expected:
        return "an expression"
    words = sorted({_describe_terminal(t) for t in expected if not t.startswith("__")})
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _open_construct(stack: list[Any]) -> tuple[str, str]:
    """What the innermost still-open '(' or '{' on the parser stack belongs to."""
    closes = {"RPAR": "LPAR", "RBRACE": "LBRACE"}
    pending: list[str] = []
    for i in range(len(stack) - 1, -1, -1):
        item = stack[i]
        if not isinstance(item, Token):
            continue
        if item.type in closes:
            pending.append(closes[item.type])
            continue
        if item.type in ("LPAR", "LBRACE"):
            if pending and pending[-1] == item.type:
                pending.pop()
                continue
            before = stack[i - 1] if i > 0 else None
            name = _construct_name(item.type, before, stack[: i - 1])
            if item.type == "LPAR" and name != "the parenthesis":
                name += f" opened at {item.line}:{item.column}"
            return item.type, name
    return "", ""


def _construct_name(kind: str, before: object, earlier: list[Any]) -> str:
    if kind == "LBRACE":
        names = [t for t in earlier if isinstance(t, Token) and t.type == "NAME"]
        return f"the body of def {names[0]}" if names else "the body of the def"
    if isinstance(before, Token):
        if before.type == "NAME":
            prev = earlier[-1] if earlier else None
            if isinstance(prev, Token) and prev.type == "DEF":
                return f"the inputs of def {before}"
            if str(before) in BUILTINS:
                return f"the call of {before}"
            starts_statement = (isinstance(prev, Token) and prev.type == "LBRACE") or (
                isinstance(prev, Tree) and prev.data == "statement"
            )
            if starts_statement:
                return f"the indices of {before}"
            return f"the access of {before}"
        if before.type == "TYPE":
            return f"the dimensions or cast of {before}"
        if before.type == "MINMAX":
            return f"{before}(...)"
        if before.type == "_ARROW":
            return "the outputs"
    return "the parenthesis"


def _syntax_error(e: UnexpectedInput, source: str) -> TCSyntaxError:
    line, column = e.line if e.line > 0 else 1, e.column if e.column > 0 else 1
    span = Span(line, column, line, column + 1)
    match e:
        case UnexpectedCharacters():
            pos = e.pos_in_stream or 0
            ch = source[pos] if pos < len(source) else ""
            return TCSyntaxError(f"unexpected character {ch!r}", span)
        case UnexpectedToken() | UnexpectedEOF():
            expected = set(e.expected) if e.expected else set()
            token = getattr(e, "token", None)
            if token is None or token.type == "$END":
                found = "the end of the text"
                line, column = _end_position(source)
                span = Span(line, column, line, column + 1)
            else:
                found = f"'{token}'"
                span = _tok_span(token)
            stack = e.interactive_parser.parser_state.value_stack if e.interactive_parser else []
            kind, construct = _open_construct(list(stack))
            if kind == "LPAR" and "RPAR" in expected and construct != "the parenthesis":
                msg = f"expected ')' to close {construct}, found {found}"
            elif kind == "LBRACE" and "RBRACE" in expected:
                msg = f"expected a statement or '}}' to close {construct}, found {found}"
            else:
                msg = f"expected {_describe_expected(expected)}, found {found}"
                if kind == "LPAR" and construct != "the parenthesis":
                    msg += f" (in {construct})"
            if token is not None and token.type == "COMPARE":
                msg += "; comparisons do not chain: write a < b && b < c"
            return TCSyntaxError(msg, span)
    return TCSyntaxError(str(e).splitlines()[0], span)


def _end_position(source: str) -> tuple[int, int]:
    stripped = source.rstrip()
    lines = stripped.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def retyped(source: str, to: ScalarType) -> str:
    """`source` with every float type named in it (`float`, `float16`, `float32`,
    `float64`, `double`: in declarations and casts) replaced by `to`'s name; float
    literals stay float32, as TC reads them. Gradient checks run a def in float64 so."""
    out, at = [], 0
    for token in _parser().lex(source):
        if token.type == "TYPE" and ScalarType.from_name(token.value).is_float:
            assert token.start_pos is not None and token.end_pos is not None
            out += [source[at : token.start_pos], to.value]
            at = token.end_pos
    return "".join(out) + source[at:]
