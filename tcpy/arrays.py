"""Arrays in and out of a call: what the caller passes, seen without a copy as NumPy
arrays or GPU buffers, and the outputs handed back in the caller's kind.

Inputs. A NumPy array is used as it is (copied only when it is not C-contiguous). A
PyTorch tensor on the CPU is seen as a NumPy array over the same memory; one on the
GPU, a CuPy array or anything else with `__cuda_array_interface__` is a GPU buffer
(for the `cuda` target). Any other object with `__dlpack__`, and a bare DLPack
capsule, is imported through DLPack: host memory as a NumPy array, GPU memory
through PyTorch or CuPy, whichever is installed. A tensor that requires a gradient is
refused: tcpy kernels have no backward.

Outputs. The first input that is a PyTorch tensor or a CuPy array decides the kind
of the outputs: PyTorch in gives PyTorch out, on the device the outputs are on
(`torch.from_numpy` on the host, `torch.as_tensor` on the GPU: no copy either way);
CuPy gives CuPy. Outputs on the GPU come from that library's caching allocator
(`new_device_outputs`). NumPy arrays, Python scalars and other DLPack producers give NumPy
arrays (or, for GPU inputs of another kind, `DeviceArray`s, which every GPU library
takes without a copy).
"""

from __future__ import annotations

import ctypes
import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tcpy.errors import TCInputError


class Kind(enum.Enum):
    """The array library of a call's inputs, which its outputs are returned in."""

    NUMPY = "numpy"
    TORCH = "torch"
    CUPY = "cupy"


def library_of(value: Any) -> Kind:
    module = type(value).__module__
    if module.startswith("torch"):
        return Kind.TORCH
    if module.startswith("cupy"):
        return Kind.CUPY
    return Kind.NUMPY


def kind_of(values: tuple[Any, ...]) -> Kind:
    """The kind of the first input that is not a NumPy array (NUMPY when none is)."""
    for value in values:
        if type(value) is not np.ndarray:
            kind = library_of(value)
            if kind is not Kind.NUMPY:
                return kind
    return Kind.NUMPY


def conversion_hint(value: Any, dtype: np.dtype) -> str:
    """How to convert `value` to `dtype` in its own library."""
    match library_of(value):
        case Kind.TORCH:
            return f"x.to(torch.{dtype.name})"
        case Kind.CUPY:
            return f"x.astype(cupy.{dtype.name})"
        case _ if dtype.name == "bfloat16":
            return "x.astype(ml_dtypes.bfloat16)"
        case _:
            return f"x.astype(np.{dtype.name})"


def check_no_grad(name: str, value: Any, what: str = "input") -> None:
    if getattr(value, "requires_grad", False) is True:
        raise TCInputError(
            f"{what} {name} requires a gradient, and an engine's kernels have no backward: "
            "for PyTorch operators with gradients, define the source with "
            f"tcpy.torch.define(source) and call its ops; else pass {name}.detach() (or "
            "run the call under torch.no_grad())"
        )


def host_view(name: str, value: Any, dtype: np.dtype) -> Any:
    """`value` as a NumPy array over its memory, or an object with
    `__cuda_array_interface__` for GPU memory; raises TCInputError for anything else."""
    if hasattr(value, "__cuda_array_interface__"):
        return value
    if library_of(value) is Kind.TORCH and getattr(value.device, "type", None) == "cpu":
        return torch_numpy(value.detach())
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "__array__"):
        return np.asarray(value)
    if type(value).__name__ == "PyCapsule":
        value = _Capsule(value)
    if hasattr(value, "__dlpack__"):
        return _from_dlpack(name, value)
    raise TCInputError(
        f"input {name} must be an array of {dtype} (NumPy, PyTorch, CuPy or any DLPack "
        f"producer), not {type(value).__name__}"
    )


