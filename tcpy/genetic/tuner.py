"""A tuning session: `TunerConfig` in, `TuneResult` out.

`tune` builds the search space of a definition at the tuning shapes, seeds the first
generation with the starting options, runs the genetic search with an evaluator that
compiles, checks and times candidates in worker processes, and stores the best options
(and the top few) in the tuned-options store, from which later calls pick them up.

The answer is settled by a final round (`settle`): the search's best few and the best
starting options timed again side by side. A challenger replaces the start only when
it is at least `MARGIN` faster there, so that timing noise never trades what the user
had for options that are no faster.
Tuning on `cuda-emu` or `reference` is refused: emulated or interpreted times say
nothing about the hardware.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tcpy.errors import TCError
from tcpy.genetic.plot import convergence
from tcpy.mapping.options import MappingOptions

if TYPE_CHECKING:
    from tcpy.genetic.search import SearchResult

log = logging.getLogger("tcpy.tune")

TUNABLE_TARGETS = ("cpu", "cuda")
FINALISTS = 3  # the search's best few, timed again against the start
ROUNDS = 3  # rounds of the final timing, each of `runs` runs per finalist
MARGIN = 0.02  # how much faster than the start a finalist must be to replace it


@dataclass(frozen=True)
class TunerConfig:
    """How a tuning session searches. Budgets: `generations`, `max_trials` candidates,
    `max_time_s` seconds; the search also stops when the best has not improved for
    `patience` generations. `runs` timed runs per candidate (their median counts; each
    run the mean of calls lasting `tasks.RUN_S`, after `tasks.WARM_S` of warm-up),
    `timeout_s` per compile and per timing, `workers` compile processes, `seed` for
    reproducibility (up to timing noise), `executor` a `dask.distributed.Client` or a
    scheduler address to evaluate on Dask workers instead of local processes."""

    generations: int = 10
    population: int = 20
    crossover_rate: float = 0.8
    mutation_rate: float = 0.1
    elites: int = 2
    max_trials: int | None = None
    max_time_s: float | None = None
    patience: int = 3
    runs: int = 5
    timeout_s: float = 30.0
    workers: int = 2
    seed: int = 0
    executor: Any = None

    def __post_init__(self) -> None:
        def fail(message: str) -> None:
            raise TCError(f"TunerConfig: {message}")

        if self.generations < 1 or self.population < 2:
            fail("generations must be at least 1 and population at least 2")
        if not (0 <= self.crossover_rate <= 1 and 0 <= self.mutation_rate <= 1):
            fail("crossover_rate and mutation_rate are probabilities (0 to 1)")
        if not 0 <= self.elites < self.population:
            fail("elites must be at least 0 and less than the population")
        if self.runs < 1 or self.timeout_s <= 0 or self.workers < 1:
            fail("runs and workers must be at least 1, timeout_s positive")


@dataclass
class TuneResult:
    """What a tuning session found. `time_s` and `baseline_s` are the times of the
    options found and of the best starting options, timed side by side at the end of
    the session; `history` (one dict per generation) and `top` have the search's own
    times."""

    entry: str
    target: str
    device: str
    definition: str  # the def's canonical text: what the result is keyed by
    inputs: list[list[Any]]  # [shape, dtype] of each input
    options: MappingOptions
    time_s: float
    baseline_s: float
    history: list[dict[str, Any]]
    trials: int
    failures: dict[str, int]
    top: list[tuple[MappingOptions, float]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def speedup(self) -> float:
        return self.baseline_s / self.time_s if self.time_s > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry, "target": self.target, "device": self.device,
            "def": self.definition, "inputs": self.inputs, "options": self.options.to_dict(),
            "time_s": self.time_s,
            "baseline_s": self.baseline_s, "speedup": self.speedup, "trials": self.trials,
            "failures": self.failures, "history": self.history, "wall_s": self.wall_s,
            "top": [{"options": o.to_dict(), "time_s": t} for o, t in self.top],
        }  # fmt: skip

    def save(self, path: str | Path) -> None:
        """The result as JSON, for `engine.load_tuned(path)` on another machine."""
        strict = json.dumps(_finite(self.to_dict()), indent=1, allow_nan=False)
        Path(path).write_text(strict + "\n")

    def plot(self, path: str | Path) -> None:
        """The convergence plot: best-so-far and each generation's median against the
        trials, and the starting options' time as a line (needs matplotlib)."""
        convergence(self, Path(path))


