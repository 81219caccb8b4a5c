"""The CUDA runtime's call path without a GPU: `GpuKernels` over a driver whose memory
is host bytes and whose kernels are Python functions reading and writing it. What it
checks is the runtime's own work, which the `gpu` tests repeat on a real device: memory
borrowed from the pool and given back, the caller's outputs handed over or freed, one
synchronisation per call, zero-fill only where the def needs it, the status word."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fake_gpu import DeviceVector, HostMemoryDriver

import tcpy
from tcpy.binding import bind, bind_out
from tcpy.codegen.status import STATUS_INDEX_OUT_OF_RANGE
from tcpy.errors import TCLaunchError
from tcpy.kernels import GpuKernels
from tcpy.parser import check_source
from tcpy.poly.coverage import written_before_read
from tcpy.poly.scop import build_scop
from tcpy.runtime import cuda, streams
from tcpy.runtime.status import KernelFault

SOURCE = """
def scale(float(N) A) -> (O, P) {
    O(i) = A(i) * 2
    P(i) += A(i)
}
"""  # O is written whole; P adds to the zero it starts from


def _scale(drv: HostMemoryDriver, args: list[int]) -> None:
    n, a, o, p, _status = args
    drv.view(o, n)[:] = drv.view(a, n) * 2
    drv.view(p, n)[:] += drv.view(a, n)


def _gather_fault(drv: HostMemoryDriver, args: list[int]) -> None:
    drv.view(args[-1], 1, np.int32)[0] = STATUS_INDEX_OUT_OF_RANGE


@pytest.fixture
def drv(monkeypatch: pytest.MonkeyPatch) -> HostMemoryDriver:
    driver = HostMemoryDriver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    return driver


def _kernels(
    *functions: Callable[..., None], asynchronous: bool = False, source: str = SOURCE
) -> tuple[GpuKernels, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        (cdef,) = check_source(source).values()
    written = written_before_read(build_scop(cdef, None))
    launches = [((1, 1, 1), (1, 1, 1))] * len(functions)
    options = tcpy.MappingOptions.cuda()
    kernels = GpuKernels(cdef, "", list(functions), launches, options, written, asynchronous)
    return kernels, cdef


def test_the_coverage_analysis_sees_which_output_needs_its_zeros() -> None:
    kernels, _ = _kernels(_scale)
    assert kernels.written == {"O"}


def test_host_calls_borrow_from_the_pool_and_give_everything_back(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_scale)
    a = np.arange(1, 6, dtype=np.float32)
    o, p = kernels(bind(cdef, [a]))
    np.testing.assert_array_equal(o, a * 2)
    np.testing.assert_array_equal(p, a)
    first = drv.allocs  # A's copy, O, P and the status word
    assert first == 4 and drv.syncs == 1
    for _ in range(5):
        o, p = kernels(bind(cdef, [a]))
        np.testing.assert_array_equal(p, a)  # P is zeroed again though its block is reused
    assert drv.allocs == first and drv.frees == 0
    assert drv.syncs == 6
    memory = cuda.pool(drv)
    assert sum(len(b) for b in memory.idle.values()) == 4


def test_only_the_tensors_not_written_whole_are_zero_filled(
    drv: HostMemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels, cdef = _kernels(_scale)
    a = np.arange(4, dtype=np.float32)
    monkeypatch.delenv("TCPY_POISON", raising=False)
    kernels(bind(cdef, [a]))
    fills = [(value, nbytes) for _, value, nbytes in drv.memsets]
    assert fills == [(0, 16), (0, 4)]  # P, then the status word; not O
    drv.memsets.clear()
    monkeypatch.setenv("TCPY_POISON", "1")
    o, _ = kernels(bind(cdef, [a]))
    assert [(v, n) for _, v, n in drv.memsets] == [(0xFF, 16), (0, 16), (0, 4)]
    np.testing.assert_array_equal(o, a * 2)


def test_kernels_run_back_to_back_and_synchronise_once(drv: HostMemoryDriver) -> None:
    order: list[str] = []

    def first(d: HostMemoryDriver, args: list[int]) -> None:
        order.append(f"first after {d.syncs} syncs")
        _scale(d, args)

    def second(d: HostMemoryDriver, args: list[int]) -> None:
        order.append(f"second after {d.syncs} syncs")

    kernels, cdef = _kernels(first, second)
    kernels(bind(cdef, [np.ones(3, np.float32)]))
    assert order == ["first after 0 syncs", "second after 0 syncs"] and drv.syncs == 1


def test_device_outputs_are_the_callers_and_freed_if_the_call_fails(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    o, p = kernels(bind(cdef, [a]))
    assert isinstance(o, cuda.DeviceArray) and isinstance(p, cuda.DeviceArray)
    np.testing.assert_array_equal(o.get(), [0, 2, 4])
    assert drv.frees == 0
    allocs = drv.allocs
    drv.fail_sync = True
    with pytest.raises(TCLaunchError, match="injected"):
        kernels(bind(cdef, [a]))
    assert drv.allocs == allocs + 2 and drv.frees == 2  # the two outputs it would have handed
    del o, p
    assert drv.frees == 4  # a DeviceArray frees its memory with the object


def test_a_fault_in_the_status_word_is_raised_and_the_memory_given_back(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_gather_fault)
    with pytest.raises(KernelFault, match="outside its extent"):
        kernels(bind(cdef, [np.ones(3, np.float32)]))
    assert drv.syncs == 1
    assert drv.frees == 0 and sum(len(b) for b in cuda.pool(drv).idle.values()) == 4


@pytest.mark.parametrize("nbytes", [1, 512, 513, 1000, 4096, 4097, 10**6, 3 * 2**20 + 1])
def test_pool_blocks_are_at_most_an_eighth_larger_than_asked(nbytes: int) -> None:
    size = cuda.DevicePool.rounded(nbytes)
    assert size >= nbytes and size % 64 == 0
    assert size == 512 or size <= nbytes * 9 / 8


def test_the_pool_keeps_only_so_much_idle_and_retries_after_trimming() -> None:
    drv = HostMemoryDriver()
    memory = cuda.DevicePool(drv, idle_limit=4096)  # type: ignore[arg-type]
    blocks = [memory.acquire(2048) for _ in range(3)]
    for b in blocks:
        memory.release(b)
    assert drv.frees == 1 and memory.idle_bytes == 4096  # the third went back
    assert memory.acquire(2000) in blocks and drv.allocs == 3  # 2000 rounds to 2048

    refusals = [True]
    alloc = drv.alloc

    def refusing(nbytes: int) -> int:
        if refusals:
            refusals.pop()
            raise TCLaunchError("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY")
        return alloc(nbytes)

    drv.alloc = refusing  # type: ignore[method-assign]
    memory.acquire(8192)
    assert memory.idle_bytes == 0 and drv.frees == 2  # the idle block freed, then retried


def test_an_asynchronous_call_on_the_device_returns_without_waiting(
    drv: HostMemoryDriver,
) -> None:
    """Device inputs and outputs: no synchronisation at the call; the next call waits
    for it first and reads its status word. Host outputs still wait."""
    kernels, cdef = _kernels(_scale, asynchronous=True)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    o, _ = kernels(bind(cdef, [a]))
    assert drv.syncs == 0
    np.testing.assert_array_equal(o.get(), [0, 2, 4])
    kernels(bind(cdef, [a]))
    assert drv.syncs == 1  # the first call's status, read before the second ran
    kernels(bind(cdef, [np.ones(3, np.float32)]))  # host outputs: copied back, so waited
    assert drv.syncs == 3


def test_an_asynchronous_failure_is_raised_at_the_next_call_or_by_synchronize(
    drv: HostMemoryDriver,
) -> None:
    faulty, cdef = _kernels(_gather_fault, asynchronous=True)
    kernels, _ = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    faulty(bind(cdef, [a]))  # returns: the fault is in a status word nobody read yet
    with pytest.raises(tcpy.TCInputError, match="a call of scale that did not wait failed") as e:
        kernels(bind(cdef, [a]))
    assert not isinstance(e.value, KernelFault)  # not explained by the call running now
    kernels(bind(cdef, [a]))  # reported once
    engine = tcpy.ExecutionEngine("cuda", asynchronous=True)
    faulty(bind(cdef, [a]))
    with pytest.raises(tcpy.TCInputError, match="outside its extent"):
        engine.synchronize()
    syncs = drv.syncs
    engine.synchronize()  # nothing pending: no wait
    assert drv.syncs == syncs
    memory = cuda.pool(drv)  # every block back, the deferred status words too
    assert sum(len(b) for b in memory.idle.values()) == len(memory.sizes)


def test_asynchronous_is_an_option_of_the_cuda_target_only() -> None:
    with pytest.raises(tcpy.TCError, match="asynchronous is an option of the cuda target"):
        tcpy.ExecutionEngine("cpu", asynchronous=True)
    tcpy.ExecutionEngine("cpu").synchronize()  # nothing to wait for


# Streams: every operation of a call on the caller's stream, one synchronisation of it.

STREAM_A, STREAM_B = 0x5A000, 0x5B000


def _operations(drv: HostMemoryDriver) -> set[str]:
    return {operation for operation, _ in drv.streams}


def test_a_call_runs_on_the_stream_its_inputs_interface_names(drv: HostMemoryDriver) -> None:
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    drv.streams.clear()
    o, _ = kernels(bind(cdef, [a]))
    assert _operations(drv) == {"memset", "launch", "synchronize", "to_host"}
    assert {stream for _, stream in drv.streams} == {STREAM_A}
    assert drv.streams.count(("synchronize", STREAM_A)) == 1 and not drv.orders
    drv.streams.clear()
    np.testing.assert_array_equal(o.get(), [0, 2, 4])  # read back in the stream's order
    assert drv.streams == [("to_host", STREAM_A)]
    drv.streams.clear()
    host_o, host_p = np.empty(3, np.float32), np.empty(3, np.float32)
    kernels(bind(cdef, [a]), (host_o, host_p))  # host out=: copied back on the stream
    assert ("to_host", STREAM_A) in drv.streams
    assert {stream for _, stream in drv.streams} == {STREAM_A}


def test_the_legacy_default_stream_of_the_interface_is_stream_0(drv: HostMemoryDriver) -> None:
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=1)
    drv.streams.clear()
    kernels(bind(cdef, [a]))
    assert {stream for _, stream in drv.streams} == {0}


def test_numpy_inputs_run_on_the_default_stream(drv: HostMemoryDriver) -> None:
    kernels, cdef = _kernels(_scale)
    kernels(bind(cdef, [np.ones(3, np.float32)]))
    assert _operations(drv) == {"to_device", "memset", "launch", "synchronize", "to_host"}
    assert {stream for _, stream in drv.streams} == {0}
    assert drv.streams.count(("synchronize", 0)) == 1 and not drv.orders


def test_an_interface_without_a_stream_needs_no_ordering(drv: HostMemoryDriver) -> None:
    face = {"shape": (3,), "typestr": "<f4", "data": (1, False), "version": 3}
    assert streams.cai_stream(face) is None
    assert streams.cai_stream({**face, "stream": None}) is None
    assert streams.cai_stream({**face, "version": 2, "stream": STREAM_A}) is None
    assert streams.cai_stream({**face, "stream": 1}) == 0
    assert streams.cai_stream({**face, "stream": 2}) == streams.PER_THREAD
    assert streams.cai_stream({**face, "stream": STREAM_A}) == STREAM_A
    kernels, cdef = _kernels(_scale)
    kernels(bind(cdef, [DeviceVector(drv, np.ones(3, np.float32))]))
    assert {stream for _, stream in drv.streams} == {0}


def test_arrays_on_two_streams_run_on_the_first_ordered_against_the_other(
    drv: HostMemoryDriver,
) -> None:
    """The input on A, an out= destination on B: the call runs on A after B's work so
    far, and B's later work runs after the call's."""
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    binding = bind(cdef, [a])
    o = DeviceVector(drv, np.zeros(3, np.float32), stream=STREAM_B)
    p = DeviceVector(drv, np.zeros(3, np.float32), stream=STREAM_A)
    drv.streams.clear()
    kernels(binding, bind_out(cdef, binding, (o, p)))
    assert {stream for _, stream in drv.streams} == {STREAM_A}
    assert drv.orders == [(STREAM_A, STREAM_B), (STREAM_B, STREAM_A)]
    np.testing.assert_array_equal(drv.view(o.pointer, 3), [0, 2, 4])


def test_a_driver_with_a_stream_of_its_own_is_ordered_against_the_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pycuda queues on a stream of its own (`work_stream`): it waits for the caller's
    stream before the call's work, and the caller's stream waits for it after."""
    own = 0x7700
    drv = HostMemoryDriver(own_stream=own)
    monkeypatch.setattr(cuda, "driver", lambda: drv)
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    kernels(bind(cdef, [a]))
    assert drv.orders == [(own, STREAM_A), (STREAM_A, own)]
    asynchronous, _ = _kernels(_scale, asynchronous=True)
    drv.orders.clear()
    asynchronous(bind(cdef, [a]))  # returns before the kernels ran: ordered all the same
    assert drv.orders == [(own, STREAM_A), (STREAM_A, own)]


