"""Isolated execution of compiler runs: failure classes, worker processes, replays.

The differential fuzzer (`tools/fuzz`) and the genetic tuner both run candidate
(program, options) pairs that may crash the process (a segfault in a generated kernel),
hang (the isl scheduler), raise an error, or compute a wrong result. They share:

- `Failure`, the closed set of ways a run can fail;
- `run_tasks`, which runs a module-level function over many argument tuples in
  long-lived worker processes, each task under a timeout, and classifies every task
  even when its worker dies or has to be killed;
- `Replay`, a JSON record of one failing run that `tcpy.fuzz_tasks.replay` re-runs
  in-process.

The fuzzer's own tasks (the differential check against the reference, the front end
alone, a replay) are in `tcpy.fuzz_tasks`: they build engines, and this module, which
the tuner imports, builds none (the engine imports the tuner).

A task reports a wrong result by raising `WrongResult`, loops that ran far more than
the work of the def by raising `Runaway`, and a case that is itself invalid (the front
end or the reference rejects the program, so it says nothing about the compiler) by
raising `InvalidCase`; every other exception is classified by its type. A task may
say when its compilation is over and its kernel runs (`phase("run")`): the run then
has a timeout of its own (`run_timeout`), apart from the compilation's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from tcpy.errors import TCError


class Failure(enum.Enum):
    """How a run failed. Every program the reference runs must compile and agree under
    every valid option set, so a `TCError` from the compiler counts as a failure too."""

    COMPILE_ERROR = "compile_error"  # a TCError under valid options
    CRASH = "crash"  # the worker process died (segfault, abort)
    HANG = "hang"  # the task ran past its timeout; its worker was killed
    WRONG_RESULT = "wrong_result"  # outputs differ from the reference
    INTERNAL_ERROR = "internal_error"  # an exception that is not a TCError escaped
    RUNAWAY = "runaway"  # the loops ran far more iterations than the def holds work


class Runaway(Exception):
    """Raised by a task whose kernel's loops ran far more iterations than the def's
    statement instances and threads (`tcpy.kernels.Iterations.runaway`), whatever
    the time they took."""


class WrongResult(Exception):
    """Raised by a task whose outputs differ from the reference."""


class InvalidCase(Exception):
    """Raised by a task whose case is invalid (not a compiler failure): the front end or
    the reference rejected the program, so no target is expected to run it."""


@dataclass(frozen=True)
class Outcome:
    """What became of one task: `failure` is None when it passed (or was invalid)."""

    failure: Failure | None
    detail: str = ""
    seconds: float = 0.0
    value: Any = None  # what the task returned, when it returned
    invalid: bool = False  # the task raised InvalidCase


def run_task(fn: Callable[..., Any], args: tuple[Any, ...]) -> Outcome:
    """Run `fn(*args)` in this process and classify how it ended. Crashes and hangs
    cannot be caught here; `run_tasks` catches those around a worker."""
    start = time.perf_counter()

    def ended(failure: Failure | None, detail: str = "", **kw: Any) -> Outcome:
        return Outcome(failure, detail, time.perf_counter() - start, **kw)

    try:
        value = fn(*args)
    except InvalidCase as e:
        return ended(None, str(e), invalid=True)
    except WrongResult as e:
        return ended(Failure.WRONG_RESULT, str(e))
    except Runaway as e:
        return ended(Failure.RUNAWAY, str(e))
    except TCError as e:
        return ended(Failure.COMPILE_ERROR, f"{type(e).__name__}: {e}")
    except Exception:
        return ended(Failure.INTERNAL_ERROR, traceback.format_exc())
    return ended(None, value=value)


# --- worker processes -------------------------------------------------------------------


_PARENT: Connection | None = None  # in a worker: the pipe to the parent


RUN = "run"
"""The phase of a task that runs what it compiled (`phase`)."""
COMPILE = "compile"
"""The phase of a task that compiles (where every task starts)."""


def phase(name: str) -> None:
    """Tell the parent the task enters phase `name`: from `RUN` on, the task has the
    pool's `run_timeout` left; from `COMPILE` on, the task's timeout again.
    Nothing in a process that is not a worker."""
    if _PARENT is not None:
        _PARENT.send(("phase", name))


def _worker_main(conn: Connection, env: Mapping[str, str]) -> None:
    """Serve tasks from the pipe until it closes. The outcome is sent whole; a value
    that does not pickle is replaced by its repr so the parent still learns the class."""
    os.environ.update(env)
    _serve(conn)


READY = "ready"
STARTUP_SECONDS = 120.0  # for a worker to start and import tcpy, on a loaded machine


def _serve(conn: Connection) -> None:
    """Say `READY`, then serve tasks. A parent that closed the pipe (it timed the task
    out, or finished) ends the worker quietly."""
    global _PARENT
    _PARENT = conn
    try:
        conn.send(READY)
    except ConnectionError:
        return
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, ConnectionError):
            return
        outcome = run_task(fn, args)
        try:
            conn.send(outcome)
        except ConnectionError:
            return
        except Exception:
            try:
                conn.send(dataclasses.replace(outcome, value=repr(outcome.value)))
            except ConnectionError:
                return


class _Interpreter:
    """A worker that is a fresh Python interpreter (`python -m tcpy.sandbox FD`), talking
    over a socket pair. Unlike a forked worker it holds none of libgomp's threads (they
    do not survive `fork`: a forked process that had run an OpenMP kernel hangs in its
    next parallel region), and unlike multiprocessing's `spawn` and `forkserver` it
    never imports the caller's main module, so a user's script without an
    `if __name__ == "__main__"` guard can tune. It has the parent's `sys.path`, so a
    task's function is found wherever the parent found it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair()
        path = os.pathsep.join(p for p in sys.path if p)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tcpy.sandbox", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env={**os.environ, **env, "PYTHONPATH": path},
        )
        theirs.close()
        self.conn = Connection(ours.detach())

    def kill(self) -> None:
        self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self) -> int | None:
        return self.popen.returncode  # negative: the signal that ended it, as multiprocessing


