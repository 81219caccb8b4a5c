"""How many threads a `cpu` kernel runs on, and how its OpenMP threads wait.

A kernel's OpenMP team (GNU libgomp's) waits at each barrier for its slowest thread,
and a thread that shares its core with another busy thread loses whole time slices
there. So each call counts the threads busy elsewhere (other processes, and other
libraries' threads in this one: OpenBLAS's or PyTorch's, which keep spinning for a
while after their calls) and leaves their cores to them, or, where a kernel at its
sizes ran faster on all cores in that state, takes them all (`threads_now`, `Trials`).
Its own threads wait for the next call by spinning for a short while only
(`openmp.SPIN_COUNT`, 10 us), then sleep, so that the next library's call finds its
cores free; within a call they wait at the kernel's own barriers
(`tcpy.codegen.region`), which spin longer.
Woken at the next call, a sleeping thread may be put on the core of the thread that
woke it and stay there, the two taking turns while another core idles; so a team that
has a core for each of its threads gets one each (`Teams.place`).

Results do not depend on the thread count: the parallel loops share out whole
iterations, each computing the same outputs the same way on any thread, and no
reduction is split across threads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tcpy import knobs
from tcpy.runtime import openmp, toolchain

SERIAL_WORK = 1 << 15
"""Fewer statement instances than this run on one thread unless more are given:
starting an OpenMP team and its barriers cost more than they share (measured on 2
cores: an addition of 16 or 4,096 elements took 11-12 us on one thread and 15-16 on
two; at 65,536 both took 32; at 2^20, two threads 140 against 242)."""


def threads_now(asked: int = 0, work: int | None = None, trials: Trials | None = None) -> int:
    """The threads a kernel runs on at this call: those given (`knobs.cpu_threads`),
    else one for less than `SERIAL_WORK` statement instances (`work`), else the
    cores, or, where other threads keep some busy (`Load`), the free cores or all of
    them, whichever ran the kernel faster in that state (`trials`, the kernel's at
    these sizes; the free cores without them). Measured on 2 cores beside one busy
    process, 2 threads ran kernels 1.6x to 50x slower than on a quiet machine, 1
    thread at most 2x slower; but beside OpenBLAS's threads after a NumPy call, a
    512^3 matmul ran 1.6x faster on both cores than on the one free."""
    given = knobs.cpu_threads(asked)
    if trials is not None:
        trials.chosen = None
    before = getattr(_LAST, "count", 1)
    if given is not None:
        count = given
    elif work is not None and work < SERIAL_WORK:
        _LAST.count = 1
        return 1
    else:
        count = _LOAD.free_cores(time.monotonic(), runnable_elsewhere)
        if trials is not None and count < _LOAD.cores:
            count = trials.choose(count, _LOAD.cores, before)
    caller = threading.get_native_id()
    _TEAMS.know(count, caller)
    _TEAMS.place(count, caller)
    _LAST.count = count
    return count


ALLOWED_SECONDS = 0.05
"""How long the cores a caller may run on are taken as read (`Teams.place`)."""

_LAST = threading.local()
"""The thread count of the calling thread's last kernel call (`count`)."""


class Trials:
    """How fast a kernel at given sizes ran on each thread count while other threads
    kept some cores busy: `choose` tries the free cores and all of them until each
    has `TRIALS` times, then keeps the faster by the least of its last `TRIALS`
    times, trying the other again every `RETRY` calls, two calls in a row; `record`
    takes the time of the call `choose` chose for. A call on more threads than the
    caller's last call wakes threads that slept, their caches cold, and is not
    recorded: timed, it stood for the count's cost only at a switch, so that once the
    free cores won, every retry of all the cores was such a switch, and they never
    won back. The least, not the median: right after NumPy's calls a 512^3 matmul on
    2 threads took 1.3-1.5 ms but for one call in three or four at 3.6-7 ms (OpenBLAS's
    thread still spinning), in runs, against 2.5-2.8 ms on 1; by the median of three
    it spent most calls on 1 thread (2.5 ms, 1.45x the best fixed count), by the
    least 0.98x. Beside a busy process, where 2 threads are slow at every call, the
    least chose as the median did. Calls on a quiet machine are not recorded: they
    run on all cores."""

    TRIALS = 3
    RETRY = 50

    def __init__(self) -> None:
        self._seconds: dict[int, deque[float]] = {}
        self._calls = 0
        self._timed = False  # whether the chosen call is recorded
        self.chosen: int | None = None

    def choose(self, free: int, cores: int, before: int = 1) -> int:
        """The count for this call: `free` or `cores`; `before`, the caller's last."""
        self._calls += 1
        few, many = self._times(free), self._times(cores)
        if len(few) < self.TRIALS:
            best = free
        elif len(many) < self.TRIALS:
            best = cores
        else:  # the faster by the least (the free cores on a tie), or the other to retry
            faster = min(few) <= min(many)
            best = free if faster else cores
            if self._calls % self.RETRY in (0, 1):
                best = free if best == cores else cores
        self._timed = best <= before
        self.chosen = best
        return best

    def _times(self, count: int) -> deque[float]:
        times = self._seconds.get(count)
        if times is None:
            times = self._seconds[count] = deque(maxlen=self.TRIALS)
        return times

    def record(self, seconds: float) -> None:
        if self.chosen is not None and self._timed:
            self._seconds[self.chosen].append(seconds)


