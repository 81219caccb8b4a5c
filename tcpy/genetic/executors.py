"""Where candidates are compiled, checked and timed: local processes, or Dask workers.

An executor takes a batch of candidates (options as JSON) and gives back a `Trial` for
each: its time, or how it failed, and the device it ran on. Both executors run every
task of tcpy (`tcpy.genetic.tasks`) in a `tcpy.sandbox` worker process, never in a
process that matters: a segfault or a hang costs that worker, and the candidate is a
`CRASH` or a `HANG`.

`LocalExecutor` (the default, `TunerConfig(executor=None)`): the batch compiles and is
checked on `workers` processes at once (`run_tasks`), then the valid candidates are
timed one at a time in one `Sandbox`, with nothing else of the session running. Each
timing prunes against the best time so far, this batch's included.

`DaskExecutor` (`executor` a `distributed.Client`, or a scheduler address from which it
makes a client and closes it at the end): one Dask task per candidate, which compiles
and checks it and then times it on the same Dask worker, where the kernel it compiled
sits in the session's cache. On the worker:

1. the task runs tcpy in a sandbox process owned by that worker for this session
   (kept across tasks, restarted after a crash or a hang): the Dask worker itself runs
   none of tcpy's code, so a crash or a hang is an outcome and never a `KilledWorker`;
2. the problem's data file (tuning inputs and reference outputs) lives on the tuning
   machine: its bytes are scattered to the workers once per session and written once
   per worker into the session's private temp dir, named by their hash;
3. the kernel cache is in that temp dir too, one per session and worker, removed when
   the session closes;
4. compile and check run under the per-host lock held shared, timing under it held
   exclusive (`timing_lock`): on one host a timing never overlaps a compile or a
   timing of another worker, or a local session's timing. Compiling one candidate may
   overlap timing another only when they are on different hosts;
5. the trial carries the worker's device (`ExecutionEngine(target).device()`, asked in
   the sandbox), so the session knows what its times were measured on.

Tasks of a batch are submitted together, so on Dask a candidate prunes against the
best time of the batches before its own. A Dask task that raises anyway (a worker lost
with its machine) is not a candidate's failure: the error surfaces.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import dataclasses
import hashlib
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tcpy.errors import TCError
from tcpy.genetic.tasks import (
    Problem,
    Trial,
    compile_and_check,
    device_of,
    faulty,
    side_by_side_held,
    time_candidate,
    time_held,
    time_side_by_side,
    timing_lock,
)
from tcpy.sandbox import Outcome, Sandbox, run_tasks


def _trial(outcome: Outcome, device: str) -> Trial:
    if outcome.failure is not None:
        return Trial(None, outcome.failure, outcome.detail, device)
    return Trial(float(outcome.value), device=device)


def check_task(
    problem: Problem, options_json: str, faults: dict[int, str]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The compile-and-check task of a candidate: the fault-injecting one when the test
    hook is set, which it then carries as an argument (workers are other processes)."""
    if faults:
        return faulty, (problem, options_json, faults)
    return compile_and_check, (problem, options_json)


class Executor(abc.ABC):
    """Runs batches of candidates of one problem; `close` frees what it holds."""

    @abc.abstractmethod
    def measure(self, jsons: list[str], best_s: float) -> list[Trial]:
        """A trial per candidate, in order; `best_s` is the best time before the batch."""

    @abc.abstractmethod
    def side_by_side(self, jsons: list[str], rounds: int) -> list[float] | None:
        """Candidates measured before, timed again together on one device
        (`tasks.time_side_by_side`); None when that failed."""

    @abc.abstractmethod
    def close(self) -> None: ...


def make_executor(
    config: Any, problem: Problem, cache_dir: Path, faults: dict[int, str]
) -> Executor:
    """The executor `config.executor` names (a `TunerConfig`): None for local processes,
    a `distributed.Client` or a scheduler address for Dask."""
    if config.executor is None:
        return LocalExecutor(config, problem, cache_dir, faults)
    return DaskExecutor(config, problem, faults)


# --- local processes -------------------------------------------------------------------------


