"""The CUDA runtime: a small driver layer with two implementations, chosen at run time.

`driver()` returns the implementation on `cuda.bindings.driver`, else (or when
`TCPY_CUDA_DRIVER=pycuda` asks) the pycuda one: cuda.bindings launches on the caller's
stream, so a steady call asks the driver for its launches only, where pycuda orders its
own stream against the caller's with events at every call. The rest of tcpy only sees
the `Driver` interface: the device's name and compute capability, loading a cubin,
device memory, copies, memsets, events, and launching a kernel with its grid, block
and arguments. Every call is checked.

Streams. Every copy, memset and launch, and the synchronisation, takes the stream of
the call it belongs to (`tcpy.runtime.streams.call_streams`: the caller's current
PyTorch or CuPy stream, the one a `__cuda_array_interface__` names, else the default
stream 0). Copies to the device and launches are queued without waiting; a copy to
the host waits for its stream, since the caller reads the array next. A call
synchronises its stream once, after its last kernel (`synchronize(stream)`,
`cuStreamSynchronize`, not the whole context), where a failure of any of them is raised
as a `TCLaunchError`.

cuda.bindings queues everything on the caller's stream itself. pycuda cannot launch on
a stream it did not create: it queues a call's work on a stream of its own, made to
wait for the caller's stream at the start of the call and the caller's stream made to
wait for it at the end (`streams.enter`, `streams.leave`), with events through libcuda
(`streams.LibcudaEvents`). That costs two event records and two stream waits per call
(a few microseconds, no host wait), and serialises the calls of every caller stream
on pycuda's one stream.

Threads. The driver's context is current in the thread that made the driver;
`driver()` makes it current in any other thread that asks for it (PyTorch's autograd
runs a CUDA backward on a thread of its own), once per thread.

Device memory a call borrows comes from `pool(drv)` (`tcpy.runtime.pool`), which hands a
block still in use by queued work only to work on the same stream.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tcpy import knobs
from tcpy.errors import TCLaunchError
from tcpy.mapping.gpu.device import DeviceProfile
from tcpy.runtime.pool import POOL_IDLE_BYTES, DevicePool, pool
from tcpy.runtime.streams import DEFAULT, LibcudaEvents
from tcpy.runtime.words import words

__all__ = ["POOL_IDLE_BYTES", "DeviceArray", "DevicePool", "Driver", "driver", "pool"]


class Driver(Protocol):
    """A driver layer. `stream` is a CUDA stream handle (0: the default stream); the
    operations of a call for `stream` are queued on `work_stream(stream)`, in order."""

    name: str

    def device_name(self) -> str: ...
    def arch(self) -> str: ...
    def attribute(self, name: str) -> int: ...
    def bind_thread(self) -> None:
        """Make the driver's context current in the calling thread."""
        ...

    def load(self, cubin: bytes, functions: Sequence[str]) -> list[Any]: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def to_device(self, pointer: int, array: np.ndarray, stream: int) -> None: ...
    def memset(self, pointer: int, value: int, nbytes: int, stream: int) -> None: ...
    def to_host(self, array: np.ndarray, pointer: int, stream: int) -> None:
        """Copy, and wait for the stream: the array holds the data on return."""
        ...

    def arguments(self, kinds: Sequence[str]) -> Arguments:
        """A kernel's argument buffer for arguments of `kinds` ("i64", "ptr"), built
        once and patched at each call (`Arguments.set`)."""
        ...

    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
        args: Arguments, stream: int,
    ) -> None: ...  # fmt: skip
    def mapped_words(self, count: int) -> tuple[np.ndarray, int]:
        """`count` int32 words of page-locked host memory mapped into the device's
        address space (the device writes through to it): the host's view, and the
        device address."""
        ...

    def event(self) -> Any:
        """A new event (without timing), for `record` and `done`."""
        ...

    def record(self, event: Any, stream: int) -> None:
        """Record `event` after the work queued for `stream` so far."""
        ...

    def done(self, event: Any) -> bool:
        """Whether the work before `event`'s record has finished: a query, never a
        wait; a failure of that work raises a TCLaunchError."""
        ...

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph."""
        ...

    def synchronize(self, stream: int) -> None:
        """Wait for the work queued for `stream`; a failure of any of it raises."""
        ...

    def work_stream(self, stream: int) -> int:
        """The stream the operations for `stream` are queued on."""
        ...

    def order(self, after: int, before: int) -> None:
        """Make the work queued on `after` from now on run after the work queued on
        `before` so far (on the GPU: the host does not wait)."""
        ...


class Arguments:
    """A kernel's arguments as `cuLaunchKernel` takes them: one array of 64-bit slots
    (an integer or a pointer each) and the array of the slots' addresses, built once
    (a launch plan's) and patched at each call (`set`, or `patch` for a run of them)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        self.kinds = tuple(kinds)
        self.slots = (ctypes.c_uint64 * len(kinds))()
        base = ctypes.addressof(self.slots)
        self.addresses = (ctypes.c_void_p * len(kinds))(*range(base, base + 8 * len(kinds), 8))
        self.address = ctypes.addressof(self.addresses)

    def set(self, index: int, value: int) -> None:
        self.slots[index] = value & 0xFFFFFFFFFFFFFFFF  # an i64 as its two's complement

    def patch(self, first: int, values: list[int]) -> None:
        """Slots `first`, `first + 1`, ... take `values` (addresses)."""
        self.slots[first : first + len(values)] = values  # type: ignore[assignment]

    @property
    def values(self) -> list[int]:
        return [v - (1 << 64) if v >> 63 else v for v in self.slots]


# The driver's device attributes (`CU_DEVICE_ATTRIBUTE_<name>`) each profile field reads.
_PROFILE_ATTRIBUTES = {
    "sms": "MULTIPROCESSOR_COUNT",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "max_blocks_per_sm": "MAX_BLOCKS_PER_MULTIPROCESSOR",
    "shared_per_block": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "shared_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "registers_per_block": "MAX_REGISTERS_PER_BLOCK",
    "registers_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "l2_bytes": "L2_CACHE_SIZE",
}


def device_profile(drv: Driver) -> DeviceProfile:
    """The profile of the driver's device, from its attributes."""
    facts = {field: drv.attribute(name) for field, name in _PROFILE_ATTRIBUTES.items()}
    return DeviceProfile(name=drv.device_name(), arch=drv.arch(), **facts)


def has_gpu() -> bool:
    try:
        driver()
    except TCLaunchError:
        return False
    return True


_thread = threading.local()


def driver() -> Driver:
    """The driver `TCPY_CUDA_DRIVER` names, else cuda.bindings', else pycuda's if
    cuda.bindings cannot reach a GPU; a TCLaunchError when none can. Its context is
    current in the calling thread."""
    drv = _driver(knobs.cuda_driver())
    if getattr(_thread, "bound", None) is not drv:
        drv.bind_thread()
        _thread.bound = drv
    return drv


@functools.cache
def _driver(choice: str | None) -> Driver:
    errors = []
    makers: tuple[type[_PyCuda] | type[_Bindings], ...] = (_Bindings, _PyCuda)
    if choice == "pycuda":
        makers = (_PyCuda,)
    elif choice == "bindings":
        makers = (_Bindings,)
    for make in makers:
        try:
            return make()
        except ImportError as e:
            errors.append(f"{make.name}: not installed ({e.name})")
        except Exception as e:  # any failure to initialise means no usable GPU here
            errors.append(f"{make.name}: {e}")
    raise TCLaunchError("no CUDA GPU could be used: " + "; ".join(errors))


def _pop_quietly(context: Any) -> None:
    # raises where it is not this thread's current context: nothing to pop here
    with contextlib.suppress(Exception):
        context.pop()


class _PyCuda:
    name = "pycuda"

    def __init__(self) -> None:
        import pycuda.driver as cuda

        cuda.init()
        self.cuda = cuda
        self.device = cuda.Device(0)
        self.context = self.device.retain_primary_context()
        self.context.push()
        # popped before pycuda's own cleanup, which reports a context left on the stack
        atexit.register(_pop_quietly, self.context)
        self.stream = cuda.Stream()  # where all of tcpy's work goes (see the module's doc)
        self.events = LibcudaEvents()

    def device_name(self) -> str:
        return str(self.device.name())

    def bind_thread(self) -> None:
        current = self.cuda.Context.get_current()
        if current is None or current.handle != self.context.handle:
            self.context.push()  # left on this thread's stack, as in the first thread

    def arch(self) -> str:
        major, minor = self.device.compute_capability()
        return f"sm_{major}{minor}"

    def attribute(self, name: str) -> int:
        return int(self.device.get_attribute(getattr(self.cuda.device_attribute, name)))

    def load(self, cubin: bytes, functions: Sequence[str]) -> list[Any]:
        module = self.cuda.module_from_buffer(cubin)
        self._modules = [*getattr(self, "_modules", []), module]  # keep them loaded
        return [module.get_function(f) for f in functions]

    def alloc(self, nbytes: int) -> int:
        allocation = self.cuda.mem_alloc(max(nbytes, 1))
        self._allocations = getattr(self, "_allocations", {})
        self._allocations[int(allocation)] = allocation  # freed when dropped
        return int(allocation)

    def free(self, pointer: int) -> None:
        allocation = self._allocations.pop(pointer, None)
        if allocation is not None:
            allocation.free()

    # The caller's `stream` is not used by the operations: they go to `self.stream`,
    # which `streams.enter` and `streams.leave` order against it.

    def to_device(self, pointer: int, array: np.ndarray, stream: int) -> None:
        self.cuda.memcpy_htod_async(pointer, array, self.stream)  # pageable: staged at once

    def memset(self, pointer: int, value: int, nbytes: int, stream: int) -> None:
        self.cuda.memset_d8_async(pointer, value, nbytes, self.stream)

    def to_host(self, array: np.ndarray, pointer: int, stream: int) -> None:
        self.cuda.memcpy_dtoh_async(array, pointer, self.stream)
        self.synchronize(stream)

    def arguments(self, kinds: Sequence[str]) -> Arguments:
        return Arguments(kinds)

    def launch(self, function: Any, grid: Any, block: Any, args: Arguments, stream: int) -> None:
        # a prepared call packs the arguments by a format set once per function
        form = "".join("q" if kind == "i64" else "P" for kind in args.kinds)
        if getattr(function, "_tcpy_form", None) != form:
            function.prepare(form)
            function._tcpy_form = form
        try:
            function.prepared_async_call(grid, block, self.stream, *args.values)
        except self.cuda.Error as e:
            raise TCLaunchError(f"the kernel launch failed: {e}") from None

    def mapped_words(self, count: int) -> tuple[np.ndarray, int]:
        flags = self.cuda.host_alloc_flags.DEVICEMAP
        host = self.cuda.pagelocked_zeros(count, np.int32, mem_flags=flags)
        self._mapped = [*getattr(self, "_mapped", []), host]  # kept for the process
        return host, int(host.base.get_device_pointer())

    def event(self) -> Any:
        return self.cuda.Event(self.cuda.event_flags.DISABLE_TIMING)

    def record(self, event: Any, stream: int) -> None:
        event.record(self.stream)

    def done(self, event: Any) -> bool:
        try:
            return bool(event.query())
        except self.cuda.Error as e:
            raise TCLaunchError(f"the kernel failed while running: {e}") from None

    def capturing(self, stream: int) -> bool:
        return self.events.capturing(stream) or self.events.capturing(int(self.stream.handle))

    def synchronize(self, stream: int) -> None:
        try:
            self.stream.synchronize()
        except self.cuda.Error as e:
            raise TCLaunchError(f"the kernel failed while running: {e}") from None

    def work_stream(self, stream: int) -> int:
        return int(self.stream.handle)

    def order(self, after: int, before: int) -> None:
        self.events.order(after, before)


class _Bindings:
    name = "cuda.bindings"

    def __init__(self) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        self._check(cu.cuInit(0), "cuInit")
        self.device = self._check(cu.cuDeviceGet(0), "cuDeviceGet")
        self.context = self._check(cu.cuDevicePrimaryCtxRetain(self.device), "retain context")
        self._check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._modules: list[Any] = []
        self._event_lock = threading.Lock()

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise TCLaunchError(f"{what} failed: {err}")
        return rest[0] if len(rest) == 1 else rest

    def bind_thread(self) -> None:
        current = self._check(self.cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != int(self.context):
            self._check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def device_name(self) -> str:
        name = self._check(self.cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return bytes(name).split(b"\0")[0].decode()

    def arch(self) -> str:
        attr = self.cu.CUdevice_attribute
        get = self.cu.cuDeviceGetAttribute
        major = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
        minor = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
        return f"sm_{self._check(major, 'attribute')}{self._check(minor, 'attribute')}"

    def attribute(self, name: str) -> int:
        which = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self._check(self.cu.cuDeviceGetAttribute(which, self.device), name))

    def load(self, cubin: bytes, functions: Sequence[str]) -> list[Any]:
        module = self._check(self.cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        self._modules.append(module)
        return [self._check(self.cu.cuModuleGetFunction(module, f.encode()), f) for f in functions]

    def alloc(self, nbytes: int) -> int:
        return int(self._check(self.cu.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))

    def free(self, pointer: int) -> None:
        self._check(self.cu.cuMemFree(pointer), "cuMemFree")

    def to_device(self, pointer: int, array: np.ndarray, stream: int) -> None:
        # from pageable memory the bytes are staged before the call returns, so the
        # array may go at once
        copy = self.cu.cuMemcpyHtoDAsync(pointer, array.ctypes.data, array.nbytes, stream)
        self._check(copy, "copy in")

    def memset(self, pointer: int, value: int, nbytes: int, stream: int) -> None:
        self._check(self.cu.cuMemsetD8Async(pointer, value, nbytes, stream), "cuMemsetD8Async")

    def to_host(self, array: np.ndarray, pointer: int, stream: int) -> None:
        copy = self.cu.cuMemcpyDtoHAsync(array.ctypes.data, pointer, array.nbytes, stream)
        self._check(copy, "copy out")
        self.synchronize(stream)

    def arguments(self, kinds: Sequence[str]) -> Arguments:
        return Arguments(kinds)

    def launch(self, function: Any, grid: Any, block: Any, args: Arguments, stream: int) -> None:
        gx, gy, gz = grid
        bx, by, bz = block
        err = self.cu.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, 0, stream, args.address, 0)
        if int(err[0] if isinstance(err, tuple) else err) != 0:
            raise TCLaunchError(f"cuLaunchKernel failed: {err}")

    def mapped_words(self, count: int) -> tuple[np.ndarray, int]:
        flags = self.cu.CU_MEMHOSTALLOC_DEVICEMAP
        host = int(self._check(self.cu.cuMemHostAlloc(4 * count, flags), "cuMemHostAlloc"))
        device = self._check(self.cu.cuMemHostGetDevicePointer(host, 0), "device pointer")
        view = np.ctypeslib.as_array((ctypes.c_int32 * count).from_address(host))
        view[:] = 0
        return view, int(device)  # kept for the process

    def event(self) -> Any:
        flags = self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return self._check(self.cu.cuEventCreate(flags), "cuEventCreate")

    def record(self, event: Any, stream: int) -> None:
        self._check(self.cu.cuEventRecord(event, stream), "cuEventRecord")

    def done(self, event: Any) -> bool:
        err = self.cu.cuEventQuery(event)
        code = err[0] if isinstance(err, tuple) else err
        if code == self.cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        if int(code) != 0:
            raise TCLaunchError(f"the kernel failed while running: {err}")
        return True

    def capturing(self, stream: int) -> bool:
        status = self._check(self.cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
        return bool(int(status) == 1)  # CU_STREAM_CAPTURE_STATUS_ACTIVE

    def synchronize(self, stream: int) -> None:
        err = self.cu.cuStreamSynchronize(stream)
        if int(err[0] if isinstance(err, tuple) else err) != 0:
            raise TCLaunchError(f"the kernel failed while running: {err}")

    def work_stream(self, stream: int) -> int:
        return stream

    def order(self, after: int, before: int) -> None:
        with self._event_lock:  # a record and its wait together (see LibcudaEvents)
            self._check(self.cu.cuEventRecord(self._event, before), "cuEventRecord")
            self._check(self.cu.cuStreamWaitEvent(after, self._event, 0), "cuStreamWaitEvent")

    @functools.cached_property
    def _event(self) -> Any:
        flags = self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        return self._check(self.cu.cuEventCreate(flags), "cuEventCreate")


def wait(drv: Driver, stream: int) -> None:
    """Wait for the work queued for `stream` (a failure of it raises a TCLaunchError);
    the pool's blocks pending on it are then free for every stream."""
    drv.synchronize(stream)
    pool(drv).settled(stream)


class DeviceArray:
    """An array in GPU memory that tcpy allocated (the outputs of a call whose inputs
    were device arrays of no library with an allocator of its own). It exposes
    `__cuda_array_interface__`, so PyTorch (`torch.as_tensor`) and CuPy
    (`cupy.asarray`) take it without a copy; `get()` copies it to a NumPy array. Its
    memory is a block of the driver's pool (`pool`), given back with the object,
    pending on the streams that used it (kept, when a CUDA graph capture made it: the
    graph's replays write there). Its contents are ready in the order of
    `stream`, the stream of the call that made it: work queued there after the call,
    and `get()`, see them."""

    __slots__ = ("__weakref__", "_driver", "_pool", "captured", "dtype", "ndim", "others",
                 "pointer", "shape", "stream")  # fmt: skip

    def __init__(
        self, shape: tuple[int, ...], dtype: np.dtype, pointer: int, drv: Driver,
        stream: int = DEFAULT, captured: bool = False, memory: DevicePool | None = None,
    ) -> None:  # fmt: skip
        self.shape = shape
        self.captured = captured  # made under a CUDA graph capture: the graph's memory
        self.dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        self.ndim = len(shape)
        self.pointer = pointer
        self.stream = stream
        self.others: set[int] | None = None  # other streams calls that used it were on
        self._driver = drv
        self._pool = memory or pool(drv)  # where the block goes back

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "version": 3,
            "strides": None,
            "stream": None,  # ordered by tcpy itself (`used_on`)
        }

    def used_on(self, stream: int) -> None:
        """A call queued on `stream` reads or writes the array: its memory is reused
        only after that work (see `__del__`)."""
        if stream != self.stream:
            self.others = {*(self.others or ()), stream}

    def get(self) -> np.ndarray:
        """The array on the host. Waits for the array's stream; a failure of a call
        queued there (or of any call in flight) is raised here."""
        drv = self._driver
        out = np.empty(self.shape, self.dtype)
        drv.to_host(out, self.pointer, self.stream)
        pool(drv).settled(self.stream)
        status = words(drv)
        failure = status.failure()
        status.settled(self.stream)
        if failure is not None:
            raise failure
        return out

    def __del__(self) -> None:
        try:
            drv = self._driver
            for other in self.others or ():  # the array's stream waits for their work
                drv.order(drv.work_stream(self.stream), other)
            if not self.captured:  # a graph's replays keep writing there
                self._pool.release(self.pointer, self.stream)
        except Exception:  # the context may be gone at interpreter exit
            return
