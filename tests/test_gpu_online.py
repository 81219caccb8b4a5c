"""Row kernels over tiles of a row on the GPU (`tcpy.mapping.gpu.online`): a def whose
chain the online rewrite takes (`online_tile`) runs as one kernel on `cuda-emu`, with
its initialisations and last statements, the scores of a tile in shared memory and
never in global memory; the same results as the `reference` target on attention and
on chains that are not attention, with masked rows and tiles; and a statement whose
dependence crosses rows is not taken in."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_online import ATTENTION, ATTENTION_VARIANT, LSE, chain_case

import tcpy
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source

from differential import run_against_reference

# queries, keys and values as separate inputs: a tile's keys and values are each one box
SEPARATE = """
def attention(float(B,H,S,E) Q, float(B,H,S,E) K, float(B,H,S,E) V, float(B,S) M) -> (A) {
    Sc(b,h,i,j) +=! Q(b,h,i,e) * K(b,h,j,e)
    Sc(b,h,i,j) = Sc(b,h,i,j) * 0.25 + M(b,j)
    mx(b,h,i) max=! Sc(b,h,i,j)
    P(b,h,i,j) = exp(Sc(b,h,i,j) - mx(b,h,i))
    sm(b,h,i) +=! P(b,h,i,j)
    A(b,h,i,e) +=! P(b,h,i,j) * V(b,h,j,e)
    A(b,h,i,e) = A(b,h,i,e) / sm(b,h,i)
}"""


@pytest.fixture(autouse=True)
def _checked_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_EMU_CHECK", "1")  # races, bounds, barriers, unread shared


def _options(source: str, tile: int) -> MappingOptions:
    (cdef,) = check_source(source).values()
    return cuda_defaults(cdef).replace(online_tile=tile)


def _mask(rng: np.random.Generator, batch: int, keys: int) -> np.ndarray:
    mask = np.where(rng.random((batch, keys)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[-1, : keys // 2] = -np.inf  # the first tiles of the last batch masked whole
    return mask


def _one_launch(compiled: tcpy.Compiled, *inputs: np.ndarray) -> list[dict]:
    profile = compiled.profile(*inputs)
    assert len(profile) == 1, [p["kernel"] for p in profile]
    return profile


@pytest.mark.parametrize("tile", [1, 5, 8, 32, 64])
def test_attention_runs_as_one_kernel_without_its_scores_in_memory(tile: int) -> None:
    rng = np.random.default_rng(tile)
    q, k, v = (rng.standard_normal((2, 2, 21, 8)).astype(np.float32) for _ in range(3))
    mask = _mask(rng, 2, 21)
    compiled, got, want = run_against_reference(
        "cuda-emu", SEPARATE, q, k, v, mask, options=_options(SEPARATE, tile)
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    (launch,) = _one_launch(compiled, q, k, v, mask)
    assert launch["global_store_bytes"] == want.nbytes  # the output alone, stored once
    for tensor in ("t_Sc", "t_P"):  # neither the scores nor the probabilities loaded
        assert f"TC_LD({tensor}," not in compiled.source


@pytest.mark.parametrize("tile", [4, 16])
@pytest.mark.parametrize("source", [ATTENTION, ATTENTION_VARIANT], ids=["attention", "variant"])
def test_attention_from_one_input_of_queries_keys_and_values(source: str, tile: int) -> None:
    """The bench's layout (and the heads after the sequence, written otherwise): the
    queries, keys and values are copied apart first (`tcpy.poly.slices`), three
    launches, then the chain is one kernel that never loads a score."""
    rng = np.random.default_rng(tile)
    shape = (3, 2, 21, 2, 8) if "qkv" in source else (3, 2, 2, 21, 8)
    qkv = rng.standard_normal(shape).astype(np.float32)
    mask = _mask(rng, 2, 21)
    compiled, got, want = run_against_reference(
        "cuda-emu", source, qkv, mask, options=_options(source, tile)
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert len(compiled.profile(qkv, mask)) == 4
    scores = "t_Sc" if "Sc(" in source else "t_scores"
    assert f"TC_LD({scores}," not in compiled.source
    assert f"TC_ST({scores}," not in compiled.source


def test_slices_are_copied_first_and_only_of_what_the_def_does_not_write() -> None:
    from tcpy.poly.online import online_reductions
    from tcpy.poly.slices import sliced_operands

    (cdef,) = check_source(ATTENTION).values()
    rewritten = online_reductions(cdef, 8)
    sliced = sliced_operands(rewritten)
    assert [st.tensor for st in sliced.statements[:3]] == ["QKV_0", "QKV_1", "QKV_2"]
    (group,) = sliced.together
    assert (group.start, group.stop) == (rewritten.together[0].start + 3,
                                          rewritten.together[0].stop + 3)  # fmt: skip
    members = sliced.statements[group.start : group.stop]
    read = {a.tensor for st in members for a in tcpy.parser.ast.walk(st.rhs)
            if isinstance(a, tcpy.parser.ast.Access)}  # fmt: skip
    assert "QKV" not in read and {"QKV_0", "QKV_1", "QKV_2"} <= read
    assert sliced_operands(cdef) is cdef  # nothing run together: nothing sliced
    # a tensor the def computes is not sliced (its copies would be stale)
    source = ATTENTION.replace("(float(T,B,H,S,E) QKV,", "(float(T,B,H,S,E) X,").replace(
        "{\n", "{\n    QKV(t,b,h,s,e) = X(t,b,h,s,e)\n", 1
    )
    (computed,) = check_source(source).values()
    kept = online_reductions(computed, 8)
    assert kept.together  # the chain is rewritten, its QKV read apart but computed
    assert sliced_operands(kept) is kept


@pytest.mark.parametrize("tile", [3, 16, 64])
@pytest.mark.parametrize("name", ["lse", "softmax", "weighted", "cross_entropy"])
def test_chains_that_are_not_attention(name: str, tile: int) -> None:
    source, inputs = chain_case(name, np.random.default_rng(tile))
    compiled, got, want = run_against_reference(
        "cuda-emu", source, *inputs, options=_options(source, tile)
    )
    for g, w in zip(
        got if isinstance(got, tuple) else (got,),
        want if isinstance(want, tuple) else (want,),
        strict=True,
    ):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, equal_nan=True)
    # the chain and its last statements one kernel; cross-entropy's loss, a sum over
    # the rows, is two of its own (its zero, its sum)
    launches = {"lse": 1, "softmax": 1, "weighted": 1, "cross_entropy": 3}[name]
    assert len(compiled.profile(*inputs)) == launches


def test_a_row_that_is_minus_infinity_gives_what_the_reference_gives() -> None:
    x = np.full((2, 9), -np.inf, np.float32)
    x[1] = np.arange(9, dtype=np.float32)
    _, got, want = run_against_reference("cuda-emu", LSE, x, options=_options(LSE, 4))
    assert math.isnan(want[0]) and math.isnan(got[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


# every row reads the first row's offset: its statement is not taken into the rows
SHIFTED = """
def shifted(float(R,N) X) -> (out) {
    c(r) = X(r, 0)
    m(r) max=! X(r,j) - c(0)
    l(r) +=! exp(X(r,j) - c(0) - m(r))
    out(r) = m(r) + log(l(r))
}"""


def test_a_statement_whose_dependence_crosses_rows_stays_apart() -> None:
    x = np.random.default_rng(0).standard_normal((5, 23)).astype(np.float32)
    compiled, got, want = run_against_reference(
        "cuda-emu", SHIFTED, x, options=_options(SHIFTED, 8)
    )
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    assert len(compiled.profile(x)) == 2  # `c` first, in a kernel of its own


def test_without_lane_reductions_the_chain_is_mapped_as_any_nest() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 13, 4)).astype(np.float32) for _ in range(3))
    mask = _mask(rng, 1, 13)
    options = _options(SEPARATE, 4).replace(reduce_across_threads=False)
    _, got, want = run_against_reference("cuda-emu", SEPARATE, q, k, v, mask, options=options)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
