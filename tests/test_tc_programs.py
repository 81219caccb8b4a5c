"""Programs in the style of the original TC project's library and tests that tcpy once
refused at `define`, each run on the `reference`, `cpu` and `cuda-emu` targets at the
sizes TC ran them with and checked against an independent NumPy expression.

- Outputs whose inferred start depends on the sizes: TC's convolution gradients, whose
  image index starts at `KH - 1` (0 for the 1x1 filters of TC's tests), and
  `A(i) = B(10 - i)` with `I = 11`. The start is checked at call time: a 3x3 filter is
  refused then, with the error that names the index; a start that is non-zero for
  every size is still refused at `define`.
- `C()`: the 0-d access written with empty parentheses, on the left and on the right.
- Words of C and isl (`nan`, `inf`, `INFINITY`, `tc_status`, ...) as ordinary names.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest

import tcpy
from tcpy import TCRangeError
from tcpy.mapping.options import MappingOptions

TARGETS = ["reference", "cpu", "cuda-emu"]

CONV_GRAD = """
def convolution_grad(float(N,C,H,W) I, float(M,C,KH,KW) W1, float(N,M,H,W) O_grad)
    -> (I_grad, W1_grad)
{
    I_grad(n, c, h, w) +=! O_grad(n, m, h - kh, w - kw) * W1(m, c, kh, kw)
    W1_grad(m, c, kh, kw) +=! O_grad(n, m, h - kh, w - kw) * I(n, c, h, w)
}
"""

WEIGHT_GRAD = """
def weight_grad(float(N,C,H,W) I, float(N,M,OH,OW) O_grad) -> (W_grad) {
    W_grad(m, c, kh, kw) +=! O_grad(n, m, oh, ow) * I(n, c, oh + kh, ow + kw)
        where kh in 0:H-OH+1, kw in 0:W-OW+1
}
"""

REVERSE = "def reverse(float(I) B) -> (A) { A(i) = B(10 - i) }"

SUM_0D = """
def sum_0d(float(M) A) -> (C, D, E) {
    C() +=! A(r_m)
    D() = C() * 2.0 + C
    E(i) = A(i) / C()
}
"""

C_WORDS = """
def c_words(float(N) nan, float inf) -> (INFINITY, tc_status, ceild) {
    and(i) = nan(i) * inf
    INFINITY() max=! and(r)
    tc_status(i) = and(i) - INFINITY()
    ceild(i) = tc_status(i) + nan(i)
}
"""


def _engine(target: str, source: str) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tcpy.TCWarning)  # none of these is suspicious
        engine.define(source)
    return engine


def _rng() -> np.random.Generator:
    return np.random.default_rng(13)


def _data(*shape: int) -> np.ndarray:
    return _rng().standard_normal(shape).astype(np.float32)


def _close(got: object, want: np.ndarray) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_convolution_gradients_with_a_1x1_filter(target: str) -> None:
    n, c, m, h, w = 2, 3, 4, 5, 6
    image, filt, grad = _data(n, c, h, w), _data(m, c, 1, 1), _data(n, m, h, w)
    i_grad, w_grad = _engine(target, CONV_GRAD).convolution_grad(image, filt, grad)
    _close(i_grad, np.einsum("nmhw,mc->nchw", grad, filt[:, :, 0, 0]))
    _close(w_grad, np.einsum("nmhw,nchw->mc", grad, image)[:, :, None, None])


def test_convolution_gradient_on_cpu_with_parametric_sizes() -> None:
    # The domain of h starts at KH - 1 in the generated code too; 0 at this call.
    n, c, m, h, w = 2, 3, 4, 5, 6
    image, filt, grad = _data(n, c, h, w), _data(m, c, 1, 1), _data(n, m, h, w)
    options = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)
    engine = _engine("cpu", CONV_GRAD)
    i_grad, _ = engine.run("convolution_grad", image, filt, grad, options=options)
    _close(i_grad, np.einsum("nmhw,mc->nchw", grad, filt[:, :, 0, 0]))


@pytest.mark.parametrize("target", TARGETS)
def test_convolution_gradient_with_a_3x3_filter_is_refused_at_call_time(target: str) -> None:
    engine = _engine(target, CONV_GRAD)  # accepted at define: a 1x1 filter is fine
    with pytest.raises(TCRangeError) as info:
        engine.convolution_grad(_data(2, 3, 5, 6), _data(4, 3, 3, 3), _data(2, 4, 5, 6))
    err = info.value
    assert "I_grad would start at index 2, not 0, in its dimension 2 written by h" in err.message
    assert "inferred h in KH - 1:H; at H=5, KH=3 that is 2:5" in err.message
    assert "I_grad(n, c, h, w) +=! O_grad(n, m, h - kh + KH - 1, w - kw + KW - 1)" in err.message
    assert err.line == 5 and err.column == 18  # the h of I_grad(n, c, h, w)
    assert str(err).splitlines()[-1].strip() == "^"


@pytest.mark.parametrize("target", TARGETS)
def test_weight_gradient(target: str) -> None:
    n, c, m, h, w, kh, kw = 2, 3, 4, 7, 6, 3, 2
    image, grad = _data(n, c, h, w), _data(n, m, h - kh + 1, w - kw + 1)
    w_grad = _engine(target, WEIGHT_GRAD).weight_grad(image, grad)
    want = np.zeros((m, c, kh, kw), np.float32)
    for a in range(kh):
        for b in range(kw):
            window = image[:, :, a : a + h - kh + 1, b : b + w - kw + 1]
            want[:, :, a, b] = np.einsum("nmhw,nchw->mc", grad, window)
    _close(w_grad, want)


@pytest.mark.parametrize("target", TARGETS)
def test_reversal_from_a_constant(target: str) -> None:
    engine = _engine(target, REVERSE)
    b = _data(11)
    _close(engine.reverse(b), b[::-1].copy())
    with pytest.raises(TCRangeError, match=r"A would start at index -1, not 0"):
        engine.reverse(_data(12))
    with pytest.raises(TCRangeError, match=r"A would start at index 1, not 0"):
        engine.reverse(_data(10))


@pytest.mark.parametrize("target", TARGETS)
def test_0d_output_written_and_read_with_empty_parentheses(target: str) -> None:
    a = np.abs(_data(7)) + 1
    c, d, e = _engine(target, SUM_0D).sum_0d(a)
    total = a.sum(dtype=np.float32)
    _close(c, np.asarray(total))
    _close(d, np.asarray(total * 3))
    _close(e, a / total)


@pytest.mark.parametrize("target", TARGETS)
def test_words_of_c_and_isl_are_ordinary_names(target: str) -> None:
    x = _data(5)
    top, status, ceild = _engine(target, C_WORDS).c_words(x, 2.0)
    scaled = x * 2
    _close(top, np.asarray(scaled.max()))
    _close(status, scaled - scaled.max())
    _close(ceild, scaled - scaled.max() + x)


@pytest.mark.parametrize(
    ("source", "line", "fragment"),
    [
        ("def f(float(N) I) -> (O) {\n  O(i) = I(i - 1)\n}", 2, "O would start at index 1"),
        (
            "def f(float(N) A, float(M) B) -> (O) {\n\n  O(i) = A(i - 1) + B(i - M)\n}",
            3,
            "O would start at index max(1, M)",
        ),
    ],
)
def test_a_start_nonzero_for_every_size_is_refused_at_define(
    source: str, line: int, fragment: str
) -> None:
    with pytest.raises(TCRangeError) as info:
        tcpy.ExecutionEngine("reference").define(source)
    assert info.value.line == line and fragment in info.value.message


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("op", "fn"), [("max=!", np.max), ("min=!", np.min)], ids=["max", "min"])
def test_min_max_reductions_follow_numpy_on_nan_and_infinities(
    target: str, op: str, fn: Callable[..., np.ndarray]
) -> None:
    a = np.array(
        [[np.nan, 1, 2], [1, np.nan, 2], [1, 2, np.nan], [-np.inf] * 3, [np.inf] * 3], np.float32
    )
    o = _engine(target, f"def f(float(N,M) A) -> (O) {{ O(i) {op} A(i,j) }}").f(a)
    np.testing.assert_array_equal(o, fn(a, axis=1))
