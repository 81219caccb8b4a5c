"""Call-time binding: the checks every target runs on a call's inputs.

`bind` checks the inputs of a call against a `CheckedDef` (count, rank, dtype,
fixed sizes, consistent size symbols), fixes the value of every size symbol, and
evaluates every range, every deferred start of an output and every deferred bounds
proof at those sizes. Failures are
`TCInputError` (about the inputs) or `TCRangeError` (about the program at these sizes),
naming the input, the dimension and the values involved.

No silent casting: an input must have exactly the declared dtype. A Python scalar is
accepted for a 0-d input when its kind fits (bool, int within range, or a number for
a float). Arrays of other libraries are seen without a copy (`tcpy.arrays`); inputs
that are not C-contiguous are copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tcpy.arrays import (
    Kind,
    check_no_grad,
    conversion_hint,
    host_view,
    interface_dtype,
    library_of,
    torch_numpy,
)
from tcpy.errors import InternalError, TCInputError, TCRangeError
from tcpy.parser.checked import (
    CheckedDef,
    CheckedStatement,
    IndexRange,
    StartCheck,
    TensorInfo,
)
from tcpy.parser.ranges import start_message
from tcpy.runtime.streams import cai_stream

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, eq=False, slots=True)
class DeviceInput:
    """An input that lives in GPU memory (PyTorch, CuPy, ...), seen through
    `__cuda_array_interface__`: used where it is, without a copy. `stream` is the one
    its interface (version 3) asks a consumer to order after (`tcpy.runtime.streams`)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    pointer: int
    owner: Any
    stream: int | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)


def device_input(info: TensorInfo, value: Any, what: str = "input") -> DeviceInput:
    face = value.__cuda_array_interface__
    shape = tuple(int(d) for d in face["shape"])
    dtype = interface_dtype(face["typestr"])
    strides = face.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for d in reversed(shape):
            expected.append(step)
            step *= d
        if tuple(strides) != tuple(reversed(expected)) and 0 not in shape:
            raise TCInputError(
                f"{what} {info.name} is a strided view in GPU memory; pass a contiguous "
                "tensor (for example x.contiguous())"
            )
    return DeviceInput(shape, dtype, int(face["data"][0]), value, cai_stream(face))


@dataclass(frozen=True, slots=True)
class Binding:
    """The inputs of one call, checked, with the sizes they fix."""

    arrays: tuple[np.ndarray | DeviceInput, ...]
    sizes: Mapping[str, int]
    # some range or output is empty at these sizes: nothing to compile, the reference
    # interpreter gives the (empty, or identity-filled) outputs
    empty: bool = False

    @property
    def on_device(self) -> bool:
        return any(isinstance(a, DeviceInput) for a in self.arrays)

    @property
    def host_arrays(self) -> tuple[np.ndarray, ...]:
        """The inputs as NumPy arrays (for the targets that run on the host)."""
        out = []
        for a in self.arrays:
            if isinstance(a, DeviceInput):
                raise InternalError("a device input reached a host target")
            out.append(a)
        return tuple(out)

    def shape_of(self, info: TensorInfo) -> tuple[int, ...]:
        """The shape of `info` at these sizes; an extent that would be negative is 0."""
        return tuple(max(d.evaluate(self.sizes), 0) for d in info.shape)

    def ranges(self, st: CheckedStatement) -> dict[str, tuple[int, int]]:
        return {r.var: (r.lo.evaluate(self.sizes), r.hi.evaluate(self.sizes)) for r in st.ranges}


class DeviceCall(NamedTuple):
    """What the steady call on GPU arrays reads of its inputs (`device_signature`):
    the key of everything the checks of `bind` depend on, the arrays' addresses, the
    arrays themselves, the stream each asks the call to order after (None: none), the
    call's stream (the first of those, else the default stream), whether they name
    several, and the first array's library ("torch", "cupy" or "")."""

    key: tuple[Any, ...]
    addresses: tuple[int, ...]
    owners: tuple[Any, ...]
    streams: tuple[int | None, ...]
    stream: int
    many: bool
    library: str


