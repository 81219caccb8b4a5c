"""A def as one kernel (`MappingOptions.one_kernel`, `tcpy.codegen.one_kernel`): the
kernels of a def run as parts of one persistent kernel, launched cooperatively, with
grid-wide barriers between the parts; and the emulator's grid-wide and named
barriers, which execute it.

What is tested:

* defs of several kernels (a matmul with its row sums and a division, a layer norm,
  a softmax, a BERT encoder layer, a matmul on the tensor cores followed by point-wise
  statements) give the reference's outputs on `cuda-emu` (checked: bounds, races,
  barriers) in one launch, whose profile counts the grid barriers each block passed;
* the one kernel is right on any number of blocks: run on 1, 2, 3 and 7 resident
  blocks, the same outputs;
* what the source says: the parts are device functions, in-step parts with fewer
  threads than the block synchronise with `bar.sync 1, n`, independent parts take
  turns; NVRTC compiles it;
* where the kernels cannot be one (a kernel in step on threads that are not whole
  warps, shared memory past the static limit) they run as kernels of their own, and
  the fallback is said;
* the emulator's grid barrier: it orders every block's writes before every block's
  reads after it; a block that leaves the kernel while others wait, threads of a block
  that wait at different barriers, a named barrier that is not whole warps, and a
  part (or a part's next block) reading shared memory that the one before left are
  reported, never a hang;
* the option: validated, searched by the tuner on `cuda` only, a one-kernel def on
  the GPU's launch plan: its grid barrier's words are zeroed and passed before the
  status word, and its launch is cooperative on the driver's work stream.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from fake_gpu import HostMemoryDriver

import tcpy
from tcpy.binding import bind
from tcpy.codegen import one_kernel
from tcpy.codegen.cuda import ACCESS_MACROS, kernel_parameters
from tcpy.errors import TCEmulationError, TCMappingError
from tcpy.genetic.space import build_space
from tcpy.kernels import GpuKernels
from tcpy.mapping.gpu import MappedKernel, cuda_defaults
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_cuda
from tcpy.runtime import cuda, emulator, nvrtc

from differential import run_against_reference

MATMUL_ROWS = """
def rows(float(M,K) A, float(K,N) B) -> (C, S, O) {
    C(m,n) +=! A(m,k) * B(k,n)
    S(m) +=! C(m,n)
    O(m,n) = C(m,n) / S(m)
}
"""
LAYER_NORM = """
def norm(float(N,D) X, float(D) g, float(D) b) -> (Y) {
    mean(n) +=! X(n,d) / D
    c(n,d) = X(n,d) - mean(n)
    var(n) +=! c(n,d) * c(n,d) / D
    Y(n,d) = g(d) * c(n,d) / sqrt(var(n) + 1e-5) + b(d)
}
"""
SOFTMAX = """
def softmax(float(N,C) X) -> (P) {
    m(n) max=! X(n,c)
    e(n,c) = exp(X(n,c) - m(n))
    s(n) +=! e(n,c)
    P(n,c) = e(n,c) / s(n)
}
"""
BF16_MATMUL_COLUMNS = """
def mmc(bfloat16(M,K) A, bfloat16(K,N) B, float(N) bias) -> (Y, S) {
    C(m,n) +=! float(A(m,k)) * float(B(k,n))
    Y(m,n) = fmax(C(m,n) + bias(n), 0.0)
    S(n) +=! Y(m,n)
}
"""


def _rng_inputs(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s, dtype=np.float32) for s in shapes]


CASES = {
    "matmul rows": (MATMUL_ROWS, _rng_inputs((37, 21), (21, 45)), {"fuse_rows": False}),
    "layer norm": (LAYER_NORM, _rng_inputs((19, 70), (70,), (70,)), {"fuse_rows": False}),
    "softmax": (SOFTMAX, _rng_inputs((5, 300)), {"fuse_rows": False}),
    "softmax, row kernel": (SOFTMAX, _rng_inputs((40, 33)), {}),
}


def _outputs(result: object) -> list[np.ndarray]:
    found = result if isinstance(result, tuple) else (result,)
    return [np.asarray(x, np.float32) for x in found]


def _as_one(source: str, inputs: list[np.ndarray], **options: object) -> tcpy.Compiled:
    """The def compiled as one kernel on `cuda-emu`, its outputs checked against the
    reference's."""
    given = MappingOptions.cuda().replace(one_kernel=True, **options)
    compiled, got, want = run_against_reference(
        "cuda-emu", source, *inputs, options=given, emu_check=True
    )
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
    return compiled


