"""tcpy's own float32 exp, log, tanh and erf (`tcpy.codegen.vector_math`): within their
documented ULP bounds on a stratified sample (every input with `TCPY_EXHAUSTIVE=1`),
special values exact, the same bits vectorised and not; and kernels that use them
(softmax, log-softmax, gelu, sigmoid) against the reference on NaN, infinities and
signed zeros."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.codegen import vector_math
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.check_vector_math import check  # noqa: E402

FUNCTIONS = sorted(vector_math.OWN)


def _assert_within_bound(name: str, result: dict[str, float]) -> None:
    assert result["specials"] == 0, (
        f"{name}: a special value differs at bits {result['special_at']}"
    )
    assert result["vector_scalar_differ"] == 0, f"{name}: vector and scalar bits differ"
    assert result["max_ulps"] <= vector_math.ERROR_ULPS[name], result


@pytest.mark.parametrize("name", FUNCTIONS)
def test_sampled_inputs_within_the_documented_bound(name: str, tmp_path: Path) -> None:
    result = check(name, exhaustive=False, workdir=tmp_path)
    assert result["checked"] > 200_000
    _assert_within_bound(name, result)


@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.skipif(os.environ.get("TCPY_EXHAUSTIVE") != "1", reason="TCPY_EXHAUSTIVE=1 runs it")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_every_input_within_the_documented_bound(name: str, tmp_path: Path) -> None:
    result = check(name, exhaustive=True, workdir=tmp_path)
    assert result["checked"] == 2**32
    _assert_within_bound(name, result)


def _source(tc: str, sizes: dict[str, int]) -> str:
    (cdef,) = check_source(tc).values()
    return lower_to_c(cdef, sizes, tcpy.MappingOptions.cpu(), check=True).source


def test_libmvec_keeps_the_functions_it_computes_faster() -> None:
    assert vector_math.chosen(libmvec=False) == vector_math.OWN
    assert vector_math.chosen(libmvec=True) == {"exp", "log"}


def test_float32_calls_are_tcpys_and_float64_keeps_libm() -> None:
    f32 = _source(
        "def f(float(N) X) -> (Y) { Y(i) = exp(X(i)) + log(X(i)) + sqrt(X(i)) }", {"N": 64}
    )
    assert "tc_expf(" in f32 and "tc_logf(" in f32 and "sqrtf(" in f32
    assert " expf(" not in f32 and " logf(" not in f32
    assert "tc_tanhf" not in f32  # only the functions a kernel uses
    f64 = _source("def f(double(N) X) -> (Y) { Y(i) = exp(X(i)) }", {"N": 64})
    assert "= exp(" in f64 and "tc_expf" not in f64


SPECIALS = np.array(
    [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 88.8, -88.8, 104.0, -104.0, 1.0, -2.5],
    dtype=np.float32,
)

KERNELS = {
    "softmax": """def softmax(float(N, D) I) -> (O) {
        maxVal(n) max=! I(n, d)
        expDist(n, d) = exp(I(n, d) - maxVal(n))
        expSum(n) +=! expDist(n, d)
        O(n, d) = expDist(n, d) / expSum(n)
    }""",
    "log_softmax": """def log_softmax(float(N, D) I) -> (O) {
        maxVal(n) max=! I(n, d)
        expSum(n) +=! exp(I(n, d) - maxVal(n))
        O(n, d) = I(n, d) - maxVal(n) - log(expSum(n))
    }""",
    "gelu": "def gelu(float(N, D) X) -> (O) {"
    " O(n, d) = 0.5 * X(n, d) * (1.0 + tanh(0.7978845608 * (X(n, d)"
    " + 0.044715 * X(n, d) * X(n, d) * X(n, d)))) }",
    "gelu_erf": "def gelu_erf(float(N, D) X) -> (O) {"
    " O(n, d) = 0.5 * X(n, d) * (1.0 + erf(X(n, d) * 0.70710678)) }",
    "sigmoid": "def sigmoid(float(N, D) X) -> (O) { O(n, d) = 1.0 / (1.0 + exp(-X(n, d))) }",
    "log_tanh": "def log_tanh(float(N, D) X) -> (O, T) {"
    " O(n, d) = log(X(n, d)) T(n, d) = tanh(X(n, d)) }",
}


def _inputs(name: str) -> np.ndarray:
    """Rows of normal values, each row with some of `SPECIALS` (the softmaxes: rows with
    one special each, so that a row's NaN or inf does not hide the others)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((len(SPECIALS) + 3, 37)).astype(np.float32) * 4
    if "softmax" in name:
        for r, v in enumerate(SPECIALS):
            x[r, r % 37] = v
        x[-1, :] = -np.inf  # a row of -inf: NaN, as 0 / 0
        x[-2, :5] = np.inf
    else:
        x[0, : len(SPECIALS)] = SPECIALS
        x[1, : len(SPECIALS)] = SPECIALS[::-1]
    return x


def _same(got: np.ndarray, want: np.ndarray, name: str, atol: np.ndarray | float) -> None:
    """NaN where the reference has NaN, its infinities and zeros' signs exactly, the
    finite values close: a few float32 ULPs of the result, or `atol` where the kernel's
    formula cancels (gelu's 1 + tanh(u) near -1)."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), name
    infinite = np.isinf(want)
    assert np.array_equal(got[infinite], want[infinite]), name
    zero = want == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), name
    finite = np.isfinite(want)
    error = np.abs(np.where(finite, got, 0).astype(np.float64) - np.where(finite, want, 0))
    bound = 2e-6 * np.abs(want) + np.broadcast_to(atol, want.shape)
    assert np.all(error[finite] <= bound[finite]), (name, np.max(error - bound))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_keep_special_values_as_the_reference(name: str) -> None:
    engine, reference = tcpy.ExecutionEngine("cpu"), tcpy.ExecutionEngine("reference")
    (entry,) = engine.define(KERNELS[name])
    reference.define(KERNELS[name])
    x = _inputs(name)
    with np.errstate(all="ignore"):
        got = engine.run(entry, x)
        want = reference.run(entry, x)
    got_t = got if isinstance(got, tuple) else (got,)
    want_t = want if isinstance(want, tuple) else (want,)
    # gelu is 0.5 x (1 + t): an error of t within its bound (2 ULPs of 1) moves it by
    # x ULPs of 1 (`ERROR_ULPS`), whatever the result's size; log-softmax's
    # x - max - log(sum) is rounded at each step, in ULPs of its operands
    size = np.abs(np.where(np.isfinite(x), x, 0))
    atol: np.ndarray | float = 1e-37
    if name.startswith("gelu"):
        atol = size * 2.4e-7
    elif name == "log_softmax":
        atol = 1e-6 * (size + size.max(axis=1, keepdims=True) + 1)
    for g, w in zip(got_t, want_t, strict=True):
        _same(np.asarray(g), np.asarray(w), name, atol)