def _finite(value: Any) -> Any:
    """`value` with infinite and NaN times as None, so that the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def tune(
    engine: Any,
    entry: str,
    inputs: tuple[Any, ...],
    config: TunerConfig | None = None,
    starting_options: MappingOptions | None = None,
    *,
    engine_class: Callable[[str], Any],
) -> TuneResult:
    """Tune `entry` of `engine` for the shapes and dtypes of `inputs` (which are also
    the inputs every candidate is checked and timed on); store and return the best.
    `engine_class` (`tcpy.ExecutionEngine`, which `ExecutionEngine.tune` hands in: the
    engine imports the tuner, never the reverse) makes the engines of the reference
    outputs here and of the candidates in worker processes."""
    import time

    from tcpy.binding import bind
    from tcpy.genetic.evaluate import Evaluator
    from tcpy.genetic.progress import Reporter
    from tcpy.genetic.search import search
    from tcpy.genetic.space import build_space
    from tcpy.genetic.tasks import save_problem
    from tcpy.parser.printer import canonical

    config = config or TunerConfig()
    if engine.target not in TUNABLE_TARGETS:
        raise TCError(
            f"tuning runs on the hardware it tunes for: use the cpu or cuda target, not "
            f"{engine.target} (emulated or interpreted times say nothing about a device)"
        )
    started = time.monotonic()
    cdef = engine.checked(entry)
    binding = bind(cdef, inputs)
    preset = engine.default_options(entry, *inputs)
    # the user's options (or the preset), and what earlier sessions found for these
    # shapes or the nearest ones: the session returns nothing slower than these
    starts = [starting_options or preset, *engine.tuned_starting_points(entry, *inputs)]
    want = _reference_outputs(engine_class, cdef.source, entry, inputs)
    space = build_space(cdef, binding.sizes, engine.target, preset)
    scratch = Path(tempfile.mkdtemp(prefix="tcpy-tune-"))
    try:
        problem = save_problem(
            scratch, cdef.source, entry, engine.target, inputs, want, engine_class
        )
        evaluator = Evaluator(problem, config, scratch / "cache", _bugs_dir())
        try:
            with Reporter(entry, config) as reporter:
                found = search(space, starts, evaluator, config, reporter.update)
            best, time_s, baseline_s = settle(found, starts, evaluator.side_by_side)
            device = evaluator.device or engine.device()  # where candidates ran (Dask)
        finally:
            evaluator.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not math.isfinite(found.best_s):
        raise TCError(
            f"tuning {entry} found no candidate that compiled and ran correctly "
            f"({dict(found.failures)}); see the tcpy.tune log"
        )
    result = TuneResult(
        entry=entry, target=engine.target, device=device,
        definition=canonical(cdef), inputs=[[list(a.shape), str(a.dtype)] for a in binding.arrays],
        options=best,
        time_s=time_s, baseline_s=baseline_s, history=found.history,
        trials=found.trials, failures=dict(found.failures), top=found.top(5),
        wall_s=time.monotonic() - started,
    )  # fmt: skip
    engine.store_tuned(result)
    return result


def settle(
    found: SearchResult,
    starts: list[MappingOptions],
    side_by_side: Callable[[list[MappingOptions], int], list[float] | None],
) -> tuple[MappingOptions, float, float]:
    """The session's answer and the times it is reported with, `(options, time_s,
    baseline_s)`: the search's `FINALISTS` best and its best starting options, timed
    again together; the fastest finalist wins only when it beats the start by `MARGIN`.
    Without a valid start (the user's options failed), the fastest finalist wins; when
    the final timing fails, the search's own times decide."""
    start = _best_start(found, starts)
    finalists = [o for o, _ in found.top(FINALISTS) if start is None or o != start]
    contenders = finalists if start is None else [start, *finalists]
    times = side_by_side(contenders, ROUNDS) if len(contenders) > 1 else None
    if times is None:
        return found.best, found.best_s, found.start_s
    if start is None:
        k = min(range(len(times)), key=times.__getitem__)
        return contenders[k], times[k], math.inf
    k = min(range(1, len(times)), key=times.__getitem__, default=0)
    if k and times[k] < times[0] * (1 - MARGIN):
        return contenders[k], times[k], times[0]
    return start, times[0], times[0]


def _best_start(found: SearchResult, starts: list[MappingOptions]) -> MappingOptions | None:
    """The fastest of the starting options that ran correctly in the search."""
    times: dict[MappingOptions, float] = {}
    for options in starts:
        _, measured = found.measured.get(options.to_json(), (options, None))
        if measured is not None and measured.time_s is not None:
            times[options] = measured.time_s
    return min(times, key=times.__getitem__) if times else None


def _reference_outputs(
    engine_class: Callable[[str], Any], source: str, entry: str, inputs: tuple[Any, ...]
) -> tuple[Any, ...]:
    import warnings

    ref = engine_class("reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.define(source)
    out = ref.run(entry, *inputs)
    return out if isinstance(out, tuple) else (out,)


def _bugs_dir() -> Path:
    """Where replays of compiler bugs found while tuning go: beside the kernel cache."""
    import os

    from tcpy import knobs

    root = knobs.cache_dir()
    if root is None:
        return Path(tempfile.gettempdir()) / f"tcpy-bugs-{os.getuid()}"
    return root / "bugs"
