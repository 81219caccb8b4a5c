"""The kernel of a call that is empty at its sizes, on every target.

A call is empty when a range of a statement has nothing in it or an output has an
extent of 0 at the call's sizes (an empty last batch, a reduction over zero elements).
Nothing is compiled for it: the reference interpreter computes the outputs, which are
empty, or hold what the statements that do run wrote (a `!` reduction over an empty
range leaves its operator's identity). Inputs in GPU memory are read back first, and
the outputs go where the call's kernel would have put them: into `out=`, onto the
device for device inputs, else new NumPy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tcpy.binding import Binding, DeviceInput
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.reference import interpreter


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
        on_device = binding.on_device or any(isinstance(d, DeviceInput) for d in out or ())
        drv = _driver() if on_device else None
        host = Binding(tuple(_to_host(drv, a) for a in binding.arrays), binding.sizes, True)
        results = interpreter.run(self.cdef, host)
        if out is None:
            if not binding.on_device:
                return results
            return tuple(_new_device_array(drv, r) for r in results)
        for dest, result in zip(out, results, strict=True):
            if isinstance(dest, DeviceInput):
                _copy_to_device(drv, dest.pointer, result)
            else:
                np.copyto(dest, result)
        return out


def _driver() -> Any:
    from tcpy.runtime import cuda

    return cuda.driver()


def _to_host(drv: Any, a: np.ndarray | DeviceInput) -> np.ndarray:
    if not isinstance(a, DeviceInput):
        return a
    host = np.empty(a.shape, a.dtype)
    if host.nbytes:
        drv.to_host(host, a.pointer)
    return host


def _copy_to_device(drv: Any, pointer: int, array: np.ndarray) -> None:
    if array.nbytes:
        drv.to_device(pointer, np.ascontiguousarray(array))


def _new_device_array(drv: Any, array: np.ndarray) -> Any:
    from tcpy.runtime import cuda

    pointer = drv.alloc(max(array.nbytes, 1))  # a 0-byte allocation is an error
    _copy_to_device(drv, pointer, array)
    return cuda.DeviceArray(array.shape, array.dtype, pointer, drv)
