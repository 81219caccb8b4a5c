"""Host memory for the outputs of `cpu` calls, kept for the next call.

A large array NumPy allocates comes from fresh pages (glibc maps a block of 128 KB or
more on its own and unmaps it when it is freed, or trims the heap), and each page
costs a fault at its first write: 2 us per 4 KB page here, a third of an element-wise
kernel's time on 64 MB. So an output of `MIN_BYTES` or more that the kernel writes
whole is carved from a block this pool keeps: when the last array over the block goes
(the caller's output and every view of it), the block comes back (`_Owner.__del__`)
and the next call of that size writes into pages already mapped. At most
`IDLE_BYTES` wait in the pool; beyond, a block given back is freed.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np

MIN_BYTES = 1 << 20
IDLE_BYTES = 256 << 20


class HostPool:
    """Blocks of host memory by rounded size (`rounded`), idle until taken (`empty`)."""

    def __init__(self, idle_limit: int = IDLE_BYTES) -> None:
        self.idle_limit = idle_limit
        self.idle: dict[int, list[tuple[np.ndarray, int]]] = {}  # blocks and addresses
        self.idle_bytes = 0
        self.lock = threading.Lock()

    @staticmethod
    def rounded(nbytes: int) -> int:
        """`nbytes` rounded up to an eighth of the power of two below it (at most
        12.5% more), so that sizes close to each other share blocks."""
        step = 1 << max(12, (nbytes - 1).bit_length() - 4)
        return -(-nbytes // step) * step

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """An uninitialised array of `shape` and `dtype`: from a pooled block when it
        holds `MIN_BYTES` or more, else from NumPy."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        size = self.rounded(nbytes)
        with self.lock:
            blocks = self.idle.get(size)
            taken = blocks.pop() if blocks else None
            if taken is not None:
                self.idle_bytes -= size
        if taken is None:
            fresh = np.empty(size, np.uint8)
            taken = fresh, int(fresh.ctypes.data)
        block, address = taken
        if dtype.kind in "biufc":  # NumPy's own types: the owner describes the array
            return np.asarray(_Owner(block, address, self, tuple(shape), dtype.str))
        raw: np.ndarray = np.asarray(_Owner(block, address, self, (nbytes,), "|u1"))
        return raw.view(dtype).reshape(shape)  # bfloat16: a type NumPy describes otherwise

    def give_back(self, block: np.ndarray, address: int) -> None:
        """`block` (at `address`) idle again (kept while the pool holds under its
        limit)."""
        with self.lock:
            if self.idle_bytes + block.nbytes <= self.idle_limit:
                self.idle.setdefault(block.nbytes, []).append((block, address))
                self.idle_bytes += block.nbytes

    def clear(self) -> None:
        with self.lock:
            self.idle.clear()
            self.idle_bytes = 0


class _Owner:
    """The base of an array carved from a pooled `block`: NumPy keeps it alive as long
    as the array or any view of it lives, and its end gives the block back."""

    __slots__ = ("__array_interface__", "address", "block", "pool")

    def __init__(
        self,
        block: np.ndarray,
        address: int,
        pool: HostPool,
        shape: tuple[int, ...],
        typestr: str,
    ) -> None:
        self.block, self.address, self.pool = block, address, pool
        self.__array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (address, False),
            "version": 3,
        }

    def __del__(self) -> None:
        # the pool and its lock are held here: still alive
        self.pool.give_back(self.block, self.address)


POOL = HostPool()
