"""A CUDA driver without a GPU, for tests of the runtime's own work: memory in host
bytes, kernels as Python functions of (driver, arguments), and arrays in that memory
seen through `__cuda_array_interface__`, as PyTorch's and CuPy's are."""

from __future__ import annotations

from typing import Any

import numpy as np

from tcpy.errors import TCLaunchError


class HostMemoryDriver:
    """The `Driver` interface over host bytes; `launch` calls the kernel, a Python
    function of (driver, args). `fail_sync` makes the next synchronisation fail.
    `streams` records the stream of every copy, memset, launch and synchronisation, in
    order, as (operation, stream); `orders` every `order(after, before)`. Work is
    queued on the stream it is for (`work_stream`), as cuda.bindings does; with
    `own_stream`, on a stream of the driver's own, as pycuda does."""

    def __init__(self, own_stream: int | None = None) -> None:
        self.memory: dict[int, bytearray] = {}
        self.next = 1 << 20
        self.allocs = self.frees = self.syncs = 0
        self.memsets: list[tuple[int, int, int]] = []
        self.streams: list[tuple[str, int]] = []
        self.orders: list[tuple[int, int]] = []
        self.own_stream = own_stream
        self.fail_sync = False

    def alloc(self, nbytes: int) -> int:
        self.allocs += 1
        pointer, self.next = self.next, self.next + nbytes + 4096
        self.memory[pointer] = bytearray(b"\x5a" * nbytes)  # stale bytes, as a GPU's are
        return pointer

    def free(self, pointer: int) -> None:
        self.frees += 1
        del self.memory[pointer]

    def bind_thread(self) -> None:
        self.bound = getattr(self, "bound", 0) + 1

    def to_device(self, pointer: int, array: np.ndarray, stream: int) -> None:
        self.streams.append(("to_device", stream))
        self.memory[pointer][: array.nbytes] = np.ascontiguousarray(array).tobytes()

    def to_host(self, array: np.ndarray, pointer: int, stream: int) -> None:
        self.streams.append(("to_host", stream))
        data = bytes(self.memory[pointer][: array.nbytes])
        array[...] = np.frombuffer(data, array.dtype).reshape(array.shape)

    def memset(self, pointer: int, value: int, nbytes: int, stream: int) -> None:
        self.streams.append(("memset", stream))
        self.memsets.append((pointer, value, nbytes))
        self.memory[pointer][:nbytes] = bytes([value]) * nbytes

    def view(self, pointer: int, count: int, dtype: Any = np.float32) -> np.ndarray:
        return np.frombuffer(self.memory[pointer], dtype, count)

    def launch(self, function: Any, grid: Any, block: Any, args: Any, stream: int) -> None:
        self.streams.append(("launch", stream))
        function(self, [value for _, value in args])

    def synchronize(self, stream: int) -> None:
        self.streams.append(("synchronize", stream))
        self.syncs += 1
        if self.fail_sync:
            self.fail_sync = False
            raise TCLaunchError("the kernel failed while running: (injected)")

    def work_stream(self, stream: int) -> int:
        return stream if self.own_stream is None else self.own_stream

    def order(self, after: int, before: int) -> None:
        self.orders.append((after, before))


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
