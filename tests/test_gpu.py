"""The `cuda` target on a real GPU, with both driver layers (pycuda and cuda.bindings):
every corpus program against `reference`, and device arrays used without a copy.
Marked `gpu`: skipped cleanly on machines without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcpy
from tcpy.binding import bind
from tcpy.fuzz_tasks import GRADIENT, check_against_reference, check_gradient
from tcpy.runtime import cuda as runtime

from corpus_cases import CASES, Case
from differential import as_tuple, check_outputs, corpus_engines, make_inputs
from programs import MATMUL

pytestmark = pytest.mark.gpu

DRIVERS = ["pycuda", "bindings"]


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TCPY_CUDA_DRIVER", request.param)
    try:
        runtime.driver()
    except tcpy.TCLaunchError as e:
        pytest.skip(f"driver {request.param} unavailable: {e}")
    return str(request.param)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_corpus_on_gpu(case: Case, driver: str) -> None:
    gpu, reference = corpus_engines("cuda", case.file)
    for sizes in (case.sizes, *case.odd_sizes):
        inputs = make_inputs(case, sizes)
        want = as_tuple(reference.run(case.entry, *inputs))
        got = as_tuple(gpu.run(case.entry, *inputs))
        check_outputs(case, got, want, f" on cuda ({driver})")


def test_torch_tensors_stay_on_the_device(driver: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(MATMUL)
    A = torch.rand(33, 17, device="cuda")
    B = torch.rand(17, 9, device="cuda")
    C = engine.mm(A, B)  # PyTorch in, PyTorch out, over tcpy's memory
    assert isinstance(C, torch.Tensor) and C.is_cuda
    torch.testing.assert_close(C, A @ B, rtol=1e-4, atol=1e-4)
    compiled = engine.compile("mm", A, B)
    D = compiled.run(bind(compiled.cdef, [A, B]))  # bare outputs: tcpy's device arrays
    assert isinstance(D, runtime.DeviceArray)
    np.testing.assert_allclose(D.get(), (A @ B).cpu().numpy(), rtol=1e-4, atol=1e-4)


def test_torch_outputs_come_from_torchs_caching_allocator(
    driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the pool holds the status word, a call on PyTorch tensors asks the driver
    for no memory: its output is a tensor from PyTorch's own allocator."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(AFFINE)
    x = torch.rand(1000, device="cuda")
    torch.testing.assert_close(engine.affine(x), x * 2 + 1)

    def refuse(nbytes: int) -> int:
        raise AssertionError(f"the driver was asked for {nbytes} bytes")

    monkeypatch.setattr(runtime.driver(), "alloc", refuse)
    before = torch.cuda.memory_allocated()
    y = engine.affine(x)
    assert torch.cuda.memory_allocated() >= before + y.numel() * 4
    torch.testing.assert_close(y, x * 2 + 1)
    z = engine.compile("affine", x)(x)  # a compiled kernel's call too
    torch.testing.assert_close(z, x * 2 + 1)


def test_the_device_profile_comes_from_the_driver(driver: str) -> None:
    drv = runtime.driver()
    profile = runtime.device_profile(drv)
    assert profile.arch == drv.arch() and profile.name == drv.device_name()
    assert profile.sms > 0 and profile.max_threads_per_block >= 1024
    assert profile.shared_per_block >= 48 * 1024 and profile.registers_per_block >= 32768
    assert profile.key() in tcpy.ExecutionEngine("cuda")._target.device()


def test_repeated_calls_reuse_the_pools_memory(driver: str) -> None:
    """After the first call, calls of the same shapes allocate nothing from the driver:
    A's copy, the temporaries, the host output and the status word come back to the
    pool and are borrowed again."""
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(
        "def sm(float(N,D) I) -> (O) { m(n) max=! I(n,d)\n"
        "  e(n,d) = exp(I(n,d) - m(n))\n  s(n) +=! e(n,d)\n  O(n,d) = e(n,d) / s(n) }"
    )
    x = np.random.default_rng(0).standard_normal((64, 100)).astype(np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(engine.sm(x), want, rtol=1e-5, atol=1e-6)
    blocks = dict(runtime.pool(runtime.driver()).sizes)
    for _ in range(3):
        np.testing.assert_allclose(engine.sm(x), want, rtol=1e-5, atol=1e-6)
    assert runtime.pool(runtime.driver()).sizes == blocks


def test_an_asynchronous_gather_fault_is_raised_by_synchronize(driver: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    engine = tcpy.ExecutionEngine("cuda")  # asynchronous by default
    engine.define("def g(float(N) A, int32(M) I) -> (O) { O(m) = A(I(m)) }")
    a = torch.arange(8, dtype=torch.float32, device="cuda")
    good = torch.tensor([3, 1], dtype=torch.int32, device="cuda")
    out = torch.as_tensor(engine.g(a, good), device="cuda")
    engine.synchronize()
    assert out.tolist() == [3.0, 1.0]
    engine.g(a, torch.tensor([0, 9], dtype=torch.int32, device="cuda"))
    with pytest.raises(tcpy.TCInputError, match=r"call \d+ of g .* reported asynchronously"):
        engine.synchronize()


def _torch_cuda() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch


AFFINE = "def affine(float(N) A) -> (O) { O(i) = A(i) * 2 + 1 }"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["waits", "asynchronous"])
def test_a_call_on_a_torch_stream_runs_between_its_producer_and_its_consumer(
    driver: str, asynchronous: bool
) -> None:
    """On a stream of PyTorch's own (non-blocking: no implicit order with the default
    stream), the input is the end of a long chain of matmuls queued just before the
    call, and the output is read by a kernel queued just after it: on any other stream
    the call would read the input before it is written, or its reader the output."""
    torch = _torch_cuda()
    engine = tcpy.ExecutionEngine("cuda", asynchronous=asynchronous)
    engine.define(AFFINE)
    x = torch.rand(4096, 4096, device="cuda") / 4096
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = x
        for _ in range(8):
            y = y @ x + 1
        a = y[-1]  # a row of the last product: written last
        o = torch.as_tensor(engine.affine(a), device="cuda")
        z = o * 3
        given = torch.empty_like(a)
        engine.affine(z, out=given)  # into an out= of the stream too
        w = given - 1
    side.synchronize()
    engine.synchronize()
    want = (a.cpu().numpy() * 2 + 1) * 3
    np.testing.assert_allclose(z.cpu().numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(w.cpu().numpy(), want * 2, rtol=1e-5)


def test_numpy_inputs_wait_for_nothing_on_a_torch_stream(driver: str) -> None:
    """NumPy in, NumPy out, on the default stream, whatever PyTorch's current one is."""
    torch = _torch_cuda()
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(AFFINE)
    a = np.arange(1000, dtype=np.float32)
    with torch.cuda.stream(torch.cuda.Stream()):
        np.testing.assert_array_equal(engine.affine(a), a * 2 + 1)


