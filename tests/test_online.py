"""Softmax-like chains computed online over tiles of their row (`tcpy.poly.online`,
the `online_tile` option): which chains the rule takes, the same results as the
`reference` target on programs that are attention and ones that are not (masked
rows and tiles, NaN, sizes no tile divides, kernels for every size and for one), the
statements a tile runs kept in a thread's buffers, and the dependences of the
statements run together."""

from __future__ import annotations

import math

import islpy as isl
import numpy as np
import pytest

import tcpy
from tcpy.codegen.c import compares_floats
from tcpy.mapping import marks
from tcpy.mapping.cpu import cpu_defaults
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c
from tcpy.poly.dependences import compute_dependences, conservative_dependences, violations
from tcpy.poly.online import chains, online_reductions
from tcpy.poly.schedule import original_order
from tcpy.poly.scop import build_scop, instances

from differential import run_against_reference

LSE = """
def lse(float(R,N) X) -> (out) {
    m(r) max=! X(r,j)
    l(r) +=! exp(X(r,j) - m(r))
    out(r) = m(r) + log(l(r))
}"""
CROSS_ENTROPY = """
def cross_entropy(float(B, K) X, int32(B) label) -> (loss) {
    mx(b) max=! X(b, k)
    s(b) +=! exp(X(b, k) - mx(b))
    loss() +=! (log(s(b)) + mx(b) - X(b, label(b))) / B
}"""
SOFTMAX = """
def softmax(float(N, D) I) -> (O) {
    maxVal(n) max=! I(n, d)
    e(n, d) = exp(I(n, d) - maxVal(n))
    expSum(n) +=! e(n, d)
    O(n, d) = e(n, d) / expSum(n)
}"""
# a softmax-weighted mean of each row's values, and its normaliser: not attention
WEIGHTED = """
def weighted(float(R,N) X, float(R,N) V) -> (mean, z) {
    m(r) max=! 2.0 * X(r,j)
    w(r) +=! V(r,j) * exp(2.0 * X(r,j) - m(r))
    z(r) +=! exp(2.0 * X(r,j) - m(r))
    mean(r) = w(r) / z(r)
}"""
ATTENTION = """
def attention(float(T,B,H,S,E) QKV, float(B,S) M) -> (A) {
    Sc(b,h,i,j) +=! QKV(0,b,h,i,e) * QKV(1,b,h,j,e)
    Sc(b,h,i,j) = Sc(b,h,i,j) * 0.25 + M(b,j)
    mx(b,h,i) max=! Sc(b,h,i,j)
    P(b,h,i,j) = exp(Sc(b,h,i,j) - mx(b,h,i))
    sm(b,h,i) +=! P(b,h,i,j)
    A(b,h,i,e) +=! P(b,h,i,j) * QKV(2,b,h,j,e)
    A(b,h,i,e) = A(b,h,i,e) / sm(b,h,i)
}"""
# the same attention written otherwise: the sums in the other order, other names,
# the heads after the sequence in the input and the output
ATTENTION_VARIANT = """
def attention(float(T,B,S,H,E) qkv, float(B,S) mask) -> (out) {
    scores(b,i,h,j) +=! qkv(0,b,i,h,e) * qkv(1,b,j,h,e)
    scores(b,i,h,j) = scores(b,i,h,j) * 0.25 + mask(b,j)
    top(b,i,h) max=! scores(b,i,h,j)
    p(b,i,h,j) = exp(scores(b,i,h,j) - top(b,i,h))
    out(b,i,h,e) +=! p(b,i,h,j) * qkv(2,b,j,h,e)
    total(b,i,h) +=! p(b,i,h,j)
    out(b,i,h,e) = out(b,i,h,e) / total(b,i,h)
}"""


def _def(source: str) -> tcpy.parser.checked.CheckedDef:
    (cdef,) = check_source(source).values()
    return cdef


def _chain_shape(source: str) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    return [(c.maximum, c.members, c.producers) for c in chains(_def(source))]


