"""Output and temporary buffers: which the kernel writes whole (no zero-fill needed),
and that the others still start at zero."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

import tcpy
from tcpy import host_kernels
from tcpy.parser import check_source
from tcpy.poly.coverage import written_before_read
from tcpy.poly.scop import build_scop


def _written(source: str, sizes: dict[str, int] | None = None) -> set[str]:
    (cdef,) = check_source(source).values()
    return set(written_before_read(build_scop(cdef, sizes)))


@pytest.mark.parametrize(
    ("source", "want"),
    [
        ("def f(float(M,N) A) -> (O) { O(i,j) = A(i,j) + 1.0 }", {"O"}),
        ("def f(float(M,N) A) -> (O) { O(i) +=! A(i,j) }", {"O"}),
        ("def f(float(M,N) A) -> (O) { O(i) max=! A(i,j) }", {"O"}),
        # a reduction without `!` adds to the zero the buffer starts at
        ("def f(float(M,N) A) -> (O) { O(i) += A(i,j) }", set()),
        # a temporary written whole, then read
        ("def f(float(N) A) -> (O) { T(i) = A(i) * 2.0\n O(i) = T(i) + 1.0 }", {"O", "T"}),
        # O is first written by a reduction without `!`, then overwritten
        ("def f(float(N) A) -> (O) { O(i) += A(i)\n O(i) = A(i) }", set()),
    ],
)
def test_tensors_written_whole_before_any_read(source: str, want: set[str]) -> None:
    assert _written(source) == want
    assert _written(source, {s: 5 for s in ("M", "N")} if "M" in source else {"N": 5}) == want


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_a_buffer_that_is_not_written_whole_starts_at_zero(target: str) -> None:
    """Under `TCPY_POISON=1` (set for the tests) the buffers left unfilled are all-ones
    bytes; a `+=` without `!` must still start from zero."""
    engine = tcpy.ExecutionEngine(target)
    with pytest.warns(tcpy.TCWarning, match="starts from zero"):
        engine.define("def f(float(M,N) A) -> (O, P) { O(i) += A(i,j)\n P(i) +=! A(i,j) }")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    o, p = engine.f(a)
    np.testing.assert_array_equal(o, a.sum(axis=1))
    np.testing.assert_array_equal(p, a.sum(axis=1))
    assert engine.compile("f", a)._kernel.written == frozenset({"P"})


def test_poisoned_buffers_are_nan_or_minus_one() -> None:
    assert np.isnan(host_kernels._poisoned((2, 3), np.dtype(np.float32))).all()
    assert (host_kernels._poisoned((4,), np.dtype(np.int32)) == -1).all()
    assert host_kernels._poisoned((0, 3), np.dtype(np.float64)).shape == (0, 3)


SOFTMAX = """
def softmax(float(N,D) I) -> (O, expSum, maxVal) {
    maxVal(n) max=! I(n,d)
    expDist(n,d) = exp(I(n,d) - maxVal(n))
    expSum(n) +=! expDist(n,d)
    O(n,d) = expDist(n,d) / expSum(n)
}
"""


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_temporaries_are_kept_across_calls_and_outputs_are_new(target: str) -> None:
    engine = tcpy.ExecutionEngine(target)
    engine.define(SOFTMAX)
    rng = np.random.default_rng(0)
    first, second = (rng.standard_normal((5, 7)).astype(np.float32) for _ in range(2))
    compiled = engine.compile("softmax", first)
    o1, _, _ = compiled(first)
    (kept,) = compiled._kernel._scratch.buffers  # expDist
    o2, _, _ = compiled(second)
    assert compiled._kernel._scratch.buffers[0] is kept and o2 is not o1
    np.testing.assert_allclose(o1, _softmax(first), rtol=1e-5)
    np.testing.assert_allclose(o2, _softmax(second), rtol=1e-5)


def test_calls_in_several_threads_each_have_their_temporaries() -> None:
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOFTMAX)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((64, 33)).astype(np.float32) for _ in range(8)]
    compiled = engine.compile("softmax", inputs[0])

    def many(x: np.ndarray) -> list[np.ndarray]:
        return [compiled(x)[0] for _ in range(20)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(many, inputs))
    for x, outs in zip(inputs, results, strict=True):
        for o in outs:
            np.testing.assert_allclose(o, _softmax(x), rtol=1e-5)
