"""Generated CUDA: every corpus program compiles with NVRTC for sm_80 and sm_90, and
goldens of a mapped matmul and a softmax (rewrite with `pytest --accept`)."""

from __future__ import annotations

import re
import warnings

import pytest

import tcpy
from tcpy.mapping.gpu import cuda_defaults
from tcpy.mapping.gpu.device import DeviceProfile, named
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import nvrtc

from corpus_cases import CASES, Case
from differential import CORPUS
from golden_util import check_golden
from programs import BATCH_MATMUL, CONV, MATMUL, renamed

PLAIN = MappingOptions.cuda().replace(use_shared_memory=False)
"""The CUDA default without shared memory: one element per thread, blocks narrowed
until the grid fills the device."""
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (the cuda extra)")


def _lower(source: str, entry: str, sizes: dict[str, int], options: MappingOptions,  # type: ignore[no-untyped-def]
           device: DeviceProfile | None = None):  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(source)[entry]
    return lower_to_cuda(cdef, sizes, options, check=True, device=device or named("h100"))


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_compiles_with_nvrtc(case: Case) -> None:
    source = (CORPUS / case.file).read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(source)[case.entry]
    fixed = _lower(source, case.entry, case.sizes, cuda_defaults(cdef))  # row kernels too
    parametric = _lower(
        source, case.entry, case.sizes, MappingOptions.naive().replace(use_readonly_cache=True)
    )
    for lowered in (fixed, parametric):
        for arch in ("sm_80", "sm_90"):
            assert nvrtc.compile_cubin(lowered.source, arch)[:4] == b"\x7fELF"


