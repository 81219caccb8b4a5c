"""The TC corpus as test cases: which def of which file to run, at which sizes, on
which inputs, and what NumPy says the outputs are.

Every `expected` is an independent NumPy computation (einsum, slicing, reductions),
written from the meaning of the TC program, never by calling tcpy. Float results are
computed in float64 where that is simpler and cast to the declared output type; the
tolerances of each case allow for float32 evaluation in the targets.
"""

# ruff: noqa: E741, SIM300  (tensor names of the TC programs: I, comparisons of arrays)
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Case:
    name: str  # unique id, e.g. "matmul"
    file: str  # file name under tests/corpus/
    entry: str  # the def to run
    sizes: dict[str, int]  # the default sizes (every size symbol of the entry)
    inputs: Callable[[np.random.Generator, dict[str, int]], tuple]  # inputs, in order
    expected: Callable[..., tuple]  # independent NumPy result, one array per output
    odd_sizes: tuple[dict[str, int], ...] = ()  # sizes of 1, primes, non-multiples of 32
    rtol: float = 1e-4
    atol: float = 1e-5


def _scattered(shape: tuple[int, ...], places: tuple, values: np.ndarray) -> np.ndarray:
    """Zeros of `shape` with `values` added at `places` (repeated places add up)."""
    out = np.zeros(shape)
    np.add.at(out, places, values.astype(np.float64))
    return out


