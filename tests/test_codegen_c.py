"""Generated C: goldens of two small kernels (rewrite with `pytest --accept`), the
compiled code checked against the reference, and the printer's details."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy import pipeline
from tcpy.codegen.region import SHARING
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c

from differential import CORPUS, engines
from golden_util import check_golden
from programs import LAYERNORM, MATMUL, renamed

GOLDENS = {
    "matmul": (
        renamed(MATMUL, "matmul"),
        {"M": 64, "K": 48, "N": 80},
        MappingOptions.cpu().replace(register_tile=(4, 16)),  # not the machine's choice
    ),
    "softmax": (
        """def softmax(float(N, D) I) -> (O) {
            maxVal(n) max=! I(n, d)
            expDist(n, d) = exp(I(n, d) - maxVal(n))
            expSum(n) +=! expDist(n, d)
            O(n, d) = expDist(n, d) / expSum(n)
        }""",  # as written: the golden shows the source text, indentation and all
        {"N": 16, "D": 40},
        MappingOptions.cpu().replace(outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT),
    ),
}


def _lower(source: str, sizes: dict[str, int], options: MappingOptions):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(source).values()
    return lower_to_c(cdef, sizes, options, check=True)


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_golden_c(name: str, accept: bool) -> None:
    source, sizes, options = GOLDENS[name]
    text = _lower(source, sizes, options).source
    check_golden(f"c/{name}.c", _without_vector_math(text), accept)


def _without_vector_math(text: str) -> str:
    """`text` without the libmvec declarations and their guard, which depend on the
    machine's C library."""
    kept, guarded = [], False
    for line in text.splitlines():
        if line.startswith("#ifndef TC_CONSERVATIVE"):
            guarded = True
        elif guarded and line.startswith("#endif"):
            guarded = False
        elif not guarded and "__attribute__((simd" not in line:
            kept.append(line)
    return "\n".join(kept)


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_golden_kernels_compute_the_reference(name: str) -> None:
    source, sizes, options = GOLDENS[name]
    engine, reference = tcpy.ExecutionEngine("cpu"), tcpy.ExecutionEngine("reference")
    (entry,) = engine.define(source)
    reference.define(source)
    cdef = engine.checked(entry)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal([d.evaluate(sizes) for d in t.shape]).astype(np.float32)
              for t in cdef.inputs]  # fmt: skip
    got = engine.run(entry, *inputs, options=options)
    np.testing.assert_allclose(got, reference.run(entry, *inputs), rtol=1e-5, atol=1e-5)


def test_statement_comments_and_pragmas() -> None:
    source, sizes, options = GOLDENS["matmul"]
    text = _lower(source, sizes, options).source
    assert "/* C(m,n) +=! A(m,k) * B(k,n) */" in text
    # the blocks run each output's whole reduction: no initialisation (`fresh_blocks`)
    assert "[initialisation]" not in text
    unblocked = _lower(source, sizes, options.replace(register_tile=(0,))).source
    assert "/* C(m,n) +=! A(m,k) * B(k,n)  [initialisation] */" in unblocked
    assert "#pragma omp parallel num_threads(tc_threads)" in text
    assert f"#pragma omp for{SHARING}" in text
    assert "#pragma omp simd" in text
    for line in text.splitlines():
        if line.strip().startswith("for ("):
            condition = line.split(";")[1].strip()
            assert not condition.startswith("("), line  # OpenMP rejects (cond)


def test_reductions_keep_their_accumulator_in_a_register() -> None:
    text = _lower(
        "def rowsum(float(N, D) X) -> (S) { S(n) +=! X(n, d) }",
        {"N": 8, "D": 1000},
        MappingOptions.cpu(),
    ).source
    assert "#pragma omp simd reduction(+:tc_acc)" in text


def test_options_off_remove_pragmas() -> None:
    source, sizes, _ = GOLDENS["matmul"]
    options = MappingOptions.cpu().replace(parallel=False, vectorize=False, unroll=1)
    assert "#pragma GCC unroll" in _lower(source, sizes, options).source  # a block's rows
    text = _lower(source, sizes, options.replace(register_tile=(0,))).source
    assert "#pragma" not in text


def test_parametric_sizes_come_from_the_call() -> None:
    source, _, _ = GOLDENS["matmul"]
    options = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)
    text = _lower(source, {"M": 5, "K": 6, "N": 7}, options).source
    assert "const int64_t s_M = tc_sizes[0];" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        engine = tcpy.ExecutionEngine("cpu")
        engine.define(source)
    A = np.ones((5, 6), np.float32)
    B = np.ones((6, 7), np.float32)
    np.testing.assert_array_equal(engine.matmul(A, B, options=options), np.full((5, 7), 6.0))


