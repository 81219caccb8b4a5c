"""The genetic search (DEAP) over a `Space`.

Individuals are genomes (lists of allele indices); fitness is the measured time, to
be minimised; a candidate that failed (any `Failure` class) gets an infinite time, so
selection drops it. Each generation:

1. the candidates not measured before are evaluated, as one batch (the evaluator
   compiles them in parallel and times them one at a time); a genome measured once is
   never measured again: its options are the key of a memo;
2. the best `elites` individuals pass unchanged (so the best never gets worse);
3. the others are chosen by tournament (size 3), paired, crossed over with
   probability `crossover_rate`, and mutated gene by gene with probability
   `mutation_rate` (a mutated gene takes a random allele).

Crossover is DEAP's uniform crossover (each gene from either parent with probability
1/2). The genes are categorical choices with little linkage between positions (a tile
size, a fusion strategy, an unroll factor), which is what uniform crossover suits;
TC's three-parent variant mixes faster but breaks up more of the few groups that do
go together (the x, y and z sizes of a CUDA block), and with populations of 10–30 the
two-parent form explored as well in our runs.

The first generation holds the starting options (the target's preset and the best
cached options), so a session never returns options slower than what the user had.
When fewer than a quarter of a generation's candidates are valid, the search restarts
from the best: a new population of its mutants and fresh random genomes. It stops
after `generations`, `max_trials` candidates or `max_time_s` seconds, or when the best
has not improved for `patience` generations. DEAP draws from Python's global `random`;
the search seeds it and puts its state back afterwards, so a run is reproducible from
`seed` up to timing noise, and the caller's random state is untouched.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deap import base, tools

from tcpy.genetic.space import Space
from tcpy.mapping.options import MappingOptions
from tcpy.sandbox import Failure

TOURNAMENT = 3
RESTART_VALID_FRACTION = 0.25


@dataclass(frozen=True)
class Measured:
    """What evaluating one candidate gave: its time, or how it failed."""

    time_s: float | None
    failure: Failure | None = None
    detail: str = ""

    @property
    def fitness(self) -> float:
        return self.time_s if self.time_s is not None else math.inf


Evaluate = Callable[[list[MappingOptions]], list[Measured]]


@dataclass
class Progress:
    """What the search reports after each generation (for a progress bar or a log)."""

    generation: int
    trials: int
    best_s: float
    start_s: float
    failures: Counter[str]


@dataclass
class SearchResult:
    best: MappingOptions
    best_s: float
    start_s: float  # the best time among the starting options
    history: list[dict[str, Any]]
    measured: dict[str, tuple[MappingOptions, Measured]]  # options JSON -> measurement
    trials: int = 0
    failures: Counter[str] = field(default_factory=Counter)

    def top(self, n: int) -> list[tuple[MappingOptions, float]]:
        valid = [(o, m.time_s) for o, m in self.measured.values() if m.time_s is not None]
        return sorted(valid, key=lambda t: t[1])[:n]


class _Fitness(base.Fitness):
    weights = (-1.0,)  # minimise time


class _Individual(list[int]):
    """A genome with the fitness DEAP's operators expect."""

    def __init__(self, genome: Sequence[int]) -> None:
        super().__init__(genome)
        self.fitness = _Fitness()


def search(
    space: Space,
    starts: list[MappingOptions],
    evaluate: Evaluate,
    config: Any,
    report: Callable[[Progress], None] | None = None,
) -> SearchResult:
    """The best options of `space` found by the genetic search `config` describes
    (a `TunerConfig`); `evaluate` measures a batch of options."""
    saved = random.getstate()
    random.seed(config.seed)
    try:
        return _Search(space, evaluate, config, report).run(starts)
    finally:
        random.setstate(saved)


