"""Row kernels on `cuda-emu` (`tcpy.mapping.gpu.rows`), with the emulator's race and
bounds checks on, against `reference`: a pipeline fused over its rows runs in one
kernel, one warp per row, its temporaries in shared memory. Rows the block does not
divide, rows shorter and longer than the lanes, two row indices, each reduction
operator and type, shared memory off, the options that fix the block, and the nests
left to the other mappings."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tcpy
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_cuda

from differential import run_against_reference
from programs import LAYERNORM, SOFTMAX  # SOFTMAX: `expDist`, a row-sized temporary


def _run(source: str, *inputs: np.ndarray, options: MappingOptions | None = None):  # type: ignore[no-untyped-def]
    compiled, got, want = run_against_reference(
        "cuda-emu", source, *inputs, options=options, emu_check=True
    )
    return got, want, compiled.source


def _kernels(source: str) -> int:
    return source.count("__global__")


def _stored(source: str, tensor: str) -> bool:
    """Whether the kernels write `tensor` to global memory."""
    return f"TC_ST(t_{tensor}," in source


@pytest.mark.parametrize("shape", [(37, 100), (8, 32), (3, 33), (70, 256), (2, 64)])
def test_softmax_runs_in_one_kernel(shape: tuple[int, int]) -> None:
    """37 rows: no block divides them; 32 and 33: one lane with one or two values."""
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got, want, text = _run(SOFTMAX, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _kernels(text) == 1
    assert "__syncwarp();" in text and "__shfl_xor_sync" in text
    for temporary in ("maxVal", "expDist", "expSum"):
        assert not _stored(text, temporary)
    assert text.count("TC_LD(t_I,") == 1  # the input's rows copied in once, then reread


@pytest.mark.parametrize("shape", [(37, 100), (130, 64)])
def test_layernorm_runs_in_one_kernel(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    g, b = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    got, want, text = _run(LAYERNORM, x, g, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert _kernels(text) == 1
    assert not _stored(text, "mean") and not _stored(text, "var")


def test_rows_of_a_block_share_the_operand_they_all_read() -> None:
    """With several rows a block (threadIdx.y), `g` and `b` are copied once for all."""
    cdef = check_source(LAYERNORM)["layernorm"]
    lowered = lower_to_cuda(cdef, {"N": 2048, "D": 1024}, cuda_defaults(cdef))
    (kernel,) = lowered.mapping.kernels
    # 8 rows a block would make 256 blocks, under two waves of an H100's 132 SMs
    assert kernel.block == (32, 4) and kernel.grid == (512,)
    copied = re.findall(r"TC_LD\(t_(\w+),", lowered.source)
    assert sorted(copied) == ["X", "b", "g"]


def test_two_row_indices_fold_into_the_grid() -> None:
    source = """def bsoftmax(float(B, N, D) I) -> (O) {
        m(b, n) max=! I(b, n, d)
        e(b, n, d) = exp(I(b, n, d) - m(b, n))
        s(b, n) +=! e(b, n, d)
        O(b, n, d) = e(b, n, d) / s(b, n)
    }"""
    data = np.random.default_rng(2).standard_normal((3, 5, 40)).astype(np.float32)
    got, want, text = _run(source, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _kernels(text) == 1 and "__syncwarp();" in text


@pytest.mark.parametrize(
    ("sizes", "rows", "blocks"),
    [
        # 2 x 384 rows: 8 a block would leave 96 blocks on an H100's 132 SMs (they did:
        # the blocks were counted with each member's extent against another's tile)
        ({"B": 2, "N": 384, "D": 768}, 4, 192),
        # 384 rows: the 4 rows a block its `g` and `b` ask for make 96 blocks, 2 make 192
        ({"B": 1, "N": 384, "D": 768}, 2, 192),
        # 8,192 rows: blocks enough with 8 rows each
        ({"B": 4, "N": 2048, "D": 768}, 8, 1024),
    ],
)
def test_a_row_band_of_two_members_fills_the_device(
    sizes: dict[str, int], rows: int, blocks: int
) -> None:
    source = LAYERNORM.replace("(N, D) X", "(B, N, D) X").replace("(n", "(i, n")
    (cdef,) = check_source(source).values()
    (kernel,) = lower_to_cuda(cdef, sizes, cuda_defaults(cdef)).mapping.kernels
    assert kernel.block == (32, rows) and math.prod(kernel.grid) == blocks


@pytest.mark.parametrize(
    ("dtype", "op"),
    [("int32", "max"), ("int32", "min"), ("int64", "+"), ("double", "+"), ("float", "*")],
)
def test_each_reduction_of_a_row(dtype: str, op: str) -> None:
    """A reduction of the row, then every element scaled by it: the lanes reduce, lane 0
    writes the result, all lanes read it after the warp meets."""
    source = f"""def f({dtype}(N, D) X) -> (O) {{
        r(n) {op}=! X(n, d)
        O(n, d) = X(n, d) + r(n)
    }}"""
    rng = np.random.default_rng(3)
    np_type = {"int32": np.int32, "int64": np.int64, "double": np.float64, "float": np.float32}
    if dtype.startswith("int"):
        data = rng.integers(-50, 50, (19, 45)).astype(np_type[dtype])
    else:
        data = (rng.random((19, 45)) * 0.2 + 0.9).astype(np_type[dtype])  # products stay finite
    got, want, text = _run(source, data)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert _kernels(text) == 1 and "__shfl_xor_sync" in text


def test_without_shared_memory_the_temporaries_stay_in_global_memory() -> None:
    data = np.random.default_rng(4).standard_normal((21, 70)).astype(np.float32)
    options = cuda_defaults(check_source(SOFTMAX)["softmax"]).replace(use_shared_memory=False)
    got, want, text = _run(SOFTMAX, data, options=options)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _kernels(text) == 1 and "TC_SST(tc_" not in text
    assert _stored(text, "expDist")


def test_the_options_block_sets_the_rows_of_a_block() -> None:
    cdef = check_source(SOFTMAX)["softmax"]
    options = cuda_defaults(cdef).replace(map_to_threads=(32, 2))
    lowered = lower_to_cuda(cdef, {"N": 9, "D": 64}, options, check=True)
    assert [k.block for k in lowered.mapping.kernels] == [(32, 2)]
    data = np.random.default_rng(5).standard_normal((9, 64)).astype(np.float32)
    got, want, _ = _run(SOFTMAX, data, options=options)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_temporary_read_before_it_is_written_keeps_global_memory() -> None:
    """`t` accumulates without `!` into the zeros a temporary starts from: a slice of
    shared memory would start from garbage, so `t` is not placed there."""
    source = """def f(float(N, D) X) -> (O) {
        t(n) += X(n, d)
        O(n, d) = X(n, d) * t(n)
    }"""
    data = np.random.default_rng(6).standard_normal((10, 40)).astype(np.float32)
    with pytest.warns(tcpy.TCWarning, match="not initialised"):
        got, want, text = _run(source, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _stored(text, "t")


def test_lanes_walking_a_column_read_it_from_shared_memory() -> None:
    """The reduction walks a column: the lanes read it from the block's copy in shared
    memory (copied row by row, coalesced), never across global memory."""
    source = "def f(float(N, D) X) -> (O) { c(d) +=! X(n, d)\n O(n, d) = X(n, d) / c(d) }"
    data = (np.random.default_rng(7).random((40, 48)) + 0.5).astype(np.float32)
    got, want, text = _run(source, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _kernels(text) == 1 and "__syncwarp" in text
    assert text.count("TC_LD(t_X,") == 1  # in the copy alone


def test_rows_shorter_than_a_warp_leave_lanes_idle() -> None:
    """Rows of 20: lanes 20 to 31 run no statement but reach every `__syncwarp()` and
    shuffle (their guard is sunk to the statements)."""
    data = (np.random.default_rng(7).random((12, 20)) + 0.5).astype(np.float32)
    got, want, text = _run(SOFTMAX, data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert _kernels(text) == 1 and "__shfl_xor_sync" in text


def test_half_rows_read_twice_are_not_copied_but_rows_shared_are() -> None:
    """A bfloat16 softmax reads each row twice from global memory, a layernorm thrice
    (a copy would move 2 bytes a lane, no faster: it ran 1.3x slower on an H100); a
    row every row of the block reads (a layernorm's `g` and `b`) is still copied
    once per block."""
    import ml_dtypes

    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 64)).astype(ml_dtypes.bfloat16)
    got, want, text = _run(SOFTMAX.replace("float(", "bfloat16("), x)
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=2e-2, atol=1e-2)
    assert _kernels(text) == 1 and text.count("TC_LD(t_I,") == 2
    g, b = (rng.standard_normal(64).astype(ml_dtypes.bfloat16) for _ in range(2))
    got, want, text = _run(LAYERNORM.replace("float(", "bfloat16("), x, g, b)
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=5e-2, atol=5e-2)
    assert text.count("TC_LD(t_g,") == 1 and text.count("TC_LD(t_X,") == 3


def test_a_window_of_few_values_is_reduced_by_a_thread_not_a_warp() -> None:
    """A 2x2 max-pool in bfloat16 (its rounding to bfloat16 a statement of its own):
    a row kernel would put 2 of each warp's lanes on a window; a thread reduces its
    output's window itself, in one kernel (it ran 17x slower as a row kernel)."""
    import ml_dtypes

    source = """def pool(bfloat16(N,C,H,W) I) -> (O) {
        O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2
    }"""
    data = np.random.default_rng(10).standard_normal((2, 3, 8, 64)).astype(ml_dtypes.bfloat16)
    got, want, text = _run(source, data)
    np.testing.assert_array_equal(got, want)
    assert _kernels(text) == 1 and "__shfl" not in text and "__syncwarp" not in text


def test_the_cuda_default_fuses_only_pipelines_without_a_contraction() -> None:
    (mm,) = check_source("""def mm(float(M,K) A, float(K,N) B) -> (C, D) {
        C(m, n) +=! A(m, k) * B(k, n)
        D(m, n) = C(m, n) * 2
    }""").values()
    assert cuda_defaults(mm).outer_schedule_fusion is Fusion.MIN
    assert cuda_defaults(check_source(SOFTMAX)["softmax"]).outer_schedule_fusion is Fusion.MAX


@pytest.mark.parametrize("scalar", ["float", "float16"])
def test_a_reduction_that_leaves_lane_zero_out_runs_in_the_rows_order(scalar: str) -> None:
    """The product runs on lanes 1 to 19 and the seed and (in float16) the rounded
    store on lane 0: the warp still runs them in the row's order (isl would put the
    lane-0 statements of a lane filter in one branch, the product in another)."""
    source = f"""def f({scalar}(M, N) A) -> (O) {{
        O(m) = A(m, 0)
        O(m) *= A(m, n) where n in 1:N
    }}"""
    dtype = np.float32 if scalar == "float" else np.float16
    data = (np.random.default_rng(8).random((8, 20)) * 0.5 + 0.75).astype(dtype)
    got, want, text = _run(source, data)
    np.testing.assert_allclose(got, want, rtol=2e-3)
    assert _kernels(text) == 1 and "__shfl_xor_sync" in text


def test_statements_sharing_a_lane_guard_meet_between_them() -> None:
    """`T` on lanes 0-7 and `O` on lanes 0-7 share their guard, which isl puts around
    both; sunk to each statement, the warp meets between them, so `O` reads every
    lane's `T` (the emulator's race check would see it otherwise)."""
    source = """def g(float(R, J) X, float(J, E) V) -> (O, s) {
        T(r, j) = X(r, j) * 2
        s(r) +=! T(r, j)
        O(r, e) +=! T(r, j) * V(j, e)
        O(r, e) = O(r, e) + s(r)
    }"""
    rng = np.random.default_rng(9)
    x, v = (
        rng.standard_normal((12, 8), dtype=np.float32),
        rng.standard_normal((8, 8), dtype=np.float32),
    )
    got, want, text = _run(source, x, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert _kernels(text) == 1 and text.count("__syncwarp();") >= 3


def test_a_row_kernel_split_by_lane_is_mapped_again_without_rows() -> None:
    """`RowsOutOfStep` (a row kernel whose AST isl split by lane) maps the def again
    without row fusion, then without row kernels, and says so."""
    from tcpy.codegen.cuda import RowsOutOfStep
    from tcpy.pipeline import _in_step

    seen: list[MappingOptions] = []

    def lower(options: MappingOptions):  # type: ignore[no-untyped-def]
        seen.append(options)
        if options.reduce_across_threads:
            raise RowsOutOfStep("split")
        return lower_to_cuda(check_source(SOFTMAX)["softmax"], {"N": 4, "D": 40}, options)

    lowered = _in_step(lower, cuda_defaults(check_source(SOFTMAX)["softmax"]))
    assert [(o.fuse_rows, o.reduce_across_threads) for o in seen] == [
        (True, True),
        (False, True),
        (False, False),
    ]
    assert "split by lane" in lowered.fallbacks[0]
