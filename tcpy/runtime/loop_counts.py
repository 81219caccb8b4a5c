"""The loop counters of a counting build (`tcpy.codegen.loops.COUNT_LOOP`), read from
its loaded library: reset, with the run's limit, before a run, and read after it."""

from __future__ import annotations

import ctypes
import threading

from tcpy.codegen.loops import LOOP_COUNT_N, LOOP_COUNTS, LOOP_LIMIT, LOOP_STOPPED


class LoopCounters:
    """The counters of one loaded counting build. `lock` is held by a counted run
    from its reset to its read, so that runs on other threads do not mix in."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.n = ctypes.c_int.in_dll(library, LOOP_COUNT_N).value
        self._counts = (ctypes.c_longlong * max(1, self.n)).in_dll(library, LOOP_COUNTS)
        self._total = ctypes.c_longlong.in_dll(library, "tc_loop_total")
        self._limit = ctypes.c_longlong.in_dll(library, LOOP_LIMIT)
        self._stopped = ctypes.c_int.in_dll(library, LOOP_STOPPED)
        self.lock = threading.Lock()

    def reset(self, limit: int) -> None:
        """Zero the counters; the run stops once its loops pass `limit` iterations."""
        ctypes.memset(self._counts, 0, ctypes.sizeof(self._counts))
        self._total.value = 0
        self._stopped.value = 0
        self._limit.value = limit

    def read(self) -> tuple[int, ...]:
        return tuple(self._counts[: self.n])

    @property
    def stopped(self) -> bool:
        """Whether the last run passed its limit and was stopped."""
        return bool(self._stopped.value)


def loop_counters(library: ctypes.CDLL) -> LoopCounters | None:
    """The counters of `library`, or None when it is not a counting build."""
    try:
        return LoopCounters(library)
    except ValueError:  # ctypes: the symbol is not there
        return None
