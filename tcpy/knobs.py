"""Every environment variable tcpy reads, in one place.

- `TCPY_CACHE_DIR`: the on-disk compile cache (default: `$XDG_CACHE_HOME/tcpy`, else
  `~/.cache/tcpy`). `TCPY_CACHE_DIR=off` disables the disk cache.
- `TCPY_CACHE_MAX_MB`: a cap on the compiled kernels the disk cache keeps, in
  megabytes; the least recently used go first (default: no cap).
- `TCPY_CC`: the C compiler of the `cpu` target (default `cc`).
- `TCPY_CXX`: the C++ compiler of the `cuda-emu` target (default `g++`).
- `TCPY_EMU_CHECK=1`: check every `cuda-emu` launch (bounds, shared-memory races,
  divergent barriers), with the emulator's instrumented build.
- `TCPY_CUDA_DRIVER`: `pycuda` or `bindings` to choose the CUDA driver layer (default:
  cuda.bindings, else pycuda).
- `TCPY_CUDA_DEVICE`: the device profile (`tcpy.mapping.gpu.device`) that `cuda-emu`
  maps for, and `cuda` when no GPU is present (default `h100`).
- `TCPY_CUDA_ARCH`: the architecture cubins are built for when no GPU is present
  (default: the device profile's).
- `TCPY_VERIFY=1`: verify every schedule transform against the dependences.
- `TCPY_VECTOR_BITS`: `128`, `256` or `512`, the vector width `cpu` kernels are built
  for on x86 (default: the widest the CPU has).
- `TCPY_NUM_THREADS`: the threads a `cpu` kernel runs on, read at each call (default:
  `OMP_NUM_THREADS`'s first value, else the cores this process may run on that other
  processes do not keep busy); `MappingOptions.threads` overrides both.
- `TCPY_OPENMP`: `own` (default) or `shared`: whether `cpu` kernels run on tcpy's own
  copy of the compiler's OpenMP runtime, which waits as tcpy says whatever other
  library brought its own in first (PyTorch does), or on the process's.
- `TCPY_ISL_SECONDS`: how long one isl analysis (dependences, scheduling) may run
  before tcpy stops it and falls back to a cheaper one (default 2; all of a compile's
  isl analyses stop after two and a half times that).
- `TCPY_LOG`: `debug`, `info`, `warning` or `error`: log the `tcpy` loggers at that
  level on stderr (`tcpy.log`; default: no handler, as for any library).
- `TCPY_MAX_SOURCE_MB`: the largest TC source tcpy reads, in megabytes of 10^6 bytes
  (default 1); a larger one is refused at once.
- `TCPY_POISON=1`: fill the buffers a kernel writes whole with all-ones bytes instead
  of leaving them as allocated, so that an element left unwritten shows (the tests and
  the fuzzer set it).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tcpy.errors import TCError, TCLaunchError


def cache_dir() -> Path | None:
    """The root of the disk cache, or None when it is off. A relative `TCPY_CACHE_DIR` is
    taken from the working directory now (a later `chdir` does not move the cache); a
    relative `XDG_CACHE_HOME` is ignored, as the XDG spec says. Without a home directory
    the default stays relative (`~/.cache/tcpy`), which the cache refuses with a warning."""
    value = os.environ.get("TCPY_CACHE_DIR")
    if value == "off":
        return None
    if value:
        return Path(value).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path("~").expanduser() / ".cache"
    return base / "tcpy"


def cache_max_bytes() -> int:
    """The cap on the compiled kernels of the disk cache (`TCPY_CACHE_MAX_MB`, in
    megabytes of 10^6 bytes), in bytes; 0 when there is none. A value that is not a
    non-negative number is an error: a cap that silently does nothing would let the
    cache grow unnoticed."""
    value = os.environ.get("TCPY_CACHE_MAX_MB", "").strip()
    if not value:
        return 0
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = math.nan
    if not math.isfinite(megabytes) or megabytes < 0:
        raise TCError(
            f"TCPY_CACHE_MAX_MB={value!r}: the cache size cap must be a number of "
            "megabytes, 0 or more (0 or unset: no cap)"
        )
    return int(megabytes * 1e6)


MAX_SOURCE_KNOB = "TCPY_MAX_SOURCE_MB"


def max_source_bytes() -> int:
    """The largest TC source read, in bytes (`TCPY_MAX_SOURCE_MB`, default 1 MB). A
    value that is not a positive number is an error."""
    value = os.environ.get(MAX_SOURCE_KNOB, "").strip()
    if not value:
        return 1_000_000
    try:
        megabytes = float(value)
    except ValueError:
        megabytes = math.nan
    if not math.isfinite(megabytes) or megabytes <= 0:
        raise TCError(
            f"{MAX_SOURCE_KNOB}={value!r}: the source size limit must be a positive number "
            "of megabytes"
        )
    return int(megabytes * 1e6)


def vector_bits() -> int | None:
    """`TCPY_VECTOR_BITS`: the vector width of `cpu` kernels, None when unset."""
    value = os.environ.get("TCPY_VECTOR_BITS", "").strip()
    if not value:
        return None
    if value not in ("128", "256", "512"):
        raise TCError(f"TCPY_VECTOR_BITS={value!r}: the vector width must be 128, 256 or 512")
    return int(value)


def c_compiler() -> str:
    return os.environ.get("TCPY_CC", "cc")


def openmp_runtime() -> str:
    """`TCPY_OPENMP`: `own` (tcpy's copy of the OpenMP runtime, the default) or `shared`
    (the process's)."""
    value = os.environ.get("TCPY_OPENMP", "own").strip() or "own"
    if value not in ("own", "shared"):
        raise TCError(f"TCPY_OPENMP={value!r}: the OpenMP runtime must be 'own' or 'shared'")
    return value


def verify_schedules() -> bool:
    """`TCPY_VERIFY=1` checks the schedule against the dependences after every pass."""
    return os.environ.get("TCPY_VERIFY") == "1"


# What os.environ stores on POSIX CPython, kept in step by every change made through
# os.environ: the knobs read at each kernel call look there, as os.environ.get costs
# a few microseconds for a name that is not set (it raises and catches a KeyError).
_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _call_knob(name: str, key: bytes) -> str:
    """The value of `name` (`key` is its bytes), read at each call; "" when unset."""
    if _ENVIRON is not None:
        value = _ENVIRON.get(key)
        return os.fsdecode(value) if value is not None else ""
    return os.environ.get(name, "")


def poison_buffers() -> bool:
    """`TCPY_POISON=1` fills the buffers that are not zero-filled (tensors a kernel
    writes whole) with all-ones bytes, so that an element left unwritten shows."""
    return _call_knob("TCPY_POISON", b"TCPY_POISON") == "1"


def launch_blocking() -> bool:
    """`TCPY_LAUNCH_BLOCKING=1` makes every GPU call wait for its kernels and check
    its status word before it returns (as `CUDA_LAUNCH_BLOCKING` does for CUDA's
    own errors); read at each call."""
    return _call_knob("TCPY_LAUNCH_BLOCKING", b"TCPY_LAUNCH_BLOCKING") == "1"


def emu_check() -> bool:
    """`TCPY_EMU_CHECK=1` runs `cuda-emu` kernels instrumented and checked: bounds,
    shared-memory races, divergent barriers."""
    return os.environ.get("TCPY_EMU_CHECK") == "1"


def cxx_compiler() -> str:
    return os.environ.get("TCPY_CXX", "g++")


def cuda_driver() -> str | None:
    return os.environ.get("TCPY_CUDA_DRIVER") or None


def cuda_arch() -> str | None:
    return os.environ.get("TCPY_CUDA_ARCH") or None


def cuda_device() -> str | None:
    return os.environ.get("TCPY_CUDA_DEVICE") or None


def isl_seconds() -> float:
    """The wall-clock limit of one isl analysis (`TCPY_ISL_SECONDS`, default 2 s)."""
    try:
        value = float(os.environ.get("TCPY_ISL_SECONDS", "2"))
    except ValueError:
        return 2.0
    return value if value > 0 else 2.0


def cpu_threads(asked: int = 0) -> int | None:
    """The threads a `cpu` kernel runs on at this call when they are given: `asked`
    (the options' `threads`) when positive, else `TCPY_NUM_THREADS`, else the first
    value of `OMP_NUM_THREADS`; None when none is (the runtime then counts the cores
    that are free, `tcpy.runtime.cpu.threads_now`). A `TCPY_NUM_THREADS` that is not a
    positive integer is an error; an `OMP_NUM_THREADS` that is not one is skipped, as
    OpenMP skips it."""
    if asked > 0:
        return asked
    value = _call_knob("TCPY_NUM_THREADS", b"TCPY_NUM_THREADS").strip()
    if value:
        if not value.isdigit() or int(value) == 0:
            raise TCLaunchError(
                f"TCPY_NUM_THREADS={value!r}: the thread count must be a positive integer"
            )
        return int(value)
    first = _call_knob("OMP_NUM_THREADS", b"OMP_NUM_THREADS").split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    return None


def openmp_binds() -> bool:
    """Whether the environment binds OpenMP's threads to cores itself (`OMP_PROC_BIND`,
    `OMP_PLACES`, `GOMP_CPU_AFFINITY` set); read at each call."""
    return any(_call_knob(name, key) for name, key in _BINDING)


_BINDING = tuple(
    (name, name.encode()) for name in ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
)


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level() -> str | None:
    """The level `TCPY_LOG` names, upper-case for `logging`; None when unset. Raises
    `TCError` for another value (which `tcpy.log.configure` turns into a warning), so
    that a typo does not silently log nothing."""
    value = os.environ.get("TCPY_LOG", "").strip().lower()
    if not value:
        return None
    if value not in _LOG_LEVELS:
        raise TCError(f"TCPY_LOG={value!r}: the level must be one of {', '.join(_LOG_LEVELS)}")
    return value.upper()