GOLDENS = {
    "matmul": (
        renamed(MATMUL, "matmul"),
        "matmul",
        {"M": 64, "K": 48, "N": 80},
    ),
    "softmax": (
        """def softmax(float(N, D) I) -> (O) {
            maxVal(n) max=! I(n, d)
            expDist(n, d) = exp(I(n, d) - maxVal(n))
            expSum(n) +=! expDist(n, d)
            O(n, d) = expDist(n, d) / expSum(n)
        }""",
        "softmax",
        {"N": 16, "D": 40},
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_golden_cuda(name: str, accept: bool) -> None:
    """The CUDA default of each: the promoted matmul, the one-kernel softmax."""
    source, entry, sizes = GOLDENS[name]
    lowered = _lower(source, entry, sizes, cuda_defaults(check_source(source)[entry]))
    check_golden(f"cuda/{name}.cu", lowered.source, accept)


def test_mapping_puts_the_unit_stride_loop_on_threadidx_x() -> None:
    source, entry, sizes = GOLDENS["matmul"]
    lowered = _lower(source, entry, sizes, PLAIN)
    _init, product = lowered.mapping.kernels
    # 32x8 threads would make 3 x 8 blocks; the block's y halves while the grid is
    # under two waves of an H100's 132 SMs, down to one warp: 3 x 64 blocks
    assert product.block == (32, 1) and product.grid == (3, 64)
    text = lowered.source.split("tc_kernel_1")[1]
    # n (the last subscript of C and B) is the thread x loop: coalesced accesses
    assert "TC_LD(t_B, ((int)(c4) * e_B_1 + ((32 * (int)blockIdx.x) + (int)threadIdx.x)))" in text
    assert "tc_acc = tc_acc + " in text  # the reduction runs innermost, in a register


def test_a_large_grid_keeps_full_blocks() -> None:
    source, entry, _ = GOLDENS["matmul"]
    lowered = _lower(source, entry, {"M": 512, "K": 8, "N": 256}, PLAIN)
    assert [(k.grid, k.block) for k in lowered.mapping.kernels] == [((8, 64), (32, 8))] * 2


def test_the_device_profile_sizes_the_grid() -> None:
    """64 x 256 outputs: 32x8 threads make 8 x 8 blocks; two waves of an L4 (58 SMs)
    need 116 blocks, of an H100 (132 SMs) 264."""
    source, entry, _ = GOLDENS["matmul"]
    sizes = {"M": 64, "K": 8, "N": 256}
    grids = {
        name: _lower(source, entry, sizes, PLAIN, named(name)).mapping.kernels[1]
        for name in ("l4", "h100")
    }
    assert (grids["l4"].grid, grids["l4"].block) == ((8, 16), (32, 4))
    assert (grids["h100"].grid, grids["h100"].block) == ((8, 64), (32, 1))


def test_every_parallel_loop_is_on_the_grid_folded_beyond_two() -> None:
    sizes = {"N": 8, "C": 3, "H": 34, "W": 66, "F": 5, "KH": 3, "KW": 3}
    lowered = _lower(CONV, "conv", sizes, PLAIN)
    update = lowered.mapping.kernels[1]
    # w (64 outputs, unit stride) on x, h (32) on y, then f and n folded into z
    assert update.block == (32, 8) and update.grid == (2, 4, 5, 8)
    assert update.launch_dims() == ((2, 4, 40), (32, 8, 1))
    text = lowered.source.split("tc_kernel_1")[1]
    assert "(blockIdx.z % 5u)" in text and "(blockIdx.z / 5u)" in text
    assert "e_O_3 + ((32 * (int)blockIdx.x) + (int)threadIdx.x)" in text


def test_shared_memory_tiles_of_a_matmul() -> None:
    """32x8 threads compute a 32x32 tile of C, 4 outputs each; A's 32x64 and B's
    64x32 tiles are copied once per 64 values of k, between two barriers, and read
    from shared memory; synchronously, with one stage. B's rows of 32, whose columns
    the threads walk, are padded to 33; A's rows of 64, which each thread reads 4
    values of k at a time as one float4, to 68 (whole vectors, an odd number of them)."""
    source, entry, _ = GOLDENS["matmul"]
    options = MappingOptions.cuda().replace(copy_stages=1)
    lowered = _lower(source, entry, {"M": 128, "K": 256, "N": 96}, options)
    update = lowered.mapping.kernels[1]
    assert (update.grid, update.block) == ((3, 4), (32, 8))
    text = lowered.source.split("tc_kernel_1")[1]
    assert "__shared__ __align__(16) float tc_shared0[2176];" in text  # A: 32 x (64 + 4)
    assert "__shared__ __align__(16) float tc_shared1[2112];" in text  # B: 64 x (32 + 1)
    assert text.count("__syncthreads();") == 2
    assert "TC_LD(t_A" not in text.split("__syncthreads();")[2]  # reads after the copy
    assert "TC_SLD(tc_shared0" in text and "TC_SLD(tc_shared1" in text


@pytest.mark.parametrize(
    ("register_tile", "tile", "outputs", "runs"),
    [((), (32, 32), 4, 1), ((8, 2), (64, 64), 16, 2), ((2, 4), (16, 128), 8, 4)],
)
def test_a_threads_outputs_stay_in_registers_across_the_reduction(
    register_tile: tuple[int, ...], tile: tuple[int, int], outputs: int, runs: int
) -> None:
    """With use_private_memory (the CUDA default) each thread's outputs live in a
    register array across k, every step of which combines all of them; register_tile
    gives how many it computes along y and x (the block's tile is 32x8 times that).
    Two or four along x are adjacent (`runs`): loaded, stored and read from B's copy
    as one float2 or float4."""
    source, entry, _ = GOLDENS["matmul"]
    options = MappingOptions.cuda().replace(register_tile=register_tile)
    lowered = _lower(source, entry, {"M": 128, "K": 256, "N": 128}, options)
    update = lowered.mapping.kernels[1]
    assert update.block == (32, 8)
    assert update.grid == (128 // tile[1], 128 // tile[0])
    text = lowered.source.split("tc_kernel_1")[1]
    assert update.runs == runs
    assert f"float tc_acc[{outputs}];" in text
    loads_and_stores = f"for (int tc_q = 0; tc_q < {outputs}; tc_q += {runs}) {{"
    assert text.count(loads_and_stores) == (2 if runs > 1 else 0)
    assert text.count(f"for (int tc_j = 0; tc_j < {outputs}; tc_j++) {{") == (1 if runs > 1 else 3)
    if runs > 1:
        vector = f"float{runs}"
        assert f"TC_LDV({vector}, t_C" in text and f"TC_STV({vector}, t_C" in text
        assert f"TC_SLDV({vector}, tc_shared1" in text
    after = text.split("__syncthreads();")[2]
    assert re.search(r"if \(c\d", after) is None  # the block divides the tile: no guard
    plain = _lower(source, entry, {"M": 128, "K": 256, "N": 128},
                   options.replace(use_private_memory=False)).source  # fmt: skip
    assert "tc_acc[" not in plain


@pytest.mark.parametrize(("register_tile", "outputs"), [((), 4), ((8, 2), 16), ((4, 4), 16)])
def test_the_mapping_decides_a_threads_register_tile_on_its_mark(
    register_tile: tuple[int, ...], outputs: int
) -> None:
    """The outputs a thread keeps in registers are decided by the mapping and marked on
    its point loops (`thread_registers:<outputs>x<steps>`, the tile's outputs over the
    32x8 block's threads, and the steps of k it takes at a time: 4, k's tile being 64);
    codegen prints a register array of that many. Without use_private_memory there is
    no mark, and no register array."""
    source, entry, _ = GOLDENS["matmul"]
    sizes = {"M": 128, "K": 256, "N": 128}
    options = MappingOptions.cuda().replace(register_tile=register_tile)
    lowered = _lower(source, entry, sizes, options)
    tree = str(lowered.mapping.schedule)
    assert tree.count("thread_registers:") == 1
    assert f'"thread_registers:{outputs}x4"' in tree
    assert f"float tc_acc[{outputs}];" in lowered.source
    plain = _lower(source, entry, sizes, options.replace(use_private_memory=False))
    assert "thread_registers" not in str(plain.mapping.schedule)
    assert "tc_acc[" not in plain.source


@pytest.mark.parametrize(("n", "grid", "outputs"), [(1024, (32, 32), 4), (2048, (16, 32), 32)])
def test_the_default_thread_tile_is_larger_where_the_grid_still_fills_the_device(
    n: int, grid: tuple[int, int], outputs: int
) -> None:
    """64x128 tiles of 8x4 outputs per thread where they still give the H100 two blocks
    per SM (2048^2: 512 blocks); at 1024^2 they would give 128, fewer than its 264, and
    the tiles stay 32x32, 4 outputs per thread."""
    source, entry, _ = GOLDENS["matmul"]
    lowered = _lower(source, entry, {"M": n, "K": 256, "N": n}, MappingOptions.cuda())
    assert lowered.mapping.kernels[1].grid == grid
    assert f"float tc_acc[{outputs}];" in lowered.source


@needs_nvrtc
def test_register_tiles_load_the_shared_operands_once_per_step() -> None:
    """In NVRTC's PTX, a 32x32 tile's shared loads per FMA go from 2 (each output
    loads both operands) to 0.5 (4 steps of k at a time: each of the thread's 4 rows
    of A read as one float4, one value of B per step, per 16 FMAs); with a thread
    tile of 8x2 to 0.1875 (8 float4s of A, B's two adjacent values as a float2 at
    each step, per 64 FMAs) and of 8x4 (the default at these sizes) to 0.09375
    (8 float4s of A and 4 of B per 128 FMAs). A step at a time (`vectorize` off, which
    also drops B's float2), the 8x2 tile takes 0.625 (8 values of A and 2 of B per
    16 FMAs)."""
    source, entry, _ = GOLDENS["matmul"]
    sizes = {"M": 1024, "K": 1024, "N": 1024}
    ratios = []
    cases = [(False, (), True), (True, (), True), (True, (8, 2), True), (True, (8, 4), True),
             (True, (8, 2), False)]  # fmt: skip
    for private, register_tile, vectorize in cases:
        options = MappingOptions.cuda().replace(
            use_private_memory=private, register_tile=register_tile, vectorize=vectorize
        )
        ptx = nvrtc.compile_ptx(_lower(source, entry, sizes, options).source, "compute_90")
        update = ptx.split(".entry tc_kernel_1")[1]
        ratios.append(update.count("ld.shared.") / update.count("fma.rn.f32"))
        if register_tile == (8, 4):
            assert update.count("ld.shared.") == update.count("ld.shared.v4.f32") == 12
    assert ratios == [2.0, 0.5, 0.1875, 0.09375, 0.625]


TRANSPOSED = "def mtt(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }"
BOTH_ALONG_K = "def abt(float(M,K) A, float(N,K) B) -> (C) { C(m,n) +=! A(m,k) * B(n,k) }"
LEFT_TRANSPOSED = "def atb(float(K,M) A, float(K,N) B) -> (C) { C(m,n) +=! A(k,m) * B(k,n) }"


@pytest.mark.parametrize(
    ("source", "entry", "k", "changes", "mark", "stepped", "turned"),
    [
        (GOLDENS["matmul"][0], "matmul", 256, {}, "4x4", ("A",), ()),
        (BOTH_ALONG_K, "abt", 256, {"reduce_across_threads": False}, "4x4", ("A", "B"), ()),
        (TRANSPOSED, "mtt", 256, {}, "4x4", ("A", "B"), ("A",)),
        (LEFT_TRANSPOSED, "atb", 256, {}, "4x4", ("A",), ("A",)),
        (GOLDENS["matmul"][0], "matmul", 256, {"vectorize": False}, "4", (), ()),
        (GOLDENS["matmul"][0], "matmul", 96, {"tile": (32, 32, 6)}, "4x2", ("A",), ()),
        (GOLDENS["matmul"][0], "matmul", 36, {}, "4x4", ("A",), ()),  # k's tile of 64 past K
        (GOLDENS["matmul"][0], "matmul", 100, {}, "4", (), ()),  # tiles of 64 do not divide K
        (GOLDENS["matmul"][0], "matmul", 90, {}, "4", (), ()),  # K, under the tile, no 4 or 2
    ],
)
def test_the_mapping_decides_the_steps_of_k_a_thread_takes_at_a_time(
    source: str,
    entry: str,
    k: int,
    changes: dict[str, object],
    mark: str,
    stepped: tuple[str, ...],
    turned: tuple[str, ...],
) -> None:
    """With `vectorize`, a thread tile takes 4 (or 2) steps of its innermost reduction
    loop at a time where the loop's bounds are constant (the tile divides the extent, or
    is the extent) and some operand is read along it in its last subscript, or in the
    one before with the thread's rows in its last (`A(k,m)`: its copy then turned, the
    copy's rows along k): the mark says how many (`thread_registers:<outputs>x<steps>`)
    and the kernel which operands (`MappedKernel.stepped`, `turned`), whose copies'
    rows hold whole vectors."""
    options = MappingOptions.cuda().replace(**changes)
    lowered = _lower(source, entry, {"M": 128, "K": k, "N": 128}, options)
    assert f'"thread_registers:{mark}"' in str(lowered.mapping.schedule)
    assert lowered.mapping.kernels[1].stepped == stepped
    assert lowered.mapping.kernels[1].turned == turned
    assert ("for (int tc_k = " in lowered.source) == bool(stepped)


def test_shared_memory_tiles_with_a_three_dimensional_block() -> None:
    """A block the options give along x, y and z (found by the fuzzer): the z member
    keeps one element per thread."""
    options = MappingOptions.cuda().replace(map_to_threads=(8, 32, 4))
    lowered = _lower(BATCH_MATMUL, "bmm", {"B": 4, "M": 5, "K": 7, "N": 9}, options)
    assert lowered.mapping.kernels[1].block == (8, 5, 4)
    assert "__shared__" in lowered.source


def test_launch_sizes_are_tightened() -> None:
    source, entry, _ = GOLDENS["matmul"]
    lowered = _lower(source, entry, {"M": 5, "K": 3, "N": 7}, MappingOptions.cuda())
    assert [(k.grid, k.block) for k in lowered.mapping.kernels] == [((1, 1), (7, 5))] * 2
    assert "__launch_bounds__(35)" in lowered.source


def test_nest_without_parallel_loop_runs_in_one_thread() -> None:
    lowered = _lower("def total(float(N) A) -> (s) { s +=! A(i) }", "total", {"N": 10},
                     MappingOptions.cuda())  # fmt: skip
    assert all(k.grid == () and k.block == () for k in lowered.mapping.kernels)
    assert "__launch_bounds__(1)" in lowered.source


def test_an_element_read_several_times_is_loaded_once() -> None:
    """gelu reads `X(n, d)` five times: one load into a local. A read under `?:` may be
    out of range when its condition is false, so it stays where it is, even repeated."""
    gelu = (
        "def gelu(float(N, D) X) -> (O) { O(n, d) = 0.5 * X(n, d) * (1.0 + tanh(0.79788 *"
        " (X(n, d) + 0.044715 * X(n, d) * X(n, d) * X(n, d)))) }"
    )
    source = _lower(gelu, "gelu", {"N": 8, "D": 64}, PLAIN).source
    assert source.count("TC_LD(t_X,") == 1 and "const float tc_v0 = TC_LD(t_X," in source
    shifted = (
        "def s(float(N) X) -> (O) { O(i) = i >= 1 ? X(i - 1) + X(i - 1) : X(i) + X(i)"
        " where i in 0:N }"
    )
    source = _lower(shifted, "s", {"N": 40}, PLAIN).source
    assert source.count("TC_LD(t_X,") == 4 and "tc_v0" not in source


MATMUL_1024 = {"M": 1024, "K": 1024, "N": 1024}


@pytest.mark.parametrize(
    ("source", "sizes", "fixed", "narrow"),
    [
        (GOLDENS["matmul"][0], MATMUL_1024, True, True),
        # 2^28 elements: a flat index within 8x of 2^31
        (GOLDENS["matmul"][0], {"M": 16384, "K": 16, "N": 16384}, True, False),
        # a kernel for every size cannot know its indices fit
        (GOLDENS["matmul"][0], MATMUL_1024, False, False),
        # an integer of the def times a size may pass 2^31 in an expression isl builds
        ("def matmul(float(M,K) A) -> (C) { C(m) +=! A(m,k) where k in 0:1000000 }",
         {"M": 4, "K": 1000000}, True, False),
        # a float's digits (a GELU's 0.70710678) and a name's are no integer of an index
        ("def matmul(float(M,K) A) -> (C2) { C2(m) +=! A(m,k) * 0.70710678 + 1e-12 }",
         MATMUL_1024, True, True),
    ],
    ids=["1024", "16384", "generic", "literal", "float-literal"],
)  # fmt: skip
def test_index_arithmetic_is_32_bit_where_every_index_fits(
    source: str, sizes: dict[str, int], fixed: bool, narrow: bool
) -> None:
    options = MappingOptions.cuda().replace(fix_parameters_before_scheduling=fixed)
    text = _lower(source, "matmul", sizes, options).source
    kernel = text.split("tc_kernel_1(")[1]
    assert ("const int e_A_0 = s_M;" in kernel) is narrow
    assert ("const long long e_A_0 = s_M;" in kernel) is not narrow
    assert ("(int)threadIdx.x" in kernel) is narrow


@needs_nvrtc
def test_narrow_indices_leave_only_address_arithmetic_in_64_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVRTC's PTX of a 1024^3 matmul's update kernel: 64-bit integer arithmetic
    (`mad.lo.s64`, `setp.lt.s64`, ...) falls to under a third, what is left being the
    byte addresses (`mul.wide.s32`)."""
    from tcpy.codegen import cuda

    source, entry, _ = GOLDENS["matmul"]

    def wide_arithmetic() -> int:
        ptx = nvrtc.compile_ptx(_lower(source, entry, MATMUL_1024, MappingOptions.cuda()).source,
                                "compute_90")  # fmt: skip
        update = ptx.split(".entry tc_kernel_1")[1]
        pattern = r"^\s*(add|sub|mul|mad|shl|shr|setp|min|max|div|rem|neg|selp)\.\S*(s64|u64|b64)"
        return len(re.findall(pattern, update, flags=re.M))

    narrow = wide_arithmetic()
    monkeypatch.setattr(cuda, "narrow_indices", lambda *args: False)
    wide = wide_arithmetic()
    assert narrow * 3 < wide


@needs_nvrtc
def test_vector_copies_are_128_bit_loads_in_the_ptx() -> None:
    source, entry, _ = GOLDENS["matmul"]
    for vectorize in (True, False):
        options = MappingOptions.cuda().replace(vectorize=vectorize, copy_stages=1)
        ptx = nvrtc.compile_ptx(_lower(source, entry, MATMUL_1024, options).source, "compute_90")
        assert (".v4.f32" in ptx) is vectorize


def _tile_loop(source: str) -> str:
    """The text of the update kernel of a matmul from its tile loop's ring on."""
    return source.split("tc_kernel_1")[1]


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_matmuls_tiles_are_copied_into_a_ring_while_the_tile_before_is_computed(
    stages: int,
) -> None:
    """With `copy_stages` (2 by default, on sm_80 and later), A's and B's tiles go to
    rings of that many buffers, filled by cp.async `stages - 1` tiles ahead: one
    commit group per tile, a wait for the oldest, one barrier per tile (and one after
    the loop), and the compute reads the stage of its tile. Tiles of 32 along m, n
    and k: stages of 32 x 36 floats for A (rows read 4 values of k at a time, as
    whole float4s) and 32 x 33 for B, 4 of each fit."""
    source, entry, _ = GOLDENS["matmul"]
    options = MappingOptions.cuda().replace(copy_stages=stages, tile=(32, 32, 32))
    text = _tile_loop(_lower(source, entry, {"M": 128, "K": 256, "N": 96}, options).source)
    assert f"float tc_shared0[{stages * 1152}];" in text
    assert f"float tc_shared1[{stages * 1056}];" in text
    assert text.count("TC_CP_COMMIT();") == stages  # the prologue's, the loop's
    assert f"TC_CP_WAIT({stages - 2});" in text
    assert text.count("__syncthreads();") == 2
    assert "TC_CP_ASYNC(tc_shared0, tc_s * 1152 + " in text
    assert "TC_SLDV(float4, tc_shared0, tc_a)" in text and "tc_a = tc_stage * 1152 + " in text
    loop = text.split("TC_CP_WAIT(")[1]
    assert "TC_LD(t_A" not in loop and "TC_LD(t_B" not in loop  # reads from the ring only


def test_the_reduction_tile_shrinks_for_the_ring_then_the_ring_for_the_budget() -> None:
    """A's and B's tiles of 64 values of k take 16 KB: with 4 stages asked, the k tile
    halves to 32 (8 KB a stage: 4 fit 40 KB); in 12 KB not even a tile of 16 holds 4
    (4 KB a stage), so the largest tile with a ring of 2 or more, 16 with 2; in 6 KB
    one buffer of a tile of 16, copied synchronously. 2 stages asked, the first tile
    holding them: 64 in the default 48 KB. A's rows (32 of them), which the threads
    read 4 values of k at a time, take an odd number of whole float4s: 36, 20 and 68
    (the budget still holds them)."""
    source, entry, _ = GOLDENS["matmul"]
    cases = (
        (4, 40 * 1024, 7, "[4608]", 4),  # stages asked, budget, last tile, A's ring, commits
        (4, 12 * 1024, 15, "[1280]", 2),
        (4, 6 * 1024, 15, "[640]", 0),
        (2, 0, 3, "[4352]", 2),
    )
    for asked, budget, last, declared, commits in cases:
        options = MappingOptions.cuda().replace(copy_stages=asked, max_shared_memory=budget)
        text = _tile_loop(_lower(source, entry, {"M": 128, "K": 256, "N": 96}, options).source)
        assert f"for (int c2 = 0; c2 <= {last}; c2++)" in text
        assert f"float tc_shared0{declared};" in text
        assert text.count("TC_CP_COMMIT();") == commits


def test_before_sm_80_the_copies_are_synchronous() -> None:
    """cp.async came with sm_80: an older device keeps one buffer and plain copies."""
    import dataclasses

    source, entry, _ = GOLDENS["matmul"]
    turing = dataclasses.replace(named("a100"), name="t4", arch="sm_75")
    lowered = _lower(source, entry, {"M": 128, "K": 256, "N": 96}, MappingOptions.cuda(), turing)
    assert "TC_CP_ASYNC" not in lowered.source and "cp.async" not in lowered.source


@needs_nvrtc
def test_the_ring_is_filled_by_cp_async_in_the_ptx() -> None:
    """Element copies of 4 bytes into rows padded by one (columns of the tile are
    read); 16 bytes where a thread reads its outputs' runs as vectors (rows a
    multiple of 4), as in a 2 x 2 register tile."""
    source, entry, _ = GOLDENS["matmul"]
    plain = _lower(source, entry, MATMUL_1024, MappingOptions.cuda()).source
    ptx = nvrtc.compile_ptx(plain, "compute_90")
    assert "cp.async.ca.shared.global" in ptx and "cp.async.wait_group" in ptx
    runs = MappingOptions.cuda().replace(register_tile=(2, 2))
    ptx = nvrtc.compile_ptx(_lower(source, entry, MATMUL_1024, runs).source, "compute_90")
    assert "cp.async.cg.shared.global" in ptx  # 16 bytes


@needs_nvrtc
def test_a_def_comparing_floats_is_compiled_without_contracted_multiply_adds() -> None:
    """A max backward compares each candidate with the maximum another kernel computed:
    both must round `a * b + c` the same way, so nothing is fused where a def compares
    floats for equality (NVRTC's --fmad=false), as on the C target; other defs keep
    their FMAs."""
    source = """
def f(float(N) A, float(N) B, float(N) C) -> (Y, E) {
    Y(i) = A(i) * B(i) + C(i)
    E(i) = A(i) * B(i) + C(i) == Y(0) ? 1.0 : 0.0
}
def g(float(N) A, float(N) B, float(N) C) -> (Y) {
    Y(i) = A(i) * B(i) + C(i)
}
"""
    fmas = {}
    for entry in ("f", "g"):
        lowered = _lower(source, entry, {"N": 64}, MappingOptions.cuda())
        ptx = nvrtc.compile_ptx(lowered.source, "compute_90", exact=lowered.exact)
        fmas[entry] = (lowered.exact, ptx.count("fma.rn.f32"), ptx.count("mul.rn.f32"))
    assert fmas["f"][0] and fmas["f"][1] == 0 and fmas["f"][2] >= 1
    assert not fmas["g"][0] and fmas["g"][1] >= 1


def test_an_nvrtc_that_miscompiles_builds_unoptimised_cubins() -> None:
    """NVRTC before 13.4 drops a negation in ptxas (three GPU pairs wrong on NVRTC
    13.0); its cubins are built with ptxas at -O0, which ran them right, and the
    options of the cache key say so."""
    assert nvrtc.flags((13, 0), exact=False) == (*nvrtc.OPTIONS, "-Xptxas=-O0")
    assert nvrtc.flags((12, 9), exact=True) == (*nvrtc.OPTIONS, "--fmad=false", "-Xptxas=-O0")
    assert nvrtc.flags((13, 4), exact=False) == nvrtc.OPTIONS
    assert nvrtc.flags((13, 5), exact=True) == (*nvrtc.OPTIONS, "--fmad=false")


@needs_nvrtc
def test_an_old_nvrtc_is_named_in_a_warning_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    nvrtc._warn_unsound.cache_clear()
    source = 'extern "C" __global__ void k(float *a) { a[threadIdx.x] *= 2.0f; }'
    with pytest.warns(tcpy.TCWarning, match=r"NVRTC 13\.0 miscompiles .* pip install -U"):
        assert nvrtc.compile_cubin(source, "sm_90")[:4] == b"\x7fELF"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nvrtc.compile_cubin(source, "sm_90")  # said once
    nvrtc._warn_unsound.cache_clear()


def test_a_kernel_declares_the_extents_of_its_own_tensors_only() -> None:
    """The BERT layer as one def in bfloat16: 34 kernels over 44 tensors (float32
    accumulators included). Each declares the extents of the tensors it touches, so
    the source stays under `SOURCE_LIMIT` and keeps its mapping (every extent in every
    kernel took it past, and the fallback's plain options ran it 9x slower)."""
    import importlib

    from tcpy.parser.parse import retyped
    from tcpy.pipeline import SOURCE_LIMIT
    from tcpy.types import ScalarType

    bert = importlib.import_module("bench.bert")
    source = retyped(bert._tc(bert.LAYER, bert.BERT), ScalarType.BFLOAT16)
    sizes = {"B": 1, "T": 3, **bert.BERT}
    options = cuda_defaults(check_source(source)["layer"])
    lowered = _lower(source, "layer", sizes, options)
    assert lowered.fallbacks == () and len(lowered.source) <= SOURCE_LIMIT
    kernels = lowered.source.split('extern "C" __global__')[1:]
    assert len(kernels) == len(lowered.mapping.kernels) > 30
    for text in kernels:
        declared = set(re.findall(r"const (?:int|long long) e_(\w+)_\d+ =", text))
        assert declared and all(f"t_{name}" in text.split("{", 1)[1] for name in declared)
    assert "e_W2_0" not in kernels[0]  # the first kernel does not touch the FFN's weights