@dataclass
class _Worker:
    process: Any  # a multiprocessing process, or an _Interpreter
    conn: Connection
    task: int | None = None  # index of the task it runs
    deadline: float = 0.0
    running: bool = False  # the task said it runs what it compiled (`phase`)
    timeout: float = 0.0  # the task's timeout


class _Pool:
    """Long-lived workers that are killed and restarted when a task hangs or crashes.
    A worker gets its first task once it has said it is ready, so that a task's
    timeout never counts the interpreter's start (seconds on a loaded machine)."""

    def __init__(self, jobs: int, env: Mapping[str, str], context: str | None) -> None:
        self._ctx: Any = None if context is None else multiprocessing.get_context(context)
        self._env = dict(env)
        self.workers = [self._spawn() for _ in range(jobs)]  # they start side by side
        for w in self.workers:
            _await_ready(w)

    def _start(self) -> _Worker:
        w = self._spawn()
        _await_ready(w)
        return w

    def _spawn(self) -> _Worker:
        if self._ctx is None:
            child_process = _Interpreter(self._env)
            return _Worker(child_process, child_process.conn)
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker_main, args=(child, self._env), daemon=True)
        process.start()
        child.close()
        return _Worker(process, parent)

    def restart(self, worker: _Worker) -> _Worker:
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        fresh = self._start()
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for w in self.workers:
            w.conn.close()
        for w in self.workers:
            w.process.join(timeout=5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()


def _await_ready(w: _Worker) -> None:
    """Wait for the worker's `READY`; a worker that dies or stays silent for
    `STARTUP_SECONDS` means tcpy cannot start a Python interpreter here."""
    try:
        if w.conn.poll(STARTUP_SECONDS) and w.conn.recv() == READY:
            return
    except (EOFError, OSError):
        pass
    w.process.kill()
    raise TCError(
        f"a sandbox worker did not start within {STARTUP_SECONDS:.0f} s "
        f"(exit code {w.process.exitcode})"
    )


def run_tasks(
    fn: Callable[..., Any],
    tasks: Iterable[tuple[Any, ...]],
    *,
    jobs: int | None = None,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    context: str | None = None,
    run_timeout: float | None = None,
) -> Iterator[tuple[int, Outcome]]:
    """Run `fn(*args)` for every args of `tasks` on `jobs` worker processes (default:
    the CPU count), yielding `(index, outcome)` as tasks finish, in any order.

    `fn` must be a module-level function (it is pickled by name). A task that runs past
    `timeout` seconds, or past `run_timeout` seconds once it said it runs what it
    compiled (`phase(RUN)`), is a `HANG`, and one whose worker dies is a `CRASH`;
    either way the worker is replaced and the remaining tasks go on. `env` is set in
    each worker.

    `context` is a multiprocessing start method; by default each worker is a fresh
    interpreter (`_Interpreter` says why).
    """
    pending = iter(enumerate(tasks))
    pool = _Pool(jobs or os.cpu_count() or 1, env or {}, context)
    try:
        busy = 0
        for w in list(pool.workers):
            busy += _assign(w, fn, pending, timeout)
        while busy:
            ready = wait([w.conn for w in pool.workers if w.task is not None],
                         timeout=_time_left(pool.workers))  # fmt: skip
            for w in list(pool.workers):
                if w.task is None:
                    continue
                index = w.task
                result = _collect(w, ready, run_timeout)
                if result is None:
                    continue
                if result.failure in (Failure.CRASH, Failure.HANG):
                    w = pool.restart(w)
                else:
                    w.task = None
                busy -= 1
                yield index, result
                busy += _assign(w, fn, pending, timeout)
    finally:
        pool.close()


class Sandbox:
    """Worker processes kept across calls, for callers that run one task at a time and
    decide the next from the last (a shrinker, a tuner's next candidate):
    `with Sandbox() as sb: outcome = sb.run(fn, args, timeout)`."""

    def __init__(self, env: Mapping[str, str] | None = None, context: str | None = None) -> None:
        self._pool = _Pool(1, env or {}, context)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        timeout: float = 60.0,
        run_timeout: float | None = None,
    ) -> Outcome:
        w = self._pool.workers[0]
        _assign(w, fn, iter([(0, args)]), timeout)
        while True:
            result = _collect(w, wait([w.conn], timeout=_time_left([w])), run_timeout)
            if result is not None:
                break
        if result.failure in (Failure.CRASH, Failure.HANG):
            self._pool.restart(w)
        else:
            w.task = None
        return result

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _assign(
    w: _Worker,
    fn: Callable[..., Any],
    pending: Iterator[tuple[int, tuple[Any, ...]]],
    timeout: float,
) -> int:
    """Give `w` the next task, if any; returns how many tasks it started (0 or 1)."""
    try:
        index, args = next(pending)
    except StopIteration:
        return 0
    w.conn.send((fn, args))
    w.task, w.deadline, w.running = index, time.monotonic() + timeout, False
    w.timeout = timeout
    return 1