class LocalExecutor(Executor):
    """`workers` processes compile and check a batch, then one sandbox times its valid
    candidates one by one: on a small machine a compile beside a timing corrupts it."""

    def __init__(
        self, config: Any, problem: Problem, cache_dir: Path, faults: dict[int, str]
    ) -> None:
        self.config = config
        self.problem = problem
        self.faults = faults
        # a kernel cache of the session's own: the user's is not filled with hundreds
        # of candidates; OpenMP keeps the user's settings, so that candidates are timed
        # as the user's calls will run (compiles and timings never overlap on a host)
        self.env = {"TCPY_CACHE_DIR": str(cache_dir)}
        self._timer = Sandbox(env=self.env)
        self._device: str | None = None

    def measure(self, jsons: list[str], best_s: float) -> list[Trial]:
        trials: list[Trial | None] = [None] * len(jsons)
        fn, _ = check_task(self.problem, "", self.faults)  # one task function for all
        tasks = [check_task(self.problem, j, self.faults)[1] for j in jsons]
        for index, outcome in run_tasks(
            fn, tasks, jobs=self.config.workers,
            timeout=self.config.timeout_s, env=self.env,
        ):  # fmt: skip
            if outcome.failure is not None:
                trials[index] = _trial(outcome, "")
        for k, options_json in enumerate(jsons):
            if trials[k] is None:
                trial = self._time(options_json, best_s)
                best_s = min(best_s, trial.time_s if trial.time_s is not None else best_s)
                trials[k] = trial
        return [t for t in trials if t is not None]

    def _time(self, options_json: str, best_s: float) -> Trial:
        args = (self.problem, options_json, self.config.runs, best_s)
        outcome = self._timer.run(time_candidate, args, timeout=self.config.timeout_s)
        return _trial(outcome, self.device())

    def side_by_side(self, jsons: list[str], rounds: int) -> list[float] | None:
        args = (self.problem, jsons, self.config.runs, rounds)
        outcome = self._timer.run(
            time_side_by_side, args, timeout=self.config.timeout_s * len(jsons)
        )
        return None if outcome.failure is not None else list(outcome.value)

    def device(self) -> str:
        """This machine's device, asked once of the timing sandbox."""
        if self._device is None:
            outcome = self._timer.run(device_of, (self.problem,), self.config.timeout_s)
            self._device = str(outcome.value) if outcome.failure is None else "unknown"
        return self._device

    def close(self) -> None:
        self._timer.close()


# --- Dask workers --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """What every Dask task of a session shares; `problem.data` is a path on the tuning
    machine, replaced on the worker by where the data's bytes were written."""

    session: str
    problem: Problem
    data_sha: str
    faults: dict[int, str]
    runs: int
    timeout_s: float


class DaskExecutor(Executor):
    """Candidates as Dask tasks, each compiled, checked and timed on one worker (the
    module's docstring says how a task is isolated and how timings stay honest)."""

    def __init__(self, config: Any, problem: Problem, faults: dict[int, str]) -> None:
        distributed = _import_distributed()
        executor = config.executor
        if isinstance(executor, str):
            self.client = distributed.Client(executor)
            self._owns_client = True
        elif isinstance(executor, distributed.Client):
            self.client = executor
            self._owns_client = False
        else:
            raise TCError(
                f"TunerConfig: executor is a distributed.Client or a scheduler address, "
                f"not {type(executor).__name__}"
            )
        data = Path(problem.data).read_bytes()
        self.session = uuid.uuid4().hex
        self._job = _Job(
            self.session, problem, hashlib.sha256(data).hexdigest(), faults, config.runs,
            config.timeout_s,
        )  # fmt: skip
        # once to every worker, rather than once with every task
        self._data = self.client.scatter(data, broadcast=True, hash=False)

    def measure(self, jsons: list[str], best_s: float) -> list[Trial]:
        futures = [
            self.client.submit(evaluate_on_worker, self._job, self._data, j, best_s, pure=False)
            for j in jsons
        ]
        return list(self.client.gather(futures))

    def side_by_side(self, jsons: list[str], rounds: int) -> list[float] | None:
        """On one worker, which compiles (in its session cache) what it has not."""
        future = self.client.submit(
            side_by_side_on_worker, self._job, self._data, jsons, rounds, pure=False
        )
        times = future.result()
        return None if times is None else list(times)

    def close(self) -> None:
        """Remove the session's temp dirs and sandboxes on every worker; close the client
        if this executor made it."""
        try:
            with contextlib.suppress(OSError, TimeoutError):  # a worker already gone
                self.client.run(end_session, self.session)
            self.client.cancel([self._data])
        finally:
            if self._owns_client:
                self.client.close()