class _Search:
    def __init__(
        self,
        space: Space,
        evaluate: Evaluate,
        config: Any,
        report: Callable[[Progress], None] | None,
    ) -> None:
        self.space = space
        self.evaluate = evaluate
        self.config = config
        self.report = report
        self.memo: dict[str, tuple[MappingOptions, Measured]] = {}
        self.history: list[dict[str, Any]] = []
        self.failures: Counter[str] = Counter()
        self.trials = 0
        self.start_s = math.inf  # the best time among the starting options
        self.started = time.monotonic()
        self.rng = random.Random(config.seed)

    # --- the loop ---------------------------------------------------------------------
    def run(self, starts: list[MappingOptions]) -> SearchResult:
        cfg = self.config
        population = [_Individual(self.space.encode(o)) for o in starts]
        start_keys = [o.to_json() for o in starts]
        while len(population) < cfg.population:
            population.append(_Individual(self.space.random_genome(self.rng)))
        # the starting options themselves are measured, not only their nearest genome
        self._measure(starts)
        self.start_s = min((self.memo[k][1].fitness for k in start_keys), default=math.inf)
        best_s, stale = math.inf, 0
        for generation in range(cfg.generations):
            measured = self._assess(population)
            valid = [m for m in measured if m.time_s is not None]
            best = self._best()
            self._record(generation, measured)
            improved = best[1].fitness < best_s * (1 - 1e-3)
            best_s, stale = (best[1].fitness, 0) if improved else (best_s, stale + 1)
            if self._done(stale) or generation == cfg.generations - 1:
                break
            if len(valid) < RESTART_VALID_FRACTION * len(population):
                population = self._restart(best[0])
            else:
                population = self._breed(population)
        best_options, best_measured = self._best()
        return SearchResult(
            best_options, best_measured.fitness, self.start_s, self.history, self.memo,
            self.trials, self.failures,
        )  # fmt: skip

    def _done(self, stale: int) -> bool:
        cfg = self.config
        if cfg.patience and stale >= cfg.patience:
            return True
        if cfg.max_trials is not None and self.trials >= cfg.max_trials:
            return True
        return cfg.max_time_s is not None and time.monotonic() - self.started >= cfg.max_time_s

    # --- evaluation ---------------------------------------------------------------------
    def _measure(self, options: list[MappingOptions]) -> None:
        """Measure the options not measured yet, as one batch (within the trial budget)."""
        new = list({o.to_json(): o for o in options if o.to_json() not in self.memo}.values())
        if self.config.max_trials is not None:
            new = new[: max(0, self.config.max_trials - self.trials)]
        if not new:
            return
        for o, m in zip(new, self.evaluate(new), strict=True):
            self.memo[o.to_json()] = (o, m)
            if m.failure is not None:
                self.failures[m.failure.value] += 1
        self.trials += len(new)

    def _assess(self, population: list[_Individual]) -> list[Measured]:
        decoded = [self.space.decode(ind) for ind in population]
        self._measure(decoded)
        out = []
        for ind, o in zip(population, decoded, strict=True):
            m = self.memo.get(o.to_json(), (o, Measured(None)))[1]
            ind.fitness.values = (m.fitness,)
            out.append(m)
        return out

    def _best(self) -> tuple[MappingOptions, Measured]:
        return min(self.memo.values(), key=lambda t: t[1].fitness)

    def _record(self, generation: int, measured: list[Measured]) -> None:
        times = [m.time_s for m in measured if m.time_s is not None]
        best = self._best()[1].fitness
        self.history.append(
            {
                "generation": generation,
                "trials": self.trials,
                "best_s": best,
                "median_s": statistics.median(times) if times else math.inf,
                "failures": dict(Counter(m.failure.value for m in measured if m.failure)),
                "elapsed_s": time.monotonic() - self.started,
            }
        )
        if self.report is not None:
            failures = Counter(self.failures)
            self.report(Progress(generation, self.trials, best, self.start_s, failures))

    # --- the genetic operators ----------------------------------------------------------
    def _breed(self, population: list[_Individual]) -> list[_Individual]:
        cfg = self.config
        elites = tools.selBest(population, min(cfg.elites, len(population)))
        chosen = tools.selTournament(population, len(population) - len(elites), TOURNAMENT)
        offspring = [_Individual(ind) for ind in chosen]
        for a, b in zip(offspring[::2], offspring[1::2], strict=False):
            if random.random() < cfg.crossover_rate:
                tools.cxUniform(a, b, indpb=0.5)
        for ind in offspring:
            tools.mutUniformInt(ind, low=0, up=self.space.bounds, indpb=cfg.mutation_rate)
        return [_Individual(e) for e in elites] + offspring

    def _restart(self, best: MappingOptions) -> list[_Individual]:
        """Too few valid candidates: start again around the best, half mutants of it
        (every gene mutated with a higher rate), half random."""
        cfg = self.config
        population = [_Individual(self.space.encode(best))]
        while len(population) < cfg.population:
            if len(population) % 2:
                ind = _Individual(self.space.encode(best))
                tools.mutUniformInt(ind, low=0, up=self.space.bounds, indpb=0.3)
            else:
                ind = _Individual(self.space.random_genome(self.rng))
            population.append(ind)
        return population


def random_search(
    space: Space,
    starts: list[MappingOptions],
    evaluate: Evaluate,
    trials: int,
    seed: int,
    batch: int = 20,
) -> SearchResult:
    """The baseline the genetic search is judged against: the starting options, then
    uniformly random genomes, `trials` candidates in all, measured in batches."""
    rng = random.Random(seed)
    memo: dict[str, tuple[MappingOptions, Measured]] = {}
    failures: Counter[str] = Counter()
    history: list[dict[str, Any]] = []
    pending = list(starts)
    start_keys = [o.to_json() for o in starts]
    attempts = 0
    while len(memo) < trials and attempts < 100 * trials:
        while len(pending) < batch and attempts < 100 * trials:
            attempts += 1
            o = space.decode(space.random_genome(rng))
            if o.to_json() not in memo and o not in pending:
                pending.append(o)
        chunk = pending[: trials - len(memo)]
        pending = []
        for o, m in zip(chunk, evaluate(chunk), strict=True):
            memo[o.to_json()] = (o, m)
            if m.failure is not None:
                failures[m.failure.value] += 1
        best = min(m.fitness for _, m in memo.values())
        history.append({"generation": len(history), "trials": len(memo), "best_s": best})
    best_options, best_measured = min(memo.values(), key=lambda t: t[1].fitness)
    start_s = min((memo[k][1].fitness for k in start_keys if k in memo), default=math.inf)
    return SearchResult(
        best_options, best_measured.fitness, start_s, history, memo, len(memo), failures
    )
