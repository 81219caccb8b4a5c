"""Asynchronous calls on a real GPU, with both driver layers: a steady call on PyTorch
tensors queues its launches and nothing else, status words in mapped host memory are
read without a copy and reported at a later call, `TCPY_LAUNCH_BLOCKING` checks at the
call, and calls captured into CUDA graphs (PyTorch's and a raw stream capture) replay
right and report their faults. Marked `gpu`: skipped cleanly without one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tcpy
from tcpy.runtime import cuda as runtime
from tcpy.runtime.status import KernelFault

from programs import SOFTMAX  # with temporaries: from PyTorch's allocator on its tensors

pytestmark = pytest.mark.gpu

AFFINE = "def affine(float(N) A) -> (O) { O(i) = A(i) * 2 + 1 }"
GATHER = "def g(float(N) A, int32(M) I) -> (O) { O(m) = A(I(m)) }"


@pytest.fixture(params=["pycuda", "bindings"])
def torch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TCPY_CUDA_DRIVER", request.param)
    monkeypatch.delenv("TCPY_LAUNCH_BLOCKING", raising=False)
    monkeypatch.delenv("TCPY_POISON", raising=False)
    try:
        runtime.driver()
    except tcpy.TCLaunchError as e:
        pytest.skip(f"driver {request.param} unavailable: {e}")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device")
    return torch


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the driver's calls by name."""
    drv = runtime.driver()
    calls: Counter[str] = Counter()
    for name in ("synchronize", "to_host", "to_device", "memset", "alloc", "launch", "record"):
        method = getattr(drv, name)

        def counted(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls[_name] += 1
            return _method(*args)

        monkeypatch.setattr(drv, name, counted)
    return calls


def test_a_steady_call_on_torch_tensors_queues_its_launches_only(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(SOFTMAX)
    x = torch.randn(256, 1000, device="cuda")
    want = torch.softmax(x, 1)
    for _ in range(2):
        engine.softmax(x)
    calls = _counting(monkeypatch)
    outs = [engine.softmax(x) for _ in range(64)]
    launches = len(engine.compile("softmax", x)._kernel.functions)
    assert calls["launch"] == 64 * launches
    assert calls["synchronize"] == calls["to_host"] == calls["alloc"] == 0
    assert calls["memset"] <= 64 * 2  # the reductions' zeros, never a status word
    torch.cuda.synchronize()
    for out in outs:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
    engine.synchronize()


def _gathering(torch: Any) -> tuple[tcpy.ExecutionEngine, Any]:
    """An engine with `g` (a gather), and a vector of 8 to gather from."""
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(GATHER)
    return engine, torch.arange(8, dtype=torch.float32, device="cuda")


def test_a_fault_is_read_from_mapped_memory_at_a_later_call(torch: Any) -> None:
    engine, a = _gathering(torch)
    bad = torch.tensor([0, 9], dtype=torch.int32, device="cuda")
    engine.g(a, bad)  # returns at once: the fault is not known yet
    torch.cuda.synchronize()  # PyTorch's wait: tcpy is not told
    good = torch.tensor([3, 1], dtype=torch.int32, device="cuda")
    with pytest.raises(tcpy.TCInputError, match=r"call \d+ of g .* reported asynchronously"):
        engine.g(a, good)
    assert engine.g(a, good).tolist() == [3.0, 1.0]  # reported once; later calls run


def test_launch_blocking_raises_at_the_call(torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, a = _gathering(torch)
    bad = torch.tensor([0, 9], dtype=torch.int32, device="cuda")
    monkeypatch.setenv("TCPY_LAUNCH_BLOCKING", "1")
    with pytest.raises(KernelFault, match="outside its extent"):
        engine.g(a, bad)
    monkeypatch.delenv("TCPY_LAUNCH_BLOCKING")
    blocking = tcpy.ExecutionEngine("cuda", asynchronous=False)
    blocking.define(GATHER)
    with pytest.raises(KernelFault):
        blocking.g(a, bad)


def _warm_up(torch: Any, calls: Callable[[], object]) -> None:
    """Run `calls` twice on a side stream, as PyTorch asks before a capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            calls()
    torch.cuda.current_stream().wait_stream(side)


def test_calls_captured_by_torch_cuda_graph_replay_right(torch: Any) -> None:
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(SOFTMAX)
    engine.define(AFFINE)
    x = torch.randn(64, 300, device="cuda")
    _warm_up(torch, lambda: engine.affine(engine.softmax(x).reshape(-1)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for _ in range(10):  # 20 calls
            y = engine.affine(engine.softmax(y).reshape(-1)).reshape(64, 300)
    for _ in range(3):
        x.copy_(torch.randn(64, 300, device="cuda"))
        graph.replay()
        want = x
        for _ in range(10):
            want = torch.softmax(want, 1) * 2 + 1
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    engine.synchronize()


def test_a_fault_in_a_replayed_graph_is_reported(torch: Any) -> None:
    engine, a = _gathering(torch)
    index = torch.tensor([3, 1], dtype=torch.int32, device="cuda")
    _warm_up(torch, lambda: engine.g(a, index))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = engine.g(a, index)
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [3.0, 1.0]
    engine.synchronize()
    index.copy_(torch.tensor([0, 9], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(tcpy.TCInputError, match="a replay of a CUDA graph that captured call"):
        engine.synchronize()


class _OnStream:
    """A PyTorch tensor's memory seen through `__cuda_array_interface__` on `stream`."""

    def __init__(self, tensor: Any, stream: int) -> None:
        self.tensor, self.stream = tensor, stream

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # version 3 defines `stream` (PyTorch's own interface says version 2)
        return {**self.tensor.__cuda_array_interface__, "version": 3, "stream": self.stream}


def test_a_raw_stream_capture_replays_right(torch: Any) -> None:
    cu = pytest.importorskip("cuda.bindings.driver")
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(AFFINE)
    x = torch.rand(1000, device="cuda")
    err, stream = cu.cuStreamCreate(1)  # non-blocking
    assert int(err) == 0
    handle = int(stream)
    source = _OnStream(x, handle)
    warm = engine.affine(source)  # a warm-up on the stream: the pool holds the output's block
    cu.cuStreamSynchronize(stream)
    del warm
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    assert int(cu.cuStreamBeginCapture(stream, mode)[0]) == 0
    out = engine.affine(source)
    err, graph = cu.cuStreamEndCapture(stream)
    assert int(err) == 0
    err, instance = cu.cuGraphInstantiate(graph, 0)
    assert int(err) == 0
    x.copy_(torch.arange(1000, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    assert int(cu.cuGraphLaunch(instance, stream)[0]) == 0
    cu.cuStreamSynchronize(stream)
    got = torch.as_tensor(out, device="cuda").cpu().numpy()
    np.testing.assert_array_equal(got, np.arange(1000, dtype=np.float32) * 2 + 1)
    engine.synchronize()
