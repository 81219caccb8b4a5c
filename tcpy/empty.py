"""The kernel of a call that is empty at its sizes, on every target.

A call is empty when a range of a statement has nothing in it or an output has an
extent of 0 at the call's sizes (an empty last batch, a reduction over zero elements).
Nothing is compiled for it: the reference interpreter computes the outputs, which are
empty, or hold what the statements that do run wrote (a `!` reduction over an empty
range leaves its operator's identity). Inputs in GPU memory are read back first, and
the outputs go where the call's kernel would have put them: into `out=`, onto the
device for device inputs, else new NumPy arrays. Copies to and from the device are
queued on the caller's stream, as a kernel's would be (`tcpy.runtime.streams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tcpy.binding import Binding, DeviceInput
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.reference import interpreter
from tcpy.runtime import streams


@dataclass(frozen=True)
class EmptyCall:
    """A `Kernel` for empty calls: the reference interpreter, on any target."""

    cdef: CheckedDef
    options: MappingOptions
    source: str = "/* empty at these sizes: computed by the reference interpreter */"
    generic: bool = False
    cache_key: str = ""
    accepts_device_out: ClassVar[bool] = True

    def __call__(self, binding: Binding, out: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        if not binding.on_device and not any(isinstance(d, DeviceInput) for d in out or ()):
            return self._run(binding, out, None, streams.DEFAULT)
        drv = _driver()
        ordered = streams.call_streams((*binding.arrays, *(out or ())))
        streams.enter(drv, ordered)  # the copies, like a kernel, on the caller's stream
        try:
            return self._run(binding, out, drv, ordered[0])
        finally:
            streams.leave(drv, ordered)

    def _run(
        self, binding: Binding, out: tuple[Any, ...] | None, drv: Any, stream: int
    ) -> tuple[Any, ...]:
        arrays = tuple(_to_host(drv, a, stream) for a in binding.arrays)
        results = interpreter.run(self.cdef, Binding(arrays, binding.sizes, True))
        if out is None:
            if not binding.on_device:
                return results
            return tuple(_new_device_array(drv, r, stream) for r in results)
        for dest, result in zip(out, results, strict=True):
            if isinstance(dest, DeviceInput):
                _copy_to_device(drv, dest.pointer, result, stream)
            else:
                np.copyto(dest, result)
        return out


def _driver() -> Any:
    from tcpy.runtime import cuda

    return cuda.driver()


def _to_host(drv: Any, a: np.ndarray | DeviceInput, stream: int) -> np.ndarray:
    if not isinstance(a, DeviceInput):
        return a
    host = np.empty(a.shape, a.dtype)
    if host.nbytes:
        drv.to_host(host, a.pointer, stream)
    return host


def _copy_to_device(drv: Any, pointer: int, array: np.ndarray, stream: int) -> None:
    # queued on the stream: the bytes are staged before the copy returns
    if array.nbytes:
        drv.to_device(pointer, np.ascontiguousarray(array), stream)


def _new_device_array(drv: Any, array: np.ndarray, stream: int) -> Any:
    from tcpy.runtime import cuda

    pointer = drv.alloc(max(array.nbytes, 1))  # a 0-byte allocation is an error
    _copy_to_device(drv, pointer, array, stream)
    return cuda.DeviceArray(array.shape, array.dtype, pointer, drv, stream)
