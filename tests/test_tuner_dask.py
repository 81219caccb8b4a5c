"""The tuner on Dask workers: a real `LocalCluster` of two worker processes evaluates
the candidates; a segfault or a hang in a task is a failed candidate and never a lost
worker; the client's scheduler address works as well as the client; and without Dask
the error says how to install it. Skipped where `distributed` is not installed."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tcpy
from tcpy.binding import bind
from tcpy.genetic import evaluate as evaluation
from tcpy.genetic import executors
from tcpy.genetic.evaluate import Evaluator
from tcpy.genetic.search import Measured, search
from tcpy.genetic.space import build_space
from tcpy.genetic.tasks import save_problem
from tcpy.mapping.options import MappingOptions

from programs import MATMUL


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as local:
        yield local


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[Any]:
    import distributed

    with distributed.Client(cluster) as c:
        yield c


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tcpy.ExecutionEngine:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "user-cache"))
    e = tcpy.ExecutionEngine("cpu")
    e.define(MATMUL)
    return e


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((32, 32)).astype(np.float32)
    b = rng.standard_normal((32, 32)).astype(np.float32)
    return a, b


def _tune(engine: tcpy.ExecutionEngine, config: tcpy.TunerConfig, **kw: Any) -> tcpy.TuneResult:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        return engine.tune("mm", *_inputs(), config=config, **kw)


def _no_sessions_left(client: Any) -> None:
    """Every worker removed the session's temp dir and sandboxes when it closed."""
    left = client.run(lambda: list(executors._SESSIONS))
    assert all(not sessions for sessions in left.values()), left


def test_tuning_on_dask_workers_finds_valid_options(
    engine: tcpy.ExecutionEngine, client: Any
) -> None:
    config = tcpy.TunerConfig(generations=2, population=4, runs=2, timeout_s=30, executor=client)
    result = _tune(engine, config)
    a, b = _inputs()
    assert result.trials >= 4 and len(result.history) == 2 and not result.failures
    assert 0 < result.time_s <= result.baseline_s
    np.testing.assert_allclose(
        engine.compile("mm", a, b, options=result.options)(a, b), a @ b, rtol=1e-4, atol=1e-4
    )
    assert engine.compile("mm", a, b).options == result.options  # stored, and picked up
    _no_sessions_left(client)


def _seed_reaching(engine: tcpy.ExecutionEngine, start: MappingOptions, unrolls: set[int]) -> int:
    """A seed whose first generation holds candidates with all of `unrolls`: the first
    generation depends on the seed and the starting points alone (those `tune` adds from
    the options stored so far too), so a recording evaluator finds it at once."""
    a, b = _inputs()
    starts = [start, *engine.tuned_starting_points("mm", a, b)]
    cdef = engine.checked("mm")
    space = build_space(cdef, bind(cdef, (a, b)).sizes, "cpu", engine.default_options("mm", a, b))
    for seed in range(200):
        seen: set[int] = set()

        def record(batch: list[MappingOptions], seen: set[int] = seen) -> list[Measured]:
            seen.update(o.unroll for o in batch)
            return [Measured(1.0) for _ in batch]

        search(space, starts, record, tcpy.TunerConfig(generations=1, population=4, seed=seed))
        if unrolls <= seen:
            return seed
    raise AssertionError(f"no seed reaches unroll {unrolls}")


def test_a_crash_or_a_hang_on_a_worker_fails_the_candidate_not_the_session(
    engine: tcpy.ExecutionEngine, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault hook travels with each task to the worker processes: a segfault and a
    hang in a task are counted, and both workers live on to evaluate the rest."""
    start = engine.default_options("mm", *_inputs()).replace(unroll=1)
    seed = _seed_reaching(engine, start, {2, 4})
    monkeypatch.setattr(evaluation, "FAULTS", {2: "crash", 4: "hang"})
    workers = set(client.scheduler_info()["workers"])
    config = tcpy.TunerConfig(
        generations=2, population=4, runs=2, timeout_s=10, seed=seed, executor=client
    )
    result = _tune(engine, config, starting_options=start)
    assert result.failures["crash"] >= 1 and result.failures["hang"] >= 1
    assert result.options.unroll not in (2, 4) and result.time_s > 0
    assert set(client.scheduler_info()["workers"]) == workers  # no worker was lost
    _no_sessions_left(client)


def test_a_scheduler_address_works_and_trials_carry_the_workers_device(
    cluster: Any, client: Any, tmp_path: Path
) -> None:
    """Given an address, the evaluator makes its own client and closes it at the end;
    the times come back with the device of the worker that measured them."""
    a, b = _inputs()
    problem = save_problem(tmp_path, MATMUL, "mm", "cpu", (a, b), (a @ b,), tcpy.ExecutionEngine)
    config = tcpy.TunerConfig(runs=1, timeout_s=30, executor=cluster.scheduler_address)
    evaluator = Evaluator(problem, config, tmp_path / "cache", tmp_path / "bugs")
    try:
        measured = evaluator([MappingOptions.cpu().replace(unroll=u) for u in (1, 8)])
    finally:
        evaluator.close()
    device = tcpy.ExecutionEngine("cpu").device()
    assert all(m.time_s is not None and m.detail == device for m in measured)
    assert evaluator.device == device
    assert evaluator._executor.client.status == "closed"  # type: ignore[attr-defined]
    _no_sessions_left(client)


def test_an_executor_that_is_neither_a_client_nor_an_address_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    problem = save_problem(
        tmp_path, MATMUL, "mm", "cpu", (np.ones((2, 2), np.float32),) * 2, (), tcpy.ExecutionEngine
    )
    with pytest.raises(tcpy.TCError, match=r"distributed\.Client or a scheduler address"):
        Evaluator(problem, tcpy.TunerConfig(executor=4), tmp_path / "c", tmp_path / "b")


def test_without_dask_the_error_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    problem = save_problem(
        tmp_path, MATMUL, "mm", "cpu", (np.ones((2, 2), np.float32),) * 2, (), tcpy.ExecutionEngine
    )
    with pytest.raises(tcpy.TCError, match=r"pip install tcpy\[dask\]"):
        Evaluator(problem, tcpy.TunerConfig(executor="tcp://nowhere:1"), tmp_path, tmp_path)


def test_importing_tcpy_and_the_tuner_never_imports_dask() -> None:
    code = (
        "import sys, tcpy, tcpy.genetic.tuner, tcpy.genetic.evaluate, tcpy.genetic.executors,"
        " tcpy.genetic.tasks;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