def test_the_asynchronous_mode_settles_the_streams_calls_were_queued_on(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_scale, asynchronous=True)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    b = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_B)
    kernels(bind(cdef, [a]))
    assert drv.syncs == 0
    drv.streams.clear()
    kernels(bind(cdef, [b]))  # settles A's call first, then queues on B
    assert drv.streams[:2] == [("synchronize", STREAM_A), ("to_host", STREAM_A)]
    assert {stream for _, stream in drv.streams[2:]} == {STREAM_B}
    assert ("synchronize", STREAM_B) not in drv.streams
    kernels(bind(cdef, [a]))  # B's call settled, then one on A pending
    drv.streams.clear()
    tcpy.ExecutionEngine("cuda", asynchronous=True).synchronize()
    assert drv.streams == [("synchronize", STREAM_A), ("to_host", STREAM_A)]


def test_a_call_on_the_per_thread_default_stream_waits_even_when_asynchronous(
    drv: HostMemoryDriver,
) -> None:
    """Only the thread that queued it can name its per-thread default stream, and a
    pending word may be read from another thread."""
    kernels, cdef = _kernels(_scale, asynchronous=True)
    kernels(bind(cdef, [DeviceVector(drv, np.ones(3, np.float32), stream=streams.PER_THREAD)]))
    assert drv.streams.count(("synchronize", streams.PER_THREAD)) == 1


