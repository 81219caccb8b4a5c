"""CUDA source -> cubin: NVRTC from the cuda-python wheels, nvcc as the fallback.

A cubin for the device's exact compute capability is what gets loaded (a PTX built
by an NVRTC newer than the driver would be rejected; a cubin is not). Without a GPU,
a cubin can still be built for a named architecture such as `sm_90`. Compile errors
become a `TCCompileError` with the compiler's log and the path of the kept source.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tcpy.errors import TCCompileError

OPTIONS = ("-default-device", "--std=c++17", "-lineinfo")


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


@functools.cache
def identity() -> str:
    """The compiler that builds cubins: part of every CUDA cache key."""
    nvrtc = nvrtc_module()
    if nvrtc is not None:
        _err, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc {major}.{minor} {' '.join(OPTIONS)}"
    path = nvcc()
    if path is not None:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        return f"nvcc {done.stdout.strip().splitlines()[-1] if done.stdout else ''}"
    return "none"


def compile_cubin(source: str, arch: str, name: str = "kernel.cu") -> bytes:
    """A cubin of `source` for `arch` (like `sm_90`)."""
    nvrtc = nvrtc_module()
    if nvrtc is not None:
        return _nvrtc(nvrtc, source, arch, name)
    path = nvcc()
    if path is not None:
        return _nvcc(path, source, arch, name)
    raise TCCompileError(
        "no CUDA compiler: install the cuda extra (pip install -e '.[cuda]') for NVRTC, "
        "or put nvcc on the PATH"
    )


def compile_ptx(source: str, arch: str, name: str = "kernel.cu") -> str:
    """The PTX of `source` for a virtual architecture (like `compute_90`), from NVRTC:
    what the register and shared-memory mapping gave, before ptxas."""
    nvrtc = nvrtc_module()
    if nvrtc is None:
        raise TCCompileError("PTX needs NVRTC: install the cuda extra (pip install -e '.[cuda]')")
    prog = _compiled(nvrtc, source, arch, name)
    try:
        _e, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.decode().rstrip("\x00")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compiled(nvrtc: Any, source: str, arch: str, name: str) -> Any:
    """An NVRTC program of `source` compiled for `arch` (the caller destroys it)."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if int(err) != 0:
        raise TCCompileError(f"NVRTC could not create a program: {err}")
    options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in OPTIONS)]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    if int(err) != 0:
        _e, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(prog)
        raise _fail(source, name, log.decode(errors="replace").strip("\x00 \n"), "NVRTC")
    return prog


def _fail(source: str, name: str, log: str, compiler: str) -> TCCompileError:
    kept = Path(tempfile.mkdtemp(prefix="tcpy-failed-")) / name
    kept.write_text(source)
    return TCCompileError(f"{compiler} failed on the generated CUDA (kept at {kept}):\n{log}")


def _nvrtc(nvrtc: Any, source: str, arch: str, name: str) -> bytes:
    prog = _compiled(nvrtc, source, arch, name)
    try:
        _e, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        if int(err) != 0:
            raise TCCompileError(f"NVRTC produced no cubin for {arch}: {err}")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc(path: str, source: str, arch: str, name: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="tcpy-nvcc-") as tmp:
        src = Path(tmp) / name
        src.write_text(source)
        out = Path(tmp) / "kernel.cubin"
        cmd = [path, "-cubin", f"-arch={arch}", "-std=c++17", "-o", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise _fail(source, name, (done.stderr or done.stdout).strip(), "nvcc")
        return out.read_bytes()
