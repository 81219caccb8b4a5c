"""TC programs that several test files run, spelled once. A test that checks something
about a program's exact text (a golden, an error's line or column) keeps its own copy.

`renamed` gives a program under another def name, for the tests that call their entry
by a fixed name (`engine.f(...)`) or whose goldens carry the name."""

from __future__ import annotations

import re

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"

BATCH_MATMUL = "def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,m,k) * Y(b,k,n) }"

CONV = (
    "def conv(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {"
    " O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * K(f,c,kh,kw) }"
)
"""A convolution without padding or stride: O shrinks by the filter."""

GATHER = "def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }"
"""An embedding lookup: rows of T gathered by the indices in I."""

SOFTMAX = """def softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, d)
    expDist(n, d) = exp(I(n, d) - maxVal(n))
    expSum(n) +=! expDist(n, d)
    O(n, d) = expDist(n, d) / expSum(n)
}"""
"""Softmax over rows, with `expDist` a temporary of the row's size (the corpus's
softmax.tc has no such temporary)."""

LAYERNORM = """def layernorm(float(N, D) X, float(D) g, float(D) b) -> (O) {
    mean(n) +=! X(n, d) / D
    var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    O(n, d) = (X(n, d) - mean(n)) / sqrt(var(n) + 1e-5) * g(d) + b(d)
}"""

LAYERNORM64 = """def ln(double(N, D) X, double(D) g) -> (Y) {
    mean(n) +=! X(n, d) / D
    var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    Y(n, d) = g(d) * (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5)
}"""
"""A layer norm in float64 (for gradients), its mean and variance the reductions a
backward saves."""

FC_RELU64 = """def fc_relu(double(B, M) I, double(N, M) W, double(N) b) -> (O) {
    O(i, j) +=! I(i, k) * W(j, k)
    O(i, j) = O(i, j) + b(j)
    O(i, j) = fmax(O(i, j), 0)
}"""
"""TC's idiom of writing one tensor three times (versions `O_1`, `O_2`, `O`), in float64."""


def renamed(program: str, name: str) -> str:
    """`program` with its (first) def called `name`."""
    text, count = re.subn(r"^def \w+\(", f"def {name}(", program, count=1)
    assert count == 1, f"no def at the start of {program!r}"
    return text
