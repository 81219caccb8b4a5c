"""One negative test per error condition of the front end: the error class, the line,
and a fragment of the message. Each case names the rule it breaks."""

from __future__ import annotations

import importlib
import pickle
import warnings

import pytest

import tcpy
from tcpy import (
    TCError,
    TCRangeError,
    TCSemanticError,
    TCSyntaxError,
    TCTypeError,
)

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n"

CASES = [
    # --- syntax ---------------------------------------------------------------------
    (
        "unclosed-access",
        MM + "  C(m,n) +=! A(m,k * B(k,n)\n}",
        TCSyntaxError,
        3,
        "expected ')' to close the access of A opened at 2:15",
    ),
    (
        "unclosed-call",
        "def f(float(N) A) -> (B) {\n B(i) = exp(A(i)\n}",
        TCSyntaxError,
        3,
        "to close the call of exp",
    ),
    (
        "unclosed-indices",
        "def f(float(N) A) -> (B) {\n B(i = A(i)\n}",
        TCSyntaxError,
        2,
        "to close the indices of B",
    ),
    (
        "unclosed-body",
        "def f(float(N) A) -> (B) {\n B(i) = A(i)\n",
        TCSyntaxError,
        2,
        "'}' to close the body of def f",
    ),
    ("missing-arrow", "def f(float(N) A) (B) { B(i) = A(i) }", TCSyntaxError, 1, "expected '->'"),
    (
        "dangling-operator",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) +\n}",
        TCSyntaxError,
        3,
        "expected an expression",
    ),
    (
        "bad-character",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) $ 2\n}",
        TCSyntaxError,
        2,
        "unexpected character '$'",
    ),
    ("not-a-def", "mm(float(M) A) -> (C) {}", TCSyntaxError, 1, "expected 'def'"),
    (
        "chained-comparison",
        "def f(float(N) A) -> (B) {\n B(i) = 0 < A(i) < 1\n}",
        TCSyntaxError,
        2,
        "found '<'",
    ),
    (
        "keyword-as-index",
        "def f(float(N) A) -> (B) {\n B(in) = A(in)\n}",
        TCSyntaxError,
        2,
        "'in' is a keyword",
    ),
    (
        "type-as-name",
        "def f(float(N) A) -> (B) {\n B(float) = 1\n}",
        TCSyntaxError,
        2,
        "expected '(', found ')' (in the indices of B",
    ),
    (
        "int-literal-overflow",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) + 3000000000\n}",
        TCSyntaxError,
        2,
        "does not fit in int32",
    ),
    (
        "float-literal-overflow",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) + 1e40\n}",
        TCSyntaxError,
        2,
        "outside the range of float32",
    ),
    (
        "deep-parentheses",
        "def f(float(N) A) -> (B) {\n B(i) = " + "(" * 150 + "A(i)" + ")" * 150 + "\n}",
        TCSyntaxError,
        2,
        "nest more than",
    ),
    (
        "deep-operator-chain",
        "def f(float(N) A) -> (B) {\n B(i) = A(i)" + " + 1" * 300 + "\n}",
        TCSyntaxError,
        2,
        "nests more than",
    ),
    # --- declarations ---------------------------------------------------------------
    (
        "untyped-input",
        "def f(float(N) A, B) -> (C) {\n C(i) = A(i)\n}",
        TCSemanticError,
        1,
        "input B has no type",
    ),
    (
        "duplicate-input",
        "def f(float(N) A, float(N) A) -> (C) {\n C(i) = A(i)\n}",
        TCSemanticError,
        1,
        "input A is declared twice",
    ),
    (
        "input-as-output",
        "def f(float(N) A) -> (A) {\n A(i) = 1\n}",
        TCSemanticError,
        1,
        "both an input and an output",
    ),
    (
        "duplicate-output",
        "def f(float(N) A) -> (B, B) {\n B(i) = A(i)\n}",
        TCSemanticError,
        1,
        "output B is declared twice",
    ),
    (
        "size-named-like-tensor",
        "def f(float(A) A) -> (B) {\n B(i) = A(i)\n}",
        TCSemanticError,
        1,
        "names both a size and a tensor",
    ),
    (
        "builtin-as-tensor",
        "def f(float(N) exp) -> (B) {\n B(i) = 1\n}",
        TCSemanticError,
        1,
        "exp is a builtin function",
    ),
    (
        "fixed-size-zero",
        "def f(float(0) A) -> (B) {\n B(i) = A(i)\n}",
        TCSemanticError,
        1,
        "at least 1",
    ),
    (
        "unknown-output-size",
        "def f(float(N) A) -> (float(M) B) {\n B(i) = A(i)\n}",
        TCSemanticError,
        1,
        "size M of this output is not a size of any input",
    ),
    ("no-outputs", "def f(float(N) A) -> () {\n}", TCSemanticError, 1, "has no outputs"),
    (
        "output-never-written",
        "def f(float(N) A) -> (B, C) {\n B(i) = A(i)\n}",
        TCSemanticError,
        1,
        "output C is never written",
    ),
    (
        "duplicate-def",
        "def f(float(N) A) -> (B) { B(i) = A(i) }\ndef f(float(N) A) -> (B) { B(i) = A(i) }",
        TCSemanticError,
        2,
        "defined twice",
    ),
    # --- statements -----------------------------------------------------------------
    (
        "write-input",
        "def f(float(N) A) -> (B) {\n A(i) = 1\n B(i) = A(i)\n}",
        TCSemanticError,
        2,
        "input A is read-only",
    ),
    (
        "write-size",
        "def f(float(N) A) -> (B) {\n N = 1\n B(i) = A(i)\n}",
        TCSemanticError,
        2,
        "N is a size and cannot be written",
    ),
    (
        "unknown-tensor",
        MM + "  C(m,n) +=! X(m,k) * B(k,n)\n}",
        TCSemanticError,
        2,
        "unknown tensor or function X",
    ),
    (
        "misspelt-tensor-hint",
        MM + "  C(m,n) +=! AA(m,k) * B(k,n)\n}",
        TCSemanticError,
        2,
        "did you mean A?",
    ),
    (
        "wrong-subscript-count",
        MM + "  C(m,n) +=! A(m,k,n) * B(k,n)\n}",
        TCSemanticError,
        2,
        "accessed with 3 subscript(s)",
    ),
    ("bare-tensor", MM + "  C(m,n) +=! A * B(k,n)\n}", TCSemanticError, 2, "A has 2 dimension(s)"),
    (
        "empty-parentheses-on-a-tensor-of-rank-1",
        "def f(float(N) A) -> (B) {\n B(i) = A()\n}",
        TCSemanticError,
        2,
        "A has 1 dimension(s) but is accessed with 0 subscript(s)",
    ),
    (
        "empty-parentheses-writing-a-tensor-of-rank-1",
        "def f(float(N) A) -> (float(N) B) {\n B() = A(0)\n}",
        TCSemanticError,
        2,
        "B has 1 dimension(s) but is written with 0 index(es)",
    ),
    (
        "builtin-arity",
        "def f(float(N) A) -> (B) {\n B(i) = pow(A(i))\n}",
        TCSemanticError,
        2,
        "pow takes 2 argument(s), not 1",
    ),
    (
        "bare-builtin",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) + exp\n}",
        TCSemanticError,
        2,
        "exp is a builtin function; call it",
    ),
    (
        "size-called",
        "def f(float(N) A) -> (B) {\n B(i) = N(i)\n}",
        TCSemanticError,
        2,
        "N is a size, not a tensor",
    ),
    (
        "index-called",
        "def f(float(N) A) -> (B) {\n B(i) = i(3)\n}",
        TCSemanticError,
        2,
        "i is an index, not a tensor",
    ),
    (
        "repeated-lhs-index",
        "def f(float(N,N) A) -> (B) {\n B(i,i) = A(i,i)\n}",
        TCSemanticError,
        2,
        "index i appears twice",
    ),
    (
        "lhs-index-is-tensor",
        "def f(float(N) A) -> (B) {\n B(A) = 1\n}",
        TCSemanticError,
        2,
        "A names a tensor and cannot be used as an index",
    ),
    (
        "lhs-index-is-size",
        "def f(float(N) A) -> (B) {\n B(N) = 1\n}",
        TCSemanticError,
        2,
        "N names a size",
    ),
    (
        "rank-changes",
        "def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(i,j) = A(j)\n}",
        TCSemanticError,
        3,
        "B has 1 dimension(s) but is written with 2",
    ),
    (
        "reduction-index-without-reduction",
        MM + "  C(m,n) = A(m,k) * B(k,n)\n}",
        TCSemanticError,
        2,
        "index k appears only on the right-hand side",
    ),
    (
        "reduction-reads-itself",
        "def f(float(N,M) A) -> (B) {\n B(i) +=! A(i,j)\n B(i) +=! B(i) * A(i,j)\n}",
        TCSemanticError,
        3,
        "reads B, the tensor it reduces into",
    ),
    (
        "assign-reads-other-element",
        "def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(i) = B(i) + B(0)\n}",
        TCSemanticError,
        3,
        "read at other indices than it is written",
    ),
    (
        "temporary-read-before-write",
        "def f(float(N) A) -> (B) {\n B(i) = T(i)\n T(i) = A(i)\n}",
        TCSemanticError,
        2,
        "unknown tensor or function T",
    ),
    (
        "output-read-before-write",
        "def f(float(N) A) -> (B, C) {\n B(i) = C(i)\n C(i) = A(i)\n}",
        TCSemanticError,
        2,
        "C is read before any statement writes it",
    ),
    (
        "duplicate-where",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) where i in 0:N, i in 0:2\n}",
        TCSemanticError,
        2,
        "i has two where clauses",
    ),
    (
        "let-on-lhs-index",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) where i = 0\n}",
        TCSemanticError,
        2,
        "cannot be a let",
    ),
    (
        "let-cycle",
        "def f(float(N) A) -> (B) {\n B(i) = A(j) where j = k, k = j\n}",
        TCSemanticError,
        2,
        "in terms of itself",
    ),
    (
        "where-bound-not-size",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) where i in 0:A\n}",
        TCSemanticError,
        2,
        "A is a tensor",
    ),
    (
        "where-bound-nonaffine",
        "def f(float(N,M) A) -> (B) {\n B(i) = 1 where i in 0:N*M\n}",
        TCSemanticError,
        2,
        "must be affine in the sizes",
    ),
    (
        "equivalent-unknown-name",
        MM + "  C(m,n) +=! A(m,k) * B(k,n) <=> mm(A, Z)\n}",
        TCSemanticError,
        2,
        "the <=> annotation names Z",
    ),
    # --- types ----------------------------------------------------------------------
    (
        "float-subscript",
        "def f(float(N) A, float(N) X) -> (B) {\n B(i) = A(X(i))\n}",
        TCTypeError,
        2,
        "must be an integer, not float32",
    ),
    (
        "bool-arithmetic",
        "def f(float(N) A) -> (B) {\n B(i) = (A(i) > 0) + 1\n}",
        TCTypeError,
        2,
        "must be a number, not bool",
    ),
    (
        "logical-on-number",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) && 1 ? 1 : 0\n}",
        TCTypeError,
        2,
        "the operands of && must be bool",
    ),
    (
        "not-on-number",
        "def f(float(N) A) -> (B) {\n B(i) = !A(i) ? 1 : 0\n}",
        TCTypeError,
        2,
        "the operand of ! must be bool",
    ),
    (
        "ternary-condition",
        "def f(float(N) A) -> (B) {\n B(i) = A(i) ? 1 : 0\n}",
        TCTypeError,
        2,
        "the condition of ?: must be bool",
    ),
    ("float-modulo", "def f(float(N) A) -> (B) {\n B(i) = A(i) % 2\n}", TCTypeError, 2, "use fmod"),
    (
        "narrowing-store",
        "def f(double(N) A) -> (float(N) B) {\n B(i) = A(i)\n}",
        TCTypeError,
        2,
        "cannot store a float64 value into float32 tensor B",
    ),
    (
        "float-into-int",
        "def f(float(N) A) -> (int32(N) B) {\n B(i) = A(i)\n}",
        TCTypeError,
        2,
        "write B(i) = int32(A(i))",
    ),
    (
        "bool-sum",
        "def f(float(N,M) A) -> (B) {\n B(i) +=! A(i,j) > 0\n}",
        TCTypeError,
        2,
        "+=! needs numbers",
    ),
    (
        "bool-order",
        "def f(float(N) A) -> (B) {\n B(i) = (A(i) > 0) < (A(i) < 1)\n}",
        TCTypeError,
        2,
        "must be a number, not bool",
    ),
    # --- ranges ---------------------------------------------------------------------
    (
        "unconstrained-lhs",
        "def f(float(P,Q) I) -> (O) {\n O(i, j) = 3\n}",
        TCRangeError,
        2,
        "cannot infer the range of indices i, j",
    ),
    (
        "no-variable-alone",
        "def f(float(N,N) A) -> (O) {\n O(i) +=! A(i+j, i+j)\n}",
        TCRangeError,
        2,
        "no access bounds them on its own",
    ),
    (
        "unconstrained-reduction",
        "def f(float(N) A) -> (O) {\n O(i) +=! A(i) * k\n}",
        TCRangeError,
        2,
        "index k of the reduction",
    ),
    (
        "output-start-at-a-size",
        "def f(float(N,KH) I) -> (O) {\n O(i) +=! I(i - k - 1, k) where k in 0:KH\n}",
        TCRangeError,
        2,
        "O would start at index KH, not 0",
    ),
    (
        "nonzero-based-output",
        "def f(float(N) I) -> (O) {\n O(i) = I(i - 1)\n}",
        TCRangeError,
        2,
        "O would start at index 1, not 0",
    ),
    (
        "output-start-nonzero-for-every-size",
        "def f(float(N) A, float(M) B) -> (O) {\n O(i) = A(i - 1) + B(i - M)\n}",
        TCRangeError,
        2,
        "O would start at index max(1, M), not 0",
    ),
    (
        "always-out-of-bounds",
        "def f(float(N) A) -> (O) {\n O(i) = A(i + 1) where i in 0:N\n}",
        TCRangeError,
        2,
        "reaches index N, outside 0:N",
    ),
    (
        "empty-where-range",
        "def f(float(N) A) -> (O) {\n O(i) = A(i) where i in 3:2\n}",
        TCRangeError,
        2,
        "empty range 3:2",
    ),
]