class Load:
    """The threads busy elsewhere, sampled at most every `interval` seconds: the
    least of the last `samples` samples, so that a task that runs for an instant
    does not take a core away from the kernels."""

    def __init__(self, interval: float = 0.05, samples: int = 3) -> None:
        self.interval = interval
        self._samples: deque[int] = deque(maxlen=samples)
        self._last = -float("inf")
        self._lock = threading.Lock()
        self.cores = 1  # the cores this process may run on, read at each sample

    def free_cores(self, now: float, sample: Callable[[], int | None]) -> int:
        """The cores this process may run on less those others keep busy (at least 1)."""
        busy = self.busy_elsewhere(now, sample)
        return max(1, self.cores - busy)

    def busy_elsewhere(self, now: float, sample: Callable[[], int | None]) -> int:
        if now - self._last < self.interval:  # no sample due: no lock either
            return min(self._samples, default=0)
        with self._lock:
            if now - self._last >= self.interval:
                self.cores = knobs.cores()
                self._last = now
                value = sample()
                if value is not None:
                    self._samples.append(value)
            return min(self._samples, default=0)


_LOAD = Load()


def runnable_elsewhere() -> int | None:
    """The threads running or waiting to run now, other than the calling thread and
    the threads of tcpy's own teams (`Teams`), from the kernel's count of runnable
    tasks (`/proc/loadavg`) and this process's (`elsewhere`). Another library's
    threads in this process count: OpenBLAS's spin for a while after each of its
    calls. None where /proc does not say."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        here, tasks = set(), {int(t) for t in os.listdir("/proc/self/task")}
        for task in tasks:
            try:
                with open(f"/proc/self/task/{task}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # the thread ended
                continue
            if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"R":
                here.add(task)
    except (OSError, ValueError, IndexError):
        return None
    _TEAMS.forget_ended(tasks)
    ours = _TEAMS.threads() | {threading.get_native_id()} if _TEAMS.known else None
    return elsewhere(running, here, ours)


def elsewhere(running: int, running_here: set[int], ours: set[int] | None) -> int:
    """Of `running` runnable tasks, those that are not ours: `running_here` are the
    ids of this process's, `ours` those of the calling thread and tcpy's teams (None:
    every thread of this process)."""
    mine = len(running_here) if ours is None else len(running_here & ours)
    return max(0, running - mine)


# --- tcpy's own teams -----------------------------------------------------------------

_TEAM_C = r"""
#define _GNU_SOURCE
#include <omp.h>
#include <unistd.h>
#include <sys/syscall.h>
int tc_team(int n, long *tids) {
  int got = 0;
  #pragma omp parallel num_threads(n)
  {
    tids[omp_get_thread_num()] = (long)syscall(SYS_gettid);
    #pragma omp single
    got = omp_get_num_threads();
  }
  return got;
}
"""


class Teams:
    """The threads of the OpenMP teams tcpy's kernels run on. libgomp keeps a pool of
    threads per calling thread, reused from call to call (a smaller team lets the
    extra ones end); a region of the same libgomp that records its threads' ids
    (`tc_team`, built once per process) finds them, again whenever a caller's team
    changes size or one of its threads ended. `known` is False where that region
    could not be built: every thread of this process then counts as tcpy's.

    A team with a core for each of its threads gets one each (`place`)."""

    def __init__(self) -> None:
        self._teams: dict[int, tuple[int, frozenset[int]]] = {}  # caller -> size, ids
        self._placed: dict[int, int | None] = {}  # caller -> the core placed around
        self._cores: dict[int, tuple[float, set[int]]] = {}  # caller -> when read, its cores
        self._lock = threading.Lock()
        self.known = True
        self.placing = hasattr(os, "sched_setaffinity") and _core_function() is not None

    def know(self, count: int, caller: int | None = None) -> None:
        """Record the team of `count` threads the calling thread (`caller`, its native
        id) is about to run."""
        caller = threading.get_native_id() if caller is None else caller
        if count <= 1 or not self.known or self._teams.get(caller, (1,))[0] == count:
            return
        team = _team_function()
        if team is None:
            self.known = False
            return
        ids = (ctypes.c_long * count)()
        got = team(count, ids)
        with self._lock:
            self._teams[caller] = (count, frozenset(int(i) for i in ids[:got] if i))
            self._placed.pop(caller, None)  # its threads are where they were: not known

    def place(self, count: int, caller: int | None = None) -> None:
        """Where the calling thread's team of `count` threads has a core for each
        (the cores the caller may run on), put each of its other threads on a core
        of its own, none on the caller's (which stays free to move); where it has
        not, let them run on any of the caller's cores. Nothing is done when the
        team and the caller's core are as at the last call, nor where the
        environment binds OpenMP's threads itself (`OMP_PROC_BIND`, `OMP_PLACES`,
        `GOMP_CPU_AFFINITY`). The cores the caller may run on are read again every
        `ALLOWED_SECONDS`: at every call, the system call was a sixth of a call's
        Python work."""
        if not self.placing:
            return
        caller = threading.get_native_id() if caller is None else caller
        size, ids = self._teams.get(caller, (1, frozenset()))  # a dict read: no lock
        if size != count:  # one thread, or a team not known
            return
        allowed = self._allowed(caller)
        core = _core_function()
        around = core() if core is not None and count == len(allowed) else None
        if (caller in self._placed and self._placed[caller] == around) or knobs.openmp_binds():
            return
        others = sorted(ids - {caller})
        cores = sorted(allowed - {around}) if around is not None else []
        try:
            for k, tid in enumerate(others):
                os.sched_setaffinity(tid, {cores[k]} if cores else allowed)
        except ProcessLookupError:  # a thread ended: its team is recorded again
            with self._lock:
                self._teams.pop(caller, None)
            return
        except OSError:  # not allowed here: threads go where the system puts them
            self.placing = False
            return
        self._placed[caller] = around

    def _allowed(self, caller: int) -> set[int]:
        """The cores `caller` may run on, as read at most `ALLOWED_SECONDS` ago."""
        now = time.monotonic()
        read = self._cores.get(caller)
        if read is None or now - read[0] >= ALLOWED_SECONDS:
            read = self._cores[caller] = (now, os.sched_getaffinity(0))
        return read[1]

    def team(self) -> frozenset[int]:
        """The threads of the calling thread's team, itself among them (empty: none
        recorded)."""
        with self._lock:
            return self._teams.get(threading.get_native_id(), (1, frozenset()))[1]

    def threads(self) -> set[int]:
        with self._lock:
            return {i for _, ids in self._teams.values() for i in ids}

    def forget_ended(self, alive: set[int]) -> None:
        """Forget the teams one of whose threads is not among `alive` (this process's
        threads): the next call of their caller records its team again."""
        with self._lock:
            for caller, (_, ids) in list(self._teams.items()):
                if not ids <= alive:
                    del self._teams[caller]


@functools.cache
def _core_function() -> Callable[[], int] | None:
    """The C library's `sched_getcpu` (the core the calling thread runs on), or None
    where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.argtypes = []
    fn.restype = ctypes.c_int
    return fn


_TEAMS = Teams()


@functools.cache
def _team_function() -> Callable[[int, ctypes.Array[ctypes.c_long]], int] | None:
    """`tc_team` of a library built with the kernels' compiler and OpenMP, or None
    where it cannot be built."""
    compiler = toolchain.c_compiler()
    directory = Path(tempfile.mkdtemp(prefix="tcpy-team-"))
    source, library = directory / "team.c", directory / "team.so"
    source.write_text(_TEAM_C)
    command = [compiler, "-O1", "-fopenmp", "-shared", "-fPIC", "-o", str(library), str(source)]
    command += openmp.link_flags()
    try:
        done = subprocess.run(command, capture_output=True, timeout=120)
        if done.returncode != 0:
            return None
        fn = openmp.load(library).tc_team
    except (OSError, AttributeError, subprocess.TimeoutExpired):
        return None
    finally:  # a loaded library stays loaded
        shutil.rmtree(directory, ignore_errors=True)
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_long)]
    fn.restype = ctypes.c_int
    return fn
