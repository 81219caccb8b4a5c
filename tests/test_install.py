"""What an installed tcpy costs and ships: `import tcpy` loads only what compiling and
running kernels need, and the package carries its typing marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def test_import_tcpy_loads_neither_scipy_nor_the_tuner() -> None:
    """SciPy serves a few builtins of the reference target and the tuner's libraries a
    tuning session: both load on first use, not with `import tcpy`."""
    code = (
        "import sys, tcpy\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('scipy', 'deap', 'tqdm', 'matplotlib', 'dask', 'torch') "
        "or m == 'tcpy.genetic.tuner')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []


def test_lazy_names_still_resolve() -> None:
    code = (
        "import sys, tcpy\n"
        "from tcpy import TunerConfig\n"
        "assert tcpy.TuneResult.__name__ == 'TuneResult' and TunerConfig().generations > 0\n"
        "import numpy as np\n"
        "e = tcpy.ExecutionEngine('reference')\n"
        "e.define('def f(float(N) X) -> (Y) { Y(i) = erf(X(i)) }')\n"
        "print(float(e.f(np.zeros(3, np.float32)).sum()), 'scipy' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.0", "True"]  # the builtin loaded SciPy when it ran


def test_package_data_and_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (ROOT / "tcpy" / "py.typed").exists()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["tcpy"]
    assert project["project"]["license"] == "Apache-2.0"  # SPDX: no deprecation banner
    extras = set(project["project"]["optional-dependencies"])
    assert {"cuda", "torch", "dask", "plot", "dev"} <= extras
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    assert "egg-info" not in tracked


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    """The packages setuptools finds by the project's configuration are exactly the
    folders of `tcpy/` that hold Python modules (a package listed by hand would leave a
    new one out of a wheel install, silently)."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = pytest.importorskip("setuptools")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = project["tool"]["setuptools"]["packages"]["find"]
    found = set(setuptools.find_packages(where=str(ROOT), include=find["include"]))
    folders = {
        ".".join(Path(top).relative_to(ROOT).parts)
        for top, _, files in os.walk(ROOT / "tcpy", followlinks=True)  # tcpy/grammar
        if any(f.endswith(".py") for f in files) and "__pycache__" not in top
    }
    assert found == folders
    assert {"tcpy.mapping.gpu", "tcpy.mapping.cpu", "tcpy.cache", "tcpy.grammar"} <= found