def _conv_transpose1d(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Y[f, 2h + k] += X[c, h] W[c, f, k], by loops over the window."""
    H = X.shape[1]
    Y = np.zeros((W.shape[1], 2 * H + 1))
    for k in range(3):
        Y[:, k : k + 2 * H : 2] += np.einsum("ch,cf->fh", X.astype(np.float64), W[:, :, k])
    return Y


# --- input builders -----------------------------------------------------------------


def f32(rng: np.random.Generator, *shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return np.ascontiguousarray(rng.uniform(lo, hi, size=shape).astype(np.float32))


def f64(rng: np.random.Generator, *shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return np.ascontiguousarray(rng.uniform(lo, hi, size=shape).astype(np.float64))


def ints(
    rng: np.random.Generator, *shape: int, lo: int, hi: int, dtype: type = np.int32
) -> np.ndarray:
    """Integers in [lo, hi)."""
    return np.ascontiguousarray(rng.integers(lo, hi, size=shape).astype(dtype))


# --- output helpers -----------------------------------------------------------------


def F(x: object) -> np.ndarray:
    """As a float32 array (0-d stays 0-d)."""
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def D(x: object) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def d64(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(a, dtype=np.float64) for a in arrays)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def c_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """Integer division truncating toward zero, as in C."""
    a64 = np.asarray(a, dtype=np.int64)
    b64 = np.asarray(b, dtype=np.int64)
    return np.sign(a64) * np.sign(b64) * (np.abs(a64) // np.abs(b64))


def c_rem(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64) * c_div(a, b)


def round_half_away(x: np.ndarray) -> np.ndarray:
    x64 = np.asarray(x, dtype=np.float64)
    return np.sign(x64) * np.floor(np.abs(x64) + 0.5)


# --- expected computations ----------------------------------------------------------


def conv2d_ref(I: np.ndarray, W1: np.ndarray, stride: int = 1) -> np.ndarray:
    """Valid cross-correlation: O[n,f,h,w] = sum I[n,c,s*h+kh,s*w+kw] * W1[f,c,kh,kw]."""
    I64, W64 = d64(I, W1)
    _, _, H, W = I.shape
    _, _, KH, KW = W1.shape
    Ho, Wo = (H - KH) // stride + 1, (W - KW) // stride + 1
    out = np.zeros((I.shape[0], W1.shape[0], Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            patch = I64[
                :,
                :,
                kh : kh + stride * (Ho - 1) + 1 : stride,
                kw : kw + stride * (Wo - 1) + 1 : stride,
            ]
            out += np.einsum("nchw,fc->nfhw", patch, W64[:, :, kh, kw])
    return out


def dilate2(W1: np.ndarray) -> np.ndarray:
    """The filter of a dilation-2 convolution as an ordinary filter with zero gaps."""
    F_, C, KH, KW = W1.shape
    out = np.zeros((F_, C, 2 * KH - 1, 2 * KW - 1), dtype=W1.dtype)
    out[:, :, ::2, ::2] = W1
    return out


def group_conv_ref(I: np.ndarray, W1: np.ndarray) -> np.ndarray:
    I64, W64 = d64(I, W1)
    N, G, _, H, W = I.shape
    _, F, _, KH, KW = W1.shape
    Ho, Wo = H - KH + 1, W - KW + 1
    out = np.zeros((N, G, F, Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            out += np.einsum(
                "ngchw,gfc->ngfhw", I64[:, :, :, kh : kh + Ho, kw : kw + Wo], W64[:, :, :, kh, kw]
            )
    return out


def depthwise_ref(I: np.ndarray, W1: np.ndarray) -> np.ndarray:
    I64, W64 = d64(I, W1)
    _, _, H, W = I.shape
    _, KH, KW = W1.shape
    Ho, Wo = H - KH + 1, W - KW + 1
    out = np.zeros((I.shape[0], I.shape[1], Ho, Wo))
    for kh in range(KH):
        for kw in range(KW):
            out += I64[:, :, kh : kh + Ho, kw : kw + Wo] * W64[None, :, kh, kw, None, None]
    return out


def pool2x2(I: np.ndarray, reduce: Callable[..., np.ndarray]) -> np.ndarray:
    N, C, H, W = I.shape
    Ho, Wo = H // 2, W // 2
    blocks = I[:, :, : 2 * Ho, : 2 * Wo].astype(np.float64).reshape(N, C, Ho, 2, Wo, 2)
    return reduce(blocks, axis=(3, 5))


def softmax_parts(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = X.astype(np.float64)
    mx = x.max(axis=-1, keepdims=True)
    e = np.exp(x - mx)
    s = e.sum(axis=-1, keepdims=True)
    return e / s, mx[..., 0], s[..., 0]


def layernorm_ref(X, gamma, beta, eps):
    x = X.astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (gamma * (x - mean) / np.sqrt(var + float(eps)) + beta,)


def batchnorm_ref(X, gamma, beta, eps):
    x = X.astype(np.float64)
    mean = x.mean(axis=(0, 2, 3))
    var = ((x - mean[None, :, None, None]) ** 2).mean(axis=(0, 2, 3))
    y = (x - mean[None, :, None, None]) / np.sqrt(var + float(eps))[None, :, None, None]
    y = gamma[None, :, None, None] * y + beta[None, :, None, None]
    return F(y), F(mean), F(var)


def relu(x):
    return np.maximum(x, 0.0)


def attention_ref(Q, K, V):
    q, k, v = d64(Q, K, V)
    sc = np.einsum("btd,bsd->bts", q, k) / np.sqrt(Q.shape[2])
    sc = sc - sc.max(axis=2, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(axis=2, keepdims=True)
    return (F(np.einsum("bts,bse->bte", p, v)),)


def cross_entropy_ref(X, label):
    x = X.astype(np.float64)
    mx = x.max(axis=1)
    lse = np.log(np.exp(x - mx[:, None]).sum(axis=1)) + mx
    return (F((lse - x[np.arange(x.shape[0]), label]).mean()),)


def kru3_ref(W2, W1, W0, X):
    return (F(np.einsum("mabc,zc,yb,xa->mxyz", *d64(X, W2, W1, W0))),)


def argmax_ref(A):
    return A.argmax(axis=1).astype(np.int32), A.max(axis=1)


def box_inputs(rng, s):
    lo = f32(rng, s["N"], 2, lo=0.0, hi=1.0)
    ext = f32(rng, s["N"], 2, lo=0.1, hi=1.0)
    return (np.ascontiguousarray(np.concatenate([lo, lo + ext], axis=1)),)


def with_zeros(rng, n):
    x = f32(rng, n, lo=-2.0, hi=2.0)
    x[::3] = 0.0
    return x


def pos(rng, *shape):
    return f32(rng, *shape, lo=0.2, hi=3.0)


def nonzero_ints(rng, n, lim):
    mag = rng.integers(1, lim, size=n)
    sign = rng.choice([-1, 1], size=n)
    return np.ascontiguousarray((mag * sign).astype(np.int32))


# --- the cases ----------------------------------------------------------------------

CASES: tuple[Case, ...] = (
    # Matrix products -----------------------------------------------------------------
    Case(
        "matmul",
        "matmul.tc",
        "matmul",
        {"M": 16, "K": 24, "N": 20},
        lambda r, s: (f32(r, s["M"], s["K"]), f32(r, s["K"], s["N"])),
        lambda A, B: (F(A.astype(np.float64) @ B),),
        ({"M": 1, "K": 7, "N": 13}, {"M": 33, "K": 1, "N": 5}),
    ),
    Case(
        "matmul_tn",
        "matmul_transposed.tc",
        "matmul_tn",
        {"K": 12, "M": 10, "N": 9},
        lambda r, s: (f32(r, s["K"], s["M"]), f32(r, s["K"], s["N"])),
        lambda A, B: (F(A.T.astype(np.float64) @ B),),
        ({"K": 1, "M": 7, "N": 1}, {"K": 13, "M": 3, "N": 33}),
    ),
    Case(
        "matmul_nt",
        "matmul_transposed.tc",
        "matmul_nt",
        {"M": 10, "K": 12, "N": 9},
        lambda r, s: (f32(r, s["M"], s["K"]), f32(r, s["N"], s["K"])),
        lambda A, B: (F(A.astype(np.float64) @ B.T),),
        ({"M": 1, "K": 13, "N": 7}, {"M": 5, "K": 1, "N": 2}),
    ),
    Case(
        "batch_matmul",
        "batch_matmul.tc",
        "batch_matmul",
        {"B": 3, "M": 8, "K": 10, "N": 6},
        lambda r, s: (f32(r, s["B"], s["M"], s["K"]), f32(r, s["B"], s["K"], s["N"])),
        lambda X, Y: (F(np.matmul(X.astype(np.float64), Y)),),
        ({"B": 1, "M": 7, "K": 13, "N": 1}, {"B": 5, "M": 1, "K": 3, "N": 11}),
    ),
    Case(
        "tensordot",
        "tensordot.tc",
        "tensordot",
        {"N": 2, "C1": 3, "C2": 4, "C3": 5, "H": 3, "W": 4},
        lambda r, s: (
            f32(r, s["N"], s["C1"], s["C2"], s["H"], s["W"]),
            f32(r, s["N"], s["C2"], s["C3"], s["H"], s["W"]),
        ),
        lambda I0, I1: (F(np.einsum("nachw,ncbhw->nabhw", *d64(I0, I1))),),
        ({"N": 1, "C1": 1, "C2": 7, "C3": 2, "H": 5, "W": 1},),
    ),
    Case(
        "bias_add_grad",
        "bias_add_grad.tc",
        "bias_add_grad",
        {"N": 32, "C": 17},
        lambda r, s: (f32(r, s["N"], s["C"]),),
        lambda dO: (F(dO.astype(np.float64).sum(axis=0)),),
        ({"N": 1, "C": 1}, {"N": 13, "C": 5}),
    ),
    # Softmax, normalisations -----------------------------------------------------------
    Case(
        "softmax",
        "softmax.tc",
        "softmax",
        {"N": 8, "D": 33},
        lambda r, s: (f32(r, s["N"], s["D"], lo=-4.0, hi=4.0),),
        lambda I: (F(softmax_parts(I)[0]),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "softmax_stats",
        "softmax_outputs.tc",
        "softmax_stats",
        {"N": 8, "D": 33},
        lambda r, s: (f32(r, s["N"], s["D"], lo=-4.0, hi=4.0),),
        lambda I: tuple(F(x) for x in softmax_parts(I)),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "log_softmax",
        "log_softmax.tc",
        "log_softmax",
        {"N": 8, "D": 20},
        lambda r, s: (f32(r, s["N"], s["D"], lo=-4.0, hi=4.0),),
        lambda X: (F(np.log(softmax_parts(X)[0])),),
        ({"N": 1, "D": 1}, {"N": 13, "D": 7}),
    ),
    Case(
        "layernorm",
        "layernorm.tc",
        "layernorm",
        {"N": 8, "D": 32},
        lambda r, s: (
            f32(r, s["N"], s["D"], lo=-2.0, hi=2.0),
            f32(r, s["D"], lo=0.5, hi=1.5),
            f32(r, s["D"]),
            np.float32(1e-5),
        ),
        lambda X, g, b, eps: tuple(F(y) for y in layernorm_ref(X, g, b, eps)),
        ({"N": 3, "D": 1}, {"N": 7, "D": 13}),
        atol=1e-4,
    ),
    Case(
        "batchnorm",
        "batchnorm.tc",
        "batchnorm",
        {"N": 2, "C": 3, "H": 4, "W": 5},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"], lo=-2.0, hi=2.0),
            f32(r, s["C"], lo=0.5, hi=1.5),
            f32(r, s["C"]),
            np.float32(1e-5),
        ),
        batchnorm_ref,
        ({"N": 1, "C": 1, "H": 3, "W": 7}, {"N": 3, "C": 2, "H": 1, "W": 5}),
        atol=1e-4,
    ),
    Case(
        "cosine_similarity",
        "cosine_similarity.tc",
        "cosine_similarity",
        {"N": 10, "D": 16},
        lambda r, s: (f32(r, s["N"], s["D"]), f32(r, s["N"], s["D"])),
        lambda A, B: (
            F(
                (A.astype(np.float64) * B).sum(1)
                / np.sqrt((A.astype(np.float64) ** 2).sum(1) * (B.astype(np.float64) ** 2).sum(1))
            ),
        ),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "l2_normalize",
        "cosine_similarity.tc",
        "l2_normalize",
        {"N": 10, "D": 16},
        lambda r, s: (f32(r, s["N"], s["D"]),),
        lambda A: (F(A / np.sqrt((A.astype(np.float64) ** 2).sum(1, keepdims=True))),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    # Fully connected layers --------------------------------------------------------------
    Case(
        "fcrelu",
        "fcrelu.tc",
        "fcrelu",
        {"B": 8, "M": 16, "N": 12},
        lambda r, s: (f32(r, s["B"], s["M"]), f32(r, s["N"], s["M"]), f32(r, s["N"])),
        lambda I, W1, B1: (F(relu(I.astype(np.float64) @ W1.T + B1)),),
        ({"B": 1, "M": 1, "N": 1}, {"B": 5, "M": 13, "N": 7}),
    ),
    Case(
        "mlp2",
        "mlp2.tc",
        "mlp2",
        {"B": 4, "M": 16, "N": 12, "P": 10},
        lambda r, s: (
            f32(r, s["B"], s["M"]),
            f32(r, s["N"], s["M"]),
            f32(r, s["N"]),
            f32(r, s["P"], s["N"]),
            f32(r, s["P"]),
        ),
        lambda I, W1, B1, W2, B2: (
            F(h := relu(I.astype(np.float64) @ W1.T + B1)),
            F(relu(h @ W2.T + B2)),
        ),
        ({"B": 1, "M": 7, "N": 1, "P": 3}, {"B": 3, "M": 5, "N": 13, "P": 1}),
    ),
    Case(
        "mlp2_hidden",
        "mlp2.tc",
        "mlp2_hidden",
        {"B": 4, "M": 16, "N": 12, "P": 10},
        lambda r, s: (
            f32(r, s["B"], s["M"]),
            f32(r, s["N"], s["M"]),
            f32(r, s["N"]),
            f32(r, s["P"], s["N"]),
            f32(r, s["P"]),
        ),
        lambda I, W1, B1, W2, B2: (F(relu(I.astype(np.float64) @ W1.T + B1) @ W2.T + B2),),
        ({"B": 2, "M": 1, "N": 7, "P": 13},),
    ),
    Case(
        "gemm",
        "axpy.tc",
        "gemm",
        {"M": 12, "K": 10, "N": 9},
        lambda r, s: (
            np.float32(1.5),
            np.float32(-0.5),
            f32(r, s["M"], s["K"]),
            f32(r, s["K"], s["N"]),
            f32(r, s["M"], s["N"]),
        ),
        lambda alpha, beta, A, B, C: (
            F(float(alpha) * (A.astype(np.float64) @ B) + float(beta) * C),
        ),
        ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 13, "N": 3}),
    ),
    # Convolutions and pooling ----------------------------------------------------------
    Case(
        "conv2d",
        "conv2d.tc",
        "conv2d",
        {"N": 2, "C": 3, "H": 8, "W": 9, "F": 4, "KH": 3, "KW": 3},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
        ),
        lambda I, W1: (F(conv2d_ref(I, W1)),),
        (
            {"N": 1, "C": 1, "H": 5, "W": 7, "F": 1, "KH": 5, "KW": 1},
            {"N": 1, "C": 2, "H": 13, "W": 6, "F": 3, "KH": 2, "KW": 3},
        ),
    ),
    Case(
        "conv2d_bias_relu",
        "conv2d.tc",
        "conv2d_bias_relu",
        {"N": 2, "C": 3, "H": 7, "W": 8, "F": 4, "KH": 3, "KW": 2},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
            f32(r, s["F"]),
        ),
        lambda I, W1, B: (F(relu(conv2d_ref(I, W1) + B[None, :, None, None])),),
        (
            {"N": 1, "C": 1, "H": 1, "W": 1, "F": 1, "KH": 1, "KW": 1},
            {"N": 1, "C": 5, "H": 7, "W": 3, "F": 2, "KH": 7, "KW": 3},
        ),
    ),
    Case(
        "conv2d_stride2",
        "conv2d_strided.tc",
        "conv2d_stride2",
        {"N": 2, "C": 3, "H": 10, "W": 9, "F": 4, "KH": 3, "KW": 3},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
        ),
        lambda I, W1: (F(conv2d_ref(I, W1, stride=2)),),
        (
            {"N": 1, "C": 2, "H": 9, "W": 10, "F": 3, "KH": 3, "KW": 2},
            {"N": 1, "C": 1, "H": 3, "W": 1, "F": 1, "KH": 3, "KW": 1},
        ),
    ),
    Case(
        "group_convolution",
        "group_conv.tc",
        "group_convolution",
        {"N": 2, "G": 2, "C": 3, "H": 6, "W": 7, "F": 2, "KH": 3, "KW": 2},
        lambda r, s: (
            f32(r, s["N"], s["G"], s["C"], s["H"], s["W"]),
            f32(r, s["G"], s["F"], s["C"], s["KH"], s["KW"]),
        ),
        lambda I, W1: (F(group_conv_ref(I, W1)),),
        ({"N": 1, "G": 3, "C": 1, "H": 5, "W": 4, "F": 1, "KH": 1, "KW": 3},),
    ),
    Case(
        "depthwise_conv2d",
        "depthwise_conv.tc",
        "depthwise_conv2d",
        {"N": 2, "C": 4, "H": 8, "W": 8, "KH": 3, "KW": 3},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]), f32(r, s["C"], s["KH"], s["KW"])),
        lambda I, W1: (F(depthwise_ref(I, W1)),),
        (
            {"N": 1, "C": 1, "H": 7, "W": 5, "KH": 2, "KW": 5},
            {"N": 3, "C": 13, "H": 3, "W": 3, "KH": 1, "KW": 1},
        ),
    ),
    Case(
        "maxpool2x2",
        "maxpool.tc",
        "maxpool2x2",
        {"N": 2, "C": 3, "H": 8, "W": 10},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]),),
        lambda I: (F(pool2x2(I, np.max)),),
        ({"N": 1, "C": 1, "H": 3, "W": 5}, {"N": 1, "C": 7, "H": 7, "W": 2}),
    ),
    Case(
        "avgpool2x2",
        "avgpool.tc",
        "avgpool2x2",
        {"N": 2, "C": 3, "H": 8, "W": 10},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]),),
        lambda I: (F(pool2x2(I, np.mean)),),
        ({"N": 1, "C": 1, "H": 3, "W": 5}, {"N": 1, "C": 7, "H": 7, "W": 2}),
    ),
    Case(
        "global_avgpool",
        "avgpool.tc",
        "global_avgpool",
        {"N": 2, "C": 3, "H": 8, "W": 10},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]),),
        lambda I: (F(I.astype(np.float64).mean(axis=(2, 3))),),
        ({"N": 1, "C": 1, "H": 1, "W": 1}, {"N": 1, "C": 7, "H": 13, "W": 3}),
    ),
    # Lookups and gathers ---------------------------------------------------------------
    Case(
        "two_lut",
        "two_lut.tc",
        "two_lut",
        {"E1": 20, "E2": 15, "D": 8, "B": 4, "L1": 5, "L2": 3},
        lambda r, s: (
            f32(r, s["E1"], s["D"]),
            ints(r, s["B"], s["L1"], lo=0, hi=s["E1"]),
            f32(r, s["E2"], s["D"]),
            ints(r, s["B"], s["L2"], lo=0, hi=s["E2"]),
        ),
        lambda LUT1, I1, LUT2, I2: (
            F(LUT1.astype(np.float64)[I1].sum(axis=1)),
            F(LUT2.astype(np.float64)[I2].sum(axis=1)),
        ),
        ({"E1": 1, "E2": 7, "D": 13, "B": 1, "L1": 3, "L2": 1},),
    ),
    Case(
        "embedding",
        "embedding.tc",
        "embedding",
        {"V": 50, "D": 16, "B": 12},
        lambda r, s: (f32(r, s["V"], s["D"]), ints(r, s["B"], lo=0, hi=s["V"])),
        lambda E, idx: (E[idx],),
        ({"V": 1, "D": 1, "B": 1}, {"V": 13, "D": 7, "B": 33}),
    ),
    Case(
        "embedding_bag_mean",
        "embedding.tc",
        "embedding_bag_mean",
        {"V": 50, "D": 16, "B": 6, "L": 4},
        lambda r, s: (f32(r, s["V"], s["D"]), ints(r, s["B"], s["L"], lo=0, hi=s["V"])),
        lambda E, idx: (F(E.astype(np.float64)[idx].mean(axis=1)),),
        ({"V": 1, "D": 3, "B": 2, "L": 1}, {"V": 13, "D": 7, "B": 5, "L": 11}),
    ),
    Case(
        "embedding_i64",
        "embedding.tc",
        "embedding_i64",
        {"V": 50, "D": 16, "B": 12},
        lambda r, s: (f32(r, s["V"], s["D"]), ints(r, s["B"], lo=0, hi=s["V"], dtype=np.int64)),
        lambda E, idx: (E[idx],),
        ({"V": 7, "D": 1, "B": 13},),
    ),
    Case(
        "nll_loss",
        "cross_entropy.tc",
        "nll_loss",
        {"B": 16, "C": 10},
        lambda r, s: (f32(r, s["B"], s["C"], lo=-5.0, hi=-0.1), ints(r, s["B"], lo=0, hi=s["C"])),
        lambda logp, label: (F(-logp.astype(np.float64)[np.arange(len(label)), label].mean()),),
        ({"B": 1, "C": 1}, {"B": 13, "C": 7}),
    ),
    Case(
        "cross_entropy",
        "cross_entropy.tc",
        "cross_entropy",
        {"B": 16, "C": 10},
        lambda r, s: (f32(r, s["B"], s["C"], lo=-3.0, hi=3.0), ints(r, s["B"], lo=0, hi=s["C"])),
        cross_entropy_ref,
        ({"B": 1, "C": 1}, {"B": 13, "C": 7}),
    ),
    # Multi-way contractions ------------------------------------------------------------
    Case(
        "kru3_1",
        "kru.tc",
        "kru3_1",
        {"D2": 5, "N2": 4, "M": 3, "N0": 4, "N1": 6},
        lambda r, s: (f32(r, s["D2"], s["N2"]), f32(r, s["M"], s["N0"], s["N1"], s["N2"])),
        lambda W2, X: (F(np.einsum("mabc,dc->mabd", *d64(X, W2))),),
        ({"D2": 1, "N2": 7, "M": 2, "N0": 1, "N1": 3},),
    ),
    Case(
        "kru3",
        "kru.tc",
        "kru3",
        {"D2": 3, "N2": 4, "D1": 2, "N1": 3, "D0": 3, "N0": 2, "M": 5},
        lambda r, s: (
            f32(r, s["D2"], s["N2"]),
            f32(r, s["D1"], s["N1"]),
            f32(r, s["D0"], s["N0"]),
            f32(r, s["M"], s["N0"], s["N1"], s["N2"]),
        ),
        kru3_ref,
        ({"D2": 1, "N2": 3, "D1": 7, "N1": 1, "D0": 2, "N0": 5, "M": 1},),
    ),
    Case(
        "tucker3",
        "kru.tc",
        "tucker3",
        {"I": 4, "A": 3, "J": 3, "B": 4, "K": 5, "C": 2},
        lambda r, s: (
            f32(r, s["I"], s["A"]),
            f32(r, s["J"], s["B"]),
            f32(r, s["K"], s["C"]),
            f32(r, s["A"], s["B"], s["C"]),
        ),
        lambda U, V, W1, X: (F(np.einsum("ia,jb,kc,abc->ijk", *d64(U, V, W1, X))),),
        ({"I": 1, "A": 2, "J": 7, "B": 1, "K": 3, "C": 5},),
    ),
    Case(
        "attention",
        "attention.tc",
        "attention",
        {"B": 2, "T": 5, "S": 7, "D": 8, "E": 6},
        lambda r, s: (
            f32(r, s["B"], s["T"], s["D"], lo=-2.0, hi=2.0),
            f32(r, s["B"], s["S"], s["D"], lo=-2.0, hi=2.0),
            f32(r, s["B"], s["S"], s["E"]),
        ),
        attention_ref,
        ({"B": 1, "T": 1, "S": 1, "D": 1, "E": 1}, {"B": 3, "T": 13, "S": 5, "D": 7, "E": 2}),
    ),
    Case(
        "pairwise_sqdist",
        "pairwise_distance.tc",
        "pairwise_sqdist",
        {"M": 10, "D": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["D"]), f32(r, s["N"], s["D"])),
        lambda X, Y: (F(((X.astype(np.float64)[:, None, :] - Y[None, :, :]) ** 2).sum(-1)),),
        ({"M": 1, "D": 1, "N": 7}, {"M": 13, "D": 5, "N": 1}),
    ),
    Case(
        "pairwise_dist",
        "pairwise_distance.tc",
        "pairwise_dist",
        {"M": 10, "D": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["D"]), f32(r, s["N"], s["D"])),
        lambda X, Y: (
            F(np.sqrt(((X.astype(np.float64)[:, None, :] - Y[None, :, :]) ** 2).sum(-1))),
        ),
        ({"M": 7, "D": 3, "N": 13},),
    ),
    # Ranges: where, lets, exists -------------------------------------------------------
    Case(
        "pair_sum",
        "stencil.tc",
        "pair_sum",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (A[:-1] + A[1:],),
        ({"N": 2}, {"N": 13}),
    ),
    Case(
        "moving_avg3",
        "stencil.tc",
        "moving_avg3",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (F((A[:-2].astype(np.float64) + A[1:-1] + A[2:]) / 3.0),),
        ({"N": 3}, {"N": 13}),
    ),
    Case(
        "laplacian",
        "stencil.tc",
        "laplacian",
        {"H": 12, "W": 10},
        lambda r, s: (f32(r, s["H"], s["W"]),),
        lambda U: (
            F(
                U[:-2, 1:-1].astype(np.float64)
                + U[2:, 1:-1]
                + U[1:-1, :-2]
                + U[1:-1, 2:]
                - 4.0 * U[1:-1, 1:-1]
            ),
        ),
        ({"H": 3, "W": 3}, {"H": 7, "W": 13}),
    ),
    Case(
        "forward_diff",
        "lets.tc",
        "forward_diff",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (A[1:] - A[:-1],),
        ({"N": 2}, {"N": 13}),
    ),
    Case(
        "box2x2",
        "lets.tc",
        "box2x2",
        {"H": 12, "W": 10},
        lambda r, s: (f32(r, s["H"], s["W"]),),
        lambda A: (F(A[:-1, :-1].astype(np.float64) + A[1:, :-1] + A[:-1, 1:] + A[1:, 1:]),),
        ({"H": 2, "W": 2}, {"H": 7, "W": 13}),
    ),
    Case(
        "drop_last",
        "exists.tc",
        "drop_last",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (A[:-1].copy(),),
        ({"N": 2}, {"N": 13}),
    ),
    Case(
        "crop_like",
        "exists.tc",
        "crop_like",
        {"N": 40, "M": 25},
        lambda r, s: (f32(r, s["N"]), f32(r, s["M"])),
        lambda A, B: (A[: min(len(A), len(B))].copy(),),
        ({"N": 5, "M": 9}, {"N": 1, "M": 1}),
    ),
    Case(
        "cumsum",
        "cumsum.tc",
        "cumsum",
        {"N": 64},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (F(np.cumsum(A.astype(np.float64))),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "upsample_nearest2x",
        "upsample.tc",
        "upsample_nearest2x",
        {"H": 6, "W": 9},
        lambda r, s: (f32(r, s["H"], s["W"]),),
        lambda A: (np.repeat(np.repeat(A, 2, axis=0), 2, axis=1),),
        ({"H": 1, "W": 1}, {"H": 7, "W": 3}),
    ),
    # Ternaries, comparisons, bools -----------------------------------------------------
    Case(
        "leaky_relu",
        "ternary.tc",
        "leaky_relu",
        {"N": 8, "D": 20},
        lambda r, s: (f32(r, s["N"], s["D"]),),
        lambda X: (F(np.where(X > 0, X, 0.01 * X.astype(np.float64))),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "band_pass",
        "ternary.tc",
        "band_pass",
        {"N": 50},
        lambda r, s: (f32(r, s["N"]), np.float32(-0.5), np.float32(0.25)),
        lambda X, lo, hi: (np.where((X < lo) | (X > hi), np.float32(0.0), X),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "tridiagonal",
        "ternary.tc",
        "tridiagonal",
        {"N": 12},
        lambda r, s: (f32(r, s["N"], s["N"]),),
        lambda A: (np.triu(np.tril(A, 1), -1),),
        ({"N": 1}, {"N": 7}),
    ),
    Case(
        "sign",
        "ternary.tc",
        "sign",
        {"N": 30},
        lambda r, s: (with_zeros(r, s["N"]),),
        lambda X: (np.sign(X).astype(np.float32),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "causal_mask",
        "causal_mask.tc",
        "causal_mask",
        {"B": 2, "T": 9},
        lambda r, s: (f32(r, s["B"], s["T"], s["T"]),),
        lambda S: (
            np.where(np.tril(np.ones(S.shape[1:], dtype=bool))[None], S, np.float32(-1e9)).astype(
                np.float32
            ),
        ),
        ({"B": 1, "T": 1}, {"B": 3, "T": 13}),
    ),
    Case(
        "greater",
        "compare.tc",
        "greater",
        {"M": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["M"], s["N"])),
        lambda A, B: (A > B,),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "in_unit_interval",
        "compare.tc",
        "in_unit_interval",
        {"N": 50},
        lambda r, s: (
            np.concatenate([np.float32([0.0, 1.0, -0.0]), f32(r, s["N"] - 3, lo=-0.5, hi=1.5)])
            if s["N"] >= 3
            else f32(r, s["N"], lo=-0.5, hi=1.5),
        ),
        lambda X: ((X >= 0) & (X < 1),),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "not_equal_int",
        "compare.tc",
        "not_equal_int",
        {"N": 50},
        lambda r, s: (ints(r, s["N"], lo=0, hi=3), ints(r, s["N"], lo=0, hi=3)),
        lambda A, B: (A != B,),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "is_row_max",
        "compare.tc",
        "is_row_max",
        {"M": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (A == A.max(axis=1, keepdims=True),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "argmax",
        "argmax.tc",
        "argmax",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        argmax_ref,
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    # Casts and types -------------------------------------------------------------------
    Case(
        "dequantize",
        "casts.tc",
        "dequantize",
        {"N": 50},
        lambda r, s: (ints(r, s["N"], lo=-1000, hi=1000), np.float32(0.125)),
        lambda Q, scale: (Q.astype(np.float32) * scale,),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "quantize",
        "casts.tc",
        "quantize",
        {"N": 50},
        lambda r, s: (f32(r, s["N"], lo=-10.0, hi=10.0), np.float32(0.1)),
        lambda X, scale: (round_half_away(X / scale).astype(np.int32),),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "to_int",
        "casts.tc",
        "to_int",
        {"N": 50},
        lambda r, s: (f32(r, s["N"], lo=-50.0, hi=50.0),),
        lambda X: (X.astype(np.int32),),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "sum_double",
        "casts.tc",
        "sum_double",
        {"M": 8, "N": 30},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda X: (X.astype(np.float64).sum(axis=1),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=1e-12,
        atol=1e-12,
    ),
    Case(
        "axpy",
        "axpy.tc",
        "axpy",
        {"N": 50},
        lambda r, s: (np.float32(2.5), f32(r, s["N"]), f32(r, s["N"])),
        lambda alpha, X, Y: (F(float(alpha) * X.astype(np.float64) + Y),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "int_matmul",
        "int_ops.tc",
        "int_matmul",
        {"M": 12, "K": 10, "N": 9},
        lambda r, s: (
            ints(r, s["M"], s["K"], lo=-10, hi=10),
            ints(r, s["K"], s["N"], lo=-10, hi=10),
        ),
        lambda A, B: ((A.astype(np.int64) @ B).astype(np.int32),),
        ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 13, "N": 3}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "int64_row_sum",
        "int_ops.tc",
        "int64_row_sum",
        {"M": 8, "N": 20},
        lambda r, s: (ints(r, s["M"], s["N"], lo=-(10**12), hi=10**12, dtype=np.int64),),
        lambda A: (A.sum(axis=1, dtype=np.int64),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "c_divmod",
        "int_ops.tc",
        "c_divmod",
        {"N": 60},
        lambda r, s: (ints(r, s["N"], lo=-100, hi=100), nonzero_ints(r, s["N"], 8)),
        lambda A, B: (c_div(A, B).astype(np.int32), c_rem(A, B).astype(np.int32)),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "int64_affine",
        "int_ops.tc",
        "int64_affine",
        {"N": 50},
        lambda r, s: (ints(r, s["N"], lo=-(10**15), hi=10**15, dtype=np.int64),),
        lambda A: (A * 3 + 1,),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "dgemm",
        "double_ops.tc",
        "dgemm",
        {"M": 12, "K": 10, "N": 9},
        lambda r, s: (np.float64(0.75), f64(r, s["M"], s["K"]), f64(r, s["K"], s["N"])),
        lambda alpha, A, B: (float(alpha) * (A @ B),),
        ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 13, "N": 3}),
        rtol=1e-12,
        atol=1e-12,
    ),
    Case(
        "mixed_add",
        "double_ops.tc",
        "mixed_add",
        {"N": 50},
        lambda r, s: (f32(r, s["N"]), f64(r, s["N"])),
        lambda A, B: (A.astype(np.float64) + B,),
        ({"N": 1}, {"N": 13}),
        rtol=1e-15,
        atol=0.0,
    ),
    Case(
        "double_math",
        "double_ops.tc",
        "double_math",
        {"N": 50},
        lambda r, s: (f64(r, s["N"], lo=0.5, hi=2.0),),
        lambda X: (np.exp(X) + np.log(X) * np.sqrt(X),),
        ({"N": 1}, {"N": 13}),
        rtol=1e-12,
        atol=1e-12,
    ),
    Case(
        "normalize_image",
        "uint8_image.tc",
        "normalize_image",
        {"H": 6, "W": 8, "C": 3},
        lambda r, s: (
            ints(r, s["H"], s["W"], s["C"], lo=0, hi=256, dtype=np.uint8),
            f32(r, s["C"], lo=0.3, hi=0.6),
            f32(r, s["C"], lo=0.2, hi=0.3),
        ),
        lambda img, mean, std: (
            F(((img.astype(np.float64) / 255.0 - mean) / std).transpose(2, 0, 1)),
        ),
        ({"H": 1, "W": 1, "C": 1}, {"H": 7, "W": 13, "C": 4}),
    ),
    Case(
        "brighten",
        "uint8_image.tc",
        "brighten",
        {"N": 60},
        lambda r, s: (ints(r, s["N"], lo=0, hi=256, dtype=np.uint8),),
        lambda P: (P.astype(np.int32) + 10,),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "threshold_u8",
        "uint8_image.tc",
        "threshold_u8",
        {"N": 60},
        lambda r, s: (ints(r, s["N"], lo=0, hi=256, dtype=np.uint8), np.uint8(128)),
        lambda P, t: (P > t,),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "u8_row_sum",
        "uint8_image.tc",
        "u8_row_sum",
        {"M": 6, "N": 40},
        lambda r, s: (ints(r, s["M"], s["N"], lo=0, hi=256, dtype=np.uint8),),
        lambda P: (P.astype(np.int32).sum(axis=1, dtype=np.int32),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    # Builtins ------------------------------------------------------------------------
    Case(
        "activations",
        "builtins.tc",
        "activations",
        {"N": 64},
        lambda r, s: (f32(r, s["N"], lo=-4.0, hi=4.0),),
        lambda X: tuple(
            F(y)
            for y in (
                1.0 / (1.0 + np.exp(-X.astype(np.float64))),
                np.tanh(X.astype(np.float64)),
                np.log1p(np.exp(X.astype(np.float64))),
                np.where(X > 0, X, np.expm1(X.astype(np.float64))),
            )
        ),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "math_funcs",
        "builtins.tc",
        "math_funcs",
        {"N": 64},
        lambda r, s: (pos(r, s["N"]), f32(r, s["N"], lo=-2.0, hi=2.0)),
        lambda P, X: tuple(
            F(y)
            for y in (
                np.sqrt(P.astype(np.float64)) + np.log(P.astype(np.float64)),
                np.power(P.astype(np.float64), 1.5),
                np.abs(X),
                np.fmin(X, 0.5) + np.fmax(X, -0.5),
                _erf(X.astype(np.float64)),
                np.arctan2(X.astype(np.float64), P) + np.hypot(X.astype(np.float64), P),
            )
        ),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "rounding",
        "builtins.tc",
        "rounding",
        {"N": 64},
        lambda r, s: (f32(r, s["N"], lo=-5.0, hi=5.0),),
        lambda X: (np.floor(X), np.ceil(X), np.trunc(X)),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "more_math",
        "builtins.tc",
        "more_math",
        {"N": 64},
        lambda r, s: (pos(r, s["N"]), f32(r, s["N"], lo=-2.0, hi=2.0)),
        lambda P, X: tuple(
            F(y)
            for y in (
                np.exp2(X.astype(np.float64)) + np.log2(P.astype(np.float64)),
                np.cbrt(X.astype(np.float64)) + 1.0 / np.sqrt(P.astype(np.float64)),
                np.sin(X.astype(np.float64)) * np.cos(X.astype(np.float64))
                + (X.astype(np.float64) * P + 1.0),
                np.fmod(P.astype(np.float64), 0.75) + np.copysign(P.astype(np.float64), X),
            )
        ),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "gelu",
        "gelu.tc",
        "gelu",
        {"N": 8, "D": 32},
        lambda r, s: (f32(r, s["N"], s["D"], lo=-3.0, hi=3.0),),
        lambda X: (F(0.5 * X * (1.0 + _erf(X.astype(np.float64) / np.sqrt(2.0)))),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "gelu_tanh",
        "gelu.tc",
        "gelu_tanh",
        {"N": 8, "D": 32},
        lambda r, s: (f32(r, s["N"], s["D"], lo=-3.0, hi=3.0),),
        lambda X: (
            F(
                0.5
                * X
                * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (X + 0.044715 * X.astype(np.float64) ** 3)))
            ),
        ),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "clamp",
        "minmax_keywords.tc",
        "clamp",
        {"N": 50},
        lambda r, s: (f32(r, s["N"], lo=-2.0, hi=2.0), np.float32(-0.75), np.float32(1.25)),
        lambda X, lo, hi: (np.clip(X, lo, hi),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "relu6",
        "minmax_keywords.tc",
        "relu6",
        {"N": 50},
        lambda r, s: (f32(r, s["N"], lo=-3.0, hi=9.0),),
        lambda X: (np.clip(X, 0, 6).astype(np.float32),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "int_clip",
        "minmax_keywords.tc",
        "int_clip",
        {"N": 50},
        lambda r, s: (ints(r, s["N"], lo=-300, hi=300),),
        lambda A: (np.clip(A, -100, 100).astype(np.int32),),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    # 0-d outputs and scalar reductions -------------------------------------------------
    Case(
        "total",
        "reductions_0d.tc",
        "total",
        {"N": 100},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (F(A.astype(np.float64).sum()),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "dot",
        "reductions_0d.tc",
        "dot",
        {"N": 100},
        lambda r, s: (f32(r, s["N"]), f32(r, s["N"])),
        lambda A, B: (F(np.dot(A.astype(np.float64), B)),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "frobenius_norm",
        "reductions_0d.tc",
        "frobenius_norm",
        {"M": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (F(np.linalg.norm(A.astype(np.float64))),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "trace",
        "trace_diag.tc",
        "trace",
        {"N": 12},
        lambda r, s: (f32(r, s["N"], s["N"]),),
        lambda A: (F(np.trace(A.astype(np.float64))),),
        ({"N": 1}, {"N": 7}),
    ),
    Case(
        "diag",
        "trace_diag.tc",
        "diag",
        {"N": 12},
        lambda r, s: (f32(r, s["N"], s["N"]),),
        lambda A: (np.diag(A).copy(),),
        ({"N": 1}, {"N": 7}),
    ),
    Case(
        "diag_embed",
        "trace_diag.tc",
        "diag_embed",
        {"N": 12},
        lambda r, s: (f32(r, s["N"]),),
        lambda v: (np.diag(v),),
        ({"N": 1}, {"N": 7}),
    ),
    Case(
        "mse_loss",
        "mse_loss.tc",
        "mse_loss",
        {"N": 8, "D": 16},
        lambda r, s: (f32(r, s["N"], s["D"]), f32(r, s["N"], s["D"])),
        lambda P, T: (F(((P.astype(np.float64) - T) ** 2).mean()),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "l1_loss",
        "mse_loss.tc",
        "l1_loss",
        {"N": 8, "D": 16},
        lambda r, s: (f32(r, s["N"], s["D"]), f32(r, s["N"], s["D"])),
        lambda P, T: (F(np.abs(P.astype(np.float64) - T).mean()),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    # Reduction operators ---------------------------------------------------------------
    Case(
        "row_min",
        "reductions.tc",
        "row_min",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (A.min(axis=1),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "row_max",
        "reductions.tc",
        "row_max",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"], lo=-3.0, hi=-1.0),),
        lambda A: (A.max(axis=1),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "row_prod",
        "reductions.tc",
        "row_prod",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"], lo=0.8, hi=1.2),),
        lambda A: (F(A.astype(np.float64).prod(axis=1)),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "col_max_int",
        "reductions.tc",
        "col_max_int",
        {"M": 20, "N": 8},
        lambda r, s: (ints(r, s["M"], s["N"], lo=-1000, hi=-10),),
        lambda A: (A.max(axis=0),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "col_min_int64",
        "reductions.tc",
        "col_min_int64",
        {"M": 20, "N": 8},
        lambda r, s: (ints(r, s["M"], s["N"], lo=10**10, hi=10**15, dtype=np.int64),),
        lambda A: (A.min(axis=0),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "int_row_prod",
        "reductions.tc",
        "int_row_prod",
        {"M": 8, "N": 6},
        lambda r, s: (nonzero_ints(r, s["M"] * s["N"], 6).reshape(s["M"], s["N"]),),
        lambda A: (A.astype(np.int64).prod(axis=1).astype(np.int32),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "any_above",
        "reductions.tc",
        "any_above",
        {"M": 16, "N": 8},
        lambda r, s: (f32(r, s["M"], s["N"]), np.float32(0.7)),
        lambda A, thr: ((A > thr).any(axis=1),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "all_above",
        "reductions.tc",
        "all_above",
        {"M": 16, "N": 8},
        lambda r, s: (f32(r, s["M"], s["N"]), np.float32(-0.7)),
        lambda A, thr: ((A > thr).all(axis=1),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "global_max",
        "reductions_0d.tc",
        "global_max",
        {"M": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["N"], lo=-3.0, hi=-1.0),),
        lambda A: (np.asarray(A.max(), dtype=np.float32),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "saturating_add",
        "uint8_image.tc",
        "saturating_add",
        {"N": 60},
        lambda r, s: (
            ints(r, s["N"], lo=0, hi=256, dtype=np.uint8),
            ints(r, s["N"], lo=0, hi=256, dtype=np.uint8),
        ),
        lambda P, Q: (np.minimum(P.astype(np.int32) + Q, 255).astype(np.uint8),),
        ({"N": 1}, {"N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "reverse",
        "flip_concat.tc",
        "reverse",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (A[::-1].copy(),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "concat",
        "flip_concat.tc",
        "concat",
        {"N": 20, "M": 13},
        lambda r, s: (f32(r, s["N"]), f32(r, s["M"])),
        lambda A, B: (np.concatenate([A, B]),),
        ({"N": 1, "M": 1}, {"N": 7, "M": 2}),
    ),
    Case(
        "conv3x3_same",
        "conv2d.tc",
        "conv3x3_same",
        {"N": 2, "C": 3, "H": 7, "W": 8, "F": 4},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]), f32(r, s["F"], s["C"], 3, 3)),
        lambda I, W1: (F(conv2d_ref(np.pad(I, ((0, 0), (0, 0), (1, 1), (1, 1))), W1)),),
        ({"N": 1, "C": 1, "H": 1, "W": 1, "F": 1}, {"N": 1, "C": 2, "H": 13, "W": 5, "F": 3}),
    ),
    Case(
        "conv2d_dilated2",
        "conv2d_strided.tc",
        "conv2d_dilated2",
        {"N": 2, "C": 3, "H": 9, "W": 10, "F": 2, "KH": 3, "KW": 2},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
        ),
        lambda I, W1: (F(conv2d_ref(I, dilate2(W1))),),
        (
            {"N": 1, "C": 1, "H": 1, "W": 1, "F": 1, "KH": 1, "KW": 1},
            {"N": 1, "C": 2, "H": 7, "W": 5, "F": 3, "KH": 4, "KW": 3},
        ),
    ),
    Case(
        "masked_fill",
        "ternary.tc",
        "masked_fill",
        {"N": 8, "D": 20},
        lambda r, s: (
            f32(r, s["N"], s["D"]),
            np.ascontiguousarray(r.uniform(size=(s["N"], s["D"])) < 0.5),
            np.float32(-3.5),
        ),
        lambda A, mask, fill: (np.where(mask, A, fill).astype(np.float32),),
        ({"N": 1, "D": 1}, {"N": 7, "D": 13}),
    ),
    Case(
        "select_submatrix",
        "embedding.tc",
        "select_submatrix",
        {"M": 8, "N": 10, "P": 5, "Q": 7},
        lambda r, s: (
            f32(r, s["M"], s["N"]),
            ints(r, s["P"], lo=0, hi=s["M"]),
            ints(r, s["Q"], lo=0, hi=s["N"]),
        ),
        lambda A, rows, cols: (np.ascontiguousarray(A[np.ix_(rows, cols)]),),
        ({"M": 1, "N": 1, "P": 1, "Q": 1}, {"M": 7, "N": 3, "P": 13, "Q": 2}),
    ),
    Case(
        "embedding_backward",
        "scatter.tc",
        "embedding_backward",
        {"B": 40, "D": 16, "V": 12},
        lambda r, s: (
            f32(r, s["B"], s["D"]),
            ints(r, s["B"], lo=0, hi=s["V"]),
            f32(r, s["V"], s["D"]),
        ),
        lambda dO, idx, E: (F(_scattered((len(E), dO.shape[1]), (idx,), dO)),),
        ({"B": 1, "D": 1, "V": 1}, {"B": 33, "D": 7, "V": 3}),
    ),
    Case(
        "histogram",
        "scatter.tc",
        "histogram",
        {"N": 100},
        lambda r, s: (ints(r, s["N"], lo=0, hi=16), f32(r, s["N"])),
        lambda bins, weight: (
            F(np.bincount(bins, weights=weight.astype(np.float64), minlength=16)),
        ),
        ({"N": 1}, {"N": 37}),
    ),
    Case(
        "conv_transpose1d",
        "scatter.tc",
        "conv_transpose1d",
        {"C": 4, "H": 10, "F": 5},
        lambda r, s: (f32(r, s["C"], s["H"]), f32(r, s["C"], s["F"], 3)),
        lambda X, W: (F(_conv_transpose1d(X, W)),),
        ({"C": 1, "H": 1, "F": 1}, {"C": 3, "H": 13, "F": 2}),
    ),
    Case(
        "add_diagonal",
        "scatter.tc",
        "add_diagonal",
        {"N": 9},
        lambda r, s: (f32(r, s["N"], s["N"]), f32(r, s["N"])),
        lambda A, v: (F(A.astype(np.float64) + np.diag(v.astype(np.float64))),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "index_add_2d",
        "scatter.tc",
        "index_add_2d",
        {"M": 6, "N": 8, "P": 9, "Q": 11},
        lambda r, s: (
            f32(r, s["M"], s["N"]),
            ints(r, s["P"], lo=0, hi=s["M"]),
            ints(r, s["Q"], lo=0, hi=s["N"]),
            f32(r, s["P"], s["Q"]),
        ),
        lambda A, rows, cols, S: (F(A + _scattered(A.shape, np.ix_(rows, cols), S)),),
        ({"M": 1, "N": 1, "P": 1, "Q": 1}, {"M": 3, "N": 2, "P": 13, "Q": 7}),
    ),
    Case(
        "take_at_argmax",
        "argmax.tc",
        "take_at_argmax",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["M"], s["N"])),
        lambda A, B: (B[np.arange(A.shape[0]), A.argmax(axis=1)],),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "frac_positive",
        "casts.tc",
        "frac_positive",
        {"N": 100},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (F((A > 0).mean()),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "int8_gemm",
        "int_ops.tc",
        "int8_gemm",
        {"M": 12, "K": 16, "N": 9},
        lambda r, s: (
            ints(r, s["M"], s["K"], lo=-128, hi=128, dtype=np.int8),
            ints(r, s["K"], s["N"], lo=-128, hi=128, dtype=np.int8),
        ),
        lambda A, B: ((A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32),),
        ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 13, "N": 3}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "row_sum_acc",
        "nonbang.tc",
        "row_sum_acc",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (F(A.astype(np.float64).sum(axis=1)),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "relu_row_max",
        "nonbang.tc",
        "relu_row_max",
        {"M": 16, "N": 6},
        lambda r, s: (f32(r, s["M"], s["N"], lo=-1.0, hi=0.3),),
        lambda A: (np.maximum(A.max(axis=1), np.float32(0.0)),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
    ),
    Case(
        "two_matmul",
        "nonbang.tc",
        "two_matmul",
        {"M": 8, "K": 10, "N": 9, "L": 6},
        lambda r, s: (
            f32(r, s["M"], s["K"]),
            f32(r, s["K"], s["N"]),
            f32(r, s["M"], s["L"]),
            f32(r, s["L"], s["N"]),
        ),
        lambda A, B, C, D_: (F(A.astype(np.float64) @ B + C.astype(np.float64) @ D_),),
        ({"M": 1, "K": 1, "N": 1, "L": 1}, {"M": 7, "K": 2, "N": 13, "L": 3}),
    ),
    Case(
        "row_prod_seeded",
        "nonbang.tc",
        "row_prod_seeded",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"], lo=0.8, hi=1.2),),
        lambda A: (F(A.astype(np.float64).prod(axis=1)),),
        ({"M": 1, "N": 2}, {"M": 7, "N": 13}),
    ),
    Case(
        "min_with_seed",
        "nonbang.tc",
        "min_with_seed",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["M"], lo=-1.2, hi=0.0)),
        lambda A, S: (np.minimum(S, A.min(axis=1)),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
    ),
    # Size symbols and indices as values ----------------------------------------------
    Case(
        "scale_by_n",
        "size_values.tc",
        "scale_by_n",
        {"N": 50},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (F(A.astype(np.float64) / len(A)),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "row_mean",
        "size_values.tc",
        "row_mean",
        {"M": 8, "N": 20},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (F(A.astype(np.float64).mean(axis=1)),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "int_row_mean",
        "size_values.tc",
        "int_row_mean",
        {"M": 8, "N": 20},
        lambda r, s: (ints(r, s["M"], s["N"], lo=-50, hi=50),),
        lambda A: (c_div(A.astype(np.int64).sum(axis=1), A.shape[1]).astype(np.int32),),
        ({"M": 1, "N": 1}, {"M": 13, "N": 7}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "position_ramp",
        "size_values.tc",
        "position_ramp",
        {"B": 4, "T": 20},
        lambda r, s: (f32(r, s["B"], s["T"]),),
        lambda X: (F(X + np.arange(X.shape[1], dtype=np.float64)[None, :] / X.shape[1]),),
        ({"B": 1, "T": 1}, {"B": 3, "T": 13}),
    ),
    # Declared output types and fixed sizes -------------------------------------------
    Case(
        "matmul_declared",
        "declared_outputs.tc",
        "matmul_declared",
        {"M": 16, "K": 24, "N": 20},
        lambda r, s: (f32(r, s["M"], s["K"]), f32(r, s["K"], s["N"])),
        lambda A, B: (F(A.astype(np.float64) @ B),),
        ({"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 13, "N": 3}),
    ),
    Case(
        "row_sum_double",
        "declared_outputs.tc",
        "row_sum_double",
        {"M": 8, "N": 30},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (A.astype(np.float64).sum(axis=1),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=1e-12,
        atol=1e-12,
    ),
    Case(
        "count_positive",
        "declared_outputs.tc",
        "count_positive",
        {"M": 8, "N": 30},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: ((A > 0).sum(axis=1).astype(np.int32),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
        rtol=0.0,
        atol=0.0,
    ),
    Case(
        "box_area",
        "fixed_sizes.tc",
        "box_area",
        {"N": 20},
        box_inputs,
        lambda b: (
            F((b[:, 2].astype(np.float64) - b[:, 0]) * (b[:, 3].astype(np.float64) - b[:, 1])),
        ),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "rgb_to_gray",
        "fixed_sizes.tc",
        "rgb_to_gray",
        {"H": 6, "W": 8},
        lambda r, s: (f32(r, s["H"], s["W"], 3, lo=0.0, hi=1.0),),
        lambda img: (F(img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])),),
        ({"H": 1, "W": 1}, {"H": 7, "W": 13}),
    ),
    Case(
        "transform3",
        "fixed_sizes.tc",
        "transform3",
        {"N": 20},
        lambda r, s: (f32(r, 3, 3), f32(r, s["N"], 3)),
        lambda R, P: (F(P.astype(np.float64) @ R.T),),
        ({"N": 1}, {"N": 13}),
    ),
    # Layout: transposes, outer products, modulo and strided subscripts ---------------
    Case(
        "transpose",
        "transpose.tc",
        "transpose",
        {"M": 8, "N": 12},
        lambda r, s: (f32(r, s["M"], s["N"]),),
        lambda A: (np.ascontiguousarray(A.T),),
        ({"M": 1, "N": 13}, {"M": 7, "N": 1}),
    ),
    Case(
        "nchw_to_nhwc",
        "transpose.tc",
        "nchw_to_nhwc",
        {"N": 2, "C": 3, "H": 5, "W": 6},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]),),
        lambda I: (np.ascontiguousarray(I.transpose(0, 2, 3, 1)),),
        ({"N": 1, "C": 1, "H": 1, "W": 1}, {"N": 1, "C": 7, "H": 3, "W": 13}),
    ),
    Case(
        "outer",
        "outer.tc",
        "outer",
        {"M": 12, "N": 20},
        lambda r, s: (f32(r, s["M"]), f32(r, s["N"])),
        lambda A, B: (np.outer(A, B).astype(np.float32),),
        ({"M": 1, "N": 1}, {"M": 7, "N": 13}),
    ),
    Case(
        "kron4",
        "outer.tc",
        "kron4",
        {"M": 3, "N": 4, "P": 5, "Q": 2},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["P"], s["Q"])),
        lambda A, B: (np.einsum("ij,kl->ikjl", A, B).astype(np.float32),),
        ({"M": 1, "N": 7, "P": 1, "Q": 3},),
    ),
    Case(
        "roll1",
        "roll.tc",
        "roll1",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda A: (np.roll(A, -1),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "circular_conv",
        "roll.tc",
        "circular_conv",
        {"N": 40, "K": 5},
        lambda r, s: (f32(r, s["N"]), f32(r, s["K"])),
        lambda A, Kr: (
            F(sum(np.roll(A.astype(np.float64), -k) * float(Kr[k]) for k in range(len(Kr)))),
        ),
        ({"N": 1, "K": 3}, {"N": 7, "K": 13}),
    ),
    Case(
        "subsample3",
        "stride3.tc",
        "subsample3",
        {"N": 40},
        lambda r, s: (f32(r, s["N"]),),
        lambda I: (I[::3].copy(),),
        ({"N": 1}, {"N": 13}),
    ),
    Case(
        "subsample2d",
        "stride3.tc",
        "subsample2d",
        {"H": 12, "W": 10},
        lambda r, s: (f32(r, s["H"], s["W"]),),
        lambda I: (np.ascontiguousarray(I[::2, ::3]),),
        ({"H": 1, "W": 1}, {"H": 7, "W": 13}),
    ),
)
