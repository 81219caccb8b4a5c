"""Parser: the lexical rules, the parse-tree golden, and syntax details."""

from __future__ import annotations

from pathlib import Path

import pytest

from tcpy.errors import TCSyntaxError
from tcpy.parser import ast
from tcpy.parser.parse import parse
from tcpy.parser.printer import dump
from tcpy.types import ScalarType

from golden_util import GOLDEN, check_golden

PARSE_GOLDENS = sorted((GOLDEN / "parse").glob("*.tc"))


@pytest.mark.parametrize("path", PARSE_GOLDENS, ids=lambda p: p.stem)
def test_parse_golden(path: Path, accept: bool) -> None:
    check_golden(f"parse/{path.stem}.ast", dump(parse(path.read_text())), accept)


def _rhs(text: str) -> ast.Expr:
    program = parse(f"def f(float(N) A) -> (B) {{ B(i) = {text} }}")
    return program.defs[0].statements[0].rhs


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("3.", 3.0),
        (".5", 0.5),
        ("1.5", 1.5),
        ("1e-5", 1e-5),
        ("2E3", 2000.0),
        ("1.5e+2", 150.0),
    ],
)
def test_numbers(text: str, value: float) -> None:
    node = _rhs(text)
    assert isinstance(node, ast.IntLit if isinstance(value, int) else ast.FloatLit)
    assert node.value == value


@pytest.mark.parametrize(
    "name",
    [
        "maxVal",
        "info",
        "inf0",
        "nan1",
        "definition",
        "wherever",
        "floaty",
        "int32x",
        "min_",
        "exists2",
    ],
)
def test_keyword_prefixes_are_identifiers(name: str) -> None:
    node = _rhs(name)
    assert node == ast.Ident(name, node.span)


@pytest.mark.parametrize("name", ["nan", "inf", "and", "INFINITY", "ceild", "tc_status", "NAN"])
def test_words_of_c_and_isl_are_identifiers(name: str) -> None:
    node = _rhs(name)
    assert node == ast.Ident(name, node.span)


def test_empty_parentheses_are_the_0d_access() -> None:
    # TC's tests write a 0-d output as C(); sema reads it like the bare name.
    source = "def f(float(M) A) -> (C, D) { C() +=! A(r_m) D() = C() * 2 E = D() }"
    first, second, third = parse(source).defs[0].statements
    assert (first.tensor, first.indices, first.op) == ("C", (), ast.AssignOp.SUM_INIT)
    assert (first.lhs_span.column, first.lhs_span.end_column) == (31, 34)  # C() whole
    assert second.indices == ()
    assert isinstance(second.rhs, ast.Binary) and isinstance(second.rhs.lhs, ast.Apply)
    assert (second.rhs.lhs.name, second.rhs.lhs.args) == ("C", ())
    assert third.tensor == "E" and isinstance(third.rhs, ast.Apply) and third.rhs.args == ()


def test_comments_anywhere() -> None:
    program = parse("# head\ndef f(float(N) A # a\n) -> (B) # b\n{ # c\n B(i) # d\n = A(i) # e\n}#")
    assert program.defs[0].statements[0].tensor == "B"


def test_statements_need_no_separator() -> None:
    program = parse("def f(float(N) A) -> (B, C) { B(i) = A(i) C(i) = B(i) + N }")
    assert [s.tensor for s in program.defs[0].statements] == ["B", "C"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", ("+", 1, ("*", 2, 3))),
        ("1 - 2 - 3", ("-", ("-", 1, 2), 3)),
        ("-1 * 2", ("*", ("neg", 1), 2)),
        ("1 < 2 && 3 < 4 || 5 < 6", ("||", ("&&", ("<", 1, 2), ("<", 3, 4)), ("<", 5, 6))),
        ("1 < 2 ? 3 : 4 < 5 ? 6 : 7", ("?", ("<", 1, 2), 3, ("?", ("<", 4, 5), 6, 7))),
        ("(1 + 2) % 3", ("%", ("+", 1, 2), 3)),
        ("min(1, max(2, 3))", ("min", 1, ("max", 2, 3))),
    ],
)
def test_precedence(text: str, expected: object) -> None:
    def shape(e: ast.Expr) -> object:
        match e:
            case ast.IntLit(value=v):
                return v
            case ast.Binary(op=op, lhs=a, rhs=b):
                return (op.value, shape(a), shape(b))
            case ast.Unary(op=ast.UnaryOp.NEG, operand=v):
                return ("neg", shape(v))
            case ast.Ternary(cond=c, then=t, orelse=o):
                return ("?", shape(c), shape(t), shape(o))
        raise AssertionError(e)

    assert shape(_rhs(text)) == expected


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("=", ast.AssignOp.ASSIGN),
        ("+=", ast.AssignOp.SUM),
        ("*=", ast.AssignOp.PROD),
        ("min=", ast.AssignOp.MIN),
        ("max=", ast.AssignOp.MAX),
        ("+=!", ast.AssignOp.SUM_INIT),
        ("*=!", ast.AssignOp.PROD_INIT),
        ("min=!", ast.AssignOp.MIN_INIT),
        ("max=!", ast.AssignOp.MAX_INIT),
    ],
)
def test_assignment_forms(op: str, kind: ast.AssignOp) -> None:
    st = parse(f"def f(float(N) A) -> (B) {{ B(i) {op} A(i) }}").defs[0].statements[0]
    assert st.op is kind
    assert kind.initializes == op.endswith("!")
    assert kind.is_reduction == (op != "=")


@pytest.mark.parametrize(
    ("word", "ty"),
    [
        ("float", ScalarType.FLOAT32),
        ("double", ScalarType.FLOAT64),
        ("float16", ScalarType.FLOAT16),
        ("uint8", ScalarType.UINT8),
        ("int64", ScalarType.INT64),
        ("bool", ScalarType.BOOL),
    ],
)
def test_type_keywords(word: str, ty: ScalarType) -> None:
    d = parse(f"def f({word}(N) A, {word} s) -> (B) {{ B(i) = A(i) }}").defs[0]
    assert d.params[0].type is not None and d.params[0].type.scalar is ty
    assert d.params[1].type is not None and d.params[1].type.dims == ()


def test_spans_point_at_the_source() -> None:
    source = "def f(float(N) A) -> (B) {\n  B(i) = A(i) + 1\n}"
    st = parse(source).defs[0].statements[0]
    assert (st.span.line, st.span.column) == (2, 3)
    assert isinstance(st.rhs, ast.Binary)
    assert (st.rhs.rhs.span.line, st.rhs.rhs.span.column) == (2, 17)
    assert st.index_spans[0].column == 5


def test_ast_is_frozen() -> None:
    st = parse("def f(float(N) A) -> (B) { B(i) = A(i) }").defs[0].statements[0]
    with pytest.raises(AttributeError):
        st.tensor = "C"  # type: ignore[misc]


def test_untyped_input_parses_for_a_clear_error_later() -> None:
    d = parse("def f(A) -> (B) { B(i) = 1 }").defs[0]
    assert d.params[0].type is None


@pytest.mark.parametrize("source", ["", "   # only a comment\n"])
def test_empty_source_is_an_error(source: str) -> None:
    with pytest.raises(TCSyntaxError, match="expected 'def'"):
        parse(source)