def test_invariant_reads_are_hoisted_out_of_innermost_loops() -> None:
    source, sizes, options = GOLDENS["softmax"]  # fused: one loop over n, four over d
    lines = [ln.strip() for ln in _lower(source, sizes, options).source.splitlines()]
    (load,) = [k for k, ln in enumerate(lines) if ln.startswith("const float tc_h0 = ")]
    # maxVal lives in the thread's buffer of the row (`scratch:`), its row of one
    (buffer,) = [ln.split()[2] for ln in lines if ln.startswith("float *restrict tc_pack2 ")]
    assert f"{buffer}[" in lines[load]
    assert lines[load + 1] == "#pragma omp simd" and lines[load + 2].startswith("for (")
    assert "tc_h0" in lines[load + 3] and f"{buffer}[" not in lines[load + 3]


# found by the fuzzer (seed 5901017964): the second statement runs under a test of the
# loop around the innermost one (`if (c2 <= 2 && c4 == 0)`)
GUARDED_GATHER = """def f(int32(L, L) T, int32(L, M) static) -> (Z) {
    Z(ceild, false, c) *=! min(max((T(ceild, ceild) - static(false, 0)), (-1.0)), 1.0)
        where false in 0:L-1, c in 0:M-1
    Z(s, kw, fmaxf) = min((static(kw, s) - static(static(fmaxf, kw), s)), T(2*kw + 2, fmaxf))
}"""
GUARDED_GATHER_OPTIONS = {
    "outer_schedule_fusion": "Max",
    "intra_tile_schedule_fusion": "Max",
    "allow_skewing": True,
    "positive_orthant": True,
    "fix_parameters_before_scheduling": True,
    "tile": [2, 3, 1, 64],
    "unroll": 3,
    "interchange": [3, 1, 2, 0],
    "register_tile": [],
    "pack_operands": True,
    "map_to_blocks": [64, 64, 16],
    "map_to_threads": [32, 3],
    "reduce_across_threads": True,
    "split_reductions": True,
    "use_shared_memory": True,
    "use_private_memory": True,
    "unroll_copy_shared": False,
    "max_shared_memory": 0,
    "copy_stages": 1,
    "use_tensor_cores": True,
    "warp_tile": [16, 32],
    "input_precision": "tf32x3",
    "use_readonly_cache": True,
    "one_kernel": False,
    "shared_depth": 2,
    "private_depth": 2,
    "parallel": False,
    "vectorize": True,
    "fuse_rows": True,
    "fuse_epilogues": False,
    "online_tile": 0,
    "threads": 1,
}


def test_reads_of_a_statement_under_a_test_stay_under_it() -> None:
    """A statement that a test inside an innermost loop guards reads nothing before the
    loop: its gather's index, checked before the loop, was checked where the statement
    never runs (a fault on valid inputs), and its other reads were loaded outside the
    rows the test keeps them to."""
    engine, reference = engines("cpu", GUARDED_GATHER)
    options = MappingOptions.from_dict(GUARDED_GATHER_OPTIONS)
    rng = np.random.default_rng(1)
    t = rng.integers(-3, 4, (3, 3)).astype(np.int32)
    static = rng.integers(0, 3, (3, 6)).astype(np.int32)
    got = engine.run("f", t, static, options=options)
    np.testing.assert_array_equal(got, reference.run("f", t, static))
    text = engine.compile("f", t, static, options=options)._kernel.source
    hoisted = [ln for ln in text.splitlines() if re.match(r"\s*const \w+ tc_h\d+ = ", ln)]
    assert hoisted and not any("t_static[" in ln for ln in hoisted), hoisted


def test_temporaries_of_a_row_live_in_the_threads_buffers() -> None:
    """A fused softmax keeps maxVal, expDist and expSum in a buffer of each row: the
    temporaries are never read or written in memory."""
    source, sizes, options = GOLDENS["softmax"]
    text = _lower(source, sizes, options).source
    assert "scratch" not in text  # the mark is printed as buffers, not as a comment
    for temporary in ("maxVal", "expDist", "expSum"):
        assert f"t_{temporary}[" not in text


SCRATCH_CASES = {
    # every temporary lives and dies in its row
    "row": """def f(float(N, D) A) -> (O) {
        T(n, d) = A(n, d) * 2.0
        S(n) +=! T(n, d)
        O(n, d) = T(n, d) - S(n) + T(n, 0)
    }""",
    # U reads T across rows: T cannot be a row's
    "across": """def f(float(N, D) A) -> (O) {
        T(n, d) = A(n, d) + 1.0
        O(n, d) = T(n, d) + T(0, d)
    }""",
    # a gather of a temporary: its reads are not proven in a row's box
    "gather": """def f(float(N, D) A, int32(N) P) -> (O) {
        T(n, d) = A(n, d) * 3.0
        O(n, d) = T(n, d) + T(P(n), d)
    }""",
}