def device_signature(inputs: Sequence[Any]) -> DeviceCall | None:
    """The `DeviceCall` of a call whose inputs are all GPU arrays: PyTorch CUDA
    tensors (read through their attributes) or arrays with `__cuda_array_interface__`;
    None for any other call. Two calls with the same key pass or fail `bind`'s checks
    alike (shapes, dtypes, contiguity, no gradient required)."""
    key: list[Any] = []
    addresses: list[int] = []
    streams: list[int | None] = []
    first: int | None = None  # the call's stream
    many = False
    device: Any = None  # the last PyTorch device seen, and its current stream
    stream: int | None = None
    for a in inputs:
        kind = type(a)
        library = _LIBRARIES.get(kind)
        if library is None:
            module = kind.__module__
            library = _LIBRARIES[kind] = next(
                (name for name in ("torch", "cupy") if module.startswith(name)), ""
            )
        if library == "torch":
            if not getattr(a, "is_cuda", False):
                return None
            if a.device != device:
                device = a.device
                stream = _torch_stream(device)
            key.append((kind, a.shape, a.dtype, device, a.is_contiguous(), a.requires_grad))
            addresses.append(a.data_ptr())
        else:
            face = getattr(a, "__cuda_array_interface__", None)
            if face is None:
                return None
            key.append((kind, face["shape"], face["typestr"], face.get("strides")))
            addresses.append(face["data"][0])
            if library == "cupy":
                import cupy

                stream = int(cupy.cuda.get_current_stream().ptr)
            else:
                stream = face.get("stream")  # `cai_stream`, inlined
                if stream is not None:
                    stream = None if face["version"] < 3 else 0 if stream == 1 else stream
        streams.append(stream)
        if stream is not None:
            if first is None:
                first = stream
            elif stream != first:
                many = True
    return DeviceCall(
        tuple(key), tuple(addresses), tuple(inputs), tuple(streams),
        0 if first is None else first, many, _LIBRARIES[type(inputs[0])] if inputs else "",
    )  # fmt: skip


def host_tensors(inputs: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[np.ndarray, ...]] | None:
    """For a call whose inputs are all contiguous CPU PyTorch tensors that require no
    gradient: the key of what `bind`'s checks depend on (their shapes and dtypes) and
    the tensors as NumPy views (no copy); None for any other call."""
    key = []
    for a in inputs:
        if not type(a).__module__.startswith("torch") or getattr(a, "is_cuda", True):
            return None
        if a.requires_grad or not a.is_contiguous():
            return None
        key.append((a.shape, a.dtype))
    try:
        arrays = tuple(torch_numpy(a) for a in inputs)
    except (RuntimeError, TypeError):  # a lazy view NumPy cannot share (conjugate, ...)
        return None
    return ("torch-cpu", *key), arrays


def _torch_stream(device: Any) -> int:
    """The raw handle of PyTorch's current stream on `device`."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device.index))
    return int(torch.cuda.current_stream(device).cuda_stream)


# the library of each array type met by `device_signature`: "torch", "cupy" or ""
_LIBRARIES: dict[type, str] = {}


def signature_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a compiled kernel depends on: the shape and dtype of every input."""
    return tuple((np.shape(a), getattr(a, "dtype", type(a).__name__)) for a in args)


def generic_signature_key(args: Sequence[Any]) -> tuple[Any, ...]:
    """What a size-generic kernel depends on: the rank and dtype of every input."""
    return tuple((np.ndim(a), getattr(a, "dtype", type(a).__name__)) for a in args)


def bind(cdef: CheckedDef, args: Sequence[Any]) -> Binding:
    if len(args) != len(cdef.inputs):
        names = ", ".join(t.name for t in cdef.inputs) or "none"
        raise TCInputError(
            f"{cdef.name} takes {_count(len(cdef.inputs), 'input')} ({names}), "
            f"but {_count(len(args), 'was', 'were')} given"
        )
    arrays = tuple(_as_array(info, a) for info, a in zip(cdef.inputs, args, strict=True))
    key = (id(cdef), tuple(a.shape for a in arrays))
    known = _CHECKED.get(key)
    if known is not None and known[0] is cdef:
        return Binding(arrays, known[1], empty=known[2])
    sizes = _bind_sizes(cdef, arrays)
    empty = check_ranges(cdef, Binding(arrays, sizes))
    if len(_CHECKED) >= _CHECKED_MOST:
        _CHECKED.clear()
    _CHECKED[key] = (cdef, sizes, empty)
    return Binding(arrays, sizes, empty=empty)


_Shapes = tuple[int, tuple[tuple[int, ...], ...]]  # (a definition's id, its inputs' shapes)
_CHECKED: dict[_Shapes, tuple[CheckedDef, Mapping[str, int], bool]] = {}
"""What the inputs' shapes decide for a definition (its sizes, their checks, whether the
call is empty), by (the definition, the shapes): worked out at the first call with those
shapes only (it took 20-35 us of each call of a def with five inputs). The definition
is kept beside its sizes, so that an id reused by another never matches."""
_CHECKED_MOST = 1024


def _as_array(info: TensorInfo, value: Any) -> np.ndarray | DeviceInput:
    if type(value) is np.ndarray:  # the common case, first
        array = value
    elif isinstance(value, np.generic):  # a NumPy scalar: a 0-d array of its value
        array = np.asarray(value)
    elif (
        info.rank == 0
        and isinstance(value, bool | int | float)
        and not isinstance(value, np.generic)
    ):
        return _python_scalar(info, value)
    else:
        check_no_grad(info.name, value)
        array = host_view(info.name, value, info.scalar.dtype)
        if hasattr(array, "__cuda_array_interface__"):
            device = device_input(info, array)
            _check_kind(info, device.dtype, device.ndim, device.shape, value)
            return device
    _check_kind(info, array.dtype, array.ndim, array.shape, value)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array


