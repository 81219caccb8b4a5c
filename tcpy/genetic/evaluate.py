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
2-core machine concurrent compiles would corrupt the timings. How a candidate is
checked and timed (the median of a few runs, pruned when clearly slower than the best,
under a per-host lock) is the business of its tasks (`tcpy.genetic.tasks`).

When the search ends, its best few candidates and the best starting options are timed
again side by side (`tasks.time_side_by_side`: the candidates take turns within each
round), and the session's answer is settled on those times: the search's best is the
minimum of many noisy timings, which favours a candidate that was lucky once.

Where the tasks run is the executor's business (`tcpy.genetic.executors`: a local
process pool, or Dask workers); this module holds the `Evaluator`, which turns their
outcomes into measurements for the search, and the test hook that makes some of them
fail (`FAULTS`).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from tcpy.errors import InternalError
from tcpy.genetic.executors import make_executor
from tcpy.genetic.search import Measured
from tcpy.genetic.tasks import Problem, Trial, load_data
from tcpy.mapping.options import MappingOptions
from tcpy.sandbox import Failure, Replay

log = logging.getLogger("tcpy.tune")

FAULTS: dict[int, str] = {}
"""A test hook: candidates whose `unroll` is a key fail as the value names (a
`Failure` value), inside the worker, as a real fault would. Empty outside the tests."""


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

        inputs, _ = load_data(self.problem.data)
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