@pytest.mark.parametrize("name", sorted(SCRATCH_CASES))
@pytest.mark.parametrize("sizes", [(1, 1), (5, 7), (16, 33)])
def test_row_temporaries_match_the_reference(name: str, sizes: tuple[int, int]) -> None:
    source = SCRATCH_CASES[name]
    n, d = sizes
    rng = np.random.default_rng(n * 100 + d)
    inputs: list[np.ndarray] = [rng.standard_normal((n, d)).astype(np.float32)]
    if name == "gather":
        inputs.append(rng.integers(0, n, n).astype(np.int32))
    options = MappingOptions.cpu().replace(outer_schedule_fusion=Fusion.MAX)
    engine, reference = engines("cpu", source)
    got = engine.run("f", *inputs, options=options)
    np.testing.assert_allclose(got, reference.run("f", *inputs), rtol=1e-5, atol=1e-5)
    text = engine.compile("f", *inputs, options=options)._kernel.source
    if name == "row" and n > 1:
        assert "t_T[" not in text and "t_S[" not in text
    if name in ("across", "gather"):
        assert "t_T[" in text  # left in memory


def test_a_temporary_initialised_for_every_row_at_once_stays_in_memory() -> None:
    """Unparallelised with Max fusion, isl runs the initialisations of mx and lse for
    every row in the first iteration of the row loop: a buffer of one row per
    iteration would then leave every later row's running maximum stale."""
    source = (CORPUS / "cross_entropy.tc").read_text()
    options = MappingOptions(
        outer_schedule_fusion=Fusion.MAX,
        intra_tile_schedule_fusion=Fusion.MAX,
        fix_parameters_before_scheduling=True,
        parallel=False,
        vectorize=False,
    )
    rng = np.random.default_rng(7)
    X = rng.uniform(-3.0, 3.0, (16, 10)).astype(np.float32)
    label = rng.integers(0, 10, 16).astype(np.int32)
    engine, reference = engines("cpu", source)
    text = engine.compile("cross_entropy", X, label, options=options)._kernel.source
    assert "if (c0 == 0)" in text  # the schedule that exposed it
    assert "t_mx[" in text and "t_lse[" in text
    got = engine.run("cross_entropy", X, label, options=options)
    want = reference.run("cross_entropy", X, label)
    np.testing.assert_allclose(got, want, rtol=1e-5)


