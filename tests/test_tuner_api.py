"""The tuner as users meet it: `engine.tune`, the tuned-options store and its pick-up
by later calls (in this process and a fresh one), export and import, the convergence
plot, progress lines, and `tcpy tune`. Every session is real (the cpu target, the
genetic search, candidates compiled and timed in a worker) and tiny, as the suite runs
on two shared cores; one session is shared by the tests that only read its result."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy.cli import main
from tcpy.genetic.progress import Reporter
from tcpy.genetic.search import Measured, search
from tcpy.genetic.space import build_space

from programs import MATMUL

ROOT = Path(__file__).parent.parent
TINY = tcpy.TunerConfig(generations=2, population=4, runs=2, workers=1, timeout_s=20)
PNG = b"\x89PNG\r\n\x1a\n"


def _inputs(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return a, b


def _engine(target: str = "cpu") -> tcpy.ExecutionEngine:
    engine = tcpy.ExecutionEngine(target)
    engine.define(MATMUL)
    return engine


@dataclass
class Session:
    cache: Path  # the TCPY_CACHE_DIR the session stored its result in
    engine: tcpy.ExecutionEngine
    result: tcpy.TuneResult


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """One tiny session at 32x32, in a cache directory of its own."""
    cache = tmp_path_factory.mktemp("tuned-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TCPY_CACHE_DIR", str(cache))
        engine = _engine()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tcpy.TCWarning)
            result = engine.tune("mm", *_inputs(32, 32, 32), config=TINY)
        yield Session(cache, engine, result)


def test_import_tcpy_loads_no_tuner_dependency() -> None:
    """The tuner's dependencies cost seconds to import and are extras (matplotlib,
    Dask): a program that only compiles kernels must not pay for them."""
    code = (
        "import sys, tcpy\n"
        "print(sorted(m for m in ('deap', 'tqdm', 'matplotlib', 'dask', 'distributed')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the store and its pick-up -------------------------------------------------------------


def test_tuned_options_are_used_by_later_calls_and_explicit_options_win(
    session: Session,
) -> None:
    a, b = _inputs(32, 32, 32)
    result = session.result
    assert result.time_s <= result.baseline_s and result.trials >= 4
    assert session.engine.tuned_options("mm", a, b) == result.options
    assert session.engine.compile("mm", a, b).options == result.options
    explicit = tcpy.MappingOptions.cpu().replace(unroll=3, tile=(3, 5, 7))  # not in the space
    assert result.options != explicit
    assert session.engine.compile("mm", a, b, options=explicit).options == explicit
    np.testing.assert_allclose(session.engine.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_the_tuned_record_on_disk_holds_options_top_device_version_and_date(
    session: Session,
) -> None:
    (path,) = (session.cache / "tuned").rglob("*.json")
    record = json.loads(path.read_text())
    assert tcpy.MappingOptions.from_dict(record["options"]) == session.result.options
    top = [(tcpy.MappingOptions.from_dict(t["options"]), t["time_s"]) for t in record["top"]]
    assert top and top == [(o, pytest.approx(t)) for o, t in session.result.top]
    assert record["device"] == session.engine.device() and record["target"] == "cpu"
    assert record["tcpy"] and record["date"][:2] == "20"
    assert record["inputs"] == [[[32, 32], "float32"], [[32, 32], "float32"]]
    assert not list(path.parent.glob("*.tmp"))  # written atomically, nothing left over


def test_a_fresh_process_picks_up_the_tuned_options(session: Session, tmp_path: Path) -> None:
    """The session's result, and (as the tuner may well have kept the default options)
    a result with options that are certainly not the default, imported into another
    cache: a later process with the same cache directory compiles with each."""
    other = tcpy.MappingOptions.cpu().replace(unroll=3, tile=(3, 5, 7))
    saved = tmp_path / "other.json"
    session.result.save(saved)
    record = json.loads(saved.read_text())
    record["options"] = other.to_dict()
    saved.write_text(json.dumps(record))
    code = (  # argv: the session's cache, another cache, a file to import into it or -
        "import os, sys, numpy as np, tcpy\n"
        "a = np.ones((32, 32), np.float32)\n"
        "for cache, imported in ((sys.argv[1], '-'), (sys.argv[2], sys.argv[3])):\n"
        "    os.environ['TCPY_CACHE_DIR'] = cache\n"
        "    e = tcpy.ExecutionEngine('cpu')\n"
        f"    e.define({MATMUL!r})\n"
        "    if imported != '-':\n"
        "        e.load_tuned(imported)\n"
        "    print(e.compile('mm', a, a).options.to_json())\n"
    )
    for imported in (str(saved), "-"):  # the second time, the import is already on disk
        done = subprocess.run(
            [sys.executable, "-c", code, str(session.cache), str(tmp_path / "other"), imported],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        tuned, imported_options = map(tcpy.MappingOptions.from_json, done.stdout.split("\n")[:2])
        assert tuned == session.result.options
        assert imported_options == other != tcpy.MappingOptions.cpu()


def test_save_then_load_tuned_in_another_cache(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "best.json"
    session.result.save(saved)
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "other-cache"))
    engine = _engine()
    a, b = _inputs(32, 32, 32)
    assert engine.tuned_options("mm", a, b) is None  # another cache knows nothing yet
    engine.load_tuned(saved)
    assert engine.compile("mm", a, b).options == session.result.options
    assert list((tmp_path / "other-cache" / "tuned").rglob("*.json"))  # and keeps them

    damaged = tmp_path / "damaged.json"
    damaged.write_text(saved.read_text()[:100])
    with pytest.raises(tcpy.TCError, match="cannot load tuned options"):
        engine.load_tuned(damaged)
    record = json.loads(saved.read_text())
    del record["options"]
    damaged.write_text(json.dumps(record))
    with pytest.raises(tcpy.TCError, match="cannot load tuned options"):
        engine.load_tuned(damaged)


@pytest.mark.parametrize(
    "edit", [{"unroll": -3}, {"frobnicate": 1}], ids=["invalid-value", "unknown-field"]
)
def test_a_stored_record_that_no_longer_validates_is_skipped_with_a_warning(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: dict[str, int]
) -> None:
    """As after an upgrade that changed an option: the record is ignored (with one
    warning, not one per call) and the target's default options are used."""
    saved = tmp_path / "best.json"
    session.result.save(saved)
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))
    engine = _engine()
    engine.load_tuned(saved)
    (path,) = (tmp_path / "cache" / "tuned").rglob("*.json")
    record = json.loads(path.read_text())
    record["options"].update(edit)
    path.write_text(json.dumps(record))
    a, b = _inputs(32, 32, 32)
    with pytest.warns(tcpy.TCWarning, match="no longer validate"):
        compiled = engine.compile("mm", a, b)
    assert compiled.options == engine.default_options("mm", a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tcpy.TCWarning)
        engine.compile("mm", a, b)  # warned once already


