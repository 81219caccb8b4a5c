"""Epilogue fusion on the CPU (`tcpy.mapping.cpu.epilogues`): which runs of nests are
fused into the contraction's tiles, what is printed, and results against the
`reference` target (sizes that do and do not divide the tiles, size-generic kernels)
and bit for bit the unfused nests'."""

from __future__ import annotations

import numpy as np
import pytest

import tcpy
from tcpy.codegen.region import WAIT
from tcpy.mapping.options import MappingOptions

from differential import engines

MLP = """def f(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}"""
FUSED = {
    "mlp": MLP,
    "two_outputs": """def f(float(M,K) A, float(K,N) B, float(M,N) R) -> (C, Y) {
        C(m, n) +=! A(m, k) * B(k, n)
        Y(m, n) = tanh(C(m, n)) + R(m, n)
    }""",
    "batched": """def f(float(X,M,K) A, float(X,K,N) B, float(N) bias) -> (C) {
        C(x, m, n) +=! A(x, m, k) * B(x, k, n)
        C(x, m, n) = C(x, m, n) * bias(n)
    }""",
    "renamed_indices": """def f(float(M,K) A, float(K,N) B, float(N) bias) -> (C) {
        C(i, j) +=! A(i, k) * B(k, j)
        C(p, q) = C(p, q) - bias(q)
    }""",
}
NOT_FUSED = {
    # the epilogue reads another output of the contraction than its own
    "transposed_read": """def f(float(N,K) A, float(K,N) B) -> (C, D) {
        C(m, n) +=! A(m, k) * B(k, n)
        D(m, n) = C(n, m) + 1
    }""",
    # over fewer indices than the outputs
    "bias_of_rows": """def f(float(M,K) A, float(K,N) B) -> (C, r) {
        C(m, n) +=! A(m, k) * B(k, n)
        r(m) = C(m, 0) * 2
    }""",
}
SIZES = [
    {"B": 64, "K": 48, "N": 80, "M": 64, "X": 2},
    {"B": 37, "K": 11, "N": 53, "M": 29, "X": 3},
    {"B": 1, "K": 1, "N": 1, "M": 1, "X": 1},
    {"B": 300, "K": 70, "N": 260, "M": 130, "X": 2},
]
GENERIC = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)
UNFUSED = MappingOptions.cpu().replace(fuse_epilogues=False)


def _inputs(engine: tcpy.ExecutionEngine, sizes: dict[str, int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.uniform(-1, 1, [d.evaluate(sizes) for d in t.shape]).astype(np.float32)
        for t in engine.checked("f").inputs
    ]


def _outputs(value: object) -> tuple[np.ndarray, ...]:
    return tuple(value) if isinstance(value, tuple) else (value,)  # type: ignore[arg-type]


def _nests(source: str) -> list[str]:
    """The kernel's nests as printed, split at the barriers between them (the last
    barrier ends the region)."""
    body = source[source.index("#pragma omp parallel") :]
    return body.split(WAIT)[:-1]


@pytest.mark.parametrize("name", sorted(FUSED) + sorted(NOT_FUSED))
def test_fused_and_unfused_runs_compute_the_reference(name: str) -> None:
    source = {**FUSED, **NOT_FUSED}[name]
    cpu, reference = engines("cpu", source, quiet=True)
    for seed, sizes in enumerate(SIZES):
        if name in NOT_FUSED and sizes["M"] != sizes["N"] and "C(n, m)" in source:
            sizes = {**sizes, "M": sizes["N"]}
        inputs = _inputs(cpu, sizes, seed)
        want = _outputs(reference.f(*inputs))
        for options in (None, GENERIC):
            got = _outputs(cpu.f(*inputs, options=options))
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{sizes}")


@pytest.mark.parametrize("name", sorted(FUSED))
def test_a_fused_run_is_one_nest_in_the_contractions_tiles(name: str) -> None:
    """The initialisation, the contraction and its epilogues share one worksharing
    loop over the contraction's tiles of outputs: no barrier between them; with the
    option off, a nest each (the initialisation's left out where the contraction's
    register blocks start at the identity, `registers.fresh_blocks`)."""
    cpu, _ = engines("cpu", FUSED[name], quiet=True)
    inputs = _inputs(cpu, SIZES[0], 0)
    fused = cpu.compile("f", *inputs).source
    assert len(_nests(fused)) == 1, fused
    assert fused.count("#pragma omp for") == 1
    unfused = cpu.compile("f", *inputs, options=UNFUSED).source
    assert len(_nests(unfused)) >= 2, unfused


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_runs_that_do_not_qualify_keep_their_nests(name: str) -> None:
    cpu, _ = engines("cpu", NOT_FUSED[name], quiet=True)
    sizes = {**SIZES[0], "M": SIZES[0]["N"]}
    source = cpu.compile("f", *_inputs(cpu, sizes, 0)).source
    assert len(_nests(source)) >= 2, source


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fusing_leaves_every_bit_of_the_result(name: str) -> None:
    """Each output is reduced in the same order, in the same tiles and register
    blocks, and its epilogue computed the same: equal bit for bit to the unfused
    nests'."""
    cpu, _ = engines("cpu", FUSED[name], quiet=True)
    for seed, sizes in enumerate(SIZES):
        inputs = _inputs(cpu, sizes, seed)
        fused = _outputs(cpu.f(*inputs))
        unfused = _outputs(cpu.f(*inputs, options=UNFUSED))
        for a, b in zip(fused, unfused, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{sizes}")


def test_the_contractions_copies_stay_inside_its_tiles() -> None:
    """The MLP's weights are copied transposed (`W^T`) tile by tile of the reduction,
    above the register blocks, as in the unfused contraction."""
    cpu, _ = engines("cpu", MLP, quiet=True)
    inputs = _inputs(cpu, {"B": 256, "K": 512, "N": 512}, 0)
    fused = cpu.compile("f", *inputs).source
    unfused = cpu.compile("f", *inputs, options=UNFUSED).source
    assert "tc_pack0[" in fused and fused.count("t_W[") == unfused.count("t_W[")
    copy, block = fused.index("tc_pack0[(("), fused.index("float tc_reg[")
    assert copy < block


def test_a_unit_batch_between_parallel_loops_does_not_stop_their_collapse() -> None:
    """A projection to Q, K and V of a batch of one, its bias fused: the loop of one
    batch between the three projections and the heads is dropped, and the heads are
    shared out with the projections (36 iterations for the cores, not 3)."""
    source = """def f(float(B,S,D) X, float(T,H,E,D) W, float(T,H,E) bias) -> (Q) {
        Q(t,b,h,s,e) +=! X(b,s,d) * W(t,h,e,d)
        Q(t,b,h,s,e) = Q(t,b,h,s,e) + bias(t,h,e)
    }"""
    cpu, reference = engines("cpu", source, quiet=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 40, 48)).astype(np.float32)
    w = rng.standard_normal((3, 5, 16, 48)).astype(np.float32)
    bias = rng.standard_normal((3, 5, 16)).astype(np.float32)
    compiled = cpu.compile("f", x, w, bias)
    assert "tc_reg" in compiled.source  # the contraction blocked, its bias in its tiles
    assert compiled.source.count("#pragma omp for") == 1
    assert "#pragma omp for collapse(2)" in compiled.source
    want = reference.run("f", x, w, bias)
    np.testing.assert_allclose(compiled(x, w, bias), want, rtol=1e-5, atol=1e-4)