MLP = """def mlp(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""


def test_a_size_generic_contraction_shares_rows_and_columns_among_the_threads() -> None:
    """Compiled for any size, the MLP's rows tile is the full 256 rows: its worksharing
    loop would have one iteration for a batch of 256 but for the columns it shares out
    with it."""
    options = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)
    engine, reference = engines("cpu", MLP)
    rng = np.random.default_rng(3)
    for b, k, n in [(1, 1, 1), (5, 7, 9), (300, 40, 260)]:
        x = rng.standard_normal((b, k)).astype(np.float32)
        W = rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        got = engine.run("mlp", x, W, bias, options=options)
        want = reference.run("mlp", x, W, bias)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    text = engine.compile("mlp", x, W, bias, options=options)._kernel.source
    lines = [ln.strip() for ln in text.splitlines()]
    shared = [k for k, ln in enumerate(lines) if ln.startswith("#pragma omp for")]
    assert shared and all(lines[k] == f"#pragma omp for collapse(2){SHARING}" for k in shared)
    for k in shared:  # the two loops, directly nested, over the rows and the columns
        assert lines[k + 1].startswith("for (int64_t c0 = 0; c0 < s_B;")
        assert lines[k + 2].startswith("for (int64_t c1 = 0; c1 < s_N;")


SERIAL_ROWS = MappingOptions.cpu().replace(
    outer_schedule_fusion=Fusion.MAX,
    intra_tile_schedule_fusion=Fusion.MAX,
    tile=(1,),
    parallel=False,
    vectorize=False,
)
"""Options under which isl, left to itself, generates each statement of a softmax row
as a piece of its own, each with its own copy of the mark above them."""


@pytest.mark.parametrize("grouped", [True, False])
def test_a_row_split_into_pieces_shares_its_temporaries(
    grouped: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The statements of a row are generated as one piece (here isl splits them unless
    asked to group them); where they stay split (forced), the temporaries go back to
    memory: pieces that each lay out the thread's buffer would read one temporary where
    another was written."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))  # each way compiles its own
    if not grouped:
        build = pipeline.build_ast
        monkeypatch.setattr(pipeline, "build_ast", lambda *a, grouped=False: build(*a))
    source = (CORPUS / "softmax.tc").read_text()
    engine, reference = engines("cpu", source)
    x = np.random.default_rng(3).standard_normal((8, 33)).astype(np.float32)
    kernel = engine.compile("softmax", x, options=SERIAL_ROWS)
    assert ("t_maxVal[" in kernel.source) is not grouped
    got = kernel(x)
    np.testing.assert_allclose(got, reference.run("softmax", x), rtol=1e-5, atol=1e-7)


def test_a_read_of_a_tensor_the_loop_writes_stays_in_the_loop() -> None:
    """T(i, 0) does not depend on j, but the j loop writes T: the read stays."""
    source = "def f(float(N,M) A) -> (T, U) {\n T(i,j) = A(i,j) * 2.0\n U(i,j) = A(i,j) + T(i,0)\n}"
    options = MappingOptions.cpu().replace(outer_schedule_fusion=Fusion.MAX)
    text = _lower(source, {"N": 4, "M": 8}, options).source
    assert "tc_h" not in text
    engine, reference = engines("cpu", source)
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for got, want in zip(engine.run("f", a, options=options), reference.run("f", a), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


PIPELINES = {
    "softmax": (GOLDENS["softmax"][0], Fusion.MAX),
    "layernorm": (LAYERNORM, Fusion.MAX),
    "matmul": (GOLDENS["matmul"][0], Fusion.MIN),
    "mlp": (
        """def mlp(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
            O(b, n) +=! I(b, k) * W(n, k)
            O(b, n) = fmax(O(b, n) + bias(n), 0)
        }""",
        Fusion.MIN,
    ),
    "gelu": ("def gelu(float(N) X) -> (O) { O(n) = 0.5 * X(n) * (1.0 + tanh(X(n))) }", Fusion.MIN),
}


def test_a_guarded_read_stays_under_its_guard() -> None:
    """Found by hypothesis: `I(.., h + kh - 1, ..)` is read only where the `?:` guard
    holds; hoisted above the loop it was read at h + kh - 1 = -1, and the bounds check
    reported an index out of range."""
    source = """def conv(float(N, C, H, W) I, float(F, C, 3, 3) W1) -> (O) {
        O(n, f, h, w) +=! (h + kh >= 1 && h + kh <= H && w + kw >= 1 && w + kw <= W)
            ? I(n, c, h + kh - 1, w + kw - 1) * W1(f, c, kh, kw) : 0.0
            where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    }"""
    options = MappingOptions(
        outer_schedule_fusion=Fusion.MIN, intra_tile_schedule_fusion=Fusion.MAX,
        tile=(0, 2), parallel=False, vectorize=False, positive_orthant=False,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    i = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    engine, reference = engines("cpu", source)
    got = engine.run("conv", i, w, options=options)
    np.testing.assert_allclose(got, reference.run("conv", i, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_the_cpu_target_fuses_pipelines_but_not_contractions(name: str) -> None:
    source, fusion = PIPELINES[name]
    engine = tcpy.ExecutionEngine("cpu")
    (entry,) = engine.define(source)
    assert engine.default_options(entry).outer_schedule_fusion is fusion


@pytest.mark.parametrize("dtype", ["float", "double"])
def test_fmin_and_fmax_are_inline_selects_with_cs_semantics(dtype: str) -> None:
    """C's fmin and fmax print as inline selects that GCC vectorises (libm's fmaxf is
    a call per element: an MLP's ReLU took a third of the layer), with C's meaning: a
    NaN operand gives the other operand, two NaNs a NaN; against the reference on
    every pair of special and ordinary values."""
    source = f"""def f({dtype}(N) A, {dtype}(N) B) -> (X, Y) {{
        X(i) = fmax(A(i), B(i))
        Y(i) = fmin(A(i), B(i))
    }}"""
    special = [np.nan, np.inf, -np.inf, 0.0, 1.5, -2.0, 3.0e38, -1e-40]
    a, b = (
        np.array(v, dtype=np.float32 if dtype == "float" else np.float64)
        for v in zip(*[(x, y) for x in special for y in special], strict=True)
    )
    cpu, reference = engines("cpu", source, quiet=True)
    compiled = cpu.compile("f", a, b)
    code = re.sub(r"/\*.*?\*/", "", compiled.source, flags=re.S)
    assert not re.search(r"\bf(max|min)f?\(", code)
    assert re.search(r"\btc_fmax_float(32|64)\(", code)
    got, want = compiled(a, b), reference.run("f", a, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_array_equal(g[~np.isnan(w)], w[~np.isnan(w)])
        assert np.isnan(g[np.isnan(a) & np.isnan(b)]).all()
        assert not np.isnan(g[np.isnan(a) != np.isnan(b)]).any()
