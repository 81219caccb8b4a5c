"""Regressions found by differential fuzzing: each program, with the sizes and the
options that exposed it, against the `reference` target on `cpu` and `cuda-emu`.

Options are spelled out field by field (never left to a target's defaults), so that
later changes to how partial options are resolved cannot change what a test tests.
"""

from __future__ import annotations

import re
import warnings

import islpy as isl
import numpy as np
import pytest
from test_row_fusion import ATTENTION

import tcpy
from tcpy.codegen.printer import unroll_factor
from tcpy.errors import InternalError
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.poly.dependences import compute_dependences, violations
from tcpy.poly.scop import build_scop
from tcpy.poly.transforms import verify

from differential import as_tuple, defined, engines
from programs import MATMUL, SOFTMAX

COMPILED = ("cpu", "cuda-emu")


def options(**fields: object) -> MappingOptions:
    """MappingOptions with the scheduling fields written out; `fields` overrides."""
    base: dict[str, object] = {
        "outer_schedule_fusion": Fusion.PRESERVE3_COINCIDENT,
        "intra_tile_schedule_fusion": Fusion.PRESERVE3_COINCIDENT,
        "allow_skewing": False,
        "positive_orthant": True,
        "fix_parameters_before_scheduling": False,
        "tile": (),
        "unroll": 1,
        "interchange": (),
        "parallel": True,
        "vectorize": True,
    }
    base.update(fields)
    return MappingOptions(**base)  # type: ignore[arg-type]


