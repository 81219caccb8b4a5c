"""The `cuda-emu` target (the generated CUDA run on the CPU) against `reference`:
every corpus program with the default CUDA options at its default and odd sizes, and
under option sets drawn by hypothesis: tile sizes, grid and block sizes smaller and
larger than the problem, each fusion strategy, unrolling, the read-only cache, shared
memory (copied by elements or by 16-byte vectors), a thread's outputs in registers
over thread tiles of every shape, fixed or parametric sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcpy
from tcpy.mapping.options import WARP_TILES, Fusion, MappingOptions

from corpus_cases import CASES, Case
from differential import CORPUS, check_corpus_case, corpus_params, engines
from programs import BATCH_MATMUL, CONV, GATHER, MATMUL, renamed


@pytest.mark.parametrize(("case", "sizes"), corpus_params())
def test_corpus_cuda_emu_default_options(case: Case, sizes: dict[str, int]) -> None:
    check_corpus_case("cuda-emu", case, sizes, None)


# Grids and blocks both smaller and larger than the loops they run; kept moderate, since
# the emulator runs every (block, thread) pair, idle or not.
grids = st.lists(st.sampled_from([1, 2, 3, 7, 32, 100]), max_size=3).map(tuple)
blocks = st.lists(st.sampled_from([1, 2, 4, 8, 32]), max_size=3).map(tuple)
options_strategy = st.builds(
    MappingOptions,
    outer_schedule_fusion=st.sampled_from(list(Fusion)),
    fix_parameters_before_scheduling=st.booleans(),
    tile=st.lists(st.sampled_from([0, 1, 2, 3, 4, 16, 32]), max_size=4).map(tuple),
    map_to_blocks=grids.filter(lambda g: np.prod(g) <= 4096),
    map_to_threads=blocks.filter(lambda b: np.prod(b) <= 256),
    unroll=st.sampled_from([1, 2, 4]),
    use_readonly_cache=st.booleans(),
    reduce_across_threads=st.booleans(),
    split_reductions=st.booleans(),
    use_shared_memory=st.booleans(),
    unroll_copy_shared=st.booleans(),
    copy_stages=st.sampled_from([1, 2, 3, 4]),
    use_tensor_cores=st.booleans(),
    warp_tile=st.sampled_from(WARP_TILES),
    input_precision=st.sampled_from(["ieee", "tf32x3"]),
    use_private_memory=st.booleans(),
    register_tile=st.lists(st.sampled_from([0, 1, 2, 3, 4, 8]), max_size=2).map(tuple),
    vectorize=st.booleans(),
    one_kernel=st.booleans(),
)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=options_strategy, which=st.integers(0, 2))
def test_corpus_cuda_emu_drawn_options(case: Case, options: MappingOptions, which: int) -> None:
    size_sets = (case.sizes, *case.odd_sizes)
    check_corpus_case("cuda-emu", case, size_sets[which % len(size_sets)], options)


THREAD_TILES = {
    "matmul": renamed(MATMUL, "f"),
    "batched": renamed(BATCH_MATMUL, "f"),
    "max": "def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) max=! A(m,k) + B(k,n) }",
    "integers": "def f(int32(M,K) A, int32(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
}


@pytest.mark.parametrize("name", sorted(THREAD_TILES))
@pytest.mark.parametrize("register_tile", [(), (8, 2), (3, 3), (0, 4)])
@pytest.mark.parametrize("sizes", [(64, 64, 64), (70, 33, 45)])
def test_a_threads_outputs_in_registers_match_the_reference(
    name: str, register_tile: tuple[int, ...], sizes: tuple[int, int, int]
) -> None:
    """Each thread's outputs kept in registers across the reduction (use_private_memory,
    on in the CUDA default), over thread tiles that do and do not divide the loops,
    with NaN among the inputs of max=, under the emulator's race and bounds checks."""
    m, k, n = sizes
    rng = np.random.default_rng(m + k + n)
    if name == "integers":
        inputs = [rng.integers(-50, 50, s).astype(np.int32) for s in ((m, k), (k, n))]
    elif name == "batched":
        inputs = [rng.standard_normal(s).astype(np.float32) for s in ((2, m, k), (2, k, n))]
    else:
        inputs = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n))]
    if name == "max":
        inputs[0][3, 5] = np.nan
    emu, reference = engines("cuda-emu", THREAD_TILES[name])
    options = MappingOptions.cuda().replace(register_tile=register_tile)
    compiled = emu.compile("f", *inputs, options=options)
    assert "tc_acc[" in compiled._kernel.source
    got, want = compiled(*inputs), reference.run("f", *inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


MLP = """def f(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = fmax(O(b, n) + bias(n), 0)
}"""

TRANSPOSED = "def f(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }"
LEFT_TRANSPOSED = "def f(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }"
BATCHED_TRANSPOSED = (
    "def f(float(B,K,M) X, float(B,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,k,m) * Y(b,k,n) }"
)

STEPPED = {  # def, input shapes, options changed on the CUDA defaults, vectors of A's copy
    "8x4": (THREAD_TILES["matmul"], ((128, 64), (64, 256)), {"register_tile": (8, 4)}, "float4"),
    "4x1": (THREAD_TILES["matmul"], ((64, 128), (128, 64)), {"register_tile": (4, 1)}, "float4"),
    "3 stages": (THREAD_TILES["matmul"], ((96, 96), (96, 64)), {"copy_stages": 3}, "float4"),
    "integers": (THREAD_TILES["integers"], ((64, 32), (32, 128)), {}, "int4"),
    "batched": (THREAD_TILES["batched"], ((2, 64, 32), (2, 32, 64)), {}, "float4"),
    "mlp": (MLP, ((256, 256), (512, 256), (512,)), {"reduce_across_threads": False}, "float4"),
    # A read along its rows' first dimension: its copy turned, rows along k
    "A^T B^T": (TRANSPOSED, ((64, 128), (128, 64)), {"reduce_across_threads": False}, "float4"),
    "A^T B": (LEFT_TRANSPOSED, ((64, 128), (64, 256)), {}, "float4"),
    "batched A^T": (BATCHED_TRANSPOSED, ((2, 32, 64), (2, 32, 64)), {}, "float4"),
}


@pytest.mark.parametrize("name", sorted(STEPPED))
def test_a_threads_steps_of_k_read_as_vectors_match_the_reference(name: str) -> None:
    """A thread tile takes 4 steps of k at a time (`ThreadRegisters.steps`), reading
    each of its rows of A (and of W, rows along k) at those 4 steps as one vector from
    the copy, whose rows hold an odd number of whole vectors; an operand whose values
    along k are not adjacent (B's column, at 4x1) is read element by element; `A(k,m)`
    is copied turned, its rows along k (`MappedKernel.turned`): right under the
    emulator's race and bounds checks, and with no bank conflict in the reads (a
    turned copy's 4-byte fills, a column of it each, meet some)."""
    source, shapes, changes, vector = STEPPED[name]
    rng = np.random.default_rng(len(name))
    if name == "integers":
        inputs = [rng.integers(-50, 50, s).astype(np.int32) for s in shapes]
    else:
        inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    emu, reference = engines("cuda-emu", source)
    compiled = emu.compile("f", *inputs, options=MappingOptions.cuda().replace(**changes))
    text = compiled._kernel.source
    assert "for (int tc_k = 0; tc_k <= " in text and "tc_k += 4) {" in text
    assert f"TC_SLDV({vector}, tc_shared0, tc_a)" in text
    got, want = compiled(*inputs), reference.run("f", *inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # a turned copy's buffer holds the tile's last dimension first (`tc_i1`, `tc_i2`)
    turned = "A^T" in name
    first = "tc_i2" if name.startswith("batched A") else "tc_i1"
    filled = re.search(r"(TC_CP_ASYNC|TC_SST)\(tc_shared0, [^;]*", text)
    assert filled is not None and (f"((int)({first}) * " in filled.group(0)) is turned
    if not turned:
        assert sum(launch["bank_conflicts"] for launch in compiled.profile(*inputs)) == 0


def test_gather_out_of_range_on_cuda_emu() -> None:
    e = tcpy.ExecutionEngine("cuda-emu")
    e.define(GATHER)
    with pytest.raises(tcpy.TCInputError, match="T is read at index 3 of its dimension 0"):
        e.g(np.ones((3, 2), np.float32), np.array([0, 3], np.int32))


CROSS = """def cross(float(N) A) -> (O, T) {
    T(i) = A(i) * 2.0
    O(i) = T(i) + T(N - 1 - i) where i in 0:N
}"""


@pytest.mark.parametrize("fusion", list(Fusion))
def test_dependences_across_threads_are_kernel_boundaries(fusion: Fusion) -> None:
    """O(i) reads T at another element than the thread that wrote it: whatever the
    fusion strategy, the two statements run as two kernels, in order."""
    from tcpy.parser import check_source
    from tcpy.pipeline import lower_to_cuda

    options = MappingOptions.cuda().replace(outer_schedule_fusion=fusion)
    (cdef,) = check_source(CROSS).values()
    lowered = lower_to_cuda(cdef, {"N": 100}, options, check=True)
    assert len(lowered.mapping.kernels) == 2
    emu = tcpy.ExecutionEngine("cuda-emu")
    emu.define(CROSS)
    a = np.arange(100, dtype=np.float32)
    o, t = emu.cross(a, options=options)
    np.testing.assert_array_equal(t, 2 * a)
    np.testing.assert_array_equal(o, 2 * a + 2 * a[::-1])


def test_fused_statements_share_their_thread() -> None:
    """Statements fused under one mapped band depend on each other only within an
    element, so without the lanes of a row kernel (`tcpy.mapping.gpu.rows`) one kernel
    runs them, each row in one thread, without barriers."""
    from tcpy.parser import check_source
    from tcpy.pipeline import lower_to_cuda

    source = (CORPUS / "softmax.tc").read_text()
    options = MappingOptions.cuda().replace(
        outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT, reduce_across_threads=False
    )
    cdef = check_source(source)["softmax"]
    lowered = lower_to_cuda(cdef, {"N": 64, "D": 48}, options, check=True)
    assert len(lowered.mapping.kernels) == 1
    assert "__syncthreads" not in lowered.source


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_cuda_emu_naive_preset(case: Case) -> None:
    """The naive preset (parametric sizes, Preserve3Coincident fusion, 32x8 threads), its
    grid cut to 32x32 blocks: the emulator runs every block, busy or idle."""
    check_corpus_case(
        "cuda-emu", case, case.sizes, MappingOptions.naive().replace(map_to_blocks=(32, 32))
    )


def test_emulator_runs_synchronising_kernels_block_by_block(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A kernel with __shared__ storage and __syncthreads(): each block reverses its
    slice through shared memory, which is only right if the barrier holds."""
    from tcpy.runtime import emulator

    source = """
extern "C" __global__ void tc_kernel_0(long long s_N, const float *__restrict__ t_A,
                                       float *__restrict__ t_O, int *tc_status) {
  __shared__ float tile[8];
  long long i = blockIdx.x * 8 + threadIdx.x;
  tile[threadIdx.x] = t_A[i];
  __syncthreads();
  t_O[i] = tile[7 - threadIdx.x];
}
"""
    params = [
        "long long s_N", "const float *__restrict__ t_A", "float *__restrict__ t_O",
        "int *tc_status",
    ]  # fmt: skip
    launcher = emulator.launcher(0, params, 1, source)
    library = emulator.build(source, launcher, tmp_path)
    kernels = emulator.EmulatedKernels(library, [((4, 1, 1), (8, 1, 1))])
    a = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    kernels([32], [a, out])
    np.testing.assert_array_equal(out, a.reshape(4, 8)[:, ::-1].ravel())


@pytest.mark.parametrize("sizes", [(2, 3, 10, 12, 5), (1, 8, 18, 18, 8)])
def test_a_convolutions_outputs_stay_in_registers_across_its_three_reduction_loops(
    sizes: tuple[int, int, int, int, int],
) -> None:
    """A convolution's thread keeps its outputs across c, kh and kw (three reduction
    loops), combining each in the order it was: the results are the reference's."""
    n, c, h, w, f = sizes
    rng = np.random.default_rng(h * w)
    image = rng.standard_normal((n, c, h, w)).astype(np.float32)
    filters = rng.standard_normal((f, c, 3, 3)).astype(np.float32)
    emu, reference = engines("cuda-emu", CONV)
    compiled = emu.compile("conv", image, filters)
    # 16 output rows over 8 threads along y: 2 outputs each; 8 rows: one each
    assert ("tc_acc[" in compiled._kernel.source) == (h - 2 > 8)
    np.testing.assert_allclose(
        compiled(image, filters), reference.conv(image, filters), rtol=1e-5, atol=1e-5
    )


def test_a_gathered_index_is_checked_before_a_narrow_kernel_narrows_it() -> None:
    """A kernel at small sizes does its index arithmetic in 32 bits; an int64 index
    read from a tensor is range-checked in 64 bits first, so 2^32 + 1 is an error, not
    element 1."""
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define("def g(float(N) A, int64(M) I) -> (O) { O(m) = A(I(m)) }")
    a = np.arange(8, dtype=np.float32)
    compiled = engine.compile("g", a, np.zeros(2, np.int64))
    assert "const int e_A_0" in compiled.source
    np.testing.assert_array_equal(engine.g(a, np.array([3, 1], np.int64)), [3, 1])
    with pytest.raises(tcpy.TCInputError, match="index 4294967297 of its dimension 0"):
        engine.g(a, np.array([0, 2**32 + 1], np.int64))
