"""The `cpu` target against the `reference` target: every corpus program, at its
default and odd sizes with the default CPU options, and under option sets drawn by
hypothesis (fusion strategies, tile sizes including 0 and 1, intra-tile fusion,
unrolling, register blocks that do and do not divide the loops, fixed or parametric
sizes, OpenMP on or off)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.mapping.options import Fusion, MappingOptions

from corpus_cases import CASES, Case
from differential import check_corpus_case, corpus_params, engines
from programs import GATHER


@pytest.mark.parametrize(("case", "sizes"), corpus_params())
def test_corpus_cpu_default_options(case: Case, sizes: dict[str, int]) -> None:
    check_corpus_case("cpu", case, sizes, None)


options_strategy = st.builds(
    MappingOptions,
    outer_schedule_fusion=st.sampled_from(list(Fusion)),
    intra_tile_schedule_fusion=st.sampled_from(list(Fusion)),
    fix_parameters_before_scheduling=st.booleans(),
    tile=st.lists(st.sampled_from([0, 1, 2, 3, 4, 7, 16, 32]), max_size=4).map(tuple),
    unroll=st.sampled_from([1, 2, 4, 8]),
    register_tile=st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 8, 16]), max_size=2).map(tuple),
    pack_operands=st.sampled_from([None, True, False]),
    parallel=st.booleans(),
    vectorize=st.booleans(),
    fuse_rows=st.booleans(),
    allow_skewing=st.booleans(),
    positive_orthant=st.booleans(),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=options_strategy, which=st.integers(0, 2))
def test_corpus_cpu_drawn_options(case: Case, options: MappingOptions, which: int) -> None:
    size_sets = (case.sizes, *case.odd_sizes)
    check_corpus_case("cpu", case, size_sets[which % len(size_sets)], options)


def test_default_target() -> None:
    from tcpy.runtime import cuda

    expected = "cuda" if cuda.has_gpu() else "cpu"
    assert tcpy.ExecutionEngine().target == expected


def test_gather_out_of_range_on_cpu() -> None:
    e = tcpy.ExecutionEngine("cpu")
    e.define("def g(float(E, D) T, int32(B) I) -> (O) { O(b, d) = T(I(b), d) }")
    t = np.ones((3, 2), np.float32)
    np.testing.assert_array_equal(e.g(t, np.array([0, 2], np.int32)), np.ones((2, 2)))
    # the kernel reports a fault; the reference interpreter finds where
    with pytest.raises(tcpy.TCInputError) as err:
        e.g(t, np.array([0, 3], np.int32), options={"unroll": 2}, out=np.empty((2, 2), np.float32))
    assert "T is read at index 3 of its dimension 0, outside 0:3, at b=1" in str(err.value)
    assert err.value.line == 1 and err.value.column == 55
    kernel = e.compile("g", t, np.array([0, 3], np.int32))
    with pytest.raises(tcpy.TCInputError, match="outside its extent"):  # nothing is explained
        kernel(t, np.array([0, 3], np.int32), unchecked=True)


def test_an_unchecked_call_takes_numpy_scalars_for_scalar_inputs() -> None:
    """A scalar input given as a NumPy scalar of its dtype (what `np.float32(0.5)`
    and indexing an array give) runs unchecked as it does checked."""
    e = tcpy.ExecutionEngine("cpu")
    e.define("def axpy(float(N) X, float(N) Y, float a) -> (Z) { Z(i) = a * X(i) + Y(i) }")
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    kernel = e.compile("axpy", x, y, np.float32(2))
    for a in (np.float32(2), np.array(2, np.float32), np.array([3, 2], np.float32)[1]):
        np.testing.assert_array_equal(kernel(x, y, a, unchecked=True), 2 * x + 1)
    np.testing.assert_array_equal(kernel(x, y, np.float32(-1), unchecked=True), 1 - x)


def test_a_fault_too_large_to_explain_keeps_the_kernels_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tcpy import compiled

    monkeypatch.setattr(compiled, "EXPLAIN_POINTS", 3)
    e = tcpy.ExecutionEngine("cpu")
    e.define(GATHER)
    with pytest.raises(tcpy.TCInputError, match=r"outside its extent.*reference target names"):
        e.g(np.ones((3, 2), np.float32), np.array([0, 3], np.int32))


def test_integer_division_by_zero_on_cpu() -> None:
    e = tcpy.ExecutionEngine("cpu")
    e.define("def f(int32(N) A) -> (Q) { Q(i) = 10 / A(i) }")
    with pytest.raises(tcpy.TCInputError, match="integer division by zero at i=1"):
        e.f(np.array([1, 0], np.int32))
    np.testing.assert_array_equal(e.f(np.array([3, -4], np.int32)), [3, -2])


def test_integer_division_by_a_constant_is_cs_own_and_vectorised() -> None:
    """By a literal other than 0 and -1 a division cannot fault or overflow: C's `/`
    and `%`, which GCC vectorises (the checked helper's branch kept the loop
    scalar); by a value, the helper. Negative numerators truncate as the reference's."""
    e, ref = tcpy.ExecutionEngine("cpu"), tcpy.ExecutionEngine("reference")
    source = (
        "def f(int32(N) A, int32(N) B) -> (Q, R, S) {"
        " Q(i) = A(i) / 4\n R(i) = A(i) % 3\n S(i) = A(i) / B(i) }"
    )
    e.define(source)
    ref.define(source)
    a = np.arange(-40, 41, dtype=np.int32)
    b = np.where(a == 0, 5, a).astype(np.int32)
    for got, want in zip(e.f(a, b), ref.f(a, b), strict=True):
        np.testing.assert_array_equal(got, want)
    code = e.compile("f", a, b).source
    assert "(t_A[(int64_t)(c1)] / 4)" in code and "(t_A[(int64_t)(c1)] % 3)" in code
    assert "tc_div_int32(t_A[(int64_t)(c1)], t_B[(int64_t)(c1)], tc_status)" in code