def run_both(
    source: str, entry: str, inputs: tuple[np.ndarray, ...], target: str, opts: MappingOptions
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The outputs of `entry` on `target` with `opts`, and on `reference`."""
    got_engine, want_engine = engines(target, source, quiet=True)
    got = got_engine.run(entry, *inputs, options=opts)
    want = want_engine.run(entry, *inputs)
    return as_tuple(got), as_tuple(want)


def assert_same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # NaN positions must agree too


# --- 1. statement order under intra-tile Min fusion ------------------------------------

ORDER = """
def f(float(N) A) -> (O) {
    O(i) +=! A(k) where i in 0:N
    O(i) += A(t) where t in 0:1
}
"""


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("fixed", [True, False])
def test_intra_tile_min_fusion_keeps_statement_order(target: str, fixed: bool) -> None:
    a = np.arange(1, 17, dtype=np.float32)
    opts = options(intra_tile_schedule_fusion=Fusion.MIN, fix_parameters_before_scheduling=fixed)
    got, want = run_both(ORDER, "f", (a,), target, opts)
    assert want[0][0] == a.sum() + a[0]
    assert_same(got, want)


def test_verify_treats_set_children_as_unordered() -> None:
    """A `set` node promises no order among its children: a dependence between two of
    them must fail verification, though `Schedule.get_map()` orders them."""
    (cdef,) = check_source(ORDER).values()
    scop = build_scop(cdef, {"N": 4})
    deps = compute_dependences(scop)
    children = isl.UnionSetList.alloc(scop.ctx, 3)
    for name in ("I0", "S0", "S1"):  # a reduction's own updates are unordered
        children = children.add(isl.UnionSet.from_set(scop.statement(name).domain))
    root = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    as_sequence = root.insert_sequence(children).get_schedule()
    verify(as_sequence, deps.validity, scop.domain)  # source order: valid
    as_set = root.insert_set(children).get_schedule()
    with pytest.raises(InternalError, match="violates dependences"):
        verify(as_set, deps.validity, scop.domain)


def test_verify_finds_exactly_the_late_pairs() -> None:
    """The verifier's violations against isl's order of all instance pairs, on source
    order (none) and on the statements run in reverse (every dependence across them)."""
    (cdef,) = check_source(ORDER).values()
    scop = build_scop(cdef, {"N": 4})
    deps = compute_dependences(scop).validity
    root = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    for names in (("I0", "S0", "S1"), ("S1", "S0", "I0")):
        children = isl.UnionSetList.alloc(scop.ctx, 3)
        for name in names:
            children = children.add(isl.UnionSet.from_set(scop.statement(name).domain))
        schedule = root.insert_sequence(children).get_schedule()
        order = schedule.get_map()
        want = deps.subtract(order.lex_lt_union_map(order))
        assert violations(schedule, deps).is_equal(want)
    assert not want.is_empty()


# A tiled schedule with a block and thread mapping: isl took minutes to order all its
# instance pairs, so verification hung (cuda-emu, 2001:44).
VERIFY_SLOW = """
def f(int32(P, S) Z) -> (LUT, O) {
    LUT(m, s, w) *=! min(max(Z(0, n), (-2)), 2) where m in 0:S, s in 0:P, w in 0:S-1
    O(k) max=! min(max(LUT(k, k, k), (-8)), 8)
}
"""


@pytest.mark.parametrize("target", COMPILED)
def test_verifying_a_tiled_and_mapped_schedule(target: str) -> None:
    z = np.random.default_rng(0).integers(-5, 6, size=(1, 6), dtype=np.int32)
    opts = options(
        outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT,
        intra_tile_schedule_fusion=Fusion.MIN,
        allow_skewing=True,
        positive_orthant=False,
        tile=(17, 15, 2),
        map_to_blocks=(1, 2),
        map_to_threads=(2, 8),
        use_shared_memory=False,
        use_private_memory=False,
        vectorize=False,
    )
    got, want = run_both(VERIFY_SLOW, "f", (z,), target, opts)
    assert_same(got, want)


# --- 3. NaN in min and max -------------------------------------------------------------

EXTREMA = """
def f(float(M,N) A) -> (O, P, Q, R) {
    O(i) max=! A(i,j)
    P(i) min=! A(i,j)
    Q(i,j) = max(A(i,j), 0.0)
    R(i,j) = min(0.0, A(i,j))
}
"""


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("vectorize", [True, False])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_min_and_max_propagate_nan(target: str, vectorize: bool, n: int) -> None:
    """NaN anywhere in a row (first, middle, last lane) makes its min and max NaN, on
    every target; a row of -inf has the maximum -inf, a row of +inf the minimum +inf."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((6, n)).astype(np.float32)
    a[0, 0] = np.nan
    a[1, n // 2] = np.nan
    a[2, n - 1] = np.nan
    a[3] = -np.inf
    a[4] = np.inf
    got, want = run_both(EXTREMA, "f", (a,), target, options(vectorize=vectorize))
    assert np.isnan(want[0][:3]).all() and want[0][3] == -np.inf
    assert want[1][4] == np.inf
    assert_same(got, want)


SUMS = """
def f(float(M,N) A, int32(M,N) B) -> (S, T) {
    S(i) +=! A(i,j)
    T(i) +=! B(i,j)
}
"""


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize("n", [7, 129, 1000])
def test_long_sums_keep_nan_infinities_and_integers(target: str, fixed: bool, n: int) -> None:
    """A vectorised row sum keeps partial sums in several lanes and merges them: NaN in
    any lane, +inf beside -inf, and +inf alone give what the sequential sum gives, and
    an integer sum is exact."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((5, n)).astype(np.float32)
    a[0, n // 2] = np.nan
    a[1, 0], a[1, n - 1] = np.inf, -np.inf
    a[2, n - 1] = np.inf
    a[3, :] = -np.inf
    b = rng.integers(-(2**20), 2**20, (5, n)).astype(np.int32)
    opts = options(vectorize=True, fix_parameters_before_scheduling=fixed)
    (s, t), (ws, wt) = run_both(SUMS, "f", (a, b), target, opts)
    assert np.isnan(ws[:2]).all() and ws[2] == np.inf and ws[3] == -np.inf
    np.testing.assert_array_equal(np.isnan(s), np.isnan(ws))
    np.testing.assert_array_equal(s[2:4], ws[2:4])
    np.testing.assert_allclose(s[4], ws[4], atol=1e-6 * float(np.abs(a[4]).sum()))
    np.testing.assert_array_equal(t, wt)


# --- 2 and 4. user names never reach isl, C or CUDA as written -------------------------

HOSTILE = (
    "and", "and_", "nan", "NAN", "Nan", "INFINITY", "Infinity", "ceild", "floord",
    "infty", "S0", "I0", "c0", "b0", "t0", "tc_status", "tc_acc", "int", "float2",
    "threadIdx", "restrict", "_o0", "e_A_0", "s_N", "t_A",
)  # fmt: skip


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("start", range(0, len(HOSTILE), 3))
def test_any_identifier_is_an_index_size_or_tensor(target: str, start: int) -> None:
    """Names that are isl keywords, C or CUDA keywords, or names the generated code
    uses itself, as indices, sizes and tensors: each computes what reference does."""
    names = [HOSTILE[(start + k) % len(HOSTILE)] for k in range(8)]
    i, j, m, n, x, y, out, total = names
    source = f"""
    def f(float({m}, {n}) {x}, float {y}) -> ({out}, {total}) {{
        {out}({i}, {j}) = {x}({i}, {j}) * {y}
        {total}({j}) +=! {x}({i}, {j}) where {j} in 0:{n}
    }}
    """
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    got, want = run_both(source, "f", (a, np.float32(2.0)), target, options())
    assert_same(got, want)
    np.testing.assert_array_equal(want[0], a * 2)
    np.testing.assert_array_equal(want[1], a.sum(axis=0))


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("name", ["tc_status", "my_tc_status", "tc_sizes", "tc_buffers"])
def test_a_scalar_input_named_like_the_launcher_arguments(target: str, name: str) -> None:
    source = f"""
    def f(float(N) A, float {name}, int32(N) {name}_t) -> (O) {{
        O(i) = A(i) * {name} + float({name}_t(i))
    }}
    """
    a = np.arange(5, dtype=np.float32)
    t = np.arange(5, dtype=np.int32) * 10
    got, want = run_both(source, "f", (a, np.float32(3.0), t), target, options())
    assert_same(got, want)
    np.testing.assert_array_equal(want[0], a * 3 + t)


# --- 5 and 6. isl's scheduler: bounded in time, and falling back when it gives up ------

LONG_SCHEDULE = ATTENTION  # an attention head: isl takes minutes to fuse it at 384


def _long_schedule_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    qkv = rng.standard_normal((3, 1, 2, 64, 8), dtype=np.float32)
    return qkv, rng.standard_normal((1, 64), dtype=np.float32)


@pytest.mark.parametrize("target", COMPILED)
def test_a_scheduler_past_its_deadline_is_stopped(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Max fusion of this attention head keeps isl's scheduler busy for 7 s at a
    sequence of 64 (1.6 s at 20; minutes at 384), within its operation budget; the
    deadline stops it, Min fusion runs, the warning says so, and the kernel says what
    ran. A fallback forced by the clock is not cached on disk: a quieter machine can
    do better."""
    monkeypatch.setenv("TCPY_ISL_SECONDS", "1")
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")  # the warning comes with the compile
    inputs = _long_schedule_inputs()
    opts = options(outer_schedule_fusion=Fusion.MAX, fix_parameters_before_scheduling=True)
    engine = defined(target, LONG_SCHEDULE, quiet=True)
    with pytest.warns(tcpy.TCWarning, match=r"Max fusion abandoned: isl ran past 1 s"):
        compiled = engine.compile("attention", *inputs, options=opts)
    assert compiled.options.outer_schedule_fusion is Fusion.MIN
    assert compiled.options.fix_parameters_before_scheduling
    reference = defined("reference", LONG_SCHEDULE, quiet=True)
    want = reference.attention(*inputs)
    np.testing.assert_allclose(compiled(*inputs), want, rtol=1e-5, atol=1e-6)


def test_a_fallback_forced_by_the_clock_is_not_cached(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCPY_ISL_SECONDS", "1")
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    inputs = _long_schedule_inputs()
    opts = options(outer_schedule_fusion=Fusion.MAX, fix_parameters_before_scheduling=True)
    for _ in range(2):
        engine = tcpy.ExecutionEngine("cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tcpy.TCWarning)
            engine.define(LONG_SCHEDULE)
            engine.compile("attention", *inputs, options=opts)
        assert (engine.stats.compiles, engine.stats.disk_hits) == (1, 0)


CARRY = "def f(float(2) A) -> (O) { O(i) +=! A(i) * A(a) * A(b) * A(c) }"


@pytest.mark.parametrize("target", COMPILED)
def test_a_scheduler_that_cannot_carry_dependences_falls_back(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under Preserve3Coincident isl gives up ("unable to carry dependences")."""
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")  # the warning comes with the compile
    a = np.array([2.0, 3.0], dtype=np.float32)
    opts = options(outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT)
    with pytest.warns(tcpy.TCWarning, match="fusion abandoned: isl failed"):
        got, want = run_both(CARRY, "f", (a,), target, opts)
    assert_same(got, want)
    np.testing.assert_array_equal(want[0], a * a.sum() ** 3)


# --- 8. the C compiler ---------------------------------------------------------------


def test_pow_with_a_constant_exponent_compiles() -> None:
    """gcc 12 crashed on `powf` declared `simd` with errno semantics."""
    x = np.arange(8, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tcpy.TCWarning)
        got, want = run_both(
            "def f(float(N) X) -> (O) { O(i) = pow(X(i), 0.5) }", "f", (x,), "cpu", options()
        )
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_a_compiler_failure_is_retried_with_conservative_flags(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that fails on the usual flags (here: a wrapper that refuses
    -march=native, as a crash would) gets one more try with conservative flags."""
    wrapper = tmp_path / "cc"  # type: ignore[operator]
    wrapper.write_text(
        '#!/bin/sh\nfor a in "$@"; do [ "$a" = -march=native ] && '
        '{ echo "internal compiler error: simulated" >&2; exit 1; }; done\nexec cc "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("TCPY_CC", str(wrapper))
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    x = np.arange(10, dtype=np.float32)
    with pytest.warns(tcpy.TCWarning, match="simulated.*conservative flags"):
        got, want = run_both(
            "def f(float(N) X) -> (O) { O(i) = exp(X(i)) + 1.0 }", "f", (x,), "cpu", options()
        )
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


HEAVY_BODY = """
def f(int32(L) tmp, int32(L, R) C) -> (Z, B) {
    Z(d, kw) min=! min(max((-min(max(d, tmp(0)), (-(-2.0)))), (-3.0)), 3.0)
        where d in 0:R-1, kw in 0:L-1
    B(w, kh) max=! min(max((tmp(c) != tmp(c) ? Z(m, w) : Z(22, tmp(m))), (-9.0)), 9.0)
        where kh in 0:L-1
}
"""


@pytest.mark.parametrize(
    ("asked", "tokens", "factor"),
    [(64, 100, 4), (64, 8, 64), (8, 8, 8), (6, 8, 4), (64, 256, 2), (64, 257, 1), (1, 1, 1)],
)
def test_unrolling_is_lowered_to_the_budget(asked: int, tokens: int, factor: int) -> None:
    """The factor is the largest power of two up to the one asked for whose unrolled
    body stays within UNROLL_BUDGET (512) tokens."""
    body = [" ".join(["x"] * (tokens - 1)), ";"]  # `tokens` tokens over two lines
    assert unroll_factor(asked, body) == factor


def test_a_heavy_loop_body_is_not_unrolled_as_far_as_asked() -> None:
    """Fuzzed pair (cpu seed 1004): `unroll=64` on innermost loops whose bodies are
    a few hundred tokens long cost gcc 23 s. The factor is lowered to fit a budget;
    a light body keeps the factor asked for."""
    rng = np.random.default_rng(0)
    tmp = rng.integers(0, 5, size=6).astype(np.int32)  # indices into Z(_, 0:L-1)
    c = rng.integers(-3, 6, size=(6, 33)).astype(np.int32)
    opts = options(
        outer_schedule_fusion=Fusion.MAX,
        allow_skewing=True,
        tile=(3, 33, 3, 33, 8),
        unroll=64,
        interchange=(0, 3, 2, 1),
        threads=4,
    )
    engine = defined("cpu", HEAVY_BODY, quiet=True)
    source = engine.compile("f", tmp, c, options=opts).source
    factors = [int(f) for f in re.findall(r"#pragma GCC unroll (\d+)", source)]
    assert factors and max(factors) < 64
    assert_same(*run_both(HEAVY_BODY, "f", (tmp, c), "cpu", opts))

    engine.define("def g(float(M,N) A) -> (O) { O(i, j) = 2.0 * A(i, j) + 1.0 }")
    a = np.ones((8, 8), np.float32)
    light = engine.compile("g", a, options=options(unroll=8, vectorize=False)).source
    assert "#pragma GCC unroll 8" in light


# --- 7. dependence analysis over parametric sizes --------------------------------------

GATHER = """
def f(float(N) A, int32(M) I) -> (O, P) {
    O(i) = A(2 * i) + A(I(i)) where i in 0:M
    P(i) +=! O(j) * A(i) where j in 0:M
}
"""


@pytest.mark.parametrize("target", COMPILED)
def test_parametric_dependence_analysis_falls_back_to_the_call_sizes(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When dependence analysis over every size exceeds isl's budget (strided reads
    and gathers can), it is done again at the call's sizes; the kernel then says it
    is specialised to them. The failure is injected: isl's budget is a machine-
    independent count, but which programs exhaust it changes with isl's version."""
    from tcpy.poly import analysis

    real = analysis._dependences

    def parametric_fails(scop: object, seconds: float) -> object:
        if scop.sizes is None:  # type: ignore[attr-defined]
            raise isl.Error(
                "call to isl_union_access_info_compute_flow failed: "
                "maximal number of operations exceeded"
            )
        return real(scop, seconds)  # type: ignore[arg-type]

    monkeypatch.setattr(analysis, "_dependences", parametric_fails)
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    a = np.arange(20, dtype=np.float32)
    idx = np.array([3, 1, 4, 1, 5], dtype=np.int32)
    engine = tcpy.ExecutionEngine(target)
    engine.define(GATHER)
    with pytest.warns(tcpy.TCWarning, match="call's sizes.*operation budget"):
        compiled = engine.compile("f", a, idx, options=options())
    assert compiled.options.fix_parameters_before_scheduling
    _, want = run_both(GATHER, "f", (a, idx), "reference", options())
    assert_same(tuple(compiled(a, idx)), want)


@pytest.mark.parametrize("emit", ["schedule", "ast"])
def test_emitted_schedules_and_asts_show_the_users_names(
    emit: str, tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from tcpy.cli import main

    path = Path(str(tmp_path)) / "names.tc"
    path.write_text("def f(float(nan) and) -> (O) { O(ceild) = and(ceild) + 1.0 }")
    parametric = '{"fix_parameters_before_scheduling": false}'  # the size stays a name
    assert main(["compile", str(path), "--sizes", "nan=8", "--emit", emit,
                 "--options", parametric]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "s_nan" not in out and "i_ceild" not in out and "t_and" not in out
    assert "nan" in out


GATHERS_IN_A_REDUCTION = """
def f(float(S) T, float acc, int32(S, S) B) -> (X, LUT) {
    X(c, d) max=! ((float(B(kh, kh)) * min(B(c, i), S)) != max(T(d + s), (-(-3))) ? B(3*c + w, 0) : B(c, c)) where s in 0:4, w in 0:4
    LUT(k, b) max=! min(max((max((X(0, 0) > X(1, b) ? acc : T(2*k)), float(X(kw, j))) < ((X(b, j) * X(r, b)) - max(X(k, B(b, k)), X(b, k))) ? ((-X(k, k)) * (b - X(k, B(k, b)))) : (max((-1), B(B(b, b), 2*k + h)) - (X(b, k) / 3))), (-9)), 9) where h in 0:4
    LUT(n, l) min= X(B(m, m), m)
}
"""  # noqa: E501  (found by the fuzzer: isl's dataflow ran past its limit at fixed sizes)


@pytest.mark.parametrize("target", COMPILED)
@pytest.mark.parametrize("program", ["gathers", "softmax", "matmul"])
def test_dependences_over_approximated_when_isl_runs_out_even_at_fixed_sizes(
    target: str, program: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When dataflow analysis fails at the call's sizes too, the dependences are
    over-approximated and the statements run in source order: slower, still right."""
    from tcpy.poly import analysis
    from tcpy.poly.bounded import DeadlineExceeded

    def out_of_time(scop: object, seconds: float) -> object:
        raise DeadlineExceeded(seconds)

    monkeypatch.setattr(analysis, "_dependences", out_of_time)
    monkeypatch.setenv("TCPY_CACHE_DIR", "off")
    rng = np.random.default_rng(3)
    if program == "gathers":
        source, entry = GATHERS_IN_A_REDUCTION, "f"
        inputs: tuple = (
            rng.integers(-3, 4, 17).astype(np.float32), np.float32(2.0),
            rng.integers(0, 5, (17, 17)).astype(np.int32),
        )  # fmt: skip
    elif program == "softmax":
        source, entry = SOFTMAX, "softmax"
        inputs = (rng.standard_normal((5, 9)).astype(np.float32),)
    else:
        source, entry = MATMUL, "mm"
        inputs = (rng.standard_normal((6, 5)).astype(np.float32),
                  rng.standard_normal((5, 7)).astype(np.float32))  # fmt: skip
    for fixed in (True, False):
        opts = options(fix_parameters_before_scheduling=fixed)
        with pytest.warns(tcpy.TCWarning, match="over-approximated"):
            got, want = run_both(source, entry, inputs, target, opts)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# --- an accumulator's load and store where its reduction loop runs no iteration --------

EMPTY_REDUCTION_LOOP = """
def f(int32(K, Q) B) -> (T, U) {
    T(m, i) = (B(m, m) - B(i, 2*i + 2))
    U(s) +=! (0 > 0 ? T(2, s) : B(j, j))
}
"""  # found by the fuzzer: U has 3 elements, and thread 3 stored U[3]


@pytest.mark.parametrize("target", COMPILED)
def test_an_accumulator_is_not_loaded_or_stored_where_its_loop_runs_no_iteration(
    target: str,
) -> None:
    """Fused with T, U's reduction loop is the only bound that keeps s below U's
    extent: the register accumulator around it (loaded before the loop, stored after)
    must sit under the loop's first test. The outputs go into a larger buffer, so that
    a store past U's end shows in the element after it; `cuda-emu` also checks every
    access."""
    b = np.random.default_rng(5).integers(-9, 10, (3, 9)).astype(np.int32)
    opts = options(tile=(8, 3, 32, 64, 31))
    got, want = run_both(EMPTY_REDUCTION_LOOP, "f", (b,), target, opts)
    assert_same(got, want)
    checked = {"emu_check": True} if target == "cuda-emu" else {}
    engine = tcpy.ExecutionEngine(target, **checked)
    engine.define(EMPTY_REDUCTION_LOOP)
    u_buffer = np.full(3 + 16, 12345, dtype=np.int32)
    t_out = np.empty_like(want[0])
    engine.run("f", b, options=opts, out=(t_out, u_buffer[:3]))
    np.testing.assert_array_equal(u_buffer[:3], want[1])
    assert (u_buffer[3:] == 12345).all()


# --- a scratch temporary whose initialisation runs in a nest of its own -----------------

SPLIT_INITIALISATION = """
def f(int32(S) B, int32(S) V) -> (U, Z) {
    U max=! 0
    LUT(l, c, b) min=! (1 == 0.0 ? V(c) : max(B(l), U)) where b in 0:S
    Z(w) +=! LUT(kw, kw, w)
}
"""  # found by the fuzzer: Z read LUT's minimum from a buffer nothing had initialised


@pytest.mark.parametrize("target", COMPILED)
def test_a_temporary_initialised_in_another_nest_is_not_kept_in_a_buffer(target: str) -> None:
    """LUT's `min=!` initialisation is scheduled in a nest before the one that reduces
    into LUT and reads it back: that nest may not keep LUT in a buffer of its own,
    which nothing would have initialised. B's value is one below int32's largest, so
    the minimum with any stale value but the two largest shows."""
    b = np.array([2**31 - 2], np.int32)
    v = np.array([5], np.int32)
    opts = options(
        allow_skewing=True, positive_orthant=False, fix_parameters_before_scheduling=False
    )
    for _ in range(3):
        got, want = run_both(SPLIT_INITIALISATION, "f", (b, v), target, opts)
        assert want[1][0] == 2**31 - 2
        assert_same(got, want)


# --- a register block's partial run, vectorised by GCC behind an overlap check ---------

TWO_MATMULS = """
def two_matmul(float(M, K) A, float(K, N) B, float(M, L) C, float(L, N) D) -> (O) {
    O(m, n) +=! A(m, k) * B(k, n)
    O(m, n) += C(m, l) * D(l, n)
}
"""  # found by the drawn options of test_cpu: O's last column took C @ D twice


def test_a_register_blocks_partial_run_is_computed_once() -> None:
    """Register blocks of 2 along n = 9: the second statement's run over a block is
    bounded by `c8 <= 2 - (c4 + 6) / 5`. GCC 12.2 at -O3 -march=native (Rocket Lake
    tuning) vectorised that loop behind a check that O and D do not overlap and
    computed the last column twice; `runtime.cpu.GCC_FLAGS` keeps it from vectorising
    behind such checks. Whole blocks and partial ones, at several n."""
    rng = np.random.default_rng(0)
    opts = options(
        outer_schedule_fusion=Fusion.MIN,
        intra_tile_schedule_fusion=Fusion.MAX,
        positive_orthant=False,
        fix_parameters_before_scheduling=True,
        register_tile=(2,),
        pack_operands=None,
        parallel=False,
        vectorize=False,
    )
    for n in (9, 13, 35):
        a, b = rng.standard_normal((8, 10), np.float32), rng.standard_normal((10, n), np.float32)
        c, d = rng.standard_normal((8, 6), np.float32), rng.standard_normal((6, n), np.float32)
        got, want = run_both(TWO_MATMULS, "two_matmul", (a, b, c, d), "cpu", opts)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


# --- a loop GCC's loop distribution reordered ------------------------------------------

REINITIALISED = """
def f(float(L, L) B, int32(L, L) acc) -> (Z, Y, O) {
    Z(n, l) = min(max(float(int32(acc(l, n))), (-3.0)), 3.0)
    Y(k) min=! min(max(Z(i22, i23), (-9.0)), 9.0) where k in 0:L
    O(i25, i26) min=! min(max(Z(i25, i26), (-100.0)), 100.0)
    O(i27, i28) = (-Y(i27))
    Y(i29) max=! (-3) where i29 in 0:L
}
"""  # fuzzer pair 3601011155 (cpu): O came out -inf


def test_a_reduction_beside_a_conditional_initialisation_is_not_reordered() -> None:
    """`Max` fusion puts Y's initialisation (under `c0 == 0 && c1 == 0 && c2 == 0`, at
    `Y[c4]`) and its update (`Y[c0 + c2]`) in one loop; GCC 12.2's loop distribution at
    -O3 moved the update past the initialisation and O read +inf. The C is right (-O2
    gives the reference's result); `runtime.cpu.GCC_FLAGS` turns the distribution off."""
    opts = options(
        outer_schedule_fusion=Fusion.MAX,
        intra_tile_schedule_fusion=Fusion.MAX,
        fix_parameters_before_scheduling=False,
        tile=(4,),
        interchange=(1, 2, 0),
        pack_operands=True,
        parallel=False,
    )
    rng = np.random.default_rng(3)
    for size in (1, 3, 6):
        b = rng.standard_normal((size, size)).astype(np.float32)
        acc = rng.integers(-5, 6, size=(size, size)).astype(np.int32)
        assert_same(*run_both(REINITIALISED, "f", (b, acc), "cpu", opts))


# --- a fresh register block around a parallel loop -------------------------------------

FRESH_AROUND_PARALLEL = """
def f(float16(P) O, int32(Q) V) -> (U, C, tmp) {
    U(w, r) max=! min(max((V(w) * V(w)), (-9)), 9) where r in 0:P-1
    C(kw) +=! ((-1.0) + V(s)) where kw in 0:Q
    tmp(m, c) = min(max(((min(U(2, c), C(m)) - (-V(m))) * (-floor(V(m)))), (-3.0)), 3.0)
    U(n, b) max= int32(C(2*b + i)) where i in 0:1
    C(k) min=! min(max((-3), (-9.0)), 9.0)
}
"""  # fuzzer pair 6912020930 (cpu): tmp came out NaN


def test_a_fresh_block_with_a_parallel_loop_inside_keeps_its_initialisation() -> None:
    """Tiles of 17 x 32 put C's worksharing loop inside its register block of 3 x 3,
    which the parallel region prints as plain loops (`codegen.region`): the block,
    marked fresh, had its initialisation left out and the loops read C unset. The
    region raises `UnprintedBlock` there too, and the kernel is printed again without
    fresh blocks."""
    opts = MappingOptions.cpu().replace(
        outer_schedule_fusion=Fusion.MIN,
        intra_tile_schedule_fusion=Fusion.MAX,
        allow_skewing=True,
        positive_orthant=False,
        tile=(17, 32),
        unroll=8,
        fuse_rows=False,
        online_tile=2,
        threads=1,
    )
    rng = np.random.default_rng(6)
    o = rng.standard_normal(5).astype(np.float16)
    v = rng.integers(-4, 5, size=3).astype(np.int32)
    cpu, _ = engines("cpu", FRESH_AROUND_PARALLEL, quiet=True)
    text = cpu.compile("f", o, v, options=opts).source
    assert "C(kw) +=! ((-1.0) + V(s)) where kw in 0:Q  [initialisation] */" in text, text
    assert_same(*run_both(FRESH_AROUND_PARALLEL, "f", (o, v), "cpu", opts))


# --- a scalar temporary's buffer -------------------------------------------------------

SCALAR_SCRATCH = """
def f(float16(3, P) Y, float16 O) -> (LUT, C) {
    LUT(b, malloc, main) +=! (0 - 3) where b in 0:P, malloc in 0:P-1, main in 0:P-1
    size_t max=! min(max(LUT(d, d, m), (-3.0)), 3.0)
    size_t = O
    C(fminf) = ((3.0 * size_t) - float16(LUT(fminf, fminf, fminf)))
}
"""  # fuzzer pair 5401016374 (cpu): ValueError laying out the thread's buffers


def test_a_scalar_temporary_in_a_threads_buffer_has_a_box_of_no_extents() -> None:
    """A scalar temporary kept in a thread's buffer (`scratch:`) has a box of rank 0:
    its copy's extents (`PackedBox.held`, rounded up to whole phases) are none, not an
    unpacking error."""
    opts = options(
        allow_skewing=True,
        positive_orthant=False,
        intra_tile_schedule_fusion=Fusion.MAX,
        tile=(7, 2, 64),
        unroll=1,
        register_tile=(1,),
        vectorize=False,
        parallel=True,
        threads=1,
    )
    rng = np.random.default_rng(5)
    y = rng.standard_normal((3, 13)).astype(np.float16)
    o = np.float16(0.75)
    assert_same(*run_both(SCALAR_SCRATCH, "f", (y, o), "cpu", opts))
