"""The device memory a call borrows for what it does not hand to the caller (copies of
host inputs, temporaries, host outputs on their way back, the status word): blocks a
call gives back are kept for the next, so that a call reaches the driver's allocator
only when it needs more than earlier calls returned. One pool per driver (`pool`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from tcpy.errors import TCLaunchError
from tcpy.runtime.streams import PER_THREAD, stream_key

T = TypeVar("T")

POOL_IDLE_BYTES = 1 << 30
"""The most device memory the pool keeps idle between calls; beyond it, blocks given
back go back to the driver."""


class Memory(Protocol):
    def alloc(self, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def synchronize(self, stream: int) -> None: ...


class DevicePool:
    """Device memory borrowed for the length of a call and given back (`acquire`,
    `release`). A block is allocated at a rounded size (512 bytes at least, else a
    multiple of an eighth of the power of two below: at most 12.5% more than asked), kept,
    once given back, for the next request of that rounded size.

    Reuse must not race with the GPU. A block given back after its call synchronised
    its stream is free for any stream. One given back while work queued on a stream
    may still use it (an asynchronous call's, a failed call's) is pending on that
    stream: it is handed only to requests for the same stream, whose work runs after
    the earlier work in the stream's order, until `settled(stream)` (called once the
    stream was synchronised) frees it for every stream. An allocation the driver
    refuses is retried once after the idle blocks are freed (`trim`), pending ones
    after their streams are synchronised."""

    def __init__(self, drv: Memory, idle_limit: int = POOL_IDLE_BYTES) -> None:
        self.drv = drv
        self.idle_limit = idle_limit
        # (rounded size, stream key of the pending stream or None) -> blocks not in use
        self.idle: dict[tuple[int, Hashable], list[int]] = {}
        self.idle_bytes = 0
        self.sizes: dict[int, int] = {}  # every block the pool allocated -> its size
        self.lock = threading.Lock()

    @staticmethod
    def rounded(nbytes: int) -> int:
        if nbytes <= 512:
            return 512
        step = 1 << (nbytes - 1).bit_length() - 4  # an eighth of the power of two below
        return -(-nbytes // step) * step

    def acquire(self, nbytes: int, stream: int = 0) -> int:
        """A block of at least `nbytes` for work queued on `stream`."""
        size = self.rounded(nbytes)
        found = self._idle(size, stream)
        if found is not None:
            return found
        try:
            pointer = self.drv.alloc(size)
        except Exception:  # out of memory, maybe only for want of the idle blocks
            self.trim()
            pointer = self.drv.alloc(size)
        with self.lock:
            self.sizes[pointer] = size
        return pointer

    def take_idle(self, nbytes: int, stream: int = 0) -> int | None:
        """An idle block of at least `nbytes` for work queued on `stream`, never
        allocated (during a CUDA graph capture, when the driver must not be asked); it
        is the caller's for good. None when there is none."""
        return self._idle(self.rounded(nbytes), stream)

    def _idle(self, size: int, stream: int) -> int | None:
        """An idle block of the rounded `size` for work on `stream`: one pending on
        that stream first, keeping the free ones for others; None when there is none."""
        pending = stream if stream != PER_THREAD else stream_key(stream)
        with self.lock:
            blocks = self.idle.get((size, pending)) or self.idle.get((size, None))
            if blocks:
                self.idle_bytes -= size
                return blocks.pop()
        return None

    def release(self, pointer: int, pending: int | None = None) -> None:
        """Take back a block; `pending`: the stream whose queued work may still use it
        (None: no work on the GPU does)."""
        with self.lock:
            size = self.sizes[pointer]
            if self.idle_bytes + size <= self.idle_limit:
                key = pending if pending != PER_THREAD else stream_key(pending)
                blocks = self.idle.get((size, key))
                if blocks is None:
                    blocks = self.idle[(size, key)] = []
                blocks.append(pointer)
                self.idle_bytes += size
                return
            del self.sizes[pointer]
        if pending is not None:
            # a failed synchronisation leaves the context unusable, and the call
            # giving the block back reports its own failure
            with contextlib.suppress(TCLaunchError):
                self.drv.synchronize(pending)
        self.drv.free(pointer)

    def settled(self, stream: int) -> None:
        """`stream` was synchronised: its pending blocks are free for every stream."""
        key = stream_key(stream)
        with self.lock:
            for size, pending in [k for k in self.idle if k[1] == key]:
                self.idle.setdefault((size, None), []).extend(self.idle.pop((size, pending)))

    def trim(self) -> None:
        """Give every idle block back to the driver, after synchronising the streams
        blocks are pending on (but another thread's per-thread default stream, which
        only that thread can name)."""
        with self.lock:
            pending = {key for _, key in self.idle if key is not None}
        for key in pending:
            stream = key if isinstance(key, int) else PER_THREAD
            if stream_key(stream) == key:
                self.drv.synchronize(stream)
                self.settled(stream)
        with self.lock:
            for size, key in [k for k in self.idle if k[1] is None]:
                for pointer in self.idle.pop((size, key)):
                    del self.sizes[pointer]
                    self.idle_bytes -= size
                    self.drv.free(pointer)


class PerDriver(Generic[T]):
    """One object per driver for the process, made by `make(drv)` on first use; a
    driver gone whose id another reuses gets a new one."""

    def __init__(self, make: Callable[[Any], T]) -> None:
        self.make = make
        self.made: dict[int, tuple[Any, T]] = {}
        self.lock = threading.Lock()

    def __call__(self, drv: Any) -> T:
        with self.lock:
            found = self.made.get(id(drv))
            if found is None or found[0] is not drv:
                found = self.made[id(drv)] = (drv, self.make(drv))
            return found[1]

    def values(self) -> list[T]:
        with self.lock:
            return [made for _, made in self.made.values()]


pool = PerDriver(DevicePool)
"""The memory pool of a driver (`pool(drv)`)."""
