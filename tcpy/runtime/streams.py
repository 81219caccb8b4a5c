"""The CUDA stream a call runs on, and its order against the caller's other streams.

A call's copies, memsets and kernels go, back to back, to the caller's current stream,
so that they run after the work that produced its inputs and before the work the
caller queues next to read its outputs, without waiting for the whole device.

Which stream (`call_streams`), from each GPU array among the inputs and the `out=`
destinations, in order:

- a PyTorch tensor: `torch.cuda.current_stream(tensor.device)`;
- a CuPy array: `cupy.cuda.get_current_stream()`;
- anything else with `__cuda_array_interface__`: the `stream` its version 3 carries (1,
  the legacy default stream, is the default stream 0; 2 is the calling thread's
  per-thread default stream; absent or None: the producer needs no ordering);
- NumPy arrays and host memory have none; a call with no stream runs on the default
  stream, 0.

Mixed libraries. Arrays on different streams (a PyTorch tensor and a CuPy array, say)
make a call run on the stream of the first of them, in the order of the inputs and
then of `out=`; `enter` makes that stream wait for the work already queued on the
others, and `leave` makes the others wait for the call's work, so that no stream's
later work overwrites an input the call still reads, or reads an output early. The
outputs are ready in the order of every one of those streams.

A stream must outlive what tcpy still does on it: `engine.synchronize()`
(`words.settle`) synchronises the streams of the calls in flight by their handles, and
`DeviceArray.get()` copies on its own. PyTorch never destroys its streams;
keep a CuPy or Numba stream object alive until then.

A driver queues a call's work on `work_stream(stream)`: the stream itself for
cuda.bindings; pycuda cannot launch on a stream it did not create, so it queues on one
stream of its own, ordered against the caller's by `enter` and `leave` with events
(`LibcudaEvents`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Protocol

from tcpy.arrays import Kind, library_of
from tcpy.errors import TCLaunchError

DEFAULT = 0
"""The default stream (the legacy one, which `__cuda_array_interface__` calls 1)."""
PER_THREAD = 2
"""The calling thread's per-thread default stream: the same handle names a different
stream in every thread (CUDA's `CU_STREAM_PER_THREAD`)."""
_CAI_LEGACY = 1


class Ordering(Protocol):
    def work_stream(self, stream: int) -> int: ...
    def order(self, after: int, before: int) -> None: ...


def cai_stream(face: dict[str, Any]) -> int | None:
    """The stream a `__cuda_array_interface__` asks its consumer to order after: its
    `stream` from version 3 on, the legacy default stream (1) made 0; None when there
    is none."""
    stream = face.get("stream") if int(face.get("version", 0)) >= 3 else None
    if stream is None:
        return None
    stream = int(stream)
    return DEFAULT if stream == _CAI_LEGACY else stream


def stream_of(owner: Any, interface_stream: int | None) -> int | None:
    """The current stream of the library that owns the GPU array `owner`, or the stream
    its `__cuda_array_interface__` carried (`interface_stream`)."""
    match library_of(owner):
        case Kind.TORCH:
            import torch

            return int(torch.cuda.current_stream(owner.device).cuda_stream)
        case Kind.CUPY:
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        case _:
            return interface_stream


def call_streams(arrays: Iterable[Any]) -> tuple[int, ...]:
    """The distinct streams of the GPU arrays among `arrays` (`tcpy.binding.DeviceInput`s,
    known by their `owner`; NumPy arrays and None are skipped), the call's own first;
    `(DEFAULT,)` when there is none."""
    found: list[int] = []
    for a in arrays:
        owner = getattr(a, "owner", None)
        if owner is None:
            continue
        stream = stream_of(owner, getattr(a, "stream", None))
        if stream is not None and stream not in found:
            found.append(stream)
    return tuple(found) or (DEFAULT,)


def enter(drv: Ordering, streams: Sequence[int]) -> None:
    """Before a call's first operation: what the driver queues for `streams[0]` runs
    after the work queued so far on every one of `streams`."""
    work = drv.work_stream(streams[0])
    for stream in streams:
        if stream != work:
            drv.order(work, stream)


def leave(drv: Ordering, streams: Sequence[int]) -> None:
    """After a call's last operation: the work queued from now on on every one of
    `streams` runs after the call's."""
    work = drv.work_stream(streams[0])
    for stream in streams:
        if stream != work:
            drv.order(stream, work)


def stream_key(stream: int) -> Hashable:
    """What names `stream` across threads: the handle, with the thread for the
    per-thread default stream."""
    return (PER_THREAD, threading.get_ident()) if stream == PER_THREAD else stream


_CU_EVENT_DISABLE_TIMING = 2
_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1


class LibcudaEvents:
    """`order(after, before)` through libcuda: an event recorded on `before` that
    `after` waits for (on the GPU; the host does not wait). One event serves every
    ordering: a stream waits for the event's state when the wait is queued, so the
    event may be recorded again at once; the lock keeps a record and its wait
    together. Needs the context the streams belong to current (the device's primary
    context, which PyTorch, CuPy and both driver layers share)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        voidp, uint = ctypes.c_void_p, ctypes.c_uint
        self._record = libcuda_function(lib, "cuEventRecord", voidp, voidp)
        self._wait = libcuda_function(lib, "cuStreamWaitEvent", voidp, voidp, uint)
        create = libcuda_function(lib, "cuEventCreate", ctypes.POINTER(voidp), uint)
        self._is_capturing = libcuda_function(
            lib, "cuStreamIsCapturing", voidp, ctypes.POINTER(uint)
        )
        self._event = voidp()
        libcuda_check(create(ctypes.byref(self._event), _CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self._lock = threading.Lock()

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph."""
        status = ctypes.c_uint()
        libcuda_check(self._is_capturing(stream, ctypes.byref(status)), "cuStreamIsCapturing")
        return status.value == _CU_STREAM_CAPTURE_STATUS_ACTIVE

    def order(self, after: int, before: int) -> None:
        with self._lock:
            libcuda_check(self._record(self._event, before), "cuEventRecord")
            libcuda_check(self._wait(after, self._event, 0), "cuStreamWaitEvent")


def libcuda_function(lib: ctypes.CDLL, name: str, *argtypes: Any) -> Any:
    """libcuda's function `name`, taking `argtypes` and returning its `CUresult`."""
    function = getattr(lib, name)
    function.argtypes = list(argtypes)
    function.restype = ctypes.c_int
    return function


def libcuda_check(code: int, what: str) -> None:
    """Raises `TCLaunchError` where libcuda's call `what` returned a failure."""
    if code != 0:
        raise TCLaunchError(f"{what} failed: CUresult {code}")