def _check_kind(
    info: TensorInfo, dtype: np.dtype, ndim: int, shape: tuple[int, ...], value: Any
) -> None:
    want = info.scalar.dtype
    if dtype != want:
        raise TCInputError(
            f"input {info.name} must be {info.scalar.value}, but the array is "
            f"{dtype}; convert it explicitly, e.g. {conversion_hint(value, want)}"
        )
    if ndim != info.rank:
        raise TCInputError(
            f"input {info.name} must have {info.rank} dimension(s), but has {ndim} (shape {shape})"
        )


def bind_out(cdef: CheckedDef, binding: Binding, out: Any) -> tuple[np.ndarray | DeviceInput, ...]:
    """The destinations `out=` gives for the outputs of a call: one array per output
    (a tuple, or one array for a def with one output), each of the output's exact
    shape and dtype, C-contiguous, writable, and no two overlapping."""
    given = out if isinstance(out, tuple) else (out,)
    outputs = cdef.outputs
    if len(given) != len(outputs):
        names = ", ".join(t.name for t in outputs)
        raise TCInputError(
            f"{cdef.name} has {len(outputs)} output(s) ({names}), but out= gives {len(given)}"
        )
    dests = tuple(
        _destination(info, binding, value) for info, value in zip(outputs, given, strict=True)
    )
    for k, a in enumerate(dests):
        for b in dests[:k]:
            if _overlap(a, b):
                raise TCInputError("two arrays given as out= share memory; give separate ones")
    return dests