TEMPORARY = """
def twice(float(N) A) -> (O) {
    T(i) = A(i) * 2
    O(i) = T(i)
}
"""  # T is borrowed from the pool, even when A and O are the caller's device arrays


def _twice(drv: HostMemoryDriver, args: list[int]) -> None:
    n, a, o, t, _status = args
    drv.view(t, n)[:] = drv.view(a, n) * 2
    drv.view(o, n)[:] = drv.view(t, n)


def test_a_block_given_back_pending_on_one_stream_waits_for_its_synchronisation(
    drv: HostMemoryDriver,
) -> None:
    """An asynchronous call on A gives T's block back while its kernels may still run:
    a request for A may have it (A's order puts it after them), one for B not until A
    is synchronised."""
    kernels, cdef = _kernels(_twice, asynchronous=True, source=TEMPORARY)
    memory = cuda.pool(drv)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    o = kernels(bind(cdef, [a]))[0]
    np.testing.assert_array_equal(o.get(), [0, 2, 4])
    (block,) = (p for (_, key), blocks in memory.idle.items() if key == STREAM_A for p in blocks)
    other = memory.acquire(12, STREAM_B)
    assert other != block
    memory.release(other)
    assert memory.acquire(12, STREAM_A) == block  # in A's order: no wait needed
    memory.release(block, STREAM_A)
    drv.streams.clear()
    kernels(bind(cdef, [DeviceVector(drv, np.ones(3, np.float32), stream=STREAM_B)]))
    first_on_b = next(k for k, (_, s) in enumerate(drv.streams) if s == STREAM_B)
    assert ("synchronize", STREAM_A) in drv.streams[:first_on_b]  # settled before B had it
    assert all(key != STREAM_A for _, key in memory.idle)