def torch_numpy(tensor: Any) -> np.ndarray:
    """A CPU PyTorch tensor as a NumPy array over its memory; a bfloat16 tensor, which
    NumPy has no dtype for, as an `ml_dtypes.bfloat16` array."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_bfloat16())
    return tensor.numpy()


def from_numpy_torch(array: np.ndarray) -> Any:
    """A NumPy array as a CPU PyTorch tensor over its memory (bfloat16 included)."""
    import torch

    if array.dtype == _bfloat16():
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def interface_dtype(typestr: str) -> np.dtype:
    """The dtype of a `__cuda_array_interface__`'s type string: 2-byte opaque elements
    (`<V2`) are bfloat16, as PyTorch and ml_dtypes write it."""
    dtype = np.dtype(typestr)
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None:
        return _bfloat16()
    return dtype


def _bfloat16() -> np.dtype:
    from tcpy.types import ScalarType

    return ScalarType.BFLOAT16.dtype


# DLPack device types (dlpack.h): the host, CUDA memory, CUDA host-pinned, managed.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13


def _from_dlpack(name: str, value: Any) -> Any:
    device_type = int(value.__dlpack_device__()[0])
    if device_type in (_DL_CPU, _DL_CUDA_HOST):
        try:
            return np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError) as e:
            raise TCInputError(f"input {name} could not be imported through DLPack: {e}") from None
    if device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        for library in ("torch", "cupy"):
            try:
                module = __import__(library)
            except ImportError:
                continue
            return module.from_dlpack(value)
        raise TCInputError(
            f"input {name} is GPU memory given through DLPack; install PyTorch or CuPy "
            "to import it, or pass a tensor with __cuda_array_interface__"
        )
    raise TCInputError(
        f"input {name} is on DLPack device type {device_type}, not the host or a GPU"
    )


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    """The start of DLPack's `DLTensor`, which an unversioned capsule points at."""

    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _Capsule:
    """A bare DLPack capsule (`torch.utils.dlpack.to_dlpack`, older libraries) made a
    DLPack producer, so that `np.from_dlpack` and the GPU libraries import it."""

    def __init__(self, capsule: Any) -> None:
        try:
            head = _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor"))
        except ValueError:  # not a DLPack capsule, or one already used
            raise TCInputError(
                "a capsule given as an input is not an unused DLPack tensor"
            ) from None
        self._capsule = capsule
        self._device = (head.device.device_type, head.device.device_id)

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def new_device_outputs(
    kind: Kind, inputs: tuple[Any, ...], specs: Sequence[tuple[Any, ...]]
) -> tuple[Any, ...] | None:
    """Empty outputs of `specs` ((shape, dtype, ...): what follows is ignored) for a
    call on the GPU whose inputs are of library `kind`, from that library's caching
    allocator, on the device of its first GPU input: a call then asks the driver for
    no memory, and the library reuses the memory in the order of its current stream,
    the stream the call's work is queued on.
    None where the library has no GPU input among `inputs` (the runtime then allocates
    `DeviceArray`s)."""
    if kind is Kind.TORCH:
        import torch

        for value in inputs:
            if isinstance(value, torch.Tensor) and value.is_cuda:
                # `new_empty`: the device taken from the tensor, not parsed (faster)
                return tuple(
                    value.new_empty(spec[0], dtype=_torch_dtype(spec[1])) for spec in specs
                )
    elif kind is Kind.CUPY:
        import cupy

        for value in inputs:
            if isinstance(value, cupy.ndarray):
                with value.device:
                    return tuple(cupy.empty(spec[0], spec[1]) for spec in specs)
    return None


def device_scratch(owners: Sequence[Any]) -> Callable[[int], tuple[Any, int]] | None:
    """Temporary device memory from the caching allocator of the library of the first
    PyTorch or CuPy GPU array among `owners`: a function of the bytes wanted returning
    the array (to keep alive until the call's launches are queued) and its address.
    The library reuses it in the order of its current stream, where the call's work
    goes, and under CUDA graph capture PyTorch serves it from the graph's pool. None
    when no owner is of such a library."""
    for owner in owners:
        kind = library_of(owner)
        if kind is Kind.TORCH and owner.is_cuda:
            return functools.partial(_torch_bytes, owner.device)
        if kind is Kind.CUPY:
            return functools.partial(_cupy_bytes, owner.device)
    return None


def _torch_bytes(device: Any, nbytes: int) -> tuple[Any, int]:
    import torch

    block = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
    return block, int(block.data_ptr())


def _cupy_bytes(device: Any, nbytes: int) -> tuple[Any, int]:
    import cupy

    with device:
        block = cupy.empty(max(nbytes, 1), cupy.uint8)
    return block, int(block.data.ptr)


@functools.cache
def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    if dtype == _bfloat16():
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def wrap(outputs: tuple[Any, ...], kind: Kind) -> tuple[Any, ...]:
    """The outputs in the library of the inputs (`kind`), without copies."""
    if kind is Kind.NUMPY:
        return outputs
    if kind is Kind.TORCH:
        import torch

        return tuple(
            from_numpy_torch(o) if isinstance(o, np.ndarray) else torch.as_tensor(o, device="cuda")
            for o in outputs
        )
    import cupy

    return tuple(o if isinstance(o, np.ndarray) else cupy.asarray(o) for o in outputs)
