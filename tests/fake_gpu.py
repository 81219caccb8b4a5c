"""A CUDA driver without a GPU, for tests of the runtime's own work: memory in host
bytes, kernels as Python functions of (driver, arguments), and arrays in that memory
seen through `__cuda_array_interface__`, as PyTorch's and CuPy's are."""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

import numpy as np

from tcpy.errors import TCLaunchError
from tcpy.runtime.cuda import Arguments


class HostMemoryDriver:
    """The `Driver` interface over host bytes; `launch` calls the kernel, a Python
    function of (driver, args). `fail_sync` makes the next synchronisation fail.
    `streams` records the stream of every copy, memset, launch and synchronisation, in
    order, as (operation, stream); `orders` every `order(after, before)`. Work is
    queued on the stream it is for (`work_stream`), as cuda.bindings does; with
    `own_stream`, on a stream of the driver's own, as pycuda does. `calls` counts every
    driver call by its name. Events are done when recorded, unless `busy` (the work
    before them still running); `capture` is the stream being captured into a graph,
    if any."""

    def __init__(
        self, own_stream: int | None = None, kernels: dict[str, Any] | None = None
    ) -> None:
        self.kernels = kernels or {}  # what `load` gives for each kernel's name
        self.memory: dict[int, bytearray] = {}
        self.next = 1 << 20
        self.allocs = self.frees = self.syncs = 0
        self.memsets: list[tuple[int, int, int]] = []
        self.streams: list[tuple[str, int]] = []
        self.orders: list[tuple[int, int]] = []
        self.own_stream = own_stream
        self.fail_sync = False
        self.calls: Counter[str] = Counter()
        self.busy = False
        self.capture: int | None = None
        self.recorded: list[tuple[int, int]] = []  # (event, stream) of every record
        self.events_made = 0

    def alloc(self, nbytes: int) -> int:
        self.calls["alloc"] += 1
        if self.capture is not None:
            raise TCLaunchError("cuMemAlloc failed: not permitted while a stream is capturing")
        self.allocs += 1
        pointer, self.next = self.next, self.next + nbytes + 4096
        self.memory[pointer] = bytearray(b"\x5a" * nbytes)  # stale bytes, as a GPU's are
        return pointer

    def free(self, pointer: int) -> None:
        self.calls["free"] += 1
        self.frees += 1
        del self.memory[pointer]

    # the device: an H100's attributes; `load` gives the Python function `kernels`
    # names for each kernel (one that does nothing for the others)

    def device_name(self) -> str:
        return "fake H100"

    def arch(self) -> str:
        return "sm_90"

    def attribute(self, name: str) -> int:
        return _H100[name]

    def load(self, cubin: bytes, functions: Any) -> list[Any]:
        self.calls["load"] += 1
        return [self.kernels.get(f, _nothing) for f in functions]

    def bind_thread(self) -> None:
        self.bound = getattr(self, "bound", 0) + 1

    def to_device(self, pointer: int, array: np.ndarray, stream: int) -> None:
        self.calls["to_device"] += 1
        self.streams.append(("to_device", stream))
        self.memory[pointer][: array.nbytes] = np.ascontiguousarray(array).tobytes()

    def to_host(self, array: np.ndarray, pointer: int, stream: int) -> None:
        self.calls["to_host"] += 1
        self.streams.append(("to_host", stream))
        data = bytes(self.memory[pointer][: array.nbytes])
        array[...] = np.frombuffer(data, array.dtype).reshape(array.shape)

    def memset(self, pointer: int, value: int, nbytes: int, stream: int) -> None:
        self.calls["memset"] += 1
        self.streams.append(("memset", stream))
        self.memsets.append((pointer, value, nbytes))
        self.memory[pointer][:nbytes] = bytes([value]) * nbytes

    def view(self, pointer: int, count: int, dtype: Any = np.float32) -> np.ndarray:
        """`count` elements at `pointer`, inside any allocation."""
        bases = sorted(self.memory)
        base = bases[bisect.bisect_right(bases, pointer) - 1]
        return np.frombuffer(self.memory[base], dtype, count, offset=pointer - base)

    def arguments(self, kinds: Any) -> Arguments:
        return Arguments(kinds)

    def launch(self, function: Any, grid: Any, block: Any, args: Arguments, stream: int) -> None:
        self.calls["launch"] += 1
        self.streams.append(("launch", stream))
        function(self, args.values)

    def mapped_words(self, count: int) -> tuple[np.ndarray, int]:
        self.calls["mapped_words"] += 1
        if self.capture is not None:
            raise TCLaunchError("cuMemHostAlloc failed: not permitted while a stream is capturing")
        pointer, self.next = self.next, self.next + 4 * count + 4096
        self.memory[pointer] = bytearray(4 * count)
        return np.frombuffer(self.memory[pointer], np.int32, count), pointer

    def event(self) -> int:
        self.calls["event"] += 1
        self.events_made += 1
        return self.events_made

    def record(self, event: int, stream: int) -> None:
        self.calls["record"] += 1
        self.recorded.append((event, stream))

    def done(self, event: int) -> bool:
        self.calls["done"] += 1
        return not self.busy

    def capturing(self, stream: int) -> bool:
        self.calls["capturing"] += 1
        return self.capture is not None and stream == self.capture

    def synchronize(self, stream: int) -> None:
        self.calls["synchronize"] += 1
        self.streams.append(("synchronize", stream))
        self.syncs += 1
        if self.fail_sync:
            self.fail_sync = False
            raise TCLaunchError("the kernel failed while running: (injected)")

    def work_stream(self, stream: int) -> int:
        return stream if self.own_stream is None else self.own_stream

    def order(self, after: int, before: int) -> None:
        self.calls["order"] += 1
        self.orders.append((after, before))


_H100 = {
    "MULTIPROCESSOR_COUNT": 132,
    "MAX_THREADS_PER_BLOCK": 1024,
    "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 227 * 1024,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 228 * 1024,
    "MAX_REGISTERS_PER_BLOCK": 65536,
    "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "L2_CACHE_SIZE": 50 * 2**20,
}


def _nothing(drv: HostMemoryDriver, args: list[int]) -> None:
    """A kernel that does nothing (for timing the host's part of a call)."""


class DeviceVector:
    """A vector in the driver's memory, seen through `__cuda_array_interface__`
    (version 3, with `stream` when one is given: the stream its producer queued it on,
    in the interface's numbering, where 1 is the legacy default stream)."""

    def __init__(self, drv: HostMemoryDriver, values: np.ndarray, stream: int | None = None):
        self.shape, self.dtype = values.shape, values.dtype
        self.pointer = drv.alloc(values.nbytes)
        self.stream = stream
        drv.to_device(self.pointer, values, 0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        face = {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
                "version": 3, "strides": None}  # fmt: skip
        if self.stream is not None:
            face["stream"] = self.stream
        return face
