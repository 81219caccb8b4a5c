"""Shared test setup: the tests directory on sys.path (for corpus_cases), the golden
accept switch, and the skipping of `gpu` tests where there is no GPU."""

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


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
