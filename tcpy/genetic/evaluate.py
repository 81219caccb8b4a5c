"""Evaluating candidates so that their times can be trusted.

Each candidate is compiled and checked in a worker process (`tcpy.sandbox`): a compile
error, a crash of the worker (a segfault, an illegal address), a hang past the
timeout, a wrong result or an escaped exception that is not a `TCError` marks that
candidate failed with its class (`Failure`) and the session goes on. Every candidate's
outputs on the tuning inputs are compared with the reference's before its time counts;
a wrong result or an internal error is a compiler bug, logged on `tcpy.tune` and saved
as a replay file (`python -m tools.fuzz replay FILE` re-runs it).

Candidates of a generation compile in parallel, into a private kernel cache of the
session (the user's cache is not filled with hundreds of candidates), and are then
timed one at a time by a single worker, with nothing else of the session running: on a
2-core machine concurrent compiles would corrupt the timings. A per-host lock file
keeps two tuning sessions (or two Dask workers on one machine) from timing at once.
Timing is a warm-up run, then the median of `runs` runs; a candidate whose first run
is 100 times slower than the best so far, or whose second is 5 times slower, is pruned
after those runs (TC's thresholds): its median is still an honest upper bound. So a
candidate whose loops run away (far more iterations than the def holds work, the
fuzzer's `runaway` class) needs no counting build here: it is far slower than the
starting options, which the first generation always holds, and is pruned, or fails
its timeout.

When the search ends, its best few candidates and the best starting options are timed
again side by side (`time_side_by_side`: the candidates take turns within each round),
and the session's answer is settled on those times: the search's best is the minimum
of many noisy timings, which favours a candidate that was lucky once.

Where the tasks run is the executor's business (`tcpy.genetic.executors`: a local
process pool, or Dask workers); this module holds the tasks and the `Evaluator`, which
turns their outcomes into measurements for the search.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tcpy.errors import InternalError
from tcpy.genetic.search import Measured
from tcpy.mapping.options import MappingOptions
from tcpy.sandbox import Failure, Replay, WrongResult

if TYPE_CHECKING:
    from tcpy.genetic.executors import Trial

log = logging.getLogger("tcpy.tune")

PRUNE_FIRST = 100.0  # a first run this many times slower than the best is pruned
PRUNE_SECOND = 5.0  # a second run this many times slower is pruned

FAULTS: dict[int, str] = {}
"""A test hook: candidates whose `unroll` is a key fail as the value names (a
`Failure` value), inside the worker, as a real fault would. Empty outside the tests."""


@dataclass(frozen=True)
class Problem:
    """What every worker needs to compile, check and time a candidate: the TC source,
    the entry, the target, and a file holding the tuning inputs and the reference
    outputs (read once per worker)."""

    source: str
    entry: str
    target: str
    data: str  # path of an .npz file: in0.., want0..
    rtol: float = 1e-3


def save_problem(
    directory: Path, source: str, entry: str, target: str, inputs: tuple[Any, ...],
    want: tuple[np.ndarray, ...],
) -> Problem:  # fmt: skip
    path = directory / "problem.npz"
    arrays = {f"in{k}": np.asarray(a) for k, a in enumerate(inputs)}
    arrays.update({f"want{k}": np.asarray(w) for k, w in enumerate(want)})
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return Problem(source, entry, target, str(path))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    with np.load(path) as data:
        inputs = tuple(data[f"in{k}"] for k in range(sum(n.startswith("in") for n in data)))
        want = tuple(data[f"want{k}"] for k in range(sum(n.startswith("want") for n in data)))
    return tuple(_scalar(a) for a in inputs), want


def _scalar(a: np.ndarray) -> Any:
    """0-d inputs go back to NumPy scalars, as a user passes them."""
    return a[()] if a.ndim == 0 else a


@functools.lru_cache(maxsize=4)
def _engine(source: str, target: str) -> Any:
    import warnings

    import tcpy

    engine = tcpy.ExecutionEngine(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.define(source)
    return engine


# --- the tasks, run in worker processes ----------------------------------------------------


def compile_and_check(problem: Problem, options_json: str) -> float:
    """Compile the candidate, run it once on the tuning inputs, and compare with the
    reference; returns the compile time in seconds. Raises `WrongResult` on a mismatch
    (any other error is classified by the sandbox)."""
    inputs, want = _load(problem.data)
    engine = _engine(problem.source, problem.target)
    options = MappingOptions.from_json(options_json)
    start = time.perf_counter()
    compiled = engine.compile(problem.entry, *inputs, options=options)
    seconds = time.perf_counter() - start
    got = compiled(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        _compare(k, np.asarray(g), w, problem.rtol)
    return seconds


def _compare(k: int, got: np.ndarray, want: np.ndarray, rtol: float) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        raise WrongResult(f"output {k}: {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
    if want.dtype.kind in "biu":
        bad = got != want
    else:
        # reductions may be reassociated: compare against the output's magnitude
        scale = float(np.nanmax(np.abs(want))) if want.size and np.isfinite(want).any() else 1.0
        close = np.isclose(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True)
        bad = ~close
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise WrongResult(
            f"output {k} differs at {int(bad.sum())} of {bad.size} elements, first at {where}: "
            f"{got[where]!r}, expected {want[where]!r}"
        )


def time_candidate(problem: Problem, options_json: str, runs: int, best_s: float) -> float:
    """The median time of `runs` runs after a warm-up, under the per-host timing lock;
    pruned early when clearly slower than `best_s`."""
    compiled, inputs = _compiled(problem, options_json)
    with timing_lock():
        return _median_time(compiled, inputs, runs, best_s)


def time_held(problem: Problem, options_json: str, runs: int, best_s: float) -> float:
    """`time_candidate` for a caller that holds the timing lock already. A Dask worker
    takes the lock outside the sandbox, so that waiting for another worker of its host
    does not count against this task's timeout (and the sandbox, locking again on
    another descriptor, would wait for its own caller forever)."""
    compiled, inputs = _compiled(problem, options_json)
    return _median_time(compiled, inputs, runs, best_s)


def time_side_by_side(problem: Problem, jsons: list[str], runs: int, rounds: int) -> list[float]:
    """The median time of each candidate over `rounds` rounds, in each of which every
    candidate runs `runs` times in turn, under the per-host timing lock: a change in
    the machine's speed during the rounds touches every candidate alike."""
    kernels = [_compiled(problem, j)[0] for j in jsons]  # compiled before the lock
    with timing_lock():
        return _side_by_side(kernels, _load(problem.data)[0], runs, rounds)


