"""The genetic tuner's core: the search space from the options' metadata, the genetic
search against random search on a synthetic fitness, and evaluation that contains
every failure class (injected in the worker through the evaluator's test hook)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tcpy
from tcpy.genetic import evaluate as evaluation
from tcpy.genetic import tasks
from tcpy.genetic.evaluate import Evaluator
from tcpy.genetic.search import Measured, SearchResult, random_search, search
from tcpy.genetic.space import AUTO, MAX_THREADS, WARP, build_space
from tcpy.genetic.tasks import load_data, save_problem
from tcpy.genetic.tuner import settle
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.sandbox import Failure

from programs import MATMUL

SIZES = {"M": 96, "K": 40, "N": 64}


def _space(target: str, preset: MappingOptions):  # type: ignore[no-untyped-def]
    (cdef,) = check_source(MATMUL).values()
    return build_space(cdef, SIZES, target, preset)


# --- the space ---------------------------------------------------------------------------


def test_every_field_with_tuning_metadata_is_searched_and_only_those() -> None:
    for target, preset in (("cpu", MappingOptions.cpu()), ("cuda", MappingOptions.cuda())):
        space = _space(target, preset)
        searched = {g.name for g in space.genes}
        declared = {
            f.name
            for f in dataclasses.fields(MappingOptions)
            if "tuning" in f.metadata and target in f.metadata["tuning"].targets
        }
        assert searched == declared
        assert "threads" not in searched
    assert {"parallel", "vectorize", "interchange"} <= {
        g.name for g in _space("cpu", MappingOptions.cpu()).genes
    }
    cuda = {g.name for g in _space("cuda", MappingOptions.cuda()).genes}
    assert {"map_to_threads", "map_to_blocks", "use_readonly_cache"} <= cuda
    assert {"use_tensor_cores", "warp_tile", "copy_stages"} <= cuda
    assert "input_precision" not in cuda  # it changes the results: the user's to choose
    assert "parallel" not in cuda


def test_tile_alleles_come_from_the_loop_extents() -> None:
    space = _space("cpu", MappingOptions.cpu())
    first, *others = [g.alleles for g in space.genes if g.name == "tile"]
    assert first[:2] == (AUTO, 0)  # the target chooses, untiled
    assert len(others) == 2 and all(o == first[1:] for o in others)  # one per loop of mm
    alleles = first
    for extent in SIZES.values():
        assert extent in alleles  # the ceil-divisor 1 gives the whole loop
        assert -(-extent // 3) in alleles  # three equal tiles
    assert {1, 2, 4, 8, 16, 32, 64} <= set(alleles)


def test_presets_are_in_the_space_and_every_genome_decodes_to_valid_options() -> None:
    rng = random.Random(0)
    for target, preset in (("cpu", MappingOptions.cpu()), ("cuda", MappingOptions.cuda())):
        space = _space(target, preset)
        assert space.decode(space.encode(preset)) == preset
        for _ in range(300):
            options = space.decode(space.random_genome(rng))
            threads = int(np.prod(options.map_to_threads)) if options.map_to_threads else None
            if threads is not None:  # else the mapping's default block
                assert target == "cuda" and WARP <= threads <= MAX_THREADS
            assert options.threads == preset.threads  # not searched


# --- the search on a synthetic fitness -----------------------------------------------------


def _synthetic(space, optimum: list[int]):  # type: ignore[no-untyped-def]
    """A deterministic fitness with a known optimum: the weighted distance of each
    gene's allele index to the optimum's (as if each choice had its best value)."""

    def evaluate(batch: list[MappingOptions]) -> list[Measured]:
        out = []
        for options in batch:
            genome = space.encode(options)
            distance = sum(
                (1 + k % 3) * abs(g - o)
                for k, (g, o) in enumerate(zip(genome, optimum, strict=True))
            )
            out.append(Measured(1.0 + distance))
        return out

    return evaluate


def test_the_genetic_search_beats_random_search_at_the_same_budget() -> None:
    space = _space("cpu", MappingOptions.cpu())
    start = MappingOptions.cpu()
    config = tcpy.TunerConfig(generations=15, population=20, patience=0, seed=0)
    ga_best, random_best = [], []
    for seed in range(5):
        optimum = space.random_genome(random.Random(100 + seed))
        evaluate = _synthetic(space, optimum)
        found = search(space, [start], evaluate, dataclasses.replace(config, seed=seed))
        baseline = random_search(space, [start], evaluate, found.trials, seed)
        assert found.trials == baseline.trials
        assert found.best_s <= found.start_s  # never worse than the start
        ga_best.append(found.best_s)
        random_best.append(baseline.best_s)
    assert statistics.median(ga_best) < statistics.median(random_best)
    assert sum(g < r for g, r in zip(ga_best, random_best, strict=True)) >= 4


def test_the_search_is_reproducible_from_its_seed_and_leaves_random_alone() -> None:
    space = _space("cpu", MappingOptions.cpu())
    evaluate = _synthetic(space, space.random_genome(random.Random(7)))
    config = tcpy.TunerConfig(generations=4, population=8, seed=3)
    random.seed(12345)
    before = random.random()
    random.seed(12345)
    first = search(space, [MappingOptions.cpu()], evaluate, config)
    assert random.random() == before  # the caller's random state is untouched
    second = search(space, [MappingOptions.cpu()], evaluate, config)
    untimed = [[{k: v for k, v in h.items() if k != "elapsed_s"} for h in r.history]
               for r in (first, second)]  # fmt: skip
    assert first.best == second.best and untimed[0] == untimed[1]


def test_budgets_stop_the_search() -> None:
    space = _space("cpu", MappingOptions.cpu())
    evaluate = _synthetic(space, space.random_genome(random.Random(8)))
    capped = search(
        space, [MappingOptions.cpu()], evaluate,
        tcpy.TunerConfig(generations=50, population=10, max_trials=25, patience=0),
    )  # fmt: skip
    assert capped.trials <= 25
    flat = search(
        space, [MappingOptions.cpu()], lambda b: [Measured(1.0) for _ in b],
        tcpy.TunerConfig(generations=50, population=6, patience=2),
    )  # fmt: skip
    assert len(flat.history) == 3  # no improvement after the first generation: 2 more


def test_a_population_of_failures_restarts_from_the_best() -> None:
    space = _space("cpu", MappingOptions.cpu())
    start = MappingOptions.cpu()

    def mostly_failing(batch: list[MappingOptions]) -> list[Measured]:
        return [
            Measured(1.0) if o == start else Measured(None, Failure.COMPILE_ERROR) for o in batch
        ]

    found = search(space, [start], mostly_failing, tcpy.TunerConfig(generations=4, population=8))
    assert found.best == start and found.failures["compile_error"] > 0
    assert len(found.history) == 4


# --- evaluation in worker processes --------------------------------------------------------


@pytest.fixture
def problem(tmp_path: Path):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((24, 16)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    return save_problem(tmp_path, MATMUL, "mm", "cpu", (a, b), (a @ b,), tcpy.ExecutionEngine)


def test_every_failure_class_is_contained_and_counted(
    problem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """Candidates that raise a compile error, segfault their worker, hang, return
    wrong values or raise an unexpected exception each fail with their class; the
    other candidates are timed, and compiler bugs are saved as replay files."""
    faults = {2: "compile_error", 4: "crash", 8: "hang", 16: "wrong_result", 32: "internal_error"}
    monkeypatch.setattr(evaluation, "FAULTS", faults)
    config = tcpy.TunerConfig(workers=2, timeout_s=8, runs=2)
    bugs = tmp_path / "bugs"
    evaluator = Evaluator(problem, config, tmp_path / "cache", bugs)
    try:
        candidates = [MappingOptions.cpu().replace(unroll=u) for u in (1, 2, 4, 8, 16, 32, 64)]
        measured = evaluator(candidates)
    finally:
        evaluator.close()
    classes = [m.failure.value if m.failure else None for m in measured]
    assert classes == [None, *faults.values(), None]
    assert measured[0].time_s is not None and measured[0].time_s > 0
    saved = sorted(p.name for p in bugs.iterdir())
    assert any("wrong_result" in n for n in saved) and any("internal_error" in n for n in saved)


def test_a_wrong_result_is_caught_by_the_check(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The check compares with the reference outputs the problem carries: outputs
    that are off make the candidate a wrong result, never a time."""
    inputs, want = load_data(problem.data)
    bad = dataclasses.replace(problem, data=str(tmp_path / "bad.npz"))
    np.savez(bad.data, in0=inputs[0], in1=inputs[1], want0=want[0] + 1.0)
    evaluator = Evaluator(
        bad, tcpy.TunerConfig(workers=1, timeout_s=20, runs=1), tmp_path / "c", tmp_path / "b"
    )
    try:
        (measured,) = evaluator([MappingOptions.cpu()])
    finally:
        evaluator.close()
    assert measured.failure is Failure.WRONG_RESULT and "differs" in measured.detail


