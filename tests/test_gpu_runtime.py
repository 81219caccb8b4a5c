"""The CUDA runtime's call path without a GPU: `GpuKernels` over a driver whose memory
is host bytes and whose kernels are Python functions reading and writing it. What it
checks is the runtime's own work, which the `gpu` tests repeat on a real device: memory
borrowed from the pool and given back, the caller's outputs handed over or freed, one
synchronisation per call, zero-fill only where the def needs it, the status word."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fake_gpu import DeviceVector, HostMemoryDriver

import tcpy
from tcpy.binding import bind
from tcpy.errors import TCLaunchError
from tcpy.kernels import GpuKernels
from tcpy.parser import check_source
from tcpy.poly.coverage import written_before_read
from tcpy.poly.scop import build_scop
from tcpy.runtime import cuda
from tcpy.runtime.status import STATUS_INDEX_OUT_OF_RANGE, KernelFault

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


def _kernels(*functions: Callable[..., None], asynchronous: bool = False) -> tuple[GpuKernels, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        cdef = check_source(SOURCE)["scale"]
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
