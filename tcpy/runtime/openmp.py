"""The OpenMP runtime `cpu` kernels run on: tcpy's own copy of the compiler's libgomp.

libgomp reads how its idle threads wait (`GOMP_SPINCOUNT`, `OMP_WAIT_POLICY`) once, as
it is loaded, and a process holds one library of a name: PyTorch brings its own
`libgomp.so.1` with `import torch`, waiting by libgomp's default (300,000 spins, some
milliseconds), and kernels loaded after it ran on it, their threads spinning on every
core after each call. So the kernels link a copy of the compiler's libgomp under
another name (`SONAME`), which tcpy loads once per process with its own wait
(`SPIN_COUNT`; `own_runtime`), and each kernel is loaded with its own dependencies
first (`RTLD_DEEPBIND`): PyTorch's libgomp is global, and would take the kernels' calls.
Where no copy can be made (a compiler without libgomp, a C library without
`RTLD_DEEPBIND`), or `TCPY_OPENMP=shared` asks for the process's libgomp, kernels use
the process's, which gets `SPIN_COUNT` only where a kernel is the first to bring it in.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tcpy import knobs
from tcpy.runtime import toolchain

SPIN_COUNT = 1_000
"""How long an idle thread of a kernel's team spins before it sleeps, in libgomp's
spins (`GOMP_SPINCOUNT`; about 10 us here), unless the environment sets
`GOMP_SPINCOUNT` or `OMP_WAIT_POLICY`. libgomp waits so between calls and at its own
barriers; the kernels' barriers are their own (`tcpy.codegen.region`) and spin for
0.1 ms, so this wait is the one after a call. libgomp's default (300,000, a few
milliseconds) kept both cores busy after each call: a NumPy call right after a tcpy
call ran up to 40x slower. At 10,000 (0.1 ms), NumPy's 0.11 ms matrix-vector product
right after a tcpy call still ran 3.3x slower, and a tcpy call right after NumPy's
1.2-1.9x; at 1,000, 1.0-1.2x and 0.7-1.0x; at 2,000, 1.3-1.4x. A call whose threads
slept pays their wake-up (25-30 us here): shorter waits cost it at every call made
back to back (a 65,536-element addition on 2 threads: 27 us at 1,000 or 10,000, 54-58
us at 300), and this one where a call's own Python work outlasts it (gesummv's 0.15
ms call: 0.17-0.20 ms back to back, 0.15-0.16 at 2,000)."""

SONAME = b"libtcgomp.so"
"""The name tcpy's copy of libgomp goes by (no longer than libgomp's own, which it
replaces in place)."""

_DEEP = os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0)


@dataclass(frozen=True)
class Runtime:
    """tcpy's loaded copy of libgomp: `directory` holds it as `libgomp.so` for the
    linker's `-lgomp`; `digest` names its bytes (`data`) in the cache keys."""

    directory: Path
    data: bytes
    digest: str
    handle: ctypes.CDLL


def link_flags() -> tuple[str, ...]:
    """What a kernel's link adds so that `-fopenmp` links tcpy's copy of libgomp."""
    runtime = own_runtime()
    if runtime is None:
        return ()
    try:
        _written(runtime.directory, runtime.data)  # again where a cleaner of /tmp took it
    except OSError:  # the process's libgomp, which the kernel still runs on
        return ()
    return (f"-L{runtime.directory}",)


def identity() -> str:
    """The runtime kernels link, for the cache keys: tcpy's copy, or the process's."""
    runtime = own_runtime()
    return f"openmp={runtime.digest}" if runtime is not None else "openmp=shared"


def load(library: Path) -> ctypes.CDLL:
    """`library`, built with `link_flags`, loaded so that its OpenMP calls go to the
    runtime it was linked with."""
    if own_runtime() is not None:
        return ctypes.CDLL(os.fspath(library), mode=_DEEP)
    return _waiting_briefly(lambda: ctypes.CDLL(os.fspath(library)))


_RUNTIME_LOCK = threading.Lock()


def own_runtime() -> Runtime | None:
    """tcpy's copy of the compiler's libgomp, made and loaded once per process (in a
    directory of its own, removed when the process that made it exits); None where
    kernels use the process's. Two copies loaded would be two runtimes of one name:
    one thread makes it."""
    with _RUNTIME_LOCK:
        return _own_runtime()


@functools.cache
def _own_runtime() -> Runtime | None:
    if knobs.openmp_runtime() == "shared" or not hasattr(os, "RTLD_DEEPBIND"):
        return None
    source = _compiler_libgomp()
    if source is None:
        return None
    try:
        data = renamed(source.read_bytes(), SONAME)
        directory = toolchain.scratch_directory("tcpy-openmp-")
        library = _written(directory, data)
        handle = _waiting_briefly(lambda: ctypes.CDLL(os.fspath(library), mode=_DEEP))
    except (OSError, ValueError):
        return None
    return Runtime(directory, data, hashlib.sha256(data).hexdigest()[:16], handle)


def _written(directory: Path, data: bytes) -> Path:
    """`directory`/libgomp.so, written with `data` unless it is there."""
    library = directory / "libgomp.so"
    if not library.exists():
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        library.write_bytes(data)
    return library


def _compiler_libgomp() -> Path | None:
    """The libgomp the C compiler links with `-fopenmp`, or None where it has none."""
    compiler = toolchain.c_compiler()
    try:
        done = subprocess.run(
            [compiler, "-print-file-name=libgomp.so.1"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(done.stdout.strip())
    return path.resolve() if path.is_absolute() and path.exists() else None


def renamed(library: bytes, soname: bytes) -> bytes:
    """The 64-bit little-endian ELF shared library `library` with its soname replaced
    by `soname`, written over the old one in the dynamic string table (so no longer
    than it); a ValueError for anything else."""
    if library[:6] != b"\x7fELF\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    table = struct.unpack_from("<Q", library, 0x28)[0]  # e_shoff
    entry_size, count = struct.unpack_from("<HH", library, 0x3A)  # e_shentsize, e_shnum
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", library, table + i * entry_size) for i in range(count)
    ]
    dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dynamic is None:
        raise ValueError("no dynamic section")
    strings = sections[dynamic[6]][4]  # the offset of the table its sh_link names
    for at in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", library, at)
        if tag == 14:  # DT_SONAME
            start = strings + value
            end = library.index(b"\0", start)
            if len(soname) > end - start:
                raise ValueError(f"{soname!r} is longer than {library[start:end]!r}")
            padded = soname + b"\0" * (end - start - len(soname))
            return library[:start] + padded + library[end:]
    raise ValueError("no soname")


_ENV_LOCK = threading.Lock()


def _waiting_briefly(load: Callable[[], ctypes.CDLL]) -> ctypes.CDLL:
    """`load()` with `GOMP_SPINCOUNT` at `SPIN_COUNT`, which a libgomp it brings into
    the process reads as it starts, unless the environment chose how OpenMP threads
    wait; the environment is put back as it was."""
    with _ENV_LOCK:
        chosen = any(v in os.environ for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"))
        if not chosen:
            os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        try:
            return load()
        finally:
            if not chosen:
                del os.environ["GOMP_SPINCOUNT"]