def _apart(
    source: str, inputs: list[np.ndarray], base: MappingOptions | None = None, **options: object
) -> tuple[int, list[np.ndarray]]:
    """The def on `cuda-emu` with `options` (on `base`, the `cuda` preset by default),
    not as one kernel: its launches and outputs."""
    engine = tcpy.ExecutionEngine("cuda-emu")
    (name,) = engine.define(source)
    given = (base or MappingOptions.cuda()).replace(one_kernel=False, **options)
    compiled = engine.compile(name, *inputs, options=given)
    return len(compiled.profile(*inputs)), _outputs(compiled(*inputs))


def _kernels(source: str, inputs: list[np.ndarray], **options: object) -> int:
    """The launches of the def on `cuda-emu` with `options`, not as one kernel."""
    return _apart(source, inputs, **options)[0]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_a_def_of_several_kernels_runs_as_one_launch(case: str) -> None:
    source, inputs, options = CASES[case]
    compiled = _as_one(source, inputs, **options)
    kernels, apart = _apart(source, inputs, **options)
    for one, alone in zip(_outputs(compiled(*inputs)), apart, strict=True):
        np.testing.assert_array_equal(one, alone)  # each part is its kernel's code
    (launch,) = compiled.profile(*inputs)
    if kernels == 1:  # nothing to make one of: the kernel as it was
        assert launch["grid_barriers"] == 0
        assert "tc_grid_sync" not in compiled.source
        return
    blocks = launch["grid"][0]
    assert launch["grid"] == (min(blocks, emulator.RESIDENT_BLOCKS), 1, 1)
    assert launch["grid_barriers"] == blocks * (kernels - 1)  # each block, between parts
    assert compiled.source.count("tc_grid_sync(tc_grid);") == kernels - 1


def test_the_cases_have_several_kernels() -> None:
    """The cases above test something: all but the row kernel's have several."""
    counts = {case: _kernels(s, i, **o) for case, (s, i, o) in CASES.items()}
    assert counts["softmax, row kernel"] == 1
    assert all(n >= 2 for case, n in counts.items() if case != "softmax, row kernel")