def test_a_read_under_a_condition_in_bounds_over_its_ranges_is_not_checked() -> None:
    """A read under `?:` is checked element by element where its subscripts may leave
    the tensor (`B(i - 1)` at `i = 0`: the condition is what keeps it in); one whose
    subscripts stay in the tensor over the statement's ranges, at the sizes the kernel
    is built for, reads as an unconditional one does (a max pool's backward reads
    `d_O(n, c, h, w)` under its comparison: with the check, the loop stayed scalar),
    and so does one that a comparison of its own subscript in the condition keeps in
    (`i > 0` for `A(i - 1)`: a padded copy's reads, with the check a scalar loop)."""
    source = """
    def f(float(N) A, float(N) B) -> (O) {
        O(i) = A(i) > 0 ? B(i) / A(i) : (i > 0 ? A(i - 1) : 0) + (2 * i > 0 ? B(i - 1) : 0)
            where i in 0:N
    }"""
    e, ref = tcpy.ExecutionEngine("cpu"), tcpy.ExecutionEngine("reference")
    e.define(source)
    ref.define(source)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(37, dtype=np.float32), rng.standard_normal(37, dtype=np.float32)
    np.testing.assert_allclose(e.f(a, b), ref.f(a, b), rtol=1e-6)
    code = e.compile("f", a, b).source
    (line,) = [ln for ln in code.splitlines() if ln.strip().startswith("t_O[")]
    assert "t_B[(int64_t)(c1)]" in line and "t_A[(int64_t)(c1)]" in line, line
    assert line.count("tc_index(") == 1 and "t_B[(int64_t)(tc_index((((int32_t)(c1)) - 1)" in line
    assert "t_A[(int64_t)(((c1) - 1))]" in line, line