def test_trimming_synchronises_the_streams_idle_blocks_are_pending_on() -> None:
    drv = HostMemoryDriver()
    memory = cuda.DevicePool(drv)  # type: ignore[arg-type]
    kept, pending = memory.acquire(100), memory.acquire(100, STREAM_A)
    memory.release(kept)
    memory.release(pending, STREAM_A)
    memory.trim()
    assert drv.streams == [("synchronize", STREAM_A)]
    assert drv.frees == 2 and memory.idle_bytes == 0 and not memory.sizes


def test_a_block_beyond_the_idle_limit_is_freed_after_its_stream() -> None:
    drv = HostMemoryDriver()
    memory = cuda.DevicePool(drv, idle_limit=0)  # type: ignore[arg-type]
    memory.release(memory.acquire(100, STREAM_A), STREAM_A)
    assert drv.streams == [("synchronize", STREAM_A)] and drv.frees == 1


def test_the_drivers_context_is_made_current_once_in_each_thread_that_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PyTorch's autograd runs a CUDA backward on a thread of its own, where no
    # context is current until one is made so
    driver = HostMemoryDriver()
    monkeypatch.setattr(cuda, "_driver", lambda choice: driver)
    monkeypatch.setattr(cuda, "_thread", threading.local())
    assert cuda.driver() is driver and cuda.driver() is driver
    assert driver.bound == 1
    other = threading.Thread(target=lambda: [cuda.driver(), cuda.driver()])
    other.start()
    other.join()
    assert driver.bound == 2