def side_by_side_held(problem: Problem, jsons: list[str], runs: int, rounds: int) -> list[float]:
    """`time_side_by_side` for a caller that holds the timing lock (see `time_held`)."""
    kernels = [_compiled(problem, j)[0] for j in jsons]
    return _side_by_side(kernels, _load(problem.data)[0], runs, rounds)


def _side_by_side(
    kernels: list[Any], inputs: tuple[Any, ...], runs: int, rounds: int
) -> list[float]:
    for kernel in kernels:
        kernel(*inputs)  # warm-up
    times: list[list[float]] = [[] for _ in kernels]
    for _ in range(rounds):
        for kernel, mine in zip(kernels, times, strict=True):
            for _ in range(max(1, runs)):
                start = time.perf_counter()
                kernel(*inputs)
                mine.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _compiled(problem: Problem, options_json: str) -> tuple[Any, tuple[Any, ...]]:
    """The candidate's kernel (from the session's cache: `compile_and_check` built it)
    and the tuning inputs."""
    inputs, _ = _load(problem.data)
    engine = _engine(problem.source, problem.target)
    options = MappingOptions.from_json(options_json)
    return engine.compile(problem.entry, *inputs, options=options), inputs


def _median_time(compiled: Any, inputs: tuple[Any, ...], runs: int, best_s: float) -> float:
    compiled(*inputs)  # warm-up: first-touch of outputs, caches, OpenMP threads
    times: list[float] = []
    for k in range(max(1, runs)):
        start = time.perf_counter()
        compiled(*inputs)
        times.append(time.perf_counter() - start)
        if k == 0 and times[0] > PRUNE_FIRST * best_s:
            break
        if k == 1 and times[1] > PRUNE_SECOND * best_s:
            break
    return statistics.median(times)


@contextlib.contextmanager
def timing_lock(exclusive: bool = True) -> Iterator[None]:
    """One timing at a time on this machine, across processes and sessions. A Dask
    worker compiles under the lock shared (`exclusive=False`): compiles on one host
    overlap each other but never a timing there, which waits until they are done."""
    path = Path(tempfile.gettempdir()) / f"tcpy-timing-{os.getuid()}.lock"
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- the evaluator, in the tuning process ---------------------------------------------------


