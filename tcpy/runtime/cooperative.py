"""Cooperative launches, through libcuda (both driver layers): the one kernel of a def
(`tcpy.codegen.one_kernel`) waits at grid-wide barriers, so all its blocks must be on
the device at once, which only `cuLaunchCooperativeKernel` promises, and only for as
many blocks as the device holds at once (the kernel's occupancy times the
multiprocessors: `resident_blocks`). The kernel is loaded here as well, so that
pycuda, which gives no handle of its functions, needs nothing of its own. Needs the
context the streams belong to current (the device's primary context, which both
driver layers make current)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

from tcpy.errors import TCLaunchError
from tcpy.mapping.gpu.kernel import Launch
from tcpy.runtime.streams import libcuda_check, libcuda_function


@functools.cache
def _libcuda() -> Any:
    """The libcuda functions a cooperative kernel needs, by what they do."""
    lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
    voidp, uint, intp = ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_int)
    handle = ctypes.POINTER(voidp)
    return {
        "load": libcuda_function(lib, "cuModuleLoadData", handle, voidp),
        "get": libcuda_function(lib, "cuModuleGetFunction", handle, voidp, ctypes.c_char_p),
        "occupancy": libcuda_function(
            lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor", intp, voidp, ctypes.c_int,
            ctypes.c_size_t,
        ),
        "launch": libcuda_function(
            lib, "cuLaunchCooperativeKernel", voidp, uint, uint, uint, uint, uint, uint, uint,
            voidp, voidp,
        ),
    }  # fmt: skip


class CooperativeKernel:
    """A kernel of a cubin, launched cooperatively (see the module's doc)."""

    def __init__(self, cubin: bytes, name: str) -> None:
        lib = _libcuda()
        self._cubin = cubin  # the driver reads the image while it loads
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        libcuda_check(lib["load"](ctypes.byref(module), cubin), "cuModuleLoadData")
        libcuda_check(
            lib["get"](ctypes.byref(function), module, name.encode()), "cuModuleGetFunction"
        )
        self.module, self.function = module, function

    def resident_blocks(self, threads: int, multiprocessors: int) -> int:
        """The blocks of `threads` the device holds at once."""
        per = ctypes.c_int()
        occupancy = _libcuda()["occupancy"]
        libcuda_check(occupancy(ctypes.byref(per), self.function, threads, 0), "cuOccupancy")
        return per.value * multiprocessors

    def launch(self, grid: Any, block: Any, arguments: int, stream: int) -> None:
        """Queue the kernel on `stream`, `arguments` the address of its parameters'
        addresses (`cuda.Arguments.address`)."""
        code = _libcuda()["launch"](self.function, *grid, *block, 0, stream, arguments)
        if code != 0:
            raise TCLaunchError(f"cuLaunchCooperativeKernel failed: CUresult {code}")


def fit(kernel: CooperativeKernel, launch: Launch, multiprocessors: int) -> Launch:
    """`launch` on no more blocks than the device holds at once."""
    (blocks, _, _), block = launch
    held = kernel.resident_blocks(block[0] * block[1] * block[2], multiprocessors)
    if held < 1:
        raise TCLaunchError(
            "the def's one kernel (one_kernel=True) does not fit a multiprocessor: its "
            "blocks need more registers or shared memory than one holds; compile it with "
            "one_kernel=False"
        )
    return (min(blocks, held), 1, 1), block
