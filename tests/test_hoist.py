"""Factors of a contraction computed once (`tcpy.poly.hoist`): `alpha * A(i,k)` of
`D(i,j) += alpha * A(i,k) * B(k,j)` into a temporary over `(i,k)` on the CPU, with the
same bits as the two statements written by hand."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.poly.hoist import hoist_invariant_factors

GEMM = """def f(float(M,K) A, float(K,N) B, float(M,N) C, float alpha, float beta) -> (D) {
    D(m,n) = beta * C(m,n)
    D(m,n) += alpha * A(m,k) * B(k,n)
}"""
BY_HAND = """def f(float(M,K) A, float(K,N) B, float(M,N) C, float alpha, float beta) -> (D) {
    D(m,n) = beta * C(m,n)
    P(m,k) = alpha * A(m,k)
    D(m,n) += P(m,k) * B(k,n)
}"""


def _hoisted(source: str) -> list[str]:
    """The texts of the statements hoisting adds to `source`'s def."""
    (cdef,) = check_source(source).values()
    before = {st.text for st in cdef.statements}
    return [st.text for st in hoist_invariant_factors(cdef).statements if st.text not in before]


@pytest.mark.parametrize("generic", [False, True])
def test_a_scaled_matmul_gives_the_bits_of_the_factor_written_by_hand(generic: bool) -> None:
    """At sizes no tile divides, size-generic too (at a second shape as well): the
    same bits as the def with the factor's statement written out, and the reference's
    result to float32's accuracy."""
    assert _hoisted(GEMM) == ["D_factor(m, k) = (alpha * A(m, k))"]
    options = MappingOptions.cpu().replace(fix_parameters_before_scheduling=not generic)
    engines = {}
    for name, source in (("hoisted", GEMM), ("by hand", BY_HAND), ("reference", GEMM)):
        engines[name] = tcpy.ExecutionEngine("reference" if name == "reference" else "cpu")
        engines[name].define(source)
    rng = np.random.default_rng(0)
    for m, k, n in ((37, 50, 45), (20, 9, 70)):
        a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
        inputs = (a, b, c, np.float32(1.5), np.float32(-0.7))
        got = engines["hoisted"].f(*inputs, options=options)
        assert "D_factor" in engines["hoisted"].compile("f", *inputs, options=options).source
        np.testing.assert_array_equal(got, engines["by hand"].f(*inputs, options=options))
        np.testing.assert_allclose(got, engines["reference"].f(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("source", "hoisted"),
    [
        # the right factor, reused along m
        (
            "def f(float(M,K) A, float(K,N) B, float beta) -> (D) "
            "{ D(m,n) +=! A(m,k) * (beta * B(k,n) * B(k,n)) }",
            ["D_factor(k, n) = ((beta * B(k, n)) * B(k, n))"],
        ),
        # (A * B) * alpha: the left factor moves along every output index
        ("def f(float(M,K) A, float(K,N) B, float alpha) -> (D) "
         "{ D(m,n) +=! A(m,k) * B(k,n) * alpha }", []),
        # a matrix-vector product: alpha * A(i,j) moves along i, its only output index
        ("def f(float(M,N) A, float(N) x, float alpha) -> (y) "
         "{ y(i) +=! alpha * A(i,j) * x(j) }", []),
        # four columns: reused too little to pay for a pass over A
        ("def f(float(M,K) A, float(K,4) B, float alpha) -> (D) "
         "{ D(m,n) +=! alpha * A(m,k) * B(k,n) }", []),
        # not a sum
        ("def f(float(M,K) A, float(K,N) B, float alpha) -> (D) "
         "{ D(m,n) max=! alpha * A(m,k) * B(k,n) }", []),
        # a half factor is rounded only when the sum is done
        ("def f(float16(M,K) A, float16(K,N) B, float16 alpha) -> (D) "
         "{ D(m,n) +=! alpha * A(m,k) * B(k,n) }", []),
    ],
)  # fmt: skip
def test_which_factors_are_hoisted(source: str, hoisted: list[str]) -> None:
    assert _hoisted(source) == hoisted
