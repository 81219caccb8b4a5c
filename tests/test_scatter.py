"""The scatter-add extension: a `+=` at computed subscripts (docs/language.md, section 4).

The corpus (`tests/corpus/scatter.tc`) runs scatter-adds on every target under drawn
options; this file holds what the corpus does not: the front end's rules, indices out
of range at call time on each target, repeated places, determinism across thread
counts, and the gradients that use it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tcpy
from tcpy.parser import check_source
from tcpy.poly.dependences import compute_dependences
from tcpy.poly.schedule import bands, original_order
from tcpy.poly.scop import build_scop

TARGETS = ("reference", "cpu", "cuda-emu")

HISTOGRAM = """def h(int32(N) bins, float(N) w) -> (float(4) H) {
    H(bins(n)) += w(n)
}"""


def _engine(target: str, source: str) -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target)
    engine.define(source)
    return engine


@pytest.mark.parametrize(
    ("source", "fragment", "at"),
    [
        (
            "def f(float(N) A, int32(N) I) -> (B) {\n B(i) = A(i)\n B(I(i)) = A(i)\n}",
            "makes a scatter-add, which adds with +=, not =: B(I(i)) += A(i)",
            (3, 2),
        ),
        (
            "def f(float(N) A, int32(N) I) -> (B) {\n B(i) = A(i)\n B(I(i)) +=! A(i)\n}",
            "which adds with +=, not +=!",
            (3, 2),
        ),
        (
            "def f(float(N) A, int32(N) I) -> (B) {\n B(I(i)) += A(i)\n}",
            "a scatter-add into B needs its shape before",
            (2, 2),
        ),
        (
            "def f(float(N) A) -> (B) {\n B(i, j) = 0.0 where i in 0:N, j in 0:N\n"
            " B(i, i) = A(i)\n}",
            "a scatter-add, +=, may repeat one",
            (3, 7),
        ),
        (
            "def f(float(N) A) -> (B) {\n B(i) = A(i)\n B(A(i)) += 1.0\n}",
            "a subscript of B must be an integer, not float32",
            (3, 4),
        ),
        (
            "def f(float(N) A, int32(N) I) -> (B) {\n B(i) = A(i)\n B(I(i)) += B(i)\n}",
            "this reduction reads B, the tensor it reduces into",
            (3, 13),
        ),
        (
            "def f(float(4) A) -> (B) {\n B(i) = A(i)\n B(2 * i + k) += A(i) where k in 0:2\n}",
            "this subscript of B reaches index 7, outside 0:4",
            (3, 4),
        ),
    ],
    ids=["assign", "bang", "no-shape", "repeated-assign", "float-place", "self-read", "beyond"],
)
def test_the_front_end_explains_a_scatter_add_it_refuses(
    source: str, fragment: str, at: tuple[int, int]
) -> None:
    with pytest.raises(tcpy.TCError) as info:
        check_source(source)
    assert fragment in info.value.message, str(info.value)
    assert (info.value.line, info.value.column) == at, str(info.value)


def test_the_written_element_gives_a_range_only_to_an_index_nothing_else_bounds() -> None:
    """`d` has no other read: the element written bounds it. `b` is bounded by `w`,
    and the affine `b + 1` on the left does not narrow it: it is checked instead."""
    cdef = check_source(
        """def f(float(B) w, int32(B) idx) -> (float(8, 3) O, float(4) P) {
            O(idx(b), d) += w(b)
            P(b + 1) += w(b)
        }"""
    )["f"]
    first, second = cdef.statements
    assert [str(r) for r in first.ranges] == ["b in 0:B", "d in 0:3"]
    assert [str(r) for r in second.ranges] == ["b in 0:B"]
    assert [(c.tensor, str(c.lo), str(c.hi)) for c in second.checks] == [("P", "1", "B")]


@pytest.mark.parametrize("target", TARGETS)
def test_repeated_places_add_up_on_every_target(target: str) -> None:
    bins = np.array([3, 0, 3, 3, 1, 0, 3], np.int32)
    w = np.arange(1, 8, dtype=np.float32)
    out = _engine(target, HISTOGRAM).h(bins, w)
    np.testing.assert_array_equal(out, [2 + 6, 5, 0, 1 + 3 + 4 + 7])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("place", [4, -1])
def test_a_place_out_of_range_is_an_input_error_on_every_target(target: str, place: int) -> None:
    engine = _engine(target, HISTOGRAM)
    bins = np.array([0, place, 1], np.int32)
    with pytest.raises(tcpy.TCInputError) as info:
        engine.h(bins, np.ones(3, np.float32))
    message = str(info.value)
    assert f"H is written at index {place} of its dimension 0, outside 0:4, at n=1" in message
    assert (info.value.line, info.value.column) == (2, 7)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_an_affine_place_not_proved_is_checked_at_each_call(target: str) -> None:
    source = """def f(float(B) w, float(M) z) -> (P) {
        P(m) = z(m)
        P(b + 2) += w(b)
    }"""
    engine = _engine(target, source)
    out = engine.f(np.ones(3, np.float32), np.zeros(5, np.float32))
    np.testing.assert_array_equal(out, [0, 0, 1, 1, 1])
    with pytest.raises(tcpy.TCRangeError) as info:
        engine.f(np.ones(4, np.float32), np.zeros(5, np.float32))
    assert "subscript of P reaches index 5, outside 0:5 of its dimension 0" in str(info.value)
    assert (info.value.line, info.value.column) == (3, 11)


def test_a_scatter_add_gives_the_same_bits_whatever_the_thread_count() -> None:
    rng = np.random.default_rng(3)
    source = """def g(float(B, D) dO, int32(B) idx) -> (float(6, D) dE) {
        dE(idx(b), d) += dO(b, d)
    }"""
    engine = _engine("cpu", source)
    dO = rng.standard_normal((500, 64)).astype(np.float32)
    idx = rng.integers(0, 6, 500).astype(np.int32)
    runs = [engine.g(dO, idx, options={"threads": t}) for t in (1, 2, 3, 1, 2)]
    for out in runs[1:]:
        np.testing.assert_array_equal(out, runs[0])
    expected = np.zeros((6, 64))
    np.add.at(expected, idx, dO.astype(np.float64))
    np.testing.assert_allclose(runs[0], expected, rtol=1e-5, atol=1e-5)


def test_the_gradient_of_a_gather_is_a_scatter_add_and_costs_the_forwards_work() -> None:
    source = "def emb(double(V, D) E, int32(B) idx) -> (O) { O(b, d) = E(idx(b), d) }"
    text = tcpy.gradient(source, "emb")
    assert "d_E(idx(b), d) += d_O(b, d) where b in 0:B, d in 0:D" in text
    engine = _engine("cpu", text)
    E, idx = np.zeros((1000, 4)), np.array([7, 7, 999], np.int32)
    dE = engine.emb_grad(E, idx, np.ones((3, 4)))
    kernel = engine.compile("emb_grad", E, idx, np.ones((3, 4)))
    counted = kernel.iterations(E, idx, np.ones((3, 4)))
    assert counted.instances == 1000 * 4 + 3 * 4  # the zero fill, then one add per read
    np.testing.assert_array_equal(dE[[7, 999]], [[2] * 4, [1] * 4])
    assert dE.sum() == 12


def test_a_gather_read_under_a_condition_keeps_the_gather_form() -> None:
    """Its index is read only where the condition holds (a padding index of -1
    elsewhere), so the backward does not scatter through it."""
    source = """def emb(double(V, D) E, int32(B) idx) -> (O) {
        O(b, d) = idx(b) >= 0 ? E(idx(b), d) : 0
    }"""
    text = tcpy.gradient(source, "emb")
    assert "d_E(idx(b)" not in text
    engine = _engine("cpu", text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        dE = engine.emb_grad(np.zeros((3, 2)), np.array([-1, 2, 2], np.int32), np.ones((3, 2)))
    np.testing.assert_array_equal(dE, [[0, 0], [0, 0], [2, 2]])


def test_two_scatter_adds_that_differ_only_in_their_places_are_two_kernels() -> None:
    """The cache key is the def's canonical form, which names the places."""
    engine = tcpy.ExecutionEngine("cpu")
    for place in ("0 + i", "N - 1 - i"):
        engine.define(
            f"def f(float(N) A) -> (float(N) B) {{\n B({place}) += A(i) * A(i)\n B(i) += A(i)\n}}"
        )
        out = engine.f(np.array([1, 2, 3], np.float32))
        squares = np.array([1, 4, 9]) if place == "0 + i" else np.array([9, 4, 1])
        np.testing.assert_array_equal(out, squares + np.array([1, 2, 3]))