def test_a_matmul_on_the_tensor_cores_and_its_column_sums_as_one_kernel() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((32, 48)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(48, dtype=np.float32)
    compiled = _as_one(BF16_MATMUL_COLUMNS, [a, b, bias])
    assert "TC_MMA_BF16" in compiled.source
    assert "tc_part_1" in compiled.source  # the sums are a part of their own


def _bert_layer() -> tuple[str, list[np.ndarray]]:
    """BERT's encoder layer as one def (`bench/bert.py`) at its smoke sizes."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    bert = importlib.import_module("bert")
    sizes = {**bert.BERT, **bert.SMOKE}
    tensors = bert.tensors(torch, sizes, batch=2)
    block = bert.BLOCKS[-1]
    inputs = [np.ascontiguousarray(tensors[n].numpy()) for n in block.inputs]
    return bert._tc(bert.LAYER, sizes), inputs


def test_a_bert_layer_as_one_kernel() -> None:
    source, inputs = _bert_layer()
    compiled = _as_one(source, inputs)
    kernels = _kernels(source, inputs)
    assert kernels >= 4
    (launch,) = compiled.profile(*inputs)
    assert launch["grid_barriers"] == launch["grid"][0] * (kernels - 1)


# --- any grid -----------------------------------------------------------------------


@pytest.mark.parametrize("blocks", [1, 2, 3, 7])
def test_the_one_kernel_is_right_on_any_number_of_blocks(tmp_path: Path, blocks: int) -> None:
    source, inputs, options = CASES["matmul rows"]
    (cdef,) = check_source(source).values()
    sizes = {"M": 37, "K": 21, "N": 45}
    base = cuda_defaults(cdef)
    lowered = lower_to_cuda(cdef, sizes, base.replace(one_kernel=True, **options))
    params = one_kernel.parameters(kernel_parameters(lowered.scop))
    library = emulator.build(
        lowered.source, emulator.launcher(0, params, 3, lowered.source), tmp_path, True
    )
    (_, block) = lowered.launches[0]
    kernels = emulator.EmulatedKernels(library, [((blocks, 1, 1), block)], check=True,
                                       instrumented=True)  # fmt: skip
    a, b = inputs
    c, s, o = (
        np.zeros((37, 45), np.float32),
        np.zeros(37, np.float32),
        np.zeros((37, 45), np.float32),
    )
    kernels([37, 21, 45], [a, b, c, s, o])
    _, want = _apart(source, inputs, base, **options)  # the same code, as kernels apart
    for got, alone in zip((c, s, o), want, strict=True):
        np.testing.assert_array_equal(got, alone)


# --- the source ---------------------------------------------------------------------


def _lowered(source: str, sizes: dict[str, int], **options: object):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(source).values()
    return lower_to_cuda(cdef, sizes, MappingOptions.cuda().replace(one_kernel=True, **options))


def test_the_source_of_one_kernel() -> None:
    lowered = _lowered(LAYER_NORM, {"N": 19, "D": 70}, fuse_rows=False)
    source = lowered.source
    kernels = lowered.mapping.kernels
    assert lowered.one_kernel and len(kernels) >= 2
    threads = max(k.threads for k in kernels)
    assert lowered.launches == [((max(k.blocks for k in kernels), 1, 1), (threads, 1, 1))]
    assert source.count('extern "C" __global__') == 1
    for k in kernels:
        assert f"static __device__ __noinline__ void tc_part_{k.index}(" in source
        assert f"/* kernel {k.index}: {k.blocks} blocks of {k.threads} threads" in source
    assert "__shared__ __align__(16) unsigned char tc_pool[" in source
    nvrtc.compile_cubin(source, "sm_90")


def test_an_in_step_part_of_fewer_threads_than_the_block_uses_a_named_barrier() -> None:
    kernel = MappedKernel(0, None, (4,), (64,))  # type: ignore[arg-type]
    assert one_kernel.barrier(kernel, 64) == "__syncthreads();"
    assert one_kernel.barrier(kernel, 256) == "tc_bar_sync(64u);"


def test_kernels_that_cannot_be_one_run_apart_and_say_why() -> None:
    small = MappedKernel(0, None, (4,), (48,))  # type: ignore[arg-type]
    large = MappedKernel(1, None, (4,), (64,))  # type: ignore[arg-type]
    in_step = [one_kernel.Part(small, True, 0), one_kernel.Part(large, True, 0)]
    assert "not whole warps" in str(one_kernel.refusal(in_step, 64))
    independent = [one_kernel.Part(small, False, 0), one_kernel.Part(large, True, 0)]
    assert one_kernel.refusal(independent, 64) is None
    full = [one_kernel.Part(large, True, 40_000), one_kernel.Part(small, False, 30_000)]
    assert one_kernel.refusal(full, 64) is None  # the parts share the pool, one at a time
    past = [one_kernel.Part(large, True, one_kernel.STATIC_SHARED + 16)]
    assert "shared memory" in str(one_kernel.refusal(past, 64))


def test_a_refused_def_falls_back_to_kernels_of_its_own() -> None:
    # a block of 48 threads along x: the row kernel of a softmax works in step on 48
    # threads, which are not whole warps, beside a matmul's 64
    lowered = _lowered(MATMUL_ROWS, {"M": 37, "K": 21, "N": 45}, fuse_rows=False,
                       map_to_threads=(16, 3))  # fmt: skip
    assert not lowered.one_kernel
    assert any("not one kernel" in note for note in lowered.fallbacks)
    assert lowered.options.one_kernel is False
    assert len(lowered.launches) == len(lowered.mapping.kernels)


# --- the emulator's barriers ------------------------------------------------------------

GRID_PARAMS = ["long long s_n", "const float *__restrict__ t_in", "float *__restrict__ t_out",
               one_kernel.GRID_PARAMETER, "int *tc_status"]  # fmt: skip


def _grid_library(tmp_path: Path, body: str) -> Path:
    signature = ", ".join(GRID_PARAMS)
    source = f"""{ACCESS_MACROS}{one_kernel.GRID_INSTRUCTIONS}
extern "C" __global__ void tc_kernel_0({signature}) {{
{body}
}}
"""
    return emulator.build(source, emulator.launcher(0, GRID_PARAMS, 1, source), tmp_path, True)


def _run_grid(library: Path, blocks: int, threads: int, n: int) -> np.ndarray:
    kernels = emulator.EmulatedKernels(
        library, [((blocks, 1, 1), (threads, 1, 1))], names=["in", "out"], kernels=["grid"],
        instrumented=True, check=True,
    )  # fmt: skip
    data = np.arange(n, dtype=np.float32)
    out = np.full(n, -1, np.float32)
    kernels([n], [data, out])
    return out


# each block writes its slice of `out`, the grid waits, each block reads the next
# block's slice: right only if every block's writes come before every block's reads
NEIGHBOURS = """
  const int b = blockIdx.x, t = threadIdx.x, n = (int)s_n, per = n / gridDim.x;
  float *mine = t_out;
  TC_ST(mine, b * per + t) = TC_LD(t_in, b * per + t) * 2.0f;
  tc_grid_sync(tc_grid);
  const float next = TC_LD(mine, ((b + 1) % gridDim.x) * per + t);
  tc_grid_sync(tc_grid);
  TC_ST(mine, b * per + t) = next;
"""


def test_the_grid_barrier_orders_every_blocks_writes_before_the_reads(tmp_path: Path) -> None:
    library = _grid_library(tmp_path, NEIGHBOURS)
    out = _run_grid(library, 4, 32, 128)
    np.testing.assert_array_equal(out, np.roll(np.arange(128, dtype=np.float32) * 2, -32))


PART_READS = """
  __shared__ float tile[64];
  TC_SST(tile, threadIdx.x) = 1.0f;
  {barrier};
  TC_ST(t_out, blockIdx.x * 64 + threadIdx.x) = TC_SLD(tile, threadIdx.x);"""


@pytest.mark.parametrize(
    ("body", "fragments"),
    [
        (
            "  if (blockIdx.x == 1) return;\n  tc_grid_sync(tc_grid);",
            ("grid barrier divergence", "left the kernel"),
        ),
        (
            "  if (threadIdx.x < 32) tc_grid_sync(tc_grid); else __syncthreads();",
            ("grid barrier divergence", "wait elsewhere"),
        ),
        (
            "  if (threadIdx.x < 32) tc_grid_sync(tc_grid);",
            ("grid barrier divergence", "have left"),
        ),
        ("  if (threadIdx.x < 48) tc_bar_sync(48u);", ("bar.sync 1, 48", "whole warps")),
        ("  tc_bar_sync(32u);", ("bar.sync 1, 32", "this thread among them")),
        (
            "  if (threadIdx.x < 31) tc_bar_sync(32u);",
            ("barrier divergence", "bar.sync 1, n wait elsewhere or have exited"),
        ),
        # a part's shared memory is new: what the part before left there is undefined
        (
            PART_READS.format(barrier="tc_grid_sync(tc_grid)"),
            ("no thread of the block has written",),
        ),
        (PART_READS.format(barrier="tc_block_sync()"), ("no thread of the block has written",)),
    ],
    ids=[
        "block-leaves",
        "threads-elsewhere",
        "threads-leave",
        "not-whole-warps",
        "outsider",
        "named-missing-one",
        "part-reads-the-last-parts-shared",
        "block-reads-the-last-blocks-shared",
    ],
)
def test_a_misused_barrier_is_reported_not_hung(
    tmp_path: Path, body: str, fragments: tuple[str, ...]
) -> None:
    library = _grid_library(tmp_path, body)
    with pytest.raises(TCEmulationError) as caught:
        _run_grid(library, 3, 64, 192)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_named_barrier_synchronises_its_threads_only(tmp_path: Path) -> None:
    # the first 32 threads exchange through shared memory at their own barrier while
    # the other 32 wait at the block's
    body = """
  __shared__ float tile[32];
  const int t = threadIdx.x;
  if (t < 32) {
    TC_SST(tile, t) = TC_LD(t_in, blockIdx.x * 32 + t);
    tc_bar_sync(32u);
    TC_ST(t_out, blockIdx.x * 32 + t) = TC_SLD(tile, 31 - t);
  }
  __syncthreads();"""
    out = _run_grid(_grid_library(tmp_path, body), 2, 64, 64)
    np.testing.assert_array_equal(
        out, np.arange(64, dtype=np.float32).reshape(2, 32)[:, ::-1].reshape(-1)
    )


# --- the option and the GPU's launch plan -------------------------------------------------


def test_the_option_is_validated_and_searched_on_cuda_only() -> None:
    with pytest.raises(TCMappingError, match="one_kernel"):
        MappingOptions.cuda().replace(one_kernel=1)
    (cdef,) = check_source(MATMUL_ROWS).values()
    sizes = {"M": 37, "K": 21, "N": 45}
    cuda = build_space(cdef, sizes, "cuda", MappingOptions.cuda())
    cpu = build_space(cdef, sizes, "cpu", MappingOptions.cpu())
    assert "one_kernel" in {g.name for g in cuda.genes}
    assert "one_kernel" not in {g.name for g in cpu.genes}


class _CooperativeScale:
    """A one kernel on the fake driver: records its launches and computes `scale`'s
    outputs from the arguments it is given, as `cuLaunchCooperativeKernel` gives them
    (the address of the parameters' addresses)."""

    def __init__(self, drv: HostMemoryDriver) -> None:
        self.drv = drv
        self.launches: list[tuple[Any, Any, int, list[int]]] = []

    def launch(self, grid: Any, block: Any, arguments: int, stream: int) -> None:
        slots = (ctypes.c_void_p * 5).from_address(arguments)
        n, a, o, words, status = (ctypes.c_uint64.from_address(s).value for s in slots)
        grid_words = list(self.drv.view(words, one_kernel.GRID_WORDS, np.uint32))
        self.launches.append((grid, block, stream, grid_words))
        self.drv.view(o, n)[:] = self.drv.view(a, n) * 2
        self.drv.view(words, one_kernel.GRID_WORDS, np.uint32)[:] = 7  # as a kernel leaves them
        assert status


def test_the_gpu_plan_launches_one_kernel_cooperatively_with_zeroed_grid_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv = HostMemoryDriver(own_stream=99)
    monkeypatch.setattr(cuda, "driver", lambda: drv)
    (cdef,) = check_source("def scale(float(N) A) -> (O) {\n O(i) = A(i) * 2\n}").values()
    kernel = _CooperativeScale(drv)
    launch = ((6, 1, 1), (128, 1, 1))
    kernels = GpuKernels(cdef, "", [kernel], [launch], MappingOptions.cuda(),
                         frozenset({"O"}), cooperative=True)  # fmt: skip
    a = np.arange(5, dtype=np.float32)
    for _ in range(2):  # the words the first call left are zero again at the second
        (o,) = kernels(bind(cdef, [a]))
        np.testing.assert_array_equal(o, a * 2)
    assert [x[:3] for x in kernel.launches] == [(*launch, 99)] * 2  # the driver's work stream
    assert [x[3] for x in kernel.launches] == [[0] * one_kernel.GRID_WORDS] * 2
    assert drv.calls["launch"] == 0  # never an ordinary launch


# --- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["matmul rows", "layer norm", "bert layer"])
def test_one_kernel_on_the_gpu_is_launched_cooperatively_and_right(case: str) -> None:
    if case == "bert layer":
        source, inputs = _bert_layer()
        options = MappingOptions.cuda()
    else:
        source, inputs, extra = CASES[case]
        options = MappingOptions.cuda().replace(**extra)
    compiled, got, want = run_against_reference(
        "cuda", source, *inputs, options=options.replace(one_kernel=True)
    )
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5)
    kernels = compiled._kernel
    assert isinstance(kernels, GpuKernels) and kernels.cooperative
    ((blocks, _, _), _), *others = kernels.launches
    assert not others and blocks >= 1  # on the blocks the device holds at once
