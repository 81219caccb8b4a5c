"""The reference interpreter's semantics, each against a hand-written NumPy value:
C integer arithmetic, lazy operands, identities, statement order, types, chunking."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy import TCInputError
from tcpy.parser import ast
from tcpy.reference import interpreter
from tcpy.types import ScalarType

from differential import define_quietly
from programs import GATHER, MATMUL


def run(source: str, *args: object) -> object:
    e = tcpy.ExecutionEngine("reference")
    (name, *_) = define_quietly(e, source)
    return e.run(name, *args)


def test_integer_division_truncates_like_c() -> None:
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    q, r = run(
        "def f(int32(N) A, int32(N) B) -> (Q, R) { Q(i) = A(i) / B(i)  R(i) = A(i) % B(i) }", a, b
    )
    np.testing.assert_array_equal(q, [3, -3, -3, 3, 0])
    np.testing.assert_array_equal(r, [1, -1, 1, -1, 0])
    assert q.dtype == np.int32


def test_integer_division_by_zero_is_an_input_error() -> None:
    with pytest.raises(TCInputError, match="division by zero at i=1"):
        run("def f(int32(N) A) -> (Q) { Q(i) = 10 / A(i) }", np.array([1, 0], np.int32))


def test_ternary_guards_division_and_reads() -> None:
    a = np.array([0, 2, 5], np.int32)
    q = run("def f(int32(N) A) -> (Q) { Q(i) = A(i) != 0 ? 10 / A(i) : -1 }", a)
    np.testing.assert_array_equal(q, [-1, 5, 2])
    x = np.arange(1, 5, dtype=np.float32)
    o = run(
        "def f(float(N) A) -> (O) { O(i) = i > 0 && A(i - 1) > 1 ? 1.0 : 0.0 where i in 0:N }", x
    )
    np.testing.assert_array_equal(o, [0, 0, 1, 1])


def test_gather_out_of_range_names_the_indices() -> None:
    t = np.zeros((3, 2), np.float32)
    with pytest.raises(TCInputError, match=r"index 3 of its dimension 0, outside 0:3, at b=1, d=0"):
        run(GATHER, t, np.array([0, 3], np.int32))


@pytest.mark.parametrize(
    ("reduction", "dtype", "identity"),
    [
        (ast.Reduction.MIN, np.float32, np.inf),
        (ast.Reduction.MAX, np.float32, -np.inf),
        (ast.Reduction.MAX, np.float16, -np.inf),
        (ast.Reduction.MIN, np.float64, np.inf),
        (ast.Reduction.MIN, np.int32, np.iinfo(np.int32).max),
        (ast.Reduction.MAX, np.uint8, 0),
        (ast.Reduction.PROD, np.float64, 1),
        (ast.Reduction.SUM, np.int64, 0),
        (ast.Reduction.MAX, np.bool_, False),
    ],
)
def test_reduction_identities(reduction: ast.Reduction, dtype: type, identity: object) -> None:
    ty = ScalarType.from_dtype(np.dtype(dtype))
    assert ty is not None and reduction.neutral(ty) == identity


@pytest.mark.parametrize(("op", "fn"), [("max=!", np.max), ("min=!", np.min), ("*=!", np.prod)])
def test_bang_reductions_start_from_the_identity(op: str, fn: object) -> None:
    a = np.array([[-3, -2], [-0.5, -4]], np.float32)  # all negative: a start at 0 would show
    o = run(f"def f(float(N,M) A) -> (O) {{ O(i) {op} A(i,j) }}", a)
    np.testing.assert_array_equal(o, fn(a, axis=1))  # type: ignore[operator]


# NaN at the start, the middle and the end of a reduced row, then rows of infinities
# (which a finite start value would turn into the largest finite float).
_SPECIAL = np.array(
    [
        [np.nan, 1, 2, 3],
        [1, 2, np.nan, 3],
        [1, 2, 3, np.nan],
        [-np.inf, -np.inf, -np.inf, -np.inf],
        [np.inf, np.inf, np.inf, np.inf],
        [-1, np.inf, -np.inf, 0],
    ],
    np.float32,
)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize(("op", "fn"), [("max=!", np.max), ("min=!", np.min)])
def test_min_max_reductions_propagate_nan_and_keep_infinities(
    op: str, fn: object, dtype: type
) -> None:
    ty = {np.float32: "float", np.float64: "double", np.float16: "float16"}[dtype]
    a = _SPECIAL.astype(dtype)
    o = run(f"def f({ty}(N,M) A) -> (O) {{ O(i) {op} A(i,j) }}", a)
    assert o.dtype == dtype
    np.testing.assert_array_equal(o, fn(a, axis=1))  # type: ignore[operator]


@pytest.mark.parametrize(("op", "fn"), [("max=", np.max), ("min=", np.min)])
def test_plain_min_max_reductions_propagate_nan_from_either_side(op: str, fn: object) -> None:
    o = run(f"def f(float(N,M) A) -> (O) {{ O(i) {op[:-1]}=! A(i,j)  O(i) {op} A(i,j) }}", _SPECIAL)
    np.testing.assert_array_equal(o, fn(_SPECIAL, axis=1))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("expr", "fn"),
    [
        ("max(A(i), B(i))", np.maximum),
        ("min(A(i), B(i))", np.minimum),
        ("fmax(A(i), B(i))", np.fmax),
        ("fmin(A(i), B(i))", np.fmin),
    ],
)
def test_min_max_propagate_nan_and_fmin_fmax_follow_c(expr: str, fn: object) -> None:
    a = np.array([np.nan, 1, np.nan, -np.inf, 2], np.float32)
    b = np.array([1, np.nan, np.nan, 0, -3], np.float32)
    o = run(f"def f(float(N) A, float(N) B) -> (O) {{ O(i) = {expr} }}", a, b)
    np.testing.assert_array_equal(o, fn(a, b))  # type: ignore[operator]
    assert np.isnan(o[2])
    if expr.startswith("f"):  # C: the other operand when one is NaN
        assert o[0] == 1 and o[1] == 1
    else:  # NumPy's maximum, PyTorch's maximum: NaN wins
        assert np.isnan(o[0]) and np.isnan(o[1])


def test_integer_min_max_reductions_start_from_the_extremes() -> None:
    a = np.array([[np.iinfo(np.int32).min] * 2, [np.iinfo(np.int32).max] * 2], np.int32)
    lo, hi = run("def f(int32(N,M) A) -> (L, H) { L(i) min=! A(i,j)  H(i) max=! A(i,j) }", a)
    np.testing.assert_array_equal(lo, a.min(axis=1))
    np.testing.assert_array_equal(hi, a.max(axis=1))


def test_bang_resets_but_plain_reduction_accumulates() -> None:
    a = np.ones((2, 3), np.float32)
    o = run("def f(float(N,M) A) -> (O) { O(i) +=! A(i,j)  O(i) += A(i,j)  O(i) += A(i,j) }", a)
    np.testing.assert_array_equal(o, [9, 9])
    o = run("def f(float(N,M) A) -> (O) { O(i) +=! A(i,j)  O(i) +=! A(i,j) }", a)
    np.testing.assert_array_equal(o, [3, 3])


def test_statements_run_in_order() -> None:
    a = np.array([[1, -5], [3, 2]], np.float32)
    b = np.array([1, -10], np.float32)
    o = run(
        "def mlp(float(B,K) I, float(K) b) -> (O) {"
        " O(i,k) = I(i,k) + b(k)  O(i,k) = fmax(O(i,k), 0) }",
        a,
        b,
    )
    np.testing.assert_array_equal(o, np.maximum(a + b, 0))


def test_float16_is_stored_as_float16_and_computed_in_float32() -> None:
    a = np.array([1000, 2000], np.float16)
    o = run("def f(float16(N) A) -> (O) { O(i) = A(i) * A(i) / A(i) }", a)
    assert o.dtype == np.float16
    np.testing.assert_array_equal(o, a)  # 2000*2000 overflows float16, not float32


def test_types_of_mixed_arithmetic() -> None:
    o = run(
        "def f(int32(N) A, double(N) D) -> (O, P, Q) { O(i) = A(i) + 0.5  P(i) = D(i) * 2"
        "  Q(i) = A(i) > 1 }",
        np.array([1, 2], np.int32),
        np.array([1, 2], np.float64),
    )
    assert [x.dtype for x in o] == [np.float32, np.float64, np.bool_]
    np.testing.assert_array_equal(o[2], [False, True])


def test_builtins_follow_c() -> None:
    x = np.array([0.5, -0.5, 1.5, 2.5, -2.5], np.float32)
    np.testing.assert_array_equal(
        run("def f(float(N) A) -> (O) { O(i) = round(A(i)) }", x), [1, -1, 2, 3, -3]
    )
    y = np.array([5.0, -5.0, 7.0], np.float64)
    z = np.array([3.0, 3.0, 2.0], np.float64)
    np.testing.assert_array_equal(
        run("def f(double(N) A, double(N) B) -> (O) { O(i) = remainder(A(i), B(i)) }", y, z),
        [-1.0, 1.0, -1.0],
    )


def test_builtins_compute_in_float_unless_double() -> None:
    o = run("def f(int32(N) A) -> (O) { O(i) = sqrt(A(i)) }", np.array([4], np.int32))
    assert o.dtype == np.float32 and o[0] == 2


def test_size_symbols_and_indices_as_values() -> None:
    o = run("def f(float(N) A) -> (O) { O(i) = A(i) * i + N }", np.ones(3, np.float32))
    np.testing.assert_array_equal(o, [3, 4, 5])


def test_chunked_reduction_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 33)).astype(np.float32)
    b = rng.standard_normal((33, 5)).astype(np.float32)
    monkeypatch.setattr(interpreter, "CHUNK_ELEMENTS", 40)
    c = run(MATMUL, a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_temporaries_are_not_returned() -> None:
    x = np.array([[1, 2], [3, 4]], np.float32)
    o = run("def f(float(N,M) A) -> (O) { T(i) +=! A(i,j)  O(i,j) = A(i,j) / T(i) }", x)
    np.testing.assert_allclose(o, x / x.sum(1, keepdims=True))


def test_zero_initialised_output_read_before_write() -> None:
    o = run(
        "def f(float(N) A) -> (float(N) O, P) { P(i) = O(i) + A(i)  O(i) = A(i) }",
        np.ones(2, np.float32),
    )
    np.testing.assert_array_equal(o[1], [1, 1])


def test_out_of_range_scalar_subscript_is_reported() -> None:
    # found by the fuzzer: a non-affine constant subscript beyond the extent
    with pytest.raises(TCInputError, match="index 4 of its dimension 0, outside 0:2"):
        run("def f(float(N) A) -> (O) { O(i) = A(i) + A(N * N) }", np.ones(2, np.float32))
    with pytest.raises(TCInputError, match="at the only point"):
        run("def f(float(N) A) -> (s) { s = A(N * N) }", np.ones(2, np.float32))