@pytest.mark.parametrize(
    ("source", "cls", "line", "fragment"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_error(source: str, cls: type[TCError], line: int, fragment: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        with pytest.raises(TCError) as info:
            tcpy.ExecutionEngine().define(source)
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert err.line == line, str(err)
    assert err.column is not None and err.column >= 1
    assert fragment in err.message, str(err)
    rendered = str(err).splitlines()
    assert rendered[-1].strip().startswith("^"), str(err)
    assert rendered[-2] == source.splitlines()[line - 1].expandtabs(1)


def test_case_ids_are_unique() -> None:
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


def test_errors_pickle() -> None:
    with pytest.raises(TCError) as info:
        tcpy.ExecutionEngine().define(MM + "  C(m,n) +=! X(m,k)\n}")
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is TCSemanticError
    assert str(back) == str(info.value)
    assert back.line == 2


def test_internal_error_is_not_a_tc_error() -> None:
    assert not issubclass(tcpy.InternalError, TCError)


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("def f(float(N,M) A) -> (B) {\n B(i) += A(i,j)\n}", "not initialised"),
        (
            "def f(float(N) A) -> (float(N) B, C) {\n C(i) = B(i) + A(i)\n B(i) = A(i)\n}",
            "B is read before any statement writes it; it reads zeros",
        ),
    ],
)
def test_warnings(source: str, fragment: str) -> None:
    with pytest.warns(tcpy.TCWarning, match=fragment):
        tcpy.ExecutionEngine().define(source)


def test_guarded_read_that_narrows_a_range_warns() -> None:
    source = (
        "def pad(float(N,C,H,W) I, float(F,C,KH,KW) W1) -> (O) {\n"
        "  O(n,f,h,w) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W)\n"
        "      ? I(n,c,h+kh-1,w+kw-1) * W1(f,c,kh,kw) : 0.0 where h in 0:H, w in 0:W\n}"
    )
    with pytest.warns(tcpy.TCWarning, match=r":3:\d+: a read of I under a condition narrows"):
        tcpy.ExecutionEngine().define(source)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = source.replace("w in 0:W", "w in 0:W, kh in 0:KH, kw in 0:KW")
        tcpy.ExecutionEngine().define(fixed)


# --- the whole source, before parsing ------------------------------------------------

ONE = "def f(float(N) A) -> (B) { B(i) = A(i) }\n"


def test_a_source_over_the_size_limit_is_refused_before_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule: a TC source is at most `TCPY_MAX_SOURCE_MB` megabytes (1 by default).
    The error points at the first character past the limit, and the parser never
    runs (a 2 MB source took 28 s to reach its first error through it)."""
    parse_module = importlib.import_module("tcpy.parser.parse")

    def no_parser() -> None:
        raise AssertionError("the parser ran")

    monkeypatch.setattr(parse_module, "_parser", no_parser)
    big = ONE + "# " + "x" * 1_200_000 + "\n" + ONE.replace("f", "g")
    with pytest.raises(TCSyntaxError, match="over the limit of 1,000,000") as e:
        tcpy.ExecutionEngine("reference").define(big)
    assert e.value.line == 2 and e.value.column == 1_000_000 - len(ONE) + 1
    assert "TCPY_MAX_SOURCE_MB" in str(e.value)
    assert len(str(e.value)) < 5000  # the long line is cut around the caret
    monkeypatch.setenv("TCPY_MAX_SOURCE_MB", "0.00003")  # 30 bytes
    with pytest.raises(TCSyntaxError, match="41 bytes, over the limit of 30") as e:
        tcpy.ExecutionEngine("reference").define(ONE)
    assert (e.value.line, e.value.column) == (1, 31)


@pytest.mark.parametrize("value", ["0", "-1", "lots", "nan"])
def test_the_source_limit_must_be_a_positive_number(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TCPY_MAX_SOURCE_MB", value)
    with pytest.raises(TCError, match="positive number of megabytes"):
        tcpy.ExecutionEngine("reference").define(ONE)


def test_a_duplicate_def_is_found_before_any_def_is_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule: def names are unique in a source. A scan of the defs' headers finds
    the second `f` (not one in a comment, nor one inside a body, where it is no
    def) before the parser reads the broken statement after it."""
    parse_module = importlib.import_module("tcpy.parser.parse")
    monkeypatch.setattr(parse_module, "_parser", lambda: pytest.fail("the parser ran"))
    source = "# def f\n" + ONE + "def g(float(N) A) -> (B) {\n B(i) = A(i) }\n" + ONE + "+++"
    with pytest.raises(TCSemanticError, match="def f is defined twice") as e:
        tcpy.ExecutionEngine("reference").define(source)
    assert (e.value.line, e.value.column) == (5, 5)


def test_a_def_keyword_inside_a_body_is_left_to_the_parser() -> None:
    source = ONE + "def g(float(N) A) -> (B) { def f }\n"
    with pytest.raises(TCSyntaxError):
        tcpy.ExecutionEngine("reference").define(source)