# --- the rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (LSE, [(0, (1,), ())]),
        (CROSS_ENTROPY, [(0, (1,), ())]),
        (SOFTMAX, [(0, (1, 2), ())]),
        (WEIGHTED, [(0, (1, 2), ())]),
        (ATTENTION, [(2, (3, 4, 5), (0, 1))]),
        (ATTENTION_VARIANT, [(2, (3, 4, 5), (0, 1))]),
    ],
    ids=["lse", "cross_entropy", "softmax", "weighted", "attention", "attention_variant"],
)
def test_the_chains_the_rule_takes(source: str, expected: list) -> None:
    assert _chain_shape(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        # the maximum read other than as exp(y - m): not rescaled by a factor
        "def f(float(R,N) X) -> (l) {\n m(r) max=! X(r,j)\n l(r) +=! X(r,j) - m(r)\n}",
        # a sum that adds to what it held (`+=`): its start is not against the maximum
        "def f(float(R,N) X, float(R) l0) -> (l) {\n m(r) max=! X(r,j)\n l(r) = l0(r)\n"
        " l(r) += exp(X(r,j) - m(r))\n}",
        # two terms of different degree
        "def f(float(R,N) X) -> (l) {\n m(r) max=! X(r,j)\n l(r) +=! exp(X(r,j) - m(r)) + 1.0\n}",
        # a square of the exponential: degree 2
        "def f(float(R,N) X) -> (l) {\n m(r) max=! X(r,j)\n"
        " l(r) +=! exp(X(r,j) - m(r)) * exp(X(r,j) - m(r))\n}",
        # a maximum over two indices
        "def f(float(R,N,K) X) -> (l) {\n m(r) max=! X(r,j,k)\n l(r) +=! exp(X(r,j,k) - m(r))\n}",
        # the sum over another index than the maximum's row
        "def f(float(R,N) X, float(R,K) Y) -> (l) {\n m(r) max=! X(r,j)\n"
        " l(r) +=! exp(Y(r,k) - m(r))\n}",
    ],
    ids=["linear", "accumulating", "mixed_degree", "square", "two_indices", "other_row"],
)
def test_chains_the_rule_leaves(source: str) -> None:
    assert chains(_def(source)) == []


def test_a_sum_reading_another_sum_ends_the_chain() -> None:
    """The corpus's attention divides by the sum inside the product's sum: that sum is
    not rescalable as the sums run, so the chain is the maximum and the sum alone."""
    source = """
def attention(float(B, T, D) Q, float(B, S, D) K, float(B, S, E) V) -> (O) {
    sc(b, t, s) +=! Q(b, t, d) * K(b, s, d)
    mx(b, t) max=! sc(b, t, s)
    den(b, t) +=! exp(sc(b, t, s) - mx(b, t))
    O(b, t, e) +=! exp(sc(b, t, s) - mx(b, t)) / den(b, t) * V(b, s, e)
}"""
    assert _chain_shape(source) == [(1, (2,), ())]


def test_a_score_row_read_after_the_chain_stays_in_memory() -> None:
    """A producer whose row a later statement reads whole is not moved into the tiles."""
    source = ATTENTION.replace("-> (A)", "-> (A, Sc)").replace("Sc(b,h,i,j) +=!", "Sc(b,h,i,j) +=!")
    (chain,) = chains(_def(source))
    assert chain.producers == ()


TWO_CHAINS = """
def two(float(R,N) X, float(R,N) Y) -> (a, b) {
    m1(r) max=! X(r,j)
    l1(r) +=! exp(X(r,j) - m1(r))
    a(r) = m1(r) + log(l1(r))
    m2(r) max=! Y(r,j)
    l2(r) +=! exp(Y(r,j) - m2(r))
    b(r) = m2(r) + log(l2(r))
}"""
# the same two, interleaved: the second chain's span overlaps the first's
INTERLEAVED = """
def two(float(R,N) X, float(R,N) Y) -> (a, b) {
    m1(r) max=! X(r,j)
    m2(r) max=! Y(r,j)
    l1(r) +=! exp(X(r,j) - m1(r))
    l2(r) +=! exp(Y(r,j) - m2(r))
    a(r) = m1(r) + log(l1(r))
    b(r) = m2(r) + log(l2(r))
}"""


@pytest.mark.parametrize(
    ("source", "rewritten"), [(TWO_CHAINS, 2), (INTERLEAVED, 1)], ids=["apart", "interleaved"]
)
def test_several_chains_in_one_def(source: str, rewritten: int) -> None:
    """Chains apart are each rewritten; of chains whose statements interleave, only the
    first (each runs where its maximum was), and the results are the reference's."""
    assert len(online_reductions(_def(source), 4).together) == rewritten
    rng = np.random.default_rng(7)
    x, y = (_rows(rng, (6, 19)) for _ in range(2))
    _, got, want = run_against_reference("cpu", source, x, y, options=_options(source, 4, False))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, equal_nan=True)


def test_the_rewrite_is_idempotent_and_off_at_zero() -> None:
    cdef = _def(ATTENTION)
    assert online_reductions(cdef, 0) is cdef
    once = online_reductions(cdef, 8)
    assert len(once.together) == 1 and online_reductions(once, 8) is once


def test_the_rewrite_compares_no_floats() -> None:
    """A float `==` would build the whole kernel without fused multiply-adds (an
    attention's products ran 1.4x slower so): the rescaling is written without one."""
    for source in (LSE, SOFTMAX, WEIGHTED, ATTENTION):
        assert not compares_floats(online_reductions(_def(source), 8))


def test_online_tile_must_not_be_negative() -> None:
    with pytest.raises(tcpy.TCMappingError, match="online_tile"):
        MappingOptions.cpu().replace(online_tile=-1)


# --- the same results as the reference ---------------------------------------------------