@pytest.mark.parametrize("bits", ["128", "256", "512"])
def test_kernels_built_at_each_vector_width_match_the_reference(vector_width, bits: str) -> None:  # type: ignore[no-untyped-def]
    """The width reaches the compiler, the cache key and the register blocks; a row
    sum (partial sums in lanes) and a matmul (register blocks) are right at each."""
    from tcpy.runtime import cpu

    vector_width(bits)
    assert cpu.vector_bytes() == int(bits) // 8
    assert f"-mprefer-vector-width={bits}" in cpu.compiler_identity()
    source = """def f(float(M,K) A, float(K,N) B) -> (C, S) {
        C(m,n) +=! A(m,k) * B(k,n)
        S(m) +=! A(m,k)
    }"""
    rng = np.random.default_rng(int(bits))
    a = rng.standard_normal((37, 300)).astype(np.float32)
    b = rng.standard_normal((300, 70)).astype(np.float32)
    engine, reference = engines("cpu", source)
    for got, want in zip(engine.f(a, b), reference.f(a, b), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_vector_width_that_is_not_one_is_refused(vector_width) -> None:  # type: ignore[no-untyped-def]
    from tcpy.runtime import cpu

    vector_width("384")
    with pytest.raises(tcpy.TCError, match="128, 256 or 512"):
        cpu.vector_bytes()


def test_a_condition_that_leaves_a_read_outside_its_tensor_keeps_the_check() -> None:
    """`i >= 0` bounds `A(i + 1)` from below only: at `i = N - 1` the read leaves `A`,
    and the kernel says so, as the reference does, rather than read past the end."""
    source = "def f(float(N) A) -> (O) { O(i) = i >= 0 ? A(i + 1) : 0 where i in 0:N }"
    a = np.arange(8, dtype=np.float32)
    for target in ("cpu", "reference"):
        engine = tcpy.ExecutionEngine(target)
        engine.define(source)
        with pytest.raises(tcpy.TCError, match="outside"):
            engine.f(a)


STEADY = """
def f(float(M,K) A, float(K) x, float alpha, int32(M) I) -> (y, s) {
    t(m) +=! A(m,k) * x(k)
    y(m) = alpha * t(m) + A(I(m), 0)
    s(m) += t(m)
}
"""


def test_a_signature_checked_once_runs_by_its_buffers_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first call at a signature, calls on NumPy inputs of it run the compiled
    code by the buffers' addresses (`host_kernels.Steady`), through the engine and a
    compiled kernel alike: new values in the same arrays, new arrays and new scalars
    are read at each call, a temporary and an output the kernel does not write whole
    (`s`, accumulated from zero) start as they should, and the outputs are new
    arrays every time."""
    from tcpy.host_kernels import HostKernel

    engine, reference = engines("cpu", STEADY, quiet=True)
    rng = np.random.default_rng(5)
    A = rng.standard_normal((33, 70)).astype(np.float32)
    x = rng.standard_normal(70).astype(np.float32)
    index = rng.integers(0, 33, 33).astype(np.int32)
    compiled = engine.compile("f", A, x, 0.5, index)
    first = engine.f(A, x, 0.5, index)
    for alpha in (0.5, np.float32(0.5)):  # each kind of scalar: a signature, checked once
        engine.f(A, x, alpha, index), compiled(A, x, alpha, index)

    def bound(*args: object) -> None:
        raise AssertionError("a call went through a binding")

    monkeypatch.setattr(HostKernel, "__call__", bound)
    for alpha in (1.5, np.float32(-2.0), 0.25):
        A[3] = rng.standard_normal(70)  # new values in the same array
        x = rng.standard_normal(70).astype(np.float32)  # a new array
        want = reference.f(A, x, alpha, index)
        for got in (engine.f(A, x, alpha, index), compiled(A, x, alpha, index)):
            for g, w, old in zip(got, want, first, strict=True):
                assert g is not old
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_fault_on_the_steady_path_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    """An index array read out of range at a call of a signature checked before: the
    kernel's fault is explained as at a checked call (the statement, the index, the
    iteration), through the engine and a compiled kernel alike."""
    from tcpy.host_kernels import HostKernel

    engine, _ = engines("cpu", STEADY, quiet=True)
    A, x = np.ones((4, 6), np.float32), np.ones(6, np.float32)
    compiled = engine.compile("f", A, x, 1.0, np.zeros(4, np.int32))
    engine.f(A, x, 1.0, np.zeros(4, np.int32))
    compiled(A, x, 1.0, np.zeros(4, np.int32))
    monkeypatch.setattr(HostKernel, "__call__", None)  # the steady path only
    for call in (engine.f, compiled):
        with pytest.raises(tcpy.TCInputError) as err:
            call(A, x, 1.0, np.array([0, 1, 4, 2], np.int32))
        assert "A is read at index 4 of its dimension 0, outside 0:4, at m=2" in str(err.value)
        assert err.value.line == 4


def test_unchecked_calls_run_by_the_buffers_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`unchecked=True` on a fixed-size kernel takes the steady path too, into new
    outputs or into `out=` arrays, an output the kernel does not write whole (`s`)
    zeroed first whatever the array held."""
    from tcpy.host_kernels import HostKernel

    engine, reference = engines("cpu", STEADY, quiet=True)
    rng = np.random.default_rng(6)
    A = rng.standard_normal((9, 20)).astype(np.float32)
    x = rng.standard_normal(20).astype(np.float32)
    index = rng.integers(0, 9, 9).astype(np.int32)
    alpha = np.float32(0.75)
    compiled = engine.compile("f", A, x, alpha, index)
    want = reference.f(A, x, alpha, index)
    monkeypatch.setattr(HostKernel, "__call__", None)  # the steady path only
    outs = (np.full(9, np.nan, np.float32), np.full(9, 7.0, np.float32))
    for got in (
        compiled(A, x, alpha, index, unchecked=True),
        compiled(A, x, alpha, index, out=outs, unchecked=True),
    ):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[1], want[1], rtol=1e-5, atol=1e-5)
