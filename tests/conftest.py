"""Shared test setup: the tests directory on sys.path (for corpus_cases), the golden
accept switch, a vector width chosen for one test, and the skipping of `gpu` tests
where there is no GPU."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Compiled kernels of the test suite go to their own cache (reused by a second run of
# the suite), never to the user's; tests of the cache itself use their own directories.
# Every schedule transform is checked against the dependences while testing. Kernels
# run on two threads even where the tests' own processes keep the cores busy (the
# default would then be one), so that the parallel code is what is tested.
os.environ.setdefault("TCPY_VERIFY", "1")
os.environ.setdefault("TCPY_NUM_THREADS", "2")
os.environ.setdefault("TCPY_POISON", "1")
os.environ.setdefault("TCPY_EMU_CHECK", "1")
os.environ.setdefault(
    "TCPY_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"tcpy-test-cache-{os.getuid()}")
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--accept",
        action="store_true",
        default=False,
        help="rewrite golden files with the current output instead of comparing",
    )


@pytest.fixture
def accept(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--accept")) or os.environ.get("TCPY_ACCEPT") == "1"


@pytest.fixture
def vector_width(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Sets `TCPY_VECTOR_BITS` for one test (the width is read once per process): for
    tests of the code printed at a width, whatever vectors the machine has. Skips where
    the compiler takes no width."""
    from tcpy.runtime import cpu

    def choose(bits: str) -> None:
        if "-mprefer-vector-width=" not in cpu._target_report():
            pytest.skip("this compiler takes no vector width")
        monkeypatch.setenv("TCPY_VECTOR_BITS", bits)
        monkeypatch.setenv("TCPY_CACHE_DIR", "off")  # kernels of this width only
        cpu.vector_bytes.cache_clear()

    yield choose
    monkeypatch.undo()
    cpu.vector_bytes.cache_clear()


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
