"""The OpenMP runtime `cpu` kernels run on: tcpy's own copy of the compiler's libgomp,
which waits as tcpy says whatever libgomp another library brought in first
(`tcpy/runtime/openmp.py`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tcpy
from tcpy import knobs
from tcpy.errors import TCError
from tcpy.runtime import openmp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_libgomp = pytest.mark.skipif(
    openmp._compiler_libgomp() is None or not hasattr(os, "RTLD_DEEPBIND"),
    reason="the C compiler has no libgomp, or the C library no RTLD_DEEPBIND",
)
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf")


def _dynamic(library: Path, what: str) -> list[str]:
    """The names `readelf -d` gives for `what` (SONAME, NEEDED) in `library`."""
    out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if f"({what})" in line]


@needs_libgomp
@needs_readelf
def test_the_copy_of_libgomp_is_renamed_in_place(tmp_path: Path) -> None:
    """The copy differs from the compiler's libgomp in its soname alone, written over
    the old one; a longer name, or a file that is not a 64-bit ELF library, is refused."""
    source = openmp._compiler_libgomp()
    assert source is not None
    data = source.read_bytes()
    copy = openmp.renamed(data, b"libxy.so")
    at = next(i for i in range(len(data)) if data[i] != copy[i])
    start = data.rindex(b"\0", 0, at) + 1  # the soname's first byte
    assert data[start : start + 13] == b"libgomp.so.1\0"
    assert copy == data[:start] + b"libxy.so\0\0\0\0\0" + data[start + 13 :]
    (tmp_path / "copy.so").write_bytes(copy)
    assert _dynamic(tmp_path / "copy.so", "SONAME") == ["libxy.so"]
    with pytest.raises(ValueError, match="longer"):
        openmp.renamed(data, b"libmuch-longer-name.so.1")
    with pytest.raises(ValueError, match="ELF"):
        openmp.renamed(b"#!/bin/sh\n" + data, b"libxy.so")


def test_the_runtime_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TCPY_OPENMP", raising=False)
    assert knobs.openmp_runtime() == "own"
    monkeypatch.setenv("TCPY_OPENMP", "shared")
    assert knobs.openmp_runtime() == "shared"
    monkeypatch.setenv("TCPY_OPENMP", "mine")
    with pytest.raises(TCError, match="TCPY_OPENMP='mine'"):
        knobs.openmp_runtime()


_BESIDE = """
import ctypes, os, subprocess, sys
from pathlib import Path
from tcpy import knobs
from tcpy.runtime import openmp
# another library's libgomp, loaded first and global, as `import torch` loads PyTorch's
first = ctypes.CDLL(os.fspath(openmp._compiler_libgomp()), mode=os.RTLD_GLOBAL)
first.omp_set_num_threads(97)
directory = Path(sys.argv[1])
(directory / "probe.c").write_text(
    "#include <omp.h>\\nint probe(void) { omp_display_env(1); return omp_get_max_threads(); }\\n"
)
library, source = directory / "probe.so", directory / "probe.c"
command = [knobs.c_compiler(), "-O1", "-fopenmp", "-shared", "-fPIC", "-o", str(library)]
subprocess.run([*command, str(source), *openmp.link_flags()], check=True)
print(openmp.load(library).probe(), flush=True)
"""


@needs_libgomp
@pytest.mark.parametrize("runtime", ["own", "shared"])
def test_kernels_wait_as_tcpy_says_beside_another_libgomp(runtime: str, tmp_path: Path) -> None:
    """With another libgomp loaded first, global and waiting by its default (as
    PyTorch's is), a library built and loaded as kernels are runs on tcpy's copy:
    it spins `SPIN_COUNT` and does not see the other's settings; with
    `TCPY_OPENMP=shared` it runs on the other one, as kernels did before."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env.update(TCPY_OPENMP=runtime, PYTHONPATH=ROOT, OMP_NUM_THREADS="3")
    done = subprocess.run(
        [sys.executable, "-c", _BESIDE, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    spin = f"GOMP_SPINCOUNT = '{openmp.SPIN_COUNT}'"
    threads = done.stdout.split()  # a fresh runtime reads OMP_NUM_THREADS
    if runtime == "own":
        assert threads == ["3"] and spin in done.stderr
    else:
        assert threads == ["97"] and spin not in done.stderr


@needs_libgomp
@needs_readelf
def test_kernels_link_tcpys_copy_of_libgomp(tmp_path: Path) -> None:
    """A `cpu` kernel's library needs tcpy's copy (`SONAME`), not libgomp.so.1."""
    script = textwrap.dedent(
        """
        import numpy as np, tcpy
        engine = tcpy.ExecutionEngine("cpu")
        engine.define("def f(float(N) A) -> (B) { B(i) = A(i) + 1 }")
        assert (engine.f(np.ones(1 << 16, np.float32)) == 2).all()
        """
    )
    env = dict(os.environ, TCPY_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
    env.pop("TCPY_OPENMP", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    libraries = list(tmp_path.rglob("*.so"))
    assert libraries
    for library in libraries:
        needed = _dynamic(library, "NEEDED")
        assert openmp.SONAME.decode() in needed and "libgomp.so.1" not in needed


def test_a_kernel_runs_where_tcpy_cannot_copy_libgomp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a copy (another compiler, no RTLD_DEEPBIND), kernels link and run on the
    process's libgomp, and their cache key says so."""
    monkeypatch.setattr(openmp, "own_runtime", lambda: None)
    assert openmp.link_flags() == () and openmp.identity() == "openmp=shared"
    engine = tcpy.ExecutionEngine("cpu")
    engine.define("def f(float(N) A) -> (B) { B(i) = A(i) * 2 }")
    a = np.arange(1 << 16, dtype=np.float32)
    np.testing.assert_array_equal(engine.f(a), a * 2)


@pytest.mark.parametrize("chosen", [{}, {"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "5"}])
def test_a_libgomp_starts_with_a_short_spin_unless_the_environment_chose(
    monkeypatch: pytest.MonkeyPatch, chosen: dict[str, str]
) -> None:
    """A library that brings libgomp in is loaded with `GOMP_SPINCOUNT` at
    `SPIN_COUNT`, which libgomp reads as it starts, and the environment is put back;
    a choice the environment made is kept."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in chosen.items():
        monkeypatch.setenv(name, value)
    seen: list[str | None] = []

    def load() -> None:
        seen.append(os.environ.get("GOMP_SPINCOUNT"))

    openmp._waiting_briefly(load)
    assert seen == [chosen.get("GOMP_SPINCOUNT", None if chosen else str(openmp.SPIN_COUNT))]
    assert os.environ.get("GOMP_SPINCOUNT") == chosen.get("GOMP_SPINCOUNT")


@needs_libgomp
def test_the_copy_is_written_again_where_it_was_removed() -> None:
    """A cleaner of /tmp may take the copy from a long-running process: the next build
    writes it again, so kernels keep linking tcpy's copy (the linker would otherwise
    find the system's libgomp)."""
    runtime = openmp.own_runtime()
    assert runtime is not None
    shutil.rmtree(runtime.directory)
    flags = openmp.link_flags()
    assert flags == (f"-L{runtime.directory}",)
    assert (runtime.directory / "libgomp.so").read_bytes() == runtime.data
    assert runtime.directory.stat().st_mode & 0o022 == 0  # no one else writes there