def test_a_call_on_a_cupy_stream_runs_between_its_producer_and_its_consumer(
    driver: str,
) -> None:
    cupy = pytest.importorskip("cupy")
    engine = tcpy.ExecutionEngine("cuda", asynchronous=True)
    engine.define(AFFINE)
    x = cupy.random.rand(4096, 4096, dtype=cupy.float32) / 4096
    cupy.cuda.Device().synchronize()
    with cupy.cuda.Stream(non_blocking=True) as side:
        y = x
        for _ in range(8):
            y = y @ x + 1
        a = y[-1]
        z = cupy.asarray(engine.affine(a)) * 3
    side.synchronize()
    engine.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(z), (cupy.asnumpy(a) * 2 + 1) * 3, rtol=1e-5)


FINDINGS = json.loads((Path(__file__).parent / "corpus" / "gpu_findings.json").read_text())


@pytest.mark.parametrize("pair", FINDINGS, ids=lambda p: str(p["found"]))
def test_the_fuzzers_gpu_findings(pair: dict[str, Any], driver: str) -> None:
    """Pairs the fuzzers found wrong on an H100 and right on `cuda-emu`: a max backward
    whose candidates and maximum were rounded differently (FMA contraction, now off
    where a def compares floats), and three kernels NVRTC 13.0's ptxas miscompiled
    (now built unoptimised with an NVRTC before 13.4)."""
    check = check_gradient if pair["inputs"] == GRADIENT else check_against_reference
    args = (pair["source"], pair["entry"], pair["sizes"], pair["input_seed"], pair["options"])
    check(*args, "cuda")