def _rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values with whole rows and tiles of -inf, and a NaN."""
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x[0] = -np.inf  # a row that is -inf throughout
    x[1, : shape[1] // 2] = -np.inf  # its first tiles masked
    x[2, -1] = np.inf
    x[3, 1] = np.nan
    return x


def chain_case(name: str, rng: np.random.Generator) -> tuple[str, tuple[np.ndarray, ...]]:
    """A chain that is not attention, by `name`, and its inputs: rows of 37 values with
    the rows of `_rows` (-inf throughout, first tiles -inf, +inf, NaN)."""
    x = _rows(rng, (6, 37))
    return {
        "lse": (LSE, (x,)),
        "softmax": (SOFTMAX, (x,)),
        "weighted": (WEIGHTED, (x, rng.standard_normal((6, 37)).astype(np.float32))),
        "cross_entropy": (
            CROSS_ENTROPY,
            (np.nan_to_num(x, nan=1.0, posinf=3.0), rng.integers(0, 37, 6).astype(np.int32)),
        ),
    }[name]


def _options(source: str, tile: int, fixed: bool) -> MappingOptions:
    return cpu_defaults(_def(source)).replace(
        online_tile=tile, fix_parameters_before_scheduling=fixed
    )


@pytest.mark.parametrize("tile", [1, 3, 16, 64])
@pytest.mark.parametrize("fixed", [False, True], ids=["generic", "fixed"])
@pytest.mark.parametrize("name", ["lse", "softmax", "weighted", "cross_entropy"])
def test_rows_against_the_reference(name: str, tile: int, fixed: bool) -> None:
    source, inputs = chain_case(name, np.random.default_rng(tile))
    compiled, got, want = run_against_reference(
        "cpu", source, *inputs, options=_options(source, tile, fixed)
    )
    assert "once per tile" in compiled.source
    for g, w in zip(
        got if isinstance(got, tuple) else (got,),
        want if isinstance(want, tuple) else (want,),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("tile", [1, 5, 8, 64])
@pytest.mark.parametrize("source", [ATTENTION, ATTENTION_VARIANT], ids=["attention", "variant"])
def test_attention_against_the_reference(source: str, tile: int) -> None:
    rng = np.random.default_rng(tile)
    heads_last = "qkv" in source
    shape = (3, 2, 21, 2, 8) if heads_last else (3, 2, 2, 21, 8)
    qkv = rng.standard_normal(shape).astype(np.float32)
    mask = np.where(rng.random((2, 21)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[1, :12] = -np.inf  # the first tiles of the second batch masked whole
    compiled, got, want = run_against_reference(
        "cpu", source, qkv, mask, options=_options(source, tile, fixed=False)
    )
    assert "once per tile" in compiled.source
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_row_that_is_minus_infinity_gives_what_the_reference_gives() -> None:
    """exp(-inf - -inf) is NaN in the original: the online chain gives it too, and a
    finite row beside it is unaffected."""
    x = np.full((2, 9), -np.inf, np.float32)
    x[1] = np.arange(9, dtype=np.float32)
    _, got, want = run_against_reference("cpu", LSE, x, options=_options(LSE, 4, False))
    assert math.isnan(want[0]) and math.isnan(got[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


# --- what runs where ---------------------------------------------------------------------


def _scratch(schedule: isl.Schedule) -> set[str]:
    found: set[str] = set()

    def visit(node: isl.ScheduleNode) -> bool:
        mark = marks.of(node)
        if isinstance(mark, marks.Scratch):
            found.update(mark.tensors)
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


def test_an_attention_tile_lives_in_thread_buffers() -> None:
    """The scores and probabilities of a tile are written and read in a thread's
    buffers: the score matrix never reaches memory."""
    cdef = _def(ATTENTION)
    sizes = {"T": 3, "B": 1, "H": 2, "S": 96, "E": 16}
    lowered = lower_to_c(cdef, sizes, cpu_defaults(cdef).replace(online_tile=32))
    assert {"Sc", "P"} <= _scratch(lowered.schedule)


@pytest.mark.parametrize("source", [LSE, ATTENTION], ids=["lse", "attention"])
def test_the_work_counts_a_statement_once_per_tile(source: str) -> None:
    """The work estimate (which picks a call's threads) counts the instances the domains
    hold: a statement run once per tile, once per tile."""
    cdef = online_reductions(_def(source), 4)
    sizes = {"R": 3, "N": 10} if source == LSE else {"T": 3, "B": 1, "H": 2, "S": 10, "E": 4}
    scop = build_scop(cdef, sizes)
    counted = sum(s.domain.count_val().to_python() for s in scop.statements)
    assert instances(cdef, sizes) == counted


@pytest.mark.parametrize("deps", [compute_dependences, conservative_dependences])
def test_statements_run_together_keep_their_dependences(deps) -> None:
    """The order of last resort runs the statements of a tile together and respects
    every dependence, exact or over-approximated."""
    cdef = online_reductions(_def(ATTENTION), 4)
    scop = build_scop(cdef, {"T": 3, "B": 1, "H": 2, "S": 10, "E": 4})
    found = deps(scop)
    assert violations(original_order(scop, found), found.validity).is_empty()