class Evaluator:
    """Measures batches of candidates for the search on an executor (`TunerConfig.
    executor`: local processes by default, Dask workers when given a client): every
    candidate is compiled and checked, the valid ones timed. Failures are logged here,
    in the tuning process, where the replay files of compiler bugs are written.

    `devices` counts the valid candidates timed on each device. Times from different
    devices are not comparable, so a session that meets a second device warns, and
    `device` then names them all: a result stored under that name is looked up by no
    single machine, rather than passed off as tuned for one of them."""

    def __init__(self, problem: Problem, config: Any, cache_dir: Path, bugs_dir: Path) -> None:
        from tcpy.genetic.executors import make_executor

        self.problem = problem
        self.config = config
        self.bugs_dir = bugs_dir
        self.best_s = float("inf")
        self.faults = dict(FAULTS)  # read now: on Dask the hook travels with each task
        self.devices: Counter[str] = Counter()
        self._executor = make_executor(config, problem, cache_dir, self.faults)

    @property
    def device(self) -> str | None:
        """The device the times were measured on (None before any was)."""
        return " | ".join(sorted(self.devices)) or None

    def close(self) -> None:
        self._executor.close()

    def side_by_side(self, candidates: list[MappingOptions], rounds: int) -> list[float] | None:
        """The candidates (all valid: measured before) timed side by side on one
        device; None when that failed, which leaves the search's own times to decide."""
        times = self._executor.side_by_side([o.to_json() for o in candidates], rounds)
        if times is None:
            log.warning("timing the best candidates side by side failed; the search's times decide")
        return times

    def __call__(self, candidates: list[MappingOptions]) -> list[Measured]:
        trials = self._executor.measure([o.to_json() for o in candidates], self.best_s)
        return [self._measured(o, t) for o, t in zip(candidates, trials, strict=True)]

    def _measured(self, options: MappingOptions, trial: Trial) -> Measured:
        """The search's view of a trial; a valid one carries its device as the detail."""
        if trial.failure is not None:
            self._log_failure(options, trial.failure, trial.detail)
            return Measured(None, trial.failure, trial.detail)
        if trial.time_s is None:
            raise InternalError(f"a trial that neither failed nor has a time: {trial}")
        if self.devices and trial.device not in self.devices:
            log.warning(
                "candidates timed on different devices (%s and %s): their times are not "
                "comparable; tune on workers of one kind",
                ", ".join(self.devices), trial.device,
            )  # fmt: skip
        self.devices[trial.device] += 1
        self.best_s = min(self.best_s, trial.time_s)
        return Measured(trial.time_s, detail=trial.device)

    def _log_failure(self, options: MappingOptions, failure: Failure, detail: str) -> None:
        """Every failure on the `tcpy.tune` logger; compiler bugs also as a replay file."""
        first = detail.strip().splitlines()[-1] if detail.strip() else ""
        if failure not in (Failure.WRONG_RESULT, Failure.INTERNAL_ERROR, Failure.CRASH):
            log.info("candidate failed (%s): %s; options %s", failure.value, first, options)
            return
        path = self._save_replay(options, failure, detail)
        log.warning(
            "compiler bug (%s) with options %s: %s; replay: python -m tools.fuzz replay %s",
            failure.value, options.to_json(), first, path,
        )  # fmt: skip

    def _save_replay(self, options: MappingOptions, failure: Failure, detail: str) -> Path:
        from tcpy.parser import check_source

        inputs, _ = _load(self.problem.data)
        cdef = check_source(self.problem.source)[self.problem.entry]
        sizes = _sizes_of(cdef, inputs)
        record = Replay(
            source=self.problem.source, entry=self.problem.entry, sizes=sizes, input_seed=0,
            options=options.to_dict(), target=self.problem.target, failure=failure.value,
            detail=detail,
        )  # fmt: skip
        self.bugs_dir.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256((options.to_json() + failure.value).encode()).hexdigest()[:12]
        path = self.bugs_dir / f"tune-{self.problem.entry}-{failure.value}-{digest}.json"
        record.save(path)
        return path


def _sizes_of(cdef: Any, inputs: tuple[Any, ...]) -> dict[str, int]:
    from tcpy.binding import bind

    return dict(bind(cdef, inputs).sizes)


# --- fault injection, for the tests --------------------------------------------------------


def _faulty(problem: Problem, options_json: str, faults: dict[int, str]) -> float:
    """`compile_and_check`, except that a candidate whose unroll is a key of `faults`
    fails as the value names, the way a real fault would in a worker."""
    options = MappingOptions.from_json(options_json)
    match faults.get(options.unroll):
        case "compile_error":
            from tcpy.errors import TCCompileError

            raise TCCompileError("injected compile error")
        case "crash":
            import ctypes

            ctypes.string_at(0)  # a segfault, which kills the worker
        case "hang":
            time.sleep(3600)
        case "wrong_result":
            raise WrongResult("injected wrong result")
        case "internal_error":
            raise RuntimeError("injected internal error")
    return compile_and_check(problem, options_json)
