"""The CUDA runtime's call path without a GPU: `GpuKernels` over a driver whose memory
is host bytes and whose kernels are Python functions reading and writing it. What it
checks is the runtime's own work, which the `gpu` tests repeat on a real device: memory
borrowed from the pool and given back, the caller's outputs handed over or given back,
one synchronisation per call that waits and none for one that does not, zero-fill
only where the def needs it, the status words read lazily, launch plans, captures."""

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
from tcpy.runtime import cuda, streams, words
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
    *functions: Callable[..., None], asynchronous: bool = True, source: str = SOURCE
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
    first = drv.allocs  # A's copy, O and P (the status word is in mapped host memory)
    assert first == 3 and drv.syncs == 1 and drv.calls["mapped_words"] == 1
    for _ in range(5):
        o, p = kernels(bind(cdef, [a]))
        np.testing.assert_array_equal(p, a)  # P is zeroed again though its block is reused
    assert drv.allocs == first and drv.frees == 0
    assert drv.syncs == 6 and drv.calls["mapped_words"] == 1
    memory = cuda.pool(drv)
    assert sum(len(b) for b in memory.idle.values()) == 3
    assert not words.words(drv).owner  # every call read its word and gave it back


def test_only_the_tensors_not_written_whole_are_zero_filled(
    drv: HostMemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernels, cdef = _kernels(_scale)
    a = np.arange(4, dtype=np.float32)
    monkeypatch.delenv("TCPY_POISON", raising=False)
    kernels(bind(cdef, [a]))
    fills = [(value, nbytes) for _, value, nbytes in drv.memsets]
    assert fills == [(0, 16)]  # P; not O, and no status word (the host zeroes those)
    drv.memsets.clear()
    monkeypatch.setenv("TCPY_POISON", "1")
    o, _ = kernels(bind(cdef, [a]))
    assert [(v, n) for _, v, n in drv.memsets] == [(0xFF, 16), (0, 16)]
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


def test_device_outputs_are_the_callers_and_given_back_if_the_call_fails(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_scale, asynchronous=False)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    o, p = kernels(bind(cdef, [a]))
    assert isinstance(o, cuda.DeviceArray) and isinstance(p, cuda.DeviceArray)
    np.testing.assert_array_equal(o.get(), [0, 2, 4])
    memory = cuda.pool(drv)
    idle = sum(len(b) for b in memory.idle.values())
    drv.fail_sync = True
    with pytest.raises(TCLaunchError, match="injected"):
        kernels(bind(cdef, [a]))
    assert sum(len(b) for b in memory.idle.values()) == idle + 2  # the two it would have handed
    del o, p
    assert sum(len(b) for b in memory.idle.values()) == idle + 4  # back with the objects
    assert drv.frees == 0  # all in the pool, for the next call


def test_a_fault_in_the_status_word_is_raised_and_the_memory_given_back(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_gather_fault)
    with pytest.raises(KernelFault, match="outside its extent"):
        kernels(bind(cdef, [np.ones(3, np.float32)]))
    assert drv.syncs == 1
    assert drv.frees == 0 and sum(len(b) for b in cuda.pool(drv).idle.values()) == 3
    assert not words.words(drv).owner


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


def test_a_call_on_the_device_returns_without_waiting_by_default(
    drv: HostMemoryDriver,
) -> None:
    """Device inputs and outputs: no synchronisation and no copy at the call, nor at
    the next; host outputs still wait, once."""
    kernels, cdef = _kernels(_scale)
    assert kernels.asynchronous  # the target's default
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    o, _ = kernels(bind(cdef, [a]))
    kernels(bind(cdef, [a]))
    assert drv.syncs == 0 and drv.calls["to_host"] == 0
    np.testing.assert_array_equal(o.get(), [0, 2, 4])  # reads on its stream
    kernels(bind(cdef, [np.ones(3, np.float32)]))  # host outputs: copied back, so waited
    assert drv.syncs == 1


def test_an_asynchronous_failure_is_raised_at_the_next_call_or_by_synchronize(
    drv: HostMemoryDriver,
) -> None:
    faulty, cdef = _kernels(_gather_fault)
    kernels, _ = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    faulty(bind(cdef, [a]))  # returns: the fault is in a status word nobody read yet
    with pytest.raises(tcpy.TCInputError, match=r"call 1 of scale .* reported asynchronously") as e:
        kernels(bind(cdef, [a]))
    assert not isinstance(e.value, KernelFault)  # not explained by the call running now
    assert "TCPY_LAUNCH_BLOCKING=1" in str(e.value)
    assert drv.syncs == 0  # found in mapped memory, without waiting
    kernels(bind(cdef, [a]))  # reported once
    engine = tcpy.ExecutionEngine("cuda")
    faulty(bind(cdef, [a]))
    with pytest.raises(tcpy.TCInputError, match="outside its extent"):
        engine.synchronize()
    assert drv.syncs == 1  # the one stream with calls in flight
    engine.synchronize()  # nothing in flight: no wait
    assert drv.syncs == 1
    assert not words.words(drv).owner  # every word read and free
    memory = cuda.pool(drv)
    assert sum(len(b) for b in memory.idle.values()) == len(memory.sizes)


def test_a_failure_is_raised_where_host_data_is_read(drv: HostMemoryDriver) -> None:
    faulty, cdef = _kernels(_gather_fault)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    o, _ = faulty(bind(cdef, [a]))
    with pytest.raises(tcpy.TCInputError, match="call 1 of scale"):
        o.get()


def test_launch_blocking_checks_every_call_at_the_call(
    drv: HostMemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    faulty, cdef = _kernels(_gather_fault)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    monkeypatch.setenv("TCPY_LAUNCH_BLOCKING", "1")
    with pytest.raises(KernelFault, match="outside its extent"):
        faulty(bind(cdef, [a]))
    assert drv.syncs == 1
    monkeypatch.delenv("TCPY_LAUNCH_BLOCKING")
    blocking, _ = _kernels(_gather_fault, asynchronous=False)  # the engine's option
    with pytest.raises(KernelFault):
        blocking(bind(cdef, [a]))
    assert drv.syncs == 2 and not words.words(drv).owner


def test_a_steady_call_launches_and_nothing_else(
    drv: HostMemoryDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once warm, a call on device arrays asks the driver for its launches only: no
    synchronisation, copy, memset of a status word or allocation; an event every
    `BATCH` calls tells when their words may be reused, and the words are reused."""
    monkeypatch.delenv("TCPY_POISON", raising=False)
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32))
    binding = bind(cdef, [a])
    for _ in range(3):  # warm: the pool holds blocks for the outputs
        del _
        kernels(binding)
    drv.calls.clear()
    calls = 4 * words.SLAB
    for _ in range(calls):
        kernels(binding)
    steady = dict(drv.calls)
    assert steady.pop("launch") == calls
    assert steady.pop("capturing") == calls  # a query: is the stream being captured?
    assert steady.pop("memset") == calls  # P's zeros (the def adds to them), not a word
    assert steady.pop("record") == calls // words.BATCH
    assert steady.pop("done") <= calls // words.BATCH  # queried, never waited for
    assert steady.pop("event", 0) <= 2 * words.SLAB // words.BATCH  # then reused
    assert steady == {}  # no synchronisation, copy, allocation or new slab


def test_words_in_flight_are_never_waited_for(drv: HostMemoryDriver) -> None:
    """While the device is behind (no event done), a call takes a new slab of words
    rather than wait."""
    kernels, cdef = _kernels(_scale)
    binding = bind(cdef, [DeviceVector(drv, np.arange(3, dtype=np.float32))])
    drv.busy = True
    for _ in range(words.SLAB + 1):
        kernels(binding)
    assert drv.calls["mapped_words"] == 2 and drv.syncs == 0
    drv.busy = False
    tcpy.ExecutionEngine("cuda").synchronize()
    assert not words.words(drv).owner


def test_a_call_captured_into_a_graph_is_checked_after_its_replays(
    drv: HostMemoryDriver,
) -> None:
    """During a capture nothing waits, allocates or records; the captured call's word
    is the graph's, read after replays, and reported as a replay's failure."""
    replay: list[Callable[[], None]] = []

    def captured(d: HostMemoryDriver, args: list[int]) -> None:
        replay.append(lambda: _gather_fault(d, args))  # what a replay will do

    kernels, cdef = _kernels(captured)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    kernels(bind(cdef, [a]))  # a warm-up: the pool holds the blocks the capture needs
    drv.capture = STREAM_A
    drv.calls.clear()
    kernels(bind(cdef, [a]))
    assert set(drv.calls) <= {"launch", "memset", "capturing"}
    drv.capture = None
    tcpy.ExecutionEngine("cuda").synchronize()  # no replay yet: all well
    replay[-1]()  # the graph replayed, and its kernel faulted
    with pytest.raises(tcpy.TCInputError, match="a replay of a CUDA graph that captured call"):
        tcpy.ExecutionEngine("cuda").synchronize()
    tcpy.ExecutionEngine("cuda").synchronize()  # reported once per fault
    replay[-1]()
    with pytest.raises(tcpy.TCInputError, match="replay"):
        kernels(bind(cdef, [a]))  # the next call looks too


def test_a_long_capture_finds_its_status_words_ready(drv: HostMemoryDriver) -> None:
    """Outside captures the free words are kept at `RESERVE` or more, so that a capture
    of that many calls never asks the driver for a slab or queries an event."""
    kernels, cdef = _kernels(_scale)
    binding = bind(cdef, [DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)])
    dests = bind_out(cdef, binding, tuple(DeviceVector(drv, np.zeros(3, np.float32)) for _ in "op"))
    drv.busy = True  # nothing finishes: the free words only fall
    for _ in range(words.SLAB - words.RESERVE // 2):
        kernels(binding, dests)
    drv.capture = STREAM_A
    drv.calls.clear()
    for _ in range(words.RESERVE):
        kernels(binding, dests)
    assert set(drv.calls) <= {"launch", "memset", "capturing"}
    drv.capture = None
    drv.busy = False


def test_a_capture_needs_no_driver_memory_or_wait(drv: HostMemoryDriver) -> None:
    kernels, cdef = _kernels(_twice, source=TEMPORARY)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    drv.capture = STREAM_A
    with pytest.raises(TCLaunchError, match="warm-up"):
        kernels(bind(cdef, [a]))  # T needs memory, and none is idle
    drv.capture = streams.DEFAULT  # where NumPy inputs go
    with pytest.raises(TCLaunchError, match="cannot copy host arrays or wait"):
        kernels(bind(cdef, [np.ones(3, np.float32)]))
    drv.capture = None
    kernels(bind(cdef, [a]))  # warm-up
    tcpy.ExecutionEngine("cuda").synchronize()
    drv.capture = STREAM_A
    memory = cuda.pool(drv)
    idle = memory.idle_bytes
    kernels(bind(cdef, [a]))
    assert memory.idle_bytes < idle  # T's block now the graph's, not given back
    drv.capture = None


def test_a_failure_nobody_was_told_of_is_printed_at_exit(
    drv: HostMemoryDriver, capsys: pytest.CaptureFixture[str]
) -> None:
    faulty, cdef = _kernels(_gather_fault)
    faulty(bind(cdef, [DeviceVector(drv, np.arange(3, dtype=np.float32))]))
    words._at_exit()
    assert "a GPU call failed and was never reported: call 1 of scale" in capsys.readouterr().err


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
    assert _operations(drv) == {"memset", "launch"}  # no wait, no copy
    assert {stream for _, stream in drv.streams} == {STREAM_A} and not drv.orders
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
    tcpy.ExecutionEngine("cuda").synchronize()


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
    blocking, _ = _kernels(_scale, asynchronous=False)
    blocking(bind(cdef, [a]))
    assert drv.orders == [(own, STREAM_A), (STREAM_A, own)]
    kernels, cdef = _kernels(_scale)
    drv.orders.clear()
    kernels(bind(cdef, [a]))  # returns before the kernels ran: ordered all the same
    assert drv.orders == [(own, STREAM_A), (STREAM_A, own)]


def test_synchronize_waits_for_the_streams_calls_were_queued_on(
    drv: HostMemoryDriver,
) -> None:
    kernels, cdef = _kernels(_scale)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    b = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_B)
    kernels(bind(cdef, [a]))
    drv.streams.clear()
    kernels(bind(cdef, [b]))  # queued on B without waiting for A's call
    assert {stream for _, stream in drv.streams} == {STREAM_B}
    assert drv.syncs == 0
    drv.streams.clear()
    tcpy.ExecutionEngine("cuda").synchronize()
    assert drv.streams == [("synchronize", STREAM_A), ("synchronize", STREAM_B)]


def test_a_call_on_the_per_thread_default_stream_waits_even_when_asynchronous(
    drv: HostMemoryDriver,
) -> None:
    """Only the thread that queued it can name its per-thread default stream, and a
    pending word may be read from another thread."""
    kernels, cdef = _kernels(_scale)
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
    kernels, cdef = _kernels(_twice, source=TEMPORARY)
    memory = cuda.pool(drv)
    a = DeviceVector(drv, np.arange(3, dtype=np.float32), stream=STREAM_A)
    o = kernels(bind(cdef, [a]))[0]
    np.testing.assert_array_equal(drv.view(o.pointer, 3), [0, 2, 4])
    (block,) = (p for (_, key), blocks in memory.idle.items() if key == STREAM_A for p in blocks)
    other = memory.acquire(12, STREAM_B)
    assert other != block
    memory.release(other)
    assert memory.acquire(12, STREAM_A) == block  # in A's order: no wait needed
    memory.release(block, STREAM_A)
    drv.streams.clear()
    kernels(bind(cdef, [DeviceVector(drv, np.ones(3, np.float32), stream=STREAM_B)]))
    assert block in memory.idle[(memory.rounded(12), STREAM_A)]  # B took another, unwaited
    assert drv.syncs == 0
    np.testing.assert_array_equal(o.get(), [0, 2, 4])  # A synchronised: its blocks free
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


# The engine's steady path on GPU arrays: the cubin built by NVRTC, the kernels the
# fake driver's Python functions.

DOUBLE = "def twice_of(float(N) A) -> (O) { O(i) = A(i) * 2 }"


def _double(drv: HostMemoryDriver, args: list[int]) -> None:
    n, a, o, _status = args[0], args[1], args[-2], args[-1]  # a second input: ignored
    drv.view(o, n)[:] = drv.view(a, n) * 2


@pytest.fixture
def engine_drv(monkeypatch: pytest.MonkeyPatch) -> HostMemoryDriver:
    pytest.importorskip("cuda.bindings.nvrtc")
    driver = HostMemoryDriver(kernels={"tc_kernel_0": _double})
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    monkeypatch.delenv("TCPY_POISON", raising=False)
    return driver


@pytest.fixture
def doubling(engine_drv: HostMemoryDriver) -> tuple[tcpy.ExecutionEngine, DeviceVector]:
    """An engine on the fake driver with `twice_of`, and a vector 0, 1, 2, 3 to double."""
    engine = tcpy.ExecutionEngine("cuda")
    engine.define(DOUBLE)
    return engine, DeviceVector(engine_drv, np.arange(4, dtype=np.float32))


def _forbid_binding(patch: pytest.MonkeyPatch) -> None:
    """Make any binding of inputs or outputs fail the test: a steady call binds none."""

    def bound(*args: Any) -> None:
        pytest.fail("a steady call bound its arrays")

    for name in ("tcpy.engine.bind", "tcpy.compiled.bind", "tcpy.compiled.bind_out"):
        patch.setattr(name, bound)


def test_a_steady_engine_call_on_device_arrays_replays_its_plan(
    engine_drv: HostMemoryDriver,
    doubling: tuple[tcpy.ExecutionEngine, DeviceVector],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv = engine_drv
    engine, a = doubling
    first = engine.twice_of(a)
    np.testing.assert_array_equal(first.get(), [0, 2, 4, 6])
    del first
    compiled = engine.compile("twice_of", a)
    compiled(a)  # checked once

    _forbid_binding(monkeypatch)
    b = DeviceVector(drv, np.arange(4, dtype=np.float32) + 1)
    for _ in range(2):  # the pool then holds the two blocks the loop alternates between
        out = engine.twice_of(b)
    drv.calls.clear()
    for _ in range(10):
        out = engine.twice_of(b)  # the last output goes back to the pool: reused
    # warm: not an allocation, copy or wait; a query whether the stream is capturing
    assert dict(drv.calls) == {"launch": 10, "capturing": 10}
    np.testing.assert_array_equal(out.get(), [2, 4, 6, 8])
    drv.calls.clear()
    np.testing.assert_array_equal(compiled(a).get(), [0, 2, 4, 6])
    assert drv.calls["launch"] == 1 and drv.calls["to_host"] == 1


def test_a_steady_call_at_another_shape_is_checked_again(engine_drv: HostMemoryDriver) -> None:
    engine = tcpy.ExecutionEngine("cuda")
    engine.define("def add(float(N) A, float(N) B) -> (O) { O(i) = A(i) + B(i) }")
    drv = engine_drv
    a3 = DeviceVector(drv, np.ones(3, np.float32))
    engine.add(a3, a3)
    with pytest.raises(tcpy.TCInputError, match="input B has 4 in dimension 0"):
        engine.add(a3, DeviceVector(drv, np.ones(4, np.float32)))
    with pytest.raises(tcpy.TCInputError, match="must be float32"):
        engine.add(a3, DeviceVector(drv, np.ones(3, np.float64)))


def test_a_steady_call_with_out_binds_nothing_and_writes_the_destination(
    engine_drv: HostMemoryDriver,
    doubling: tuple[tcpy.ExecutionEngine, DeviceVector],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drv = engine_drv
    engine, a = doubling
    o = DeviceVector(drv, np.zeros(4, np.float32))
    assert engine.twice_of(a, out=o) is o  # checked whole, then remembered
    with monkeypatch.context() as patched:
        _forbid_binding(patched)
        b = DeviceVector(drv, np.arange(4, dtype=np.float32) + 1)
        drv.calls.clear()
        assert engine.twice_of(b, out=o) is o
        assert dict(drv.calls) == {"launch": 1, "capturing": 1}  # no allocation at all
        np.testing.assert_array_equal(drv.view(o.pointer, 4), [2, 4, 6, 8])
    # an out= that is the input: checked whole (computed aside, then copied in); a
    # destination of another shape is refused as on a first call
    with pytest.raises(tcpy.TCInputError, match="shares memory with an input"):
        engine.twice_of(b, out=b)
    with pytest.raises(tcpy.TCInputError, match="out for O must be float32 of shape"):
        engine.twice_of(b, out=DeviceVector(drv, np.zeros(5, np.float32)))


def test_out_destinations_that_share_memory_are_found_at_each_call() -> None:
    from tcpy.kernels import _overlapping

    # two inputs of 16 bytes at 0 and 100, one output of 16 bytes
    assert not _overlapping([0, 100, 200], [16, 16, 16], 1)
    assert _overlapping([0, 100, 8], [16, 16, 16], 1)  # into the first input
    assert _overlapping([0, 100, 84], [16, 16, 20], 1)  # its end into the second
    assert not _overlapping([0, 16, 32], [16, 16, 16], 1)  # adjacent only
    assert _overlapping([0, 100, 100], [16, 0, 16], 1) is False  # an empty input
    assert _overlapping([0, 200, 208], [16, 16, 16], 2)  # two outputs overlapping
