"""Finding the host compilers and naming them (for cache keys)."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tcpy import knobs
from tcpy.errors import TCCompileError


def require(program: str, what: str, variable: str, package: str) -> str:
    """`program` if it is on the PATH, else a TCCompileError saying how to get it."""
    if shutil.which(program) is None:
        raise TCCompileError(
            f"the {what} {program!r} was not found; install {package} or set {variable}"
        )
    return program


def c_compiler() -> str:
    """The C compiler of the `cpu` target (`TCPY_CC`), which must be on the PATH."""
    return require(knobs.c_compiler(), "C compiler", "TCPY_CC", "gcc")


@functools.cache
def version_line(program: str) -> str:
    """The first line `program --version` prints (the program's name if none)."""
    try:
        done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return program
    return done.stdout.splitlines()[0] if done.stdout else program


def scratch_directory(prefix: str) -> Path:
    """A new temporary directory for this process's own files (0755: readable where the
    process changes its user), removed at exit by the process that made it, not by a
    forked child."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    directory.chmod(0o755)
    atexit.register(_remove, directory, os.getpid())
    return directory


def _remove(directory: Path, maker: int) -> None:
    if os.getpid() == maker:
        shutil.rmtree(directory, ignore_errors=True)