def _destination(info: TensorInfo, binding: Binding, value: Any) -> np.ndarray | DeviceInput:
    if type(value) is np.ndarray:  # the common case, checked at once
        flags = value.flags
        if (
            value.shape == binding.shape_of(info)
            and value.dtype == info.scalar.dtype
            and flags.c_contiguous
            and flags.writeable
        ):
            return value
    check_no_grad(info.name, value, "out")
    if not (isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")):
        if not hasattr(value, "__array__") or library_of(value) is Kind.NUMPY:
            raise TCInputError(
                f"out for {info.name} must be a NumPy array, a PyTorch tensor or a CuPy "
                f"array, not {type(value).__name__}"
            )
        value_view = np.asarray(value)
    else:
        value_view = value
    shape = binding.shape_of(info)
    dest: np.ndarray | DeviceInput
    if hasattr(value_view, "__cuda_array_interface__"):
        dest = device_input(info, value_view, "out")
        dtype, ok = dest.dtype, True
    else:
        dest = value_view
        dtype, ok = dest.dtype, dest.flags.c_contiguous and dest.flags.writeable
    if dest.shape != shape or dtype != info.scalar.dtype:
        raise TCInputError(
            f"out for {info.name} must be {info.scalar.value} of shape {shape}, but is "
            f"{dtype} of shape {tuple(dest.shape)}"
        )
    if not ok:
        raise TCInputError(
            f"out for {info.name} must be a writable C-contiguous array; pass a "
            "contiguous one (the result would not land in a strided view)"
        )
    return dest


def _extent(a: np.ndarray | DeviceInput) -> tuple[int, int]:
    if isinstance(a, DeviceInput):
        nbytes = int(np.prod(a.shape, dtype=np.int64)) * a.dtype.itemsize
        return a.pointer, a.pointer + nbytes
    start = a.ctypes.data
    return start, start + a.nbytes


def _overlap(a: np.ndarray | DeviceInput, b: np.ndarray | DeviceInput) -> bool:
    """Whether two buffers may share memory (host and device memory never do)."""
    a_device, b_device = isinstance(a, DeviceInput), isinstance(b, DeviceInput)
    if not a_device and not b_device:  # NumPy compares the bounds of their memory
        return bool(np.may_share_memory(a, b))
    if a_device != b_device:
        return False
    (a0, a1), (b0, b1) = _extent(a), _extent(b)
    return a0 < b1 and b0 < a1 and a0 < a1 and b0 < b1


def overlaps_inputs(binding: Binding, dests: tuple[np.ndarray | DeviceInput, ...]) -> bool:
    """Whether a destination of `out=` shares memory with an input of the call."""
    return any(_overlap(d, a) for d in dests for a in binding.arrays)


def _python_scalar(info: TensorInfo, value: bool | int | float) -> np.ndarray:
    ty = info.scalar
    ok = (
        (ty.is_bool and isinstance(value, bool))
        or (ty.is_integer and isinstance(value, int) and not isinstance(value, bool))
        or (ty.is_float and not isinstance(value, bool))
    )
    if not ok:
        raise TCInputError(
            f"input {info.name} is {ty.value}, and {value!r} ({type(value).__name__}) "
            "does not convert to it without loss"
        )
    if ty.is_integer:
        limits = np.iinfo(ty.dtype)
        if not limits.min <= value <= limits.max:
            raise TCInputError(f"input {info.name} is {ty.value}, and {value} is out of its range")
    return np.asarray(value, dtype=ty.dtype)


def _bind_sizes(cdef: CheckedDef, arrays: tuple[np.ndarray | DeviceInput, ...]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    source: dict[str, str] = {}
    for info, array in zip(cdef.inputs, arrays, strict=True):
        for k, (dim, actual) in enumerate(zip(info.shape, array.shape, strict=True)):
            if dim.is_const:
                if actual != dim.const:
                    raise TCInputError(
                        f"input {info.name} must have size {dim.const} in dimension {k}, "
                        f"but has {actual} (shape {array.shape})"
                    )
                continue
            (name,) = dim.symbols()
            if name in sizes and sizes[name] != actual:
                raise TCInputError(
                    f"input {info.name} has {actual} in dimension {k} (size {name}), but "
                    f"{source[name]} gave {name} = {sizes[name]}"
                )
            if actual > _INT32_MAX:
                raise TCInputError(
                    f"input {info.name} dimension {k} (size {name}) is {actual}, larger "
                    "than int32 indices allow"
                )
            sizes[name] = actual
            source[name] = f"input {info.name} dimension {k}"
    return sizes


def _where(sizes: Mapping[str, int], symbols: frozenset[str]) -> str:
    shown = [f"{s}={sizes[s]}" for s in sorted(symbols) if s in sizes]
    return f" (at {', '.join(shown)})" if shown else ""


def _check_start(cdef: CheckedDef, s: StartCheck, sizes: Mapping[str, int]) -> None:
    """An output is allocated from 0, so a range that defines its shape must start at
    0 at these sizes (TC's gradients with a 1x1 filter do; with a 3x3 one they do not)."""
    lo, hi = s.lo.evaluate(sizes), s.hi.evaluate(sizes)
    if lo == 0:
        return
    shown = ", ".join(f"{n}={sizes[n]}" for n in sorted(s.lo.symbols() | s.hi.symbols()))
    at = f"; at {shown} that is {lo}:{hi}"
    r = IndexRange(s.var, s.lo, s.hi)
    raise TCRangeError(
        start_message(s.tensor, s.dim, r, lo, at, s.fix), s.span, cdef.source, cdef.filename
    )


def empty_at(cdef: CheckedDef, sizes: Mapping[str, int]) -> bool:
    """Whether a call at `sizes` is empty: a range of a statement has nothing in it
    (`lo:hi` with hi <= lo), or an output or temporary an extent of 0 or less."""
    return any(_is_empty(st, sizes) for st in cdef.statements) or any(
        d.evaluate(sizes) <= 0 for info in cdef.outputs + cdef.temporaries for d in info.shape
    )


def _is_empty(st: CheckedStatement, sizes: Mapping[str, int]) -> bool:
    return any(r.hi.evaluate(sizes) <= r.lo.evaluate(sizes) for r in st.ranges)


def check_ranges(cdef: CheckedDef, binding: Binding) -> bool:
    """Every deferred start of an output and every deferred bounds proof true at the
    bound sizes; returns whether the call is empty (`empty_at`). A statement with an
    empty range reads nothing, so its bounds proofs are not checked. A start is checked
    unless its tensor is empty: a `!` reduction over an empty range still sets its
    elements (to the identity), and would leave the first ones unset."""
    sizes = binding.sizes
    for st in cdef.statements:
        for s in st.starts:
            if all(d.evaluate(sizes) > 0 for d in cdef.tensor(s.tensor).shape):
                _check_start(cdef, s, sizes)
        if _is_empty(st, sizes):
            continue
        for c in st.checks:
            lo, hi, extent = (x.evaluate(sizes) for x in (c.lo, c.hi, c.extent))
            if lo < 0 or hi >= extent:
                bad = lo if lo < 0 else hi
                syms = c.lo.symbols() | c.hi.symbols() | c.extent.symbols()
                raise TCRangeError(
                    f"this subscript of {c.tensor} reaches index {bad}, outside 0:{extent} "
                    f"of its dimension {c.dim}{_where(sizes, syms)}",
                    c.span,
                    cdef.source,
                    cdef.filename,
                )
    return empty_at(cdef, sizes)


def _count(n: int, one: str, many: str = "") -> str:
    """`n` with the word for one or for several: "1 input", "2 inputs", "1 was"."""
    if many:
        return f"{n} {one if n == 1 else many}"
    return f"{n} {one}" + ("" if n == 1 else "s")
