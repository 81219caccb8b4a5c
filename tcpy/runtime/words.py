"""Status words a call's kernels write and the host reads without a copy, checked lazily.

A compiled kernel reports a fault of the input values (a gather out of range, an
integer division by zero) by writing a nonzero code into its call's status word
(`tcpy.codegen.status`). The words live in page-locked host memory mapped into the
device's address space (`Driver.mapped_words`): the device writes through to the
host, so the host reads a word where it is, with no copy and no driver call, and a
call never waits for its kernels to learn how they went.

Each call takes a zero word (`issue`). A word nobody has read yet is *in flight*;
every nonzero word is a failure, so `check` scans the words in flight (a few hundred
nanoseconds) and raises the first failure it finds, naming the def and the number of
the call that made it, whether its work has finished or not. A word goes back to the
free list, zero, once its call's work has finished, which the host learns without
waiting: every `BATCH` calls on a stream an event is recorded there after them, and
`reap` queries the events (a query, never a wait); a synchronisation of the stream
(`settled`) finishes them all. A word a kernel wrote is zeroed by the host when it is
reported, so no call memsets its word.

A call captured into a CUDA graph (`capturing`) gets a word of its own for the
graph's life (`captured`): every replay writes there, `check` reads it like the others,
and the host zeroes it after reporting; nothing is recorded or synchronised during the
capture.

Words come in slabs of `SLAB` words; when fewer than `RESERVE` are free, the finished
ones are freed and, if still too few, a new slab is allocated (a driver call, rare: the
words in flight are bounded by the work the device has queued), never during a
capture, which must not ask the driver for memory.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from tcpy.errors import TCError, TCInputError, TCLaunchError
from tcpy.runtime.pool import PerDriver, pool
from tcpy.runtime.status import check_status
from tcpy.runtime.streams import PER_THREAD, stream_key

SLAB = 1024
"""Words per slab of mapped memory (4 KB)."""
BATCH = 32
"""Calls on a stream between two events that tell when their words may be reused."""
RESERVE = 256
"""Free words kept ready outside CUDA graph captures (see `StatusWords.issue`)."""


class WordDriver(Protocol):
    def mapped_words(self, count: int) -> tuple[np.ndarray, int]: ...
    def event(self) -> Any: ...
    def record(self, event: Any, stream: int) -> None: ...
    def done(self, event: Any) -> bool: ...
    def synchronize(self, stream: int) -> None: ...


class Issued(NamedTuple):
    """What a word in flight belongs to: its call (the def's name and the call's
    number, counted per driver) and the stream the call was queued on."""

    word: int
    name: str
    call: int
    stream: int
    captured: bool = False

    def describe(self) -> str:
        where = "a replay of a CUDA graph that captured " if self.captured else ""
        return f"{where}call {self.call} of {self.name} (stream {self.stream:#x})"


_new = tuple.__new__
_ZEROS = bytes(4 * SLAB)


@dataclass
class _Batch:
    stream: int
    words: list[Issued] = field(default_factory=list)
    event: Any = None  # recorded after the batch's calls; None while the batch is open


class StatusWords:
    """The status words of one driver (see the module's doc). Thread-safe."""

    def __init__(self, drv: WordDriver) -> None:
        self.drv = drv
        self.slabs: list[tuple[np.ndarray, int]] = []  # host view, device address
        self.free: list[int] = []
        self.addresses: list[int] = []  # each word's device address
        self.views: list[memoryview] = []  # each slab's bytes
        self.owner: dict[int, Issued] = {}  # words in flight (and captured ones)
        self.open: dict[Hashable, _Batch] = {}  # per stream, words since its last event
        self.closed: list[_Batch] = []  # batches with an event, oldest first
        self.events: list[Any] = []  # events free for reuse
        self.reported: set[int] = set()  # words in flight whose failure was raised
        self.calls = 0
        self.lock = threading.Lock()

    # --- a call ----------------------------------------------------------------------

    def issue(
        self, name: str, stream: int, captured: bool = False, waited: bool = False
    ) -> tuple[int, int]:
        """A zero word for a call of `name` queued on `stream`: the word and its device
        address. `captured`: the call is being captured into a CUDA graph, and the word
        is the graph's for good; `waited`: the call will synchronise its stream and
        read its word itself (`result`)."""
        with self.lock:
            if len(self.free) < RESERVE and not captured:
                # refilled outside captures, where the driver may be asked (queries,
                # a new slab), so that a capture of up to RESERVE calls never needs to
                self._reap()
                if len(self.free) < RESERVE:
                    self._grow()
            if not self.free:
                self._grow()  # a capture longer than RESERVE calls: may fail there
            word = self.free.pop()
            self.calls += 1
            fields = (word, name, self.calls, stream, captured)
            issued = self.owner[word] = _new(Issued, fields)  # `Issued(...)`, faster
            if not captured and not waited:
                key = stream_key(stream) if stream == PER_THREAD else stream
                batch = self.open.get(key)
                if batch is None:
                    batch = self.open[key] = _Batch(stream)
                batch.words.append(issued)
                if len(batch.words) >= BATCH and stream != PER_THREAD:
                    self._close(key)
            return word, self.addresses[word]

    def result(self, word: int) -> int:
        """The code in the word of a call that waited for its stream (`waited`); the
        word is free again."""
        with self.lock:
            host = self._host(word)
            code = int(host[0])
            host[0] = 0
            del self.owner[word]
            self.reported.discard(word)
            self.free.append(word)
            return code

    def abandon(self, word: int) -> None:
        """The call of a `waited` word failed before it waited: the word is freed with
        its stream's other words (its kernels may still be queued)."""
        with self.lock:
            issued = self.owner[word]
            key = stream_key(issued.stream)
            batch = self.open.get(key)
            if batch is None:
                batch = self.open[key] = _Batch(issued.stream)
            batch.words.append(issued)

    def check(self) -> None:
        """Raise the first failure among the words in flight (no driver call)."""
        failure = self.failure()
        if failure is not None:
            raise failure

    def failure(self) -> TCError | None:
        """The first failure among the words in flight, reported (its word zeroed and,
        unless captured, freed), or None."""
        for slab, view in enumerate(self.views):  # reads need no lock
            if view.tobytes() != _ZEROS:  # the fastest look at 4 KB from Python
                with self.lock:
                    found = self._report(slab, self.slabs[slab][0])
                if found is not None:
                    return found
        return None

    def settled(self, stream: int) -> None:
        """`stream` was synchronised: the words of its calls are free (after a last
        look: call `failure` first)."""
        key = stream_key(stream)
        with self.lock:
            batch = self.open.pop(key, None)
            finished = [batch] if batch else []
            finished += [b for b in self.closed if stream_key(b.stream) == key]
            self.closed = [b for b in self.closed if stream_key(b.stream) != key]
            for b in finished:
                self._finish(b)

    def streams(self) -> list[int]:
        """The streams with words in flight (captured words aside)."""
        with self.lock:
            found = [b.stream for b in self.open.values()] + [b.stream for b in self.closed]
        return list(dict.fromkeys(found))

    # --- inside the lock -------------------------------------------------------------

    def _grow(self) -> None:
        host, device = self.drv.mapped_words(SLAB)
        host[:] = 0
        base = len(self.slabs) * SLAB
        self.slabs.append((host, device))
        self.views.append(memoryview(host).cast("B"))  # type: ignore[arg-type]
        self.addresses.extend(range(device, device + 4 * SLAB, 4))
        self.free.extend(range(base + SLAB - 1, base - 1, -1))  # popped lowest first

    def _close(self, key: Hashable) -> None:
        batch = self.open.pop(key)
        batch.event = self.events.pop() if self.events else self.drv.event()
        self.drv.record(batch.event, batch.stream)
        self.closed.append(batch)

    def _reap(self) -> None:
        """Free the words of the closed batches whose events have completed."""
        still = []
        for batch in self.closed:
            try:
                finished = self.drv.done(batch.event)
            except TCLaunchError as e:
                names = ", ".join(dict.fromkeys(w.describe() for w in batch.words))
                raise TCLaunchError(
                    f"a kernel failed while running, reported asynchronously; it was queued "
                    f"by one of: {names}: {e}"
                ) from None
            if finished:
                self._finish(batch)
            else:
                still.append(batch)
        self.closed = still

    def _finish(self, batch: _Batch) -> None:
        owner, free, reported = self.owner, self.free, self.reported
        for issued in batch.words:
            word = issued[0]
            if owner.get(word) is issued:  # not reported and reissued since
                del owner[word]
                free.append(word)
                if word in reported:  # zeroed when reported, but maybe written again
                    reported.discard(word)
                    self._host(word)[...] = 0
        if batch.event is not None:
            self.events.append(batch.event)

    def _host(self, word: int) -> np.ndarray:
        slab, offset = divmod(word, SLAB)
        return self.slabs[slab][0][offset : offset + 1]

    def _report(self, slab: int, host: np.ndarray) -> TCError | None:
        """The failure of the first nonzero word of a slab that was not reported
        before (a call's kernels still running may write its word again); the words
        are zeroed."""
        for offset in np.flatnonzero(host).tolist():
            word = slab * SLAB + offset
            code = int(host[offset])
            host[offset] = 0
            issued = self.owner.get(word)
            if issued is not None and not issued.captured:
                if word in self.reported:
                    continue
                self.reported.add(word)
            return self._error(code, issued.describe() if issued is not None else "a call")
        return None

    @staticmethod
    def _error(code: int, what: str) -> TCError:
        try:
            check_status(code)
        except TCError as e:  # not a KernelFault: the call running now did not make it
            kind = TCInputError if isinstance(e, TCInputError) else type(e)
            return kind(
                f"{what} failed, reported asynchronously (at a later call): {e}; "
                "TCPY_LAUNCH_BLOCKING=1 (or ExecutionEngine('cuda', asynchronous=False)) "
                "raises such failures at the call that made them"
            )
        raise AssertionError("a nonzero status word raises")  # pragma: no cover


words = PerDriver(StatusWords)
"""The status words of a driver (`words(drv)`)."""


def settle(drv: WordDriver) -> None:
    """Wait for the streams with words in flight and raise the first failure among
    the calls queued there (`ExecutionEngine.synchronize`). Nothing to do, and no
    synchronisation, when no call is in flight."""
    status = words(drv)
    failure: TCError | None = None
    for stream in status.streams():
        try:
            drv.synchronize(stream)
        except TCLaunchError as e:
            failure = failure or TCLaunchError(
                f"a kernel queued on stream {stream:#x} failed while running, reported "
                f"asynchronously: {e}"
            )
            continue
        found = status.failure()
        status.settled(stream)
        pool(drv).settled(stream)  # the blocks pending there too
        failure = failure or found
    failure = failure or status.failure()  # captured words, replayed since
    if failure is not None:
        raise failure


def _at_exit() -> None:
    """At interpreter exit: wait for the calls in flight and print a failure nobody
    was told of (there is no caller left to raise it to)."""
    for status in words.values():
        try:
            settle(status.drv)
        except TCError as e:
            print(f"tcpy: a GPU call failed and was never reported: {e}", file=sys.stderr)
        except Exception:  # the context may be gone at exit
            continue


atexit.register(_at_exit)