def test_a_loop_that_only_an_outer_loop_keeps_in_order_is_not_parallel() -> None:
    """`Y(f, 2*h + k)`: two instances with other `h` and `k` add into one element, so
    neither `h` nor `k` is parallel, even where `h` runs outside `k` (the source-order
    schedule, which tiling and reordering may change); `f` is."""
    source = """def t(float(C, H) X, float(C, F, 3) W) -> (Y) {
        Y(f, y) = 0.0 where f in 0:F, y in 0:2*H+1
        Y(f, 2*h + k) += X(c, h) * W(c, f, k)
    }"""
    scop = build_scop(check_source(source)["t"], {"C": 4, "H": 10, "F": 5})
    schedule = original_order(scop, compute_dependences(scop))
    (band,) = [b for b in bands(schedule) if b.band_n_member() == 4]
    flags = [band.band_member_get_coincident(k) for k in range(4)]
    assert dict(zip(scop.statement("S1").dims, flags, strict=True)) == {
        "c": False, "h": False, "f": True, "k": False,
    }  # fmt: skip
    engine = _engine("cpu", source)
    X = np.random.default_rng(0).random((4, 10), dtype=np.float32)
    W = np.random.default_rng(1).random((4, 5, 3), dtype=np.float32)
    kernel = engine.compile("t", X, W)
    assert "collapse" not in kernel.source.split("Y(f, 2*h + k)")[1]
    want = _engine("reference", source).t(X, W)
    for threads in (1, 2, 4):
        np.testing.assert_allclose(engine.t(X, W, options={"threads": threads}), want, rtol=1e-6)
