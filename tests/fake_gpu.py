"""A CUDA driver without a GPU, for tests of the runtime's own work: memory in host
bytes, kernels as Python functions of (driver, arguments), and arrays in that memory
seen through `__cuda_array_interface__`, as PyTorch's and CuPy's are."""

from __future__ import annotations

from typing import Any

import numpy as np

from tcpy.errors import TCLaunchError


class HostMemoryDriver:
    """The `Driver` interface over host bytes; `launch` calls the kernel, a Python
    function of (driver, args). `fail_sync` makes the next synchronisation fail."""

    def __init__(self) -> None:
        self.memory: dict[int, bytearray] = {}
        self.next = 1 << 20
        self.allocs = self.frees = self.syncs = 0
        self.memsets: list[tuple[int, int, int]] = []
        self.fail_sync = False

    def alloc(self, nbytes: int) -> int:
        self.allocs += 1
        pointer, self.next = self.next, self.next + nbytes + 4096
        self.memory[pointer] = bytearray(b"\x5a" * nbytes)  # stale bytes, as a GPU's are
        return pointer

    def free(self, pointer: int) -> None:
        self.frees += 1
        del self.memory[pointer]

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        self.memory[pointer][: array.nbytes] = np.ascontiguousarray(array).tobytes()

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        data = bytes(self.memory[pointer][: array.nbytes])
        array[...] = np.frombuffer(data, array.dtype).reshape(array.shape)

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        self.memsets.append((pointer, value, nbytes))
        self.memory[pointer][:nbytes] = bytes([value]) * nbytes

    def view(self, pointer: int, count: int, dtype: Any = np.float32) -> np.ndarray:
        return np.frombuffer(self.memory[pointer], dtype, count)

    def launch(self, function: Any, grid: Any, block: Any, args: Any) -> None:
        function(self, [value for _, value in args])

    def synchronize(self) -> None:
        self.syncs += 1
        if self.fail_sync:
            self.fail_sync = False
            raise TCLaunchError("the kernel failed while running: (injected)")


class DeviceVector:
    """A float32 vector in the driver's memory, seen through
    `__cuda_array_interface__`."""

    def __init__(self, drv: HostMemoryDriver, values: np.ndarray) -> None:
        self.shape, self.dtype = values.shape, values.dtype
        self.pointer = drv.alloc(values.nbytes)
        drv.to_device(self.pointer, values)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False),
                "version": 3, "strides": None}  # fmt: skip
