"""Launch plans: a compiled def's launches at fixed sizes, built once and replayed.

A `LaunchPlan` holds what a call at given sizes needs that does not depend on its
arrays: the kernels' handles, grids and blocks, one argument buffer with the sizes
written in (`cuda.Arguments`), the bytes of every output and temporary and which must
start at zero. A call then only patches the addresses of its arrays and its status
word into the buffer and queues the launches (`run`): no Python work that the
arguments do not change, no memset of the status word (`tcpy.runtime.words`), and
temporaries from the caller's library or the driver's pool, without driver calls once
warm.

Asynchronous by default: a call whose arrays are all on the device returns once its
work is queued. `run(..., wait=True)` (NumPy inputs or outputs, `TCPY_LAUNCH_BLOCKING=1`,
an engine made with `asynchronous=False`) synchronises the stream after the launches
and returns the call's status code.

Under CUDA graph capture (`Driver.capturing`), nothing synchronises or allocates from
the driver: temporaries must come from the caller's library (PyTorch's allocator
gives the graph's private pool) or from idle blocks of the pool, which then belong to
the graph for good, as its status word does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tcpy import knobs
from tcpy.errors import TCLaunchError
from tcpy.runtime import cuda, streams
from tcpy.runtime.words import words

Launch = tuple[tuple[int, int, int], tuple[int, int, int]]
# new device memory of a library's allocator: nbytes -> (keep-alive object, address)
Scratch = Callable[[int], tuple[Any, int]]


@dataclass
class LaunchPlan:
    """The launches of a def at fixed sizes (see the module's doc). `buffers`: the
    bytes of each output, then of each temporary; `zeroed`: whether each must start at
    zero (the kernels do not write it whole). The arguments are the sizes, the inputs'
    addresses, the outputs', the temporaries' and the status word's."""

    name: str
    functions: Sequence[Any]
    launches: Sequence[Launch]
    sizes: Sequence[int]
    inputs: int
    outputs: int
    buffers: Sequence[int]
    zeroed: Sequence[bool]
    drv: Any
    # the one launch of a def's one kernel, cooperative (`runtime.cooperative`); its
    # grid barrier's words are the last temporary
    cooperative: bool = False
    args: cuda.Arguments = field(init=False)
    lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        count = len(self.sizes)
        kinds = ["i64"] * count + ["ptr"] * (self.inputs + len(self.buffers) + 1)
        self.args = self.drv.arguments(kinds)
        for k, size in enumerate(self.sizes):
            self.args.set(k, size)
        self.first = count  # the slot of the first address (the word's is the last)
        self.temporaries = list(self.buffers[self.outputs :])
        self.zeros = [
            (self.inputs + k, nbytes)
            for k, (nbytes, zero) in enumerate(zip(self.buffers, self.zeroed, strict=True))
            if zero
        ]
        self.fills = [
            (self.inputs + k, nbytes) for k, nbytes in enumerate(self.buffers)
        ]  # every buffer, for TCPY_POISON (those not zeroed get all-ones bytes)
        self.work = [(f, g, b) for f, (g, b) in zip(self.functions, self.launches, strict=True)]
        self.memory = cuda.pool(self.drv)
        self.status = words(self.drv)

    def run(
        self, addresses: list[int], stream: int, scratch: Scratch | None = None,
        wait: bool = False, capturing: bool = False, ordered: Sequence[int] | None = None,
    ) -> int:  # fmt: skip
        """Queue the launches on `stream` for the inputs' and outputs' device
        `addresses` (the list is extended); temporaries from `scratch` (the caller's
        library), else from the pool. `capturing`: the stream is being captured into a
        CUDA graph; `ordered`: the streams of the call's arrays, `stream` first, when
        the work must be ordered against them (`streams.enter`, `streams.leave`).
        Returns 0 without waiting, or, with `wait`, after synchronising the stream,
        the status code of the call (0: all went well)."""
        drv = self.drv
        if capturing and wait:
            raise TCLaunchError(
                "a call being captured into a CUDA graph cannot wait for its kernels: "
                "pass arrays on the device (not NumPy), and do not set "
                "TCPY_LAUNCH_BLOCKING or asynchronous=False while capturing"
            )
        status = self.status
        kept: list[Any] = []  # the library's temporaries, alive until the launches
        borrowed: list[int] = []
        word, word_address = status.issue(self.name, stream, captured=capturing, waited=wait)
        try:
            for nbytes in self.temporaries:
                if scratch is not None:
                    owner, pointer = scratch(nbytes)
                    kept.append(owner)
                else:
                    pointer = borrow(self.memory, nbytes, stream, capturing)
                    borrowed.append(pointer)
                addresses.append(pointer)
            if knobs.poison_buffers():
                zeros = dict(self.zeros)
                for k, nbytes in self.fills:
                    drv.memset(addresses[k], 0 if k in zeros else 0xFF, nbytes, stream)
            else:
                for k, nbytes in self.zeros:
                    drv.memset(addresses[k], 0, nbytes, stream)
            addresses.append(word_address)
            if ordered:
                streams.enter(drv, ordered)
            try:
                with self.lock:  # the buffer is patched and read by the launches together
                    args = self.args
                    args.patch(self.first, addresses)
                    for function, grid, block in self.work:
                        if self.cooperative:
                            function.launch(grid, block, args.address, drv.work_stream(stream))
                        else:
                            drv.launch(function, grid, block, args, stream)
            finally:
                if ordered:
                    streams.leave(drv, ordered)
            if not wait:
                return 0
            cuda.wait(drv, stream)  # a failed launch raises here
            code = status.result(word)
            word = -1
            return code
        finally:
            if word >= 0 and wait:
                status.abandon(word)
            if borrowed and not capturing:  # a captured call's blocks are the graph's
                for pointer in borrowed:
                    self.memory.release(pointer, stream)


def borrow(memory: Any, nbytes: int, stream: int, capturing: bool) -> int:
    """A block of the pool for work on `stream`; during a capture, only an idle one
    (which is then the graph's for good)."""
    if not capturing:
        return int(memory.acquire(nbytes, stream))
    pointer = memory.take_idle(nbytes, stream)
    if pointer is None:
        raise TCLaunchError(
            "a call being captured into a CUDA graph needs device memory for its "
            "temporaries, and the driver cannot allocate during a capture: run the call "
            "once before capturing it (a warm-up), or pass PyTorch tensors, whose "
            "allocator serves captures"
        )
    return int(pointer)