def _time_left(workers: list[_Worker]) -> float:
    deadlines = [w.deadline for w in workers if w.task is not None]
    return max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.0


def _collect(w: _Worker, ready: list[Any], run_timeout: float | None = None) -> Outcome | None:
    """The outcome of `w`'s task if it ended (or must be ended now), else None. A
    `phase` message from the task moves its deadline: `run_timeout` from now, when it
    starts running what it compiled."""
    if w.conn in ready:
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(timeout=5)
            code = w.process.exitcode
            return Outcome(Failure.CRASH, f"the worker died (exit code {code})")
        if isinstance(message, Outcome):
            return message
        if message == ("phase", RUN) and run_timeout is not None:
            w.deadline, w.running = time.monotonic() + run_timeout, True
        elif message == ("phase", COMPILE) and w.running:
            w.deadline, w.running = time.monotonic() + w.timeout, False
    if time.monotonic() >= w.deadline:
        what = "its run ran past the run timeout" if w.running else "the task ran past its timeout"
        return Outcome(Failure.HANG, f"{what}; the worker was killed")
    return None


# --- replays ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """One failing run, enough to run it again: the tuner and the fuzzer write the same
    format. `inputs` names the recipe of `tcpy.fuzz_tasks.make_inputs`; `meta` holds what
    the writer wants to keep (the fuzzer's generator seed, the tuner's generation)."""

    source: str
    entry: str
    sizes: dict[str, int]
    input_seed: int
    options: dict[str, Any] | None
    target: str
    failure: str
    detail: str = ""
    inputs: str = "exact"
    meta: dict[str, Any] = field(default_factory=dict)

    def args(self) -> tuple[Any, ...]:
        """The arguments of `tcpy.fuzz_tasks.replay_task` for this run."""
        return (self.source, self.entry, self.sizes, self.input_seed, self.options,
                self.target, self.inputs)  # fmt: skip

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Replay:
        data = json.loads(Path(path).read_text())
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


if __name__ == "__main__":  # a worker: python -m tcpy.sandbox FD
    # through the module, not this __main__ copy, so that outcomes pickle as
    # tcpy.sandbox.Outcome
    from tcpy import sandbox

    sandbox._serve(Connection(int(sys.argv[1])))