def test_tuning_a_matmul_never_returns_slower_options_than_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((32, 24)).astype(np.float32)
    b = rng.standard_normal((24, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        result = engine.tune(
            "mm", a, b,
            config=tcpy.TunerConfig(generations=2, population=4, runs=2, workers=2, timeout_s=30),
        )  # fmt: skip
    assert result.time_s <= result.baseline_s and result.speedup >= 1.0
    assert result.trials >= 4 and len(result.history) == 2
    np.testing.assert_allclose(engine.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert engine.compile("mm", a, b).options == result.options
    assert result.options.outer_schedule_fusion in tuple(Fusion)


# --- the final side-by-side timing ---------------------------------------------------------


def _found(times: dict[int, float | None]) -> SearchResult:
    """A search that measured candidates `unroll=u` at `times[u]` (None: failed)."""
    measured = {}
    for u, t in times.items():
        o = MappingOptions.cpu().replace(unroll=u)
        m = Measured(t) if t is not None else Measured(None, Failure.COMPILE_ERROR)
        measured[o.to_json()] = (o, m)
    valid = {u: t for u, t in times.items() if t is not None}
    best = min(valid, key=valid.__getitem__)
    return SearchResult(MappingOptions.cpu().replace(unroll=best), valid[best], 0.0, [], measured)


def _timed(times: dict[int, float]):  # type: ignore[no-untyped-def]
    """A side-by-side timing that gives candidate `unroll=u` the time `times[u]`."""
    seen: list[list[int]] = []

    def side_by_side(candidates: list[MappingOptions], rounds: int) -> list[float]:
        seen.append([o.unroll for o in candidates])
        return [times[o.unroll] for o in candidates]

    return side_by_side, seen


def test_the_answer_is_settled_by_timing_the_finalists_beside_the_start() -> None:
    start = MappingOptions.cpu().replace(unroll=1)
    found = _found({1: 10.0, 2: 5.0, 4: 6.0, 8: 7.0, 16: 9.0})
    # the search's best was lucky: side by side, 4 is the fastest
    timed, seen = _timed({1: 10.0, 2: 8.0, 4: 6.0, 8: 7.0})
    assert settle(found, [start], timed) == (start.replace(unroll=4), 6.0, 10.0)
    assert seen == [[1, 2, 4, 8]]  # the start, then the search's best three
    # no finalist beats the start by the margin: the start stays
    timed, _ = _timed({1: 10.0, 2: 9.9, 4: 10.5, 8: 12.0})
    assert settle(found, [start], timed) == (start, 10.0, 10.0)


def test_settling_without_a_valid_start_or_a_final_timing() -> None:
    failed = MappingOptions.cpu().replace(unroll=32)
    found = _found({32: None, 2: 5.0, 4: 6.0})
    timed, seen = _timed({2: 7.0, 4: 6.5})
    assert settle(found, [failed], timed) == (failed.replace(unroll=4), 6.5, math.inf)
    assert seen == [[2, 4]]
    start = MappingOptions.cpu().replace(unroll=4)
    assert settle(found, [start], lambda c, r: None) == (found.best, 5.0, 0.0)


class _Cold:
    """A kernel on a clock of its own: its calls in the first 10 ms after its first take
    `cold` seconds (as a cold kernel's do), the later ones `warm`."""

    def __init__(self, clock: list[float], cold: float, warm: float) -> None:
        self.clock, self.cold, self.warm = clock, cold, warm
        self.began: float | None = None

    def __call__(self) -> None:
        if self.began is None:
            self.began = self.clock[0]
        early = self.clock[0] - self.began < 0.01
        self.clock[0] += self.cold if early else self.warm


def test_candidates_are_timed_warm_in_runs_of_many_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel slow for its first 10 ms of calls is timed at its warm speed, alone and
    side by side, where one warm-up call and single calls timed its cold ones: a
    candidate that ran on one thread (no threads to wake) ranked first so."""
    clock = [0.0]
    monkeypatch.setattr(tasks, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    cold = _Cold(clock, cold=0.002, warm=0.0001)
    assert tasks._median_time(cold, (), runs=3, best_s=math.inf) == pytest.approx(0.0001)
    steady = _Cold(clock, cold=0.00015, warm=0.00015)
    again = _Cold(clock, cold=0.002, warm=0.0001)
    times = tasks._side_by_side([steady, again], (), runs=2, rounds=2)
    assert times == pytest.approx([0.00015, 0.0001])
    # a first call slower than a pruned run is that run: no warm-up after it
    slow = _Cold(clock, cold=5.0, warm=5.0)
    start = clock[0]
    assert tasks._median_time(slow, (), runs=3, best_s=0.01) == 5.0
    assert clock[0] - start == 5.0


def test_the_evaluator_times_valid_candidates_side_by_side(problem, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    evaluator = Evaluator(
        problem, tcpy.TunerConfig(workers=1, timeout_s=30, runs=2), tmp_path / "c", tmp_path / "b"
    )
    candidates = [MappingOptions.cpu().replace(unroll=u) for u in (1, 4)]
    try:
        assert all(m.time_s is not None for m in evaluator(candidates))
        times = evaluator.side_by_side(candidates, rounds=2)
    finally:
        evaluator.close()
    assert times is not None and len(times) == 2 and all(t > 0 for t in times)
