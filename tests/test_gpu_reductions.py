"""Reductions shared by several threads on `cuda-emu` (`tcpy.mapping.gpu`), with the
emulator's checks on, against `reference`. Over the lanes of a warp
(`reduce_across_threads`): each operator and type the shuffles move, NaN and
infinities, rows the block does not divide, a whole tensor reduced by one warp, and
the cases the mapping leaves alone. Split across blocks with atomics
(`split_reductions`): each operator and type with a native atomic, and the cases kept
whole (float max, the deterministic option)."""

from __future__ import annotations

import numpy as np
import pytest

from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_cuda

from differential import run_against_reference


def _run(source: str, *inputs: np.ndarray, options: MappingOptions | None = None):  # type: ignore[no-untyped-def]
    compiled, got, want = run_against_reference("cuda-emu", source, *inputs, options=options)
    return got, want, compiled.source


def _lanes(source: str) -> bool:
    return "__shfl_xor_sync" in source


@pytest.mark.parametrize("op", ["+", "*", "max", "min"])
@pytest.mark.parametrize("dtype", ["float", "double", "int32", "int64"])
def test_row_reductions_on_lanes(op: str, dtype: str) -> None:
    rng = np.random.default_rng(1)
    np_dtype = {"float": np.float32, "double": np.float64, "int32": np.int32, "int64": np.int64}
    shape = (37, 100)  # 37 rows: not a multiple of any block; 100: lanes run 3 or 4 values
    if dtype.startswith("int"):
        data = rng.integers(-3, 4, shape).astype(np_dtype[dtype])
    else:
        data = (rng.random(shape) + 0.5).astype(np_dtype[dtype])  # products stay finite
    source = f"def r({dtype}(N,D) I) -> (O) {{ O(n) {op}=! I(n,d) }}"
    got, want, text = _run(source, data)
    assert _lanes(text)
    if op == "*" and dtype.startswith("int"):
        np.testing.assert_array_equal(got, want)  # wraps the same way in any order
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("op", ["max", "min", "+"])
def test_nan_and_infinities_reach_the_result(op: str) -> None:
    data = np.ones((6, 64), np.float32)
    data[1, 17] = np.nan  # one lane's value: every other lane must take it up
    data[2, :] = -np.inf
    data[3, :] = np.inf
    data[4, 40] = np.nan
    data[4, 41] = np.inf
    got, want, text = _run(f"def r(float(N,D) I) -> (O) {{ O(n) {op}=! I(n,d) }}", data)
    assert _lanes(text)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[1]) and np.isnan(got[4])


def test_a_whole_tensor_reduced_by_one_warp() -> None:
    data = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    got, want, text = _run("def total(float(N) A) -> (s) { s +=! A(i) }", data)
    assert _lanes(text)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_reduction_that_updates_runs_into_the_current_value() -> None:
    """`+=` without `!`: the warp's total is added to what the output holds."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((9, 70)).astype(np.float32)
    source = "def f(float(N,D) X) -> (O) { O(n) = 1.5 where n in 0:N\n O(n) += X(n,d) }"
    got, want, text = _run(source, X)
    assert _lanes(text)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("source", "sizes", "why"),
    [
        ("def r(float(N,D) I) -> (O) { O(n) +=! I(n,d) }", {"N": 8, "D": 20}, "under a warp"),
        ("def c(float(B,N) I) -> (O) { O(n) +=! I(b,n) }", {"B": 64, "N": 64}, "coalesced"),
    ],
)  # fmt: skip
def test_reductions_the_mapping_keeps_in_one_thread(
    source: str, sizes: dict[str, int], why: str
) -> None:
    (cdef,) = check_source(source).values()
    lowered = lower_to_cuda(cdef, sizes, MappingOptions.cuda(), check=True)
    assert not _lanes(lowered.source), why


def test_a_guarded_operand_inside_the_lanes_loop() -> None:
    """A running sum (`j <= i ? A(j) : 0`): each lane's loop evaluates the guard."""
    A = np.random.default_rng(5).standard_normal(77).astype(np.float32)
    source = "def cs(float(N) A) -> (O) { O(i) +=! j <= i ? A(j) : 0.0 where i in 0:N }"
    got, want, text = _run(source, A)
    assert _lanes(text)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_option_turns_lanes_off_and_both_agree() -> None:
    data = np.random.default_rng(4).standard_normal((40, 96)).astype(np.float32)
    source = "def r(float(N,D) I) -> (O) { O(n) max=! I(n,d) }"
    off = MappingOptions.cuda().replace(reduce_across_threads=False)
    got_on, want, text_on = _run(source, data)
    got_off, _, text_off = _run(source, data, options=off)
    assert _lanes(text_on) and not _lanes(text_off)
    np.testing.assert_array_equal(got_on, want)
    np.testing.assert_array_equal(got_off, want)


# --- reductions split across blocks (split_reductions) -----------------------------------


