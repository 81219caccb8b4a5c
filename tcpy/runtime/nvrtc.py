"""CUDA source -> cubin: NVRTC from the cuda-python wheels, nvcc as the fallback.

A cubin for the device's exact compute capability is what gets loaded (a PTX built
by an NVRTC newer than the driver would be rejected; a cubin is not). Without a GPU,
a cubin can still be built for a named architecture such as `sm_90`. Compile errors
become a `TCCompileError` with the compiler's log and the path of the kept source.

NVRTC before 13.4 (12.9 and 13.0-13.3 seen) miscompiles some of tcpy's kernels: its
ptxas folds a maximum of negated and complemented sizes into one three-way max and drops
a negation, so a loop stores its rows at a wrong stride, over other tensors (three
fuzzed pairs on an H100 with NVRTC 13.0; the SASS of 13.4 and 13.5 has the negation,
that of 12.9-13.3 does not). With such an NVRTC the cubins are built without ptxas's
optimisations (`UNOPTIMISED`), which gave the right results there, and a `TCWarning`
says so once.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from tcpy.errors import TCCompileError, TCWarning

OPTIONS = ("-default-device", "--std=c++17", "-lineinfo")
EXACT = ("--fmad=false",)
"""Added for a kernel that must round each operation on its own (`exact`): no fused
multiply-add contracted from `a * b + c`, as the C target's `EXACT_ARITHMETIC`."""
SOUND_FROM = (13, 4)
"""The first NVRTC whose ptxas builds tcpy's kernels right (see the module's doc)."""
UNOPTIMISED = ("-Xptxas=-O0",)
"""Added with an NVRTC older than `SOUND_FROM`."""


@functools.cache
def nvrtc_module() -> Any:
    """cuda.bindings' NVRTC module, or None when it (or libnvrtc) is missing."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        return None
    try:
        err, _major, _minor = nvrtc.nvrtcVersion()
    except Exception:  # a missing libnvrtc surfaces as a loader error of the binding
        return None
    return nvrtc if int(err) == 0 else None


def nvcc() -> str | None:
    return shutil.which("nvcc")


def available() -> bool:
    return nvrtc_module() is not None or nvcc() is not None


def flags(version: tuple[int, int], exact: bool) -> tuple[str, ...]:
    """NVRTC's options for a kernel, past the architecture, with NVRTC `version`."""
    sound = () if version >= SOUND_FROM else UNOPTIMISED
    return (*OPTIONS, *(EXACT if exact else ()), *sound)


def version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC `nvrtc_module` loads."""
    nvrtc = nvrtc_module()
    _err, major, minor = nvrtc.nvrtcVersion()
    return int(major), int(minor)


@functools.cache
def identity() -> str:
    """The compiler that builds cubins: part of every CUDA cache key."""
    nvrtc = nvrtc_module()
    if nvrtc is not None:
        major, minor = version()
        plain, exact = flags((major, minor), False), flags((major, minor), True)
        return f"nvrtc {major}.{minor} {' '.join(plain)} (exact: {' '.join(exact)})"
    path = nvcc()
    if path is not None:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        return f"nvcc {done.stdout.strip().splitlines()[-1] if done.stdout else ''}"
    return "none"


def compile_cubin(source: str, arch: str, name: str = "kernel.cu", exact: bool = False) -> bytes:
    """A cubin of `source` for `arch` (like `sm_90`); `exact`: no contraction of
    `a * b + c` into a fused multiply-add (`EXACT`)."""
    nvrtc = nvrtc_module()
    if nvrtc is not None:
        return _nvrtc(nvrtc, source, arch, name, exact)
    path = nvcc()
    if path is not None:
        return _nvcc(path, source, arch, name, exact)
    raise TCCompileError(
        "no CUDA compiler: install the cuda extra (pip install -e '.[cuda]') for NVRTC, "
        "or put nvcc on the PATH"
    )


def compile_ptx(source: str, arch: str, name: str = "kernel.cu", exact: bool = False) -> str:
    """The PTX of `source` for a virtual architecture (like `compute_90`), from NVRTC:
    what the register and shared-memory mapping gave, before ptxas."""
    nvrtc = nvrtc_module()
    if nvrtc is None:
        raise TCCompileError("PTX needs NVRTC: install the cuda extra (pip install -e '.[cuda]')")
    prog = _compiled(nvrtc, source, arch, name, exact)
    try:
        _e, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def ptxas_report(source: str, arch: str, exact: bool = False) -> str:
    """What ptxas says of each kernel of `source` built for `arch` (like `sm_90`), from
    NVRTC's log with `--ptxas-options=-v`: registers, spills, shared memory."""
    nvrtc = nvrtc_module()
    if nvrtc is None:
        raise TCCompileError("ptxas's report needs NVRTC: install the cuda extra")
    prog = _compiled(nvrtc, source, arch, "kernel.cu", exact, ("--ptxas-options=-v",))
    try:
        _e, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        return log.decode(errors="replace").strip("\x00 \n")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compiled(
    nvrtc: Any, source: str, arch: str, name: str, exact: bool = False, extra: tuple[str, ...] = ()
) -> Any:
    """An NVRTC program of `source` compiled for `arch` (the caller destroys it)."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if int(err) != 0:
        raise TCCompileError(f"NVRTC could not create a program: {err}")
    at = version()
    if at < SOUND_FROM:
        _warn_unsound()
    chosen = flags(at, exact)
    options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in (*chosen, *extra))]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    if int(err) != 0:
        _e, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(prog)
        raise _fail(source, name, log.decode(errors="replace").strip("\x00 \n"), "NVRTC")
    return prog


@functools.cache
def _warn_unsound() -> None:
    major, minor = version()
    warnings.warn(
        TCWarning(
            f"NVRTC {major}.{minor} miscompiles some kernels (NVRTC before "
            f"{SOUND_FROM[0]}.{SOUND_FROM[1]}: a negation dropped by ptxas), so tcpy builds "
            "its CUDA kernels without ptxas's optimisations, and they run slower; "
            "pip install -U nvidia-cuda-nvrtc gives an NVRTC that needs no such care"
        ),
        stacklevel=3,
    )


def _fail(source: str, name: str, log: str, compiler: str) -> TCCompileError:
    kept = Path(tempfile.mkdtemp(prefix="tcpy-failed-")) / name
    kept.write_text(source)
    return TCCompileError(f"{compiler} failed on the generated CUDA (kept at {kept}):\n{log}")


def _nvrtc(nvrtc: Any, source: str, arch: str, name: str, exact: bool) -> bytes:
    prog = _compiled(nvrtc, source, arch, name, exact)
    try:
        _e, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if int(err) != 0:
            raise TCCompileError(f"NVRTC produced no cubin for {arch}: {err}")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc(path: str, source: str, arch: str, name: str, exact: bool) -> bytes:
    with tempfile.TemporaryDirectory(prefix="tcpy-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        cmd = [path, "-cubin", f"-arch={arch}", "-std=c++17", *(EXACT if exact else ())]
        cmd += ["-o", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise _fail(source, name, (done.stderr or done.stdout).strip(), "nvcc")
        return out.read_bytes()
