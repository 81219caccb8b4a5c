"""Output and temporary buffers: which the kernel writes whole (no zero-fill needed),
and that the others still start at zero."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy import targets
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
    assert np.isnan(targets._poisoned((2, 3), np.dtype(np.float32))).all()
    assert (targets._poisoned((4,), np.dtype(np.int32)) == -1).all()
    assert targets._poisoned((0, 3), np.dtype(np.float64)).shape == (0, 3)