@pytest.mark.parametrize(
    ("op", "dtype"), [("+", "float"), ("+", "double"), ("+", "int32"), ("max", "int32"),
                      ("min", "int32")],
)  # fmt: skip
def test_a_long_reduction_over_few_columns_is_split_across_blocks(op: str, dtype: str) -> None:
    """512 rows, 64 columns: 2 blocks of columns would leave an H100 idle; 8 blocks of
    64 rows each add their partial results with an atomic."""
    rng = np.random.default_rng(6)
    np_dtype = {"float": np.float32, "double": np.float64, "int32": np.int32}[dtype]
    data = rng.integers(-50, 50, (512, 64)).astype(np_dtype)  # exact sums in any order
    source = f"def g({dtype}(B,N) I) -> (O) {{ O(n) {op}=! I(b,n) }}"
    got, want, text = _run(source, data)
    atomic = {"+": "atomicAdd", "max": "atomicMax", "min": "atomicMin"}[op]
    assert f"{atomic}(TC_AT(t_O, " in text
    (cdef,) = check_source(source).values()
    update = lower_to_cuda(cdef, {"B": 512, "N": 64}, MappingOptions.cuda()).mapping.kernels[1]
    assert (update.grid, update.block) == ((2, 8), (32,))  # 8 chunks of 64 rows
    np.testing.assert_array_equal(got, want)


def test_float_max_and_deterministic_results_are_not_split() -> None:
    data = np.random.default_rng(7).standard_normal((512, 64)).astype(np.float32)
    data[100, 3] = np.nan
    got, want, text = _run("def g(float(B,N) I) -> (O) { O(n) max=! I(b,n) }", data)
    assert "atomic" not in text  # CUDA has no float atomicMax, which would lose NaN
    np.testing.assert_array_equal(got, want)
    source = "def g(float(B,N) I) -> (O) { O(n) +=! I(b,n) }"
    fixed = MappingOptions.cuda().replace(split_reductions=False)
    got, want, text = _run(source, data, options=fixed)
    assert "atomic" not in text
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- reductions over a small window, whole in each thread ---------------------------------

MAXPOOL = """def maxpool(float(N,C,H,W) I) -> (O) {
    O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
}"""


def test_a_window_reduction_starts_in_registers_in_one_launch() -> None:
    """A max-pool's outputs start at the identity in each thread's registers and are
    stored once, in one launch: O is never loaded, each of its sectors stored once,
    I's loaded once (through shared memory, coalesced). Before, O was set to -inf by a
    launch of its own and the reduction's launch loaded it back."""
    x = np.random.default_rng(3).standard_normal((2, 8, 32, 32), dtype=np.float32)
    compiled, got, want = run_against_reference("cuda-emu", MAXPOOL, x)
    np.testing.assert_array_equal(got, want)
    assert compiled.source.count("__global__") == 1
    assert "tc_acc[tc_j] = (-1.0f / 0.0f);" in compiled.source
    (launch,) = compiled.profile(x)
    assert launch["distinct_load_sectors"] * 32 == x.nbytes  # I alone
    assert launch["distinct_store_sectors"] * 32 == got.nbytes
    assert launch["global_store_bytes"] == got.nbytes


@pytest.mark.parametrize(
    "source",
    [
        MAXPOOL,
        # a window whose last output lacks some values, and a sum into a float
        """def f(float(N,W) I) -> (O) { O(n,w) +=! I(n,w+k) where w in 0:W-2, k in 0:3 }""",
    ],
)
def test_window_reductions_at_odd_sizes(source: str) -> None:
    rng = np.random.default_rng(4)
    shape = (1, 3, 7, 9) if "maxpool" in source else (5, 37)
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[3] = np.nan  # the max's NaN reaches its output
    compiled, got, want = run_against_reference("cuda-emu", source, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)
    assert np.isnan(got).any()
    assert compiled.source.count("__global__") == 1


def test_which_defs_fuse_their_initialisation() -> None:
    """`Max` outer fusion for reductions over small windows of constant extent alone;
    a reduction over a size (it may be split across blocks, with its output zeroed
    apart) and a contraction keep `Min`."""
    from tcpy.mapping.gpu.strategy import cuda_defaults
    from tcpy.mapping.options import Fusion

    def fusion(src: str) -> Fusion:
        (cdef,) = check_source(src).values()
        return cuda_defaults(cdef).outer_schedule_fusion

    assert fusion(MAXPOOL) is Fusion.MAX
    assert fusion("def f(float(B,N) G) -> (O) { O(n) +=! G(b,n) }") is Fusion.MIN
    big = "def f(float(N,W) I) -> (O) { O(n,w) +=! I(n,w+k) where w in 0:W-99, k in 0:100 }"
    assert fusion(big) is Fusion.MIN
    mm = "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
    assert fusion(mm) is Fusion.MIN
