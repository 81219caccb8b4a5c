"""The tasks of a tuning session that run in worker processes: compile and check a
candidate, time it, time several side by side, and name the device they ran on.

Each is a module-level function of plain arguments (a `Problem`, options as JSON), as
a `tcpy.sandbox` worker or a Dask worker receives it pickled by its qualified name; the
executors (`tcpy.genetic.executors`) send them, the evaluator (`tcpy.genetic.evaluate`)
reads their outcomes as `Trial`s. A worker keeps its engines (one per source and target)
and the problem's data, once read, across the tasks it runs. The engines are made by
the problem's `engine_class` (`tcpy.ExecutionEngine`, pickled by its name): the engine
imports the tuner, so no module the tuner imports may import the engine.

A candidate's outputs on the tuning inputs are compared with the reference's before its
time counts (`WrongResult` otherwise). Timing is a warm-up of `WARM_S`, then the median
of `runs` runs (each the mean of as many calls as last `RUN_S`), under a per-host lock
file (`timing_lock`) that keeps two tuning sessions (or two Dask workers on one machine)
from timing at once; a candidate whose first run is 100 times slower than the best so
far, or whose second is 5 times slower, is pruned after those runs (TC's thresholds):
its median is still an honest upper bound. So a candidate whose loops run away (far more
iterations than the def holds work, the fuzzer's `runaway` class) needs no counting
build here: it is far slower than the starting options, which the first generation
always holds, and is pruned, or fails its timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tcpy.mapping.options import MappingOptions
from tcpy.sandbox import Failure, WrongResult
from tcpy.types import ScalarType

PRUNE_FIRST = 100.0  # a first run this many times slower than the best is pruned
PRUNE_SECOND = 5.0  # a second run this many times slower is pruned
WARM_S = 0.02
"""A candidate is called for at least this long before it is timed. Right after its
first call a kernel runs slower than it will (its threads and caches cold): on a
2-core machine bias_add_grad's next five calls took 0.28 ms against 0.13 steady, and
single-threaded candidates, which have no threads to wake, ranked first although
they were 1.7x slower once warm."""
RUN_S = 0.001
"""A timed run repeats the call until it lasts this long and counts the mean: the
median of five single calls of a 0.1 ms kernel was the machine's noise."""


@dataclass(frozen=True)
class Problem:
    """What every worker needs to compile, check and time a candidate: the TC source,
    the entry, the target, a file holding the tuning inputs and the reference outputs
    (read once per worker), and the class of the engines that compile it."""

    source: str
    entry: str
    target: str
    data: str  # path of an .npz file: in0.., want0..
    engine_class: Callable[[str], Any]  # `tcpy.ExecutionEngine`: makes the engine of a target
    rtol: float = 1e-3


def save_problem(
    directory: Path, source: str, entry: str, target: str, inputs: tuple[Any, ...],
    want: tuple[np.ndarray, ...], engine_class: Callable[[str], Any],
) -> Problem:  # fmt: skip
    """The problem of a session, its inputs and reference outputs written to
    `directory/problem.npz`; its candidates compile on engines of `engine_class`."""
    path = directory / "problem.npz"
    arrays = {f"in{k}": _stored(a) for k, a in enumerate(inputs)}
    arrays.update({f"want{k}": _stored(w) for k, w in enumerate(want)})
    # a .npz keeps NumPy's own dtypes only: bfloat16 (ml_dtypes') travels as its bits
    arrays["dtypes"] = np.array([np.asarray(a).dtype.name for a in (*inputs, *want)])
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return Problem(source, entry, target, str(path), engine_class)


@dataclass(frozen=True)
class Trial:
    """What became of one candidate: `time_s` when it was valid and timed, else the
    `failure`; `device` is what it ran on (empty when it failed before that was
    known)."""

    time_s: float | None
    failure: Failure | None = None
    detail: str = ""
    device: str = ""


