"""Host memory for the outputs of `cpu` calls, kept for the next call.

A large array NumPy allocates comes from fresh pages (glibc maps a block of 128 KB or
more on its own and unmaps it when it is freed, or trims the heap), and each page
costs a fault at its first write: 2 us per 4 KB page here, a third of an element-wise
kernel's time on 64 MB. Below 32 MB glibc learns: a mapped block freed raises the size
from which it maps blocks to that block's, so later blocks of that size come from its
heap, their pages already mapped. From 32 MB (`MIN_BYTES`, glibc's ceiling for that
size on 64-bit) it always maps and unmaps, so an output of that size or more that
the kernel writes whole is carved from a block this pool keeps: when the last array
over the block goes (the caller's output and every view of it), the block comes back
(`_Owner.__del__`) and the next call of that size writes into pages already mapped.
Pooling smaller outputs too (from 1 MB) kept glibc from learning, and NumPy's own
temporaries were then mapped afresh at each of its calls: NumPy's convolution right
after tcpy's ran 1.4-3.4x its quiet time in six runs of seven, 0.5-1.1x with glibc
left to learn.

At most `IDLE_BYTES` wait in the pool; a block given back past that limit makes room
by freeing the blocks idle longest (a block larger than the limit is freed itself): a
pool kept full by one large call's block, never taken again, had every later output
of 64 MB allocated afresh (an element-wise difference 9.8 ms a call against 7.6 for
its kernel).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

MIN_BYTES = 32 << 20
IDLE_BYTES = 256 << 20


class HostPool:
    """Blocks of host memory by rounded size (`rounded`), idle until taken (`empty`)."""

    def __init__(self, idle_limit: int = IDLE_BYTES) -> None:
        self.idle_limit = idle_limit
        # the idle blocks by address, the longest idle first, and their addresses by size
        self.idle: OrderedDict[int, np.ndarray] = OrderedDict()
        self.by_size: dict[int, list[int]] = {}
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
            addresses = self.by_size.get(size)
            taken = None
            if addresses:  # the block given back last: its pages the likeliest cached
                address = addresses.pop()
                taken = self.idle.pop(address), address
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
        """`block` (at `address`) idle again, the blocks idle longest freed while the
        pool would hold more than its limit (`block` itself if it is larger)."""
        size = block.nbytes
        if size > self.idle_limit:
            return
        with self.lock:
            while self.idle_bytes + size > self.idle_limit:
                oldest, freed = self.idle.popitem(last=False)
                self.by_size[freed.nbytes].remove(oldest)
                self.idle_bytes -= freed.nbytes
            self.idle[address] = block
            self.by_size.setdefault(size, []).append(address)
            self.idle_bytes += size

    def clear(self) -> None:
        with self.lock:
            self.idle.clear()
            self.by_size.clear()
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