def test_tuned_shapes_are_a_starting_point_for_nearby_shapes(session: Session) -> None:
    near = session.engine.tuned_starting_points("mm", *_inputs(48, 48, 48))
    assert near == [session.result.options]
    assert session.engine.tuned_options("mm", *_inputs(48, 48, 48)) is None  # not exact
    assert session.engine.tuned_starting_points("mm", *_inputs(32, 32, 32)) == [
        session.result.options  # the shapes tuned: their own options
    ]


@pytest.mark.parametrize("target", ["cuda-emu", "reference"])
def test_tuning_an_emulated_or_interpreted_target_is_refused(target: str) -> None:
    with pytest.raises(tcpy.TCError, match=f"cpu or cuda target, not {target}"):
        _engine(target).tune("mm", *_inputs(8, 8, 8), config=TINY)


# --- what a session reports ----------------------------------------------------------------


def test_history_has_one_record_per_generation_and_the_plot_is_a_png(
    session: Session, tmp_path: Path
) -> None:
    history = session.result.history
    assert [h["generation"] for h in history] == list(range(len(history)))
    for h in history:
        assert {"generation", "trials", "best_s", "median_s", "failures"} <= h.keys()
    assert [h["trials"] for h in history] == sorted(h["trials"] for h in history)
    assert history[-1]["best_s"] == session.result.top[0][1]  # the search's own times
    session.result.plot(tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG


def test_without_a_terminal_progress_is_one_line_per_generation() -> None:
    """The search on a synthetic fitness (the real one costs seconds) reporting to
    the Reporter as `tune` wires it: a log or CI sees plain lines, no bar."""
    (cdef,) = tcpy.check_source(MATMUL).values()
    preset = tcpy.MappingOptions.cpu()
    space = build_space(cdef, {"M": 32, "K": 32, "N": 32}, "cpu", preset)

    def evaluate(batch: list[tcpy.MappingOptions]) -> list[Measured]:
        return [Measured(1e-3 * (1 + sum(space.encode(o)) % 7)) for o in batch]

    config = tcpy.TunerConfig(generations=3, population=4, patience=0)
    stream = io.StringIO()
    with Reporter("mm", config, stream) as reporter:
        search(space, [preset], evaluate, config, reporter.update)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in stream.getvalue()
    for k, line in enumerate(lines, 1):
        assert line.startswith(f"tcpy tune mm: generation {k}/3: ")
        assert "candidates, best" in line and "x the start" in line and "0 failed" in line


def test_on_a_terminal_progress_is_a_bar() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    (cdef,) = tcpy.check_source(MATMUL).values()
    preset = tcpy.MappingOptions.cpu()
    space = build_space(cdef, {"M": 32, "K": 32, "N": 32}, "cpu", preset)
    config = tcpy.TunerConfig(generations=2, population=3, patience=0)
    stream = Terminal()
    with Reporter("mm", config, stream) as reporter:
        search(space, [preset], lambda b: [Measured(1e-3)] * len(b), config, reporter.update)
    shown = stream.getvalue()
    assert "tuning mm" in shown and "2/2" in shown and "best 1.000 ms" in shown
    assert "tcpy tune mm: generation" not in shown


# --- tcpy tune --------------------------------------------------------------------------


def test_tcpy_tune_prints_a_summary_and_writes_the_plot_and_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "mm.tc"
    source.write_text(MATMUL + "\n")
    plot, best = tmp_path / "p.png", tmp_path / "best.json"
    argv = ["tune", str(source), "--entry", "mm", "--sizes", "M=32,N=32,K=32",
            "--generations", "1", "--population", "3", "--workers", "1", "--runs", "2",
            "--seed", "0", "--plot", str(plot), "--save", str(best)]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "tuned mm on cpu" in out and "sizes M=32, K=32, N=32" in out
    for row in ("default time", "best time", "speedup", "trials", "failures"):
        assert f"  {row} " in out
    (failures,) = (line for line in out.splitlines() if line.startswith("  failures "))
    for failure in ("compile_error", "crash", "hang", "wrong_result", "internal_error"):
        assert failure in failures  # every class, with its count
    assert "tcpy tune mm: generation 1/1" in err  # progress, on stderr
    assert plot.read_bytes()[:8] == PNG
    saved = json.loads(best.read_text())
    assert saved["entry"] == "mm" and saved["trials"] == 3

    # a second session at these shapes starts from the first one's result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        assert main([*argv[:-4]]) == 0
    assert "  start time " in capsys.readouterr().out


def test_tcpy_tune_refuses_the_reference_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mm.tc"
    source.write_text(MATMUL + "\n")
    assert main(["tune", str(source), "--target", "reference"]) == 1
    assert "cpu or cuda target, not reference" in capsys.readouterr().err
