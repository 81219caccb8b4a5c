"""The engine as a library: options that layer on the target's defaults, one compile
per key across threads, a log record for every compile, real signatures and short
reprs, and pickling of engines and compiled kernels."""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import tcpy

SOURCE = """
def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
def scale(float(N) X, float s) -> (Y) {
    Y(i) = X(i) * s
}
"""


@pytest.fixture
def engine(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> tcpy.ExecutionEngine:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(SOURCE)
    return engine


def _mm_inputs(m: int = 8, k: int = 6, n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m * 100 + n)
    return rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)


# --- options ---------------------------------------------------------------------------


@pytest.mark.parametrize("given", [{"unroll": 2}, '{"unroll": 2}'])
def test_partial_options_change_only_their_fields(
    engine: tcpy.ExecutionEngine, given: object
) -> None:
    a, b = _mm_inputs()
    defaults = engine.default_options("mm", a, b)
    assert defaults.unroll != 2  # else the test shows nothing
    kernel = engine.compile("mm", a, b, options=given)
    assert kernel.options.unroll == 2
    assert kernel.options.replace(unroll=defaults.unroll) == defaults
    np.testing.assert_allclose(engine.mm(a, b, options=given), a @ b, rtol=1e-5)


def test_default_options_check_the_inputs_they_are_given(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    assert engine.default_options("mm", a, b) == engine.default_options("mm")
    with pytest.raises(tcpy.TCInputError, match=r"takes 2 inputs .* but 1 was given"):
        engine.default_options("mm", a)
    with pytest.raises(tcpy.TCInputError, match="K"):
        engine.default_options("mm", a, a)


def test_a_preset_name_replaces_the_defaults(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    kernel = engine.compile("mm", a, b, options="mlp")
    assert kernel.options == tcpy.MappingOptions.mlp()


def test_bad_partial_options_are_clear_errors(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    with pytest.raises(tcpy.TCMappingError, match="unknown mapping option"):
        engine.mm(a, b, options={"unrol": 2})
    with pytest.raises(tcpy.TCMappingError, match="not valid JSON"):
        engine.mm(a, b, options="{unroll: 2")
    with pytest.raises(tcpy.TCMappingError, match="options must be MappingOptions"):
        engine.mm(a, b, options=[("unroll", 2)])


def test_explicit_options_win_over_tuned_ones(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    tuned = engine.default_options("mm").replace(unroll=8)
    engine.store_tuned(_result(engine, tuned, a, b))
    assert engine.compile("mm", a, b).options.unroll == 8
    assert engine.compile("mm", a, b, options={"unroll": 2}).options.unroll == 2


def _result(
    engine: tcpy.ExecutionEngine, options: tcpy.MappingOptions, *inputs: np.ndarray
) -> tcpy.TuneResult:
    from tcpy.parser.printer import canonical

    cdef = engine.checked("mm")
    signature = [[list(x.shape), str(x.dtype)] for x in inputs]
    return tcpy.TuneResult(
        entry="mm", target=engine.target, device=engine.device(), definition=canonical(cdef),
        inputs=signature, options=options, time_s=1e-3, baseline_s=2e-3, history=[],
        trials=1, failures={},
    )  # fmt: skip


# --- compiles: once per key, logged ------------------------------------------------------


def test_threads_calling_one_engine_compile_each_key_once(engine: tcpy.ExecutionEngine) -> None:
    shapes = [(4 + k, 3, 5) for k in range(4)]
    inputs = [_mm_inputs(*s) for s in shapes]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            barrier.wait()
            for a, b in inputs:
                np.testing.assert_allclose(engine.mm(a, b), a @ b, rtol=1e-5)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert engine.stats.compiles + engine.stats.disk_hits == len(shapes)


def test_every_compile_is_logged_with_its_reason(
    engine: tcpy.ExecutionEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tcpy.compile")
    a, b = _mm_inputs()
    engine.mm(a, b)
    engine.mm(a, b)  # from memory: no record
    engine.mm(*_mm_inputs(5, 6, 4))
    engine.mm(a, b, options={"unroll": 2})
    messages = [r.getMessage() for r in caplog.records if r.name == "tcpy.compile"]
    assert len(messages) == 3
    assert "(first call)" in messages[0] and "float32[8, 6]" in messages[0]
    assert "(new shapes)" in messages[1] and "float32[5, 6]" in messages[1]
    assert "(new options)" in messages[2]
    assert all("compiled" in m and "schedule" in m and "cc" in m for m in messages)
    fresh = tcpy.ExecutionEngine("cpu")  # same cache directory: loaded, not compiled
    fresh.define(SOURCE)
    caplog.clear()
    fresh.mm(a, b)
    (record,) = [r.getMessage() for r in caplog.records if r.name == "tcpy.compile"]
    assert "loaded from the disk cache" in record


def test_tcpy_log_sends_the_loggers_to_stderr(tmp_path: pytest.TempPathFactory) -> None:
    import subprocess
    import sys

    program = (
        "import numpy as np, tcpy\n"
        "e = tcpy.ExecutionEngine('reference')\n"
        "e.define('def f(float(N) A) -> (B) { B(i) = A(i) }')\n"
        "e.f(np.ones(3, np.float32))\n"
    )
    env = {**__import__("os").environ, "TCPY_LOG": "info", "TCPY_CACHE_DIR": "off"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True
    )
    assert "tcpy.compile: INFO: f(float32[3]) on reference" in done.stderr
    env["TCPY_LOG"] = "loud"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, check=True
    )
    assert "TCPY_LOG='loud'" in done.stderr and "tcpy.compile" not in done.stderr


# --- signatures, docstrings, reprs --------------------------------------------------------


def test_entry_has_the_defs_signature_and_a_docstring(engine: tcpy.ExecutionEngine) -> None:
    signature = inspect.signature(engine.mm)
    assert list(signature.parameters) == ["A", "B", "options", "out"]
    assert signature.parameters["A"].kind is inspect.Parameter.POSITIONAL_ONLY
    assert engine.mm.__name__ == "mm"
    doc = engine.mm.__doc__ or ""
    assert "A: float32(M, K)" in doc and "C: float32(M, N)" in doc and "+=!" in doc


def test_reprs_are_short_and_useful(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    kernel = engine.compile("mm", a, b)
    assert repr(engine) == "ExecutionEngine(target='cpu', defs: mm, scale, kernels: 1)"
    assert repr(kernel).startswith(
        "<Compiled mm(A: float32[8, 6], B: float32[6, 4]) for these shapes"
    )
    assert kernel.cache_key[:12] in repr(kernel)
    generic = engine.compile("mm", a, b, options={"fix_parameters_before_scheduling": False})
    assert generic.generic
    assert repr(generic).startswith(
        "<Compiled mm(A: float32(M, K), B: float32(K, N)) for any sizes"
    )
    text = repr(engine.checked("mm"))
    assert text == "CheckedDef(def mm(float32(M,K) A, float32(K,N) B) -> (C))"


# --- pickling ------------------------------------------------------------------------------


def test_an_engine_with_kernels_pickles(engine: tcpy.ExecutionEngine) -> None:
    a, b = _mm_inputs()
    want = engine.mm(a, b)
    clone = pickle.loads(pickle.dumps(engine))
    assert clone.entries == ("mm", "scale") and clone.target == "cpu"
    np.testing.assert_array_equal(clone.mm(a, b), want)
    assert clone.stats.compiles == 0 and clone.stats.disk_hits == 1  # reloaded
    np.testing.assert_array_equal(clone.scale(np.ones(3, np.float32), 2.0), 2.0)


def _run_compiled(kernel: tcpy.Compiled, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return kernel(a, b)


@pytest.mark.parametrize("generic", [False, True])
def test_a_compiled_kernel_pickles(engine: tcpy.ExecutionEngine, generic: bool) -> None:
    a, b = _mm_inputs()
    options = {"fix_parameters_before_scheduling": not generic, "unroll": 2}
    kernel = engine.compile("mm", a, b, options=options)
    clone = pickle.loads(pickle.dumps(kernel))
    assert clone.generic is generic and clone.options == kernel.options
    assert clone.cache_key == kernel.cache_key and clone.source == kernel.source
    np.testing.assert_allclose(clone(a, b), a @ b, rtol=1e-5)
    # in another process, as multiprocessing and Dask send it
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        np.testing.assert_allclose(
            pool.submit(_run_compiled, kernel, a, b).result(), a @ b, rtol=1e-5
        )