def _import_distributed() -> Any:
    """`distributed`, imported only when an executor is given: `import tcpy` never
    imports Dask, which is an optional extra."""
    try:
        import distributed
    except ImportError as e:
        raise TCError(
            "TunerConfig(executor=...) evaluates on Dask, which is not installed: "
            "pip install tcpy[dask]"
        ) from e
    return distributed


# --- on a Dask worker ------------------------------------------------------------------------


class _WorkerSession:
    """A session's state on one Dask worker: a private temp dir (the data file, the
    kernel cache), the sandboxes its tasks run in, and the worker's device."""

    def __init__(self, session: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"tcpy-dask-{session[:12]}-"))
        self.env = {"TCPY_CACHE_DIR": str(self.root / "cache")}
        self.device: str | None = None
        self._free: list[Sandbox] = []
        self._all: list[Sandbox] = []
        self._lock = threading.Lock()

    def data(self, sha: str, data: bytes) -> Path:
        """The problem's data file, written on the first task of the session here."""
        path = self.root / f"problem-{sha[:16]}.npz"
        with self._lock:
            if not path.exists():
                partial = path.with_suffix(".part")
                partial.write_bytes(data)
                partial.rename(path)
        return path

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """A sandbox of the session to itself (a worker with several threads runs as
        many tasks at once, each in its own sandbox)."""
        with self._lock:
            if self._free:
                box = self._free.pop()
            else:
                box = Sandbox(env=self.env)
                self._all.append(box)
        try:
            yield box
        finally:
            with self._lock:
                self._free.append(box)

    def close(self) -> None:
        for box in self._all:
            box.close()
        shutil.rmtree(self.root, ignore_errors=True)


_SESSIONS: dict[str, _WorkerSession] = {}
_SESSIONS_LOCK = threading.Lock()


def _worker_session(session: str) -> _WorkerSession:
    with _SESSIONS_LOCK:
        if not _SESSIONS:
            atexit.register(_end_all)  # a worker shut down mid-session leaves no temp dir
        if session not in _SESSIONS:
            _SESSIONS[session] = _WorkerSession(session)
        return _SESSIONS[session]


def end_session(session: str) -> None:
    """Run on every worker when the session closes."""
    with _SESSIONS_LOCK:
        state = _SESSIONS.pop(session, None)
    if state is not None:
        state.close()


def _end_all() -> None:
    for session in list(_SESSIONS):
        end_session(session)


def evaluate_on_worker(job: _Job, data: bytes, options_json: str, best_s: float) -> Trial:
    """The Dask task: compile and check the candidate, then time it, each step in the
    session's sandbox on this worker under the host lock (shared, then exclusive). The
    lock is taken here, outside the sandbox, so that waiting for it is not counted
    against the step's timeout."""
    state = _worker_session(job.session)
    problem = dataclasses.replace(job.problem, data=str(state.data(job.data_sha, data)))
    with state.sandbox() as box:
        device = _device(state, box, problem, job.timeout_s)
        fn, args = check_task(problem, options_json, job.faults)
        with timing_lock(exclusive=False):
            checked = box.run(fn, args, timeout=job.timeout_s)
        if checked.failure is not None:
            return _trial(checked, device)
        with timing_lock():
            timed = box.run(
                time_held, (problem, options_json, job.runs, best_s), timeout=job.timeout_s
            )
    return _trial(timed, device)


def side_by_side_on_worker(
    job: _Job, data: bytes, jsons: list[str], rounds: int
) -> list[float] | None:
    """The Dask task of `DaskExecutor.side_by_side`: compiles under the host lock held
    shared, then times under it held exclusive, in a sandbox of the session."""
    state = _worker_session(job.session)
    problem = dataclasses.replace(job.problem, data=str(state.data(job.data_sha, data)))
    timeout = job.timeout_s * len(jsons)
    with state.sandbox() as box:
        for options_json in jsons:
            fn, args = check_task(problem, options_json, {})
            with timing_lock(exclusive=False):
                if box.run(fn, args, timeout=job.timeout_s).failure is not None:
                    return None
        with timing_lock():
            timed = box.run(side_by_side_held, (problem, jsons, job.runs, rounds), timeout)
    return None if timed.failure is not None else list(timed.value)


def _device(state: _WorkerSession, box: Sandbox, problem: Problem, timeout_s: float) -> str:
    """The worker's device, asked once per session of a sandbox."""
    if state.device is None:
        outcome = box.run(device_of, (problem,), timeout=timeout_s)
        state.device = str(outcome.value) if outcome.failure is None else "unknown"
    return state.device