@functools.lru_cache(maxsize=4)
def load_data(path: str) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The tuning inputs and the reference outputs in the problem's data file (read once
    per process)."""
    with np.load(path) as data:
        n = sum(name.startswith("in") for name in data)
        m = sum(name.startswith("want") for name in data)
        dtypes = [str(d) for d in data["dtypes"]] if "dtypes" in data else [""] * (n + m)
        inputs = tuple(_loaded(data[f"in{k}"], dtypes[k]) for k in range(n))
        want = tuple(_loaded(data[f"want{k}"], dtypes[n + k]) for k in range(m))
    return tuple(_scalar(a) for a in inputs), want


def _stored(a: Any) -> np.ndarray:
    array = np.asarray(a)
    return array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def _loaded(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.view(ScalarType.BFLOAT16.dtype) if dtype == "bfloat16" else a


HALF_RTOL = {ScalarType.FLOAT16: 2.0**-9, ScalarType.BFLOAT16: 2.0**-6}
"""A candidate's outputs against the reference's, relative to the output's largest
magnitude, where they are half: float32 sums added in another order may round to the
neighbouring half value."""


def _scalar(a: np.ndarray) -> Any:
    """0-d inputs go back to NumPy scalars, as a user passes them."""
    return a[()] if a.ndim == 0 else a


@functools.lru_cache(maxsize=4)
def _engine(engine_class: Callable[[str], Any], source: str, target: str) -> Any:
    import warnings

    engine = engine_class(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.define(source)
    return engine


# --- compiling, checking and timing ---------------------------------------------------------


def compile_and_check(problem: Problem, options_json: str) -> float:
    """Compile the candidate, run it once on the tuning inputs, and compare with the
    reference; returns the compile time in seconds. Raises `WrongResult` on a mismatch
    (any other error is classified by the sandbox)."""
    inputs, want = load_data(problem.data)
    engine = _engine(problem.engine_class, problem.source, problem.target)
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
    ty = ScalarType.from_dtype(want.dtype)
    if want.dtype.kind in "biu":
        bad = got != want
    else:
        if ty is not None and ty.is_half:  # two units in the last place of the type's
            rtol = max(rtol, HALF_RTOL[ty])
            got, want = got.astype(np.float32), want.astype(np.float32)
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
        return _side_by_side(kernels, load_data(problem.data)[0], runs, rounds)


def side_by_side_held(problem: Problem, jsons: list[str], runs: int, rounds: int) -> list[float]:
    """`time_side_by_side` for a caller that holds the timing lock (see `time_held`)."""
    kernels = [_compiled(problem, j)[0] for j in jsons]
    return _side_by_side(kernels, load_data(problem.data)[0], runs, rounds)


def _side_by_side(
    kernels: list[Any], inputs: tuple[Any, ...], runs: int, rounds: int
) -> list[float]:
    calls = [_warm(kernel, inputs)[0] for kernel in kernels]
    times: list[list[float]] = [[] for _ in kernels]
    for _ in range(rounds):
        for kernel, count, mine in zip(kernels, calls, times, strict=True):
            for _ in range(max(1, runs)):
                mine.append(_run(kernel, inputs, count))
    return [statistics.median(t) for t in times]


def _warm(kernel: Any, inputs: tuple[Any, ...], limit_s: float = math.inf) -> tuple[int, float]:
    """Call `kernel` once (which may set up what later calls reuse), then again until
    `WARM_S` more have passed, unless that first call took over `limit_s`; returns the
    calls a run of `RUN_S` makes and the last call's time, from which they are counted."""
    start = time.perf_counter()
    kernel(*inputs)
    began = time.perf_counter()
    last = began - start
    while last <= limit_s and time.perf_counter() - began < WARM_S:
        start = time.perf_counter()
        kernel(*inputs)
        last = time.perf_counter() - start
    return max(1, min(1000, round(RUN_S / max(last, 1e-9)))), last


def _run(kernel: Any, inputs: tuple[Any, ...], calls: int) -> float:
    """The mean time of `calls` calls of `kernel` in a row."""
    start = time.perf_counter()
    for _ in range(calls):
        kernel(*inputs)
    return (time.perf_counter() - start) / calls


def _compiled(problem: Problem, options_json: str) -> tuple[Any, tuple[Any, ...]]:
    """The candidate's kernel (from the session's cache: `compile_and_check` built it)
    and the tuning inputs."""
    inputs, _ = load_data(problem.data)
    engine = _engine(problem.engine_class, problem.source, problem.target)
    options = MappingOptions.from_json(options_json)
    return engine.compile(problem.entry, *inputs, options=options), inputs


def _median_time(compiled: Any, inputs: tuple[Any, ...], runs: int, best_s: float) -> float:
    # first-touch of outputs, caches, OpenMP threads; a first call as slow as a run
    # that would be pruned is that run
    calls, last = _warm(compiled, inputs, PRUNE_FIRST * best_s)
    if last > PRUNE_FIRST * best_s:
        return last
    times: list[float] = []
    for k in range(max(1, runs)):
        times.append(_run(compiled, inputs, calls))
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


def device_of(problem: Problem) -> str:
    """The device of the problem's target on the machine this runs on (run in a
    sandbox: on cuda asking initialises the driver)."""
    return str(problem.engine_class(problem.target).device())


# --- fault injection, for the tests --------------------------------------------------------


def faulty(problem: Problem, options_json: str, faults: dict[int, str]) -> float:
    """`compile_and_check`, except that a candidate whose unroll is a key of `faults`
    fails as the value names, the way a real fault would in a worker (`faults` is
    `tcpy.genetic.evaluate.FAULTS` as the session read it)."""
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
