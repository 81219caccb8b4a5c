"""The CUDA runtime: a small driver layer with two implementations, chosen at run time.

`driver()` returns the pycuda implementation when pycuda is installed, else the one on
`cuda.bindings.driver`; the rest of tcpy only sees the `Driver` interface: the device's
name and compute capability, loading a cubin, device memory, copies, and launching a
kernel with its grid, block and arguments. Every call is checked. Launches are queued
on the default stream without waiting; `synchronize()`, once per call of a compiled
def, raises a failure of any of them as a `TCLaunchError`.

`pool(drv)` is the device memory a call borrows for what it does not hand to the
caller (copies of host inputs, temporaries, host outputs on their way back, the status
word): blocks a call gives back are kept for the next, so that a call reaches the
driver's allocator only when it needs more than earlier calls returned.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tcpy import knobs
from tcpy.errors import TCError, TCInputError, TCLaunchError
from tcpy.mapping.device import DeviceProfile
from tcpy.runtime.status import check_status


class Driver(Protocol):
    name: str

    def device_name(self) -> str: ...
    def arch(self) -> str: ...
    def attribute(self, name: str) -> int: ...
    def load(self, cubin: bytes, functions: Sequence[str]) -> list[Any]: ...
    def alloc(self, nbytes: int) -> int: ...
    def free(self, pointer: int) -> None: ...
    def to_device(self, pointer: int, array: np.ndarray) -> None: ...
    def memset(self, pointer: int, value: int, nbytes: int) -> None: ...
    def to_host(self, array: np.ndarray, pointer: int) -> None: ...
    def launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
        args: Sequence[tuple[str, int]],
    ) -> None: ...  # fmt: skip
    def synchronize(self) -> None: ...


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


def driver() -> Driver:
    """The driver `TCPY_CUDA_DRIVER` names, else pycuda if it is installed, else
    cuda.bindings'; a TCLaunchError when none can reach a GPU."""
    return _driver(knobs.cuda_driver())


@functools.cache
def _driver(choice: str | None) -> Driver:
    errors = []
    makers: tuple[type[_PyCuda] | type[_Bindings], ...] = (_PyCuda, _Bindings)
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


class _PyCuda:
    name = "pycuda"

    def __init__(self) -> None:
        import pycuda.driver as cuda

        cuda.init()
        self.cuda = cuda
        self.device = cuda.Device(0)
        self.context = self.device.retain_primary_context()
        self.context.push()

    def device_name(self) -> str:
        return str(self.device.name())

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

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        self.cuda.memcpy_htod(pointer, array)

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        self.cuda.memset_d8(pointer, value, nbytes)

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self.cuda.memcpy_dtoh(array, pointer)

    def launch(self, function: Any, grid: Any, block: Any, args: Any) -> None:
        values = [np.int64(v) if kind == "i64" else np.uintp(v) for kind, v in args]
        try:
            function(*values, grid=grid, block=block)
        except self.cuda.Error as e:
            raise TCLaunchError(f"the kernel launch failed: {e}") from None

    def synchronize(self) -> None:
        try:
            self.cuda.Context.synchronize()
        except self.cuda.Error as e:
            raise TCLaunchError(f"the kernel failed while running: {e}") from None


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

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise TCLaunchError(f"{what} failed: {err}")
        return rest[0] if len(rest) == 1 else rest

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

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        self._check(self.cu.cuMemcpyHtoD(pointer, array.ctypes.data, array.nbytes), "copy in")

    def memset(self, pointer: int, value: int, nbytes: int) -> None:
        self._check(self.cu.cuMemsetD8(pointer, value, nbytes), "cuMemsetD8")

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        self._check(self.cu.cuMemcpyDtoH(array.ctypes.data, pointer, array.nbytes), "copy out")

    def launch(self, function: Any, grid: Any, block: Any, args: Any) -> None:
        values = [ctypes.c_int64(v) if kind == "i64" else ctypes.c_void_p(v) for kind, v in args]
        pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        self._check(
            self.cu.cuLaunchKernel(function, *grid, *block, 0, 0, ctypes.addressof(pointers), 0),
            "cuLaunchKernel",
        )

    def synchronize(self) -> None:
        err = self.cu.cuCtxSynchronize()
        if int(err[0] if isinstance(err, tuple) else err) != 0:
            raise TCLaunchError(f"the kernel failed while running: {err}")


POOL_IDLE_BYTES = 1 << 30
"""The most device memory the pool keeps idle between calls; beyond it, blocks given
back go back to the driver."""


class DevicePool:
    """Device memory borrowed for the length of a call and given back (`acquire`,
    `release`). A block is allocated at a rounded size (512 bytes at least, else a
    multiple of an eighth of the power of two below: at most 12.5% more than asked), kept,
    once given back, for the next request of that rounded size. Reuse is safe without
    waiting for the GPU: every copy and launch of tcpy's goes to the same stream, in
    order. An allocation the driver refuses is retried once after the idle blocks are
    freed (`trim`)."""

    def __init__(self, drv: Driver, idle_limit: int = POOL_IDLE_BYTES) -> None:
        self.drv = drv
        self.idle_limit = idle_limit
        self.idle: dict[int, list[int]] = {}  # rounded size -> blocks not in use
        self.idle_bytes = 0
        self.sizes: dict[int, int] = {}  # every block the pool allocated -> its size
        self.lock = threading.Lock()

    @staticmethod
    def rounded(nbytes: int) -> int:
        if nbytes <= 512:
            return 512
        step = 1 << (nbytes - 1).bit_length() - 4  # an eighth of the power of two below
        return -(-nbytes // step) * step

    def acquire(self, nbytes: int) -> int:
        size = self.rounded(nbytes)
        with self.lock:
            blocks = self.idle.get(size)
            if blocks:
                self.idle_bytes -= size
                return blocks.pop()
        try:
            pointer = self.drv.alloc(size)
        except Exception:  # out of memory, maybe only for want of the idle blocks
            self.trim()
            pointer = self.drv.alloc(size)
        with self.lock:
            self.sizes[pointer] = size
        return pointer

    def release(self, pointer: int) -> None:
        with self.lock:
            size = self.sizes[pointer]
            if self.idle_bytes + size > self.idle_limit:
                del self.sizes[pointer]
                self.drv.free(pointer)
                return
            self.idle.setdefault(size, []).append(pointer)
            self.idle_bytes += size

    def trim(self) -> None:
        """Give every idle block back to the driver."""
        with self.lock:
            for blocks in self.idle.values():
                for pointer in blocks:
                    del self.sizes[pointer]
                    self.drv.free(pointer)
            self.idle.clear()
            self.idle_bytes = 0


_pools: dict[int, DevicePool] = {}
_pools_lock = threading.Lock()


def pool(drv: Driver) -> DevicePool:
    """The memory pool of driver `drv` (one per driver, for the process)."""
    with _pools_lock:
        found = _pools.get(id(drv))
        if found is None or found.drv is not drv:
            found = _pools[id(drv)] = DevicePool(drv)
        return found


# per driver: the driver, and the status words not yet read with their defs' names
_pending: dict[int, tuple[Driver, list[tuple[int, str]]]] = {}
_pending_lock = threading.Lock()


def defer(drv: Driver, status: int, name: str) -> None:
    """Leave the status word `status` (a block of `pool(drv)`) of a call of def `name`
    that did not wait for its kernels, to be read by the next `settle`."""
    with _pending_lock:
        owner, waiting = _pending.get(id(drv), (drv, []))
        if owner is not drv:  # a driver gone, whose id was reused
            waiting = []
        waiting.append((status, name))
        _pending[id(drv)] = (drv, waiting)


def settle(drv: Driver) -> None:
    """Wait for the calls that did not wait for their kernels (an asynchronous
    engine's), read their status words and give them back to the pool; raise the first
    failure among them, naming its def. Nothing to do (and no synchronisation) when
    there are none."""
    with _pending_lock:
        owner, waiting = _pending.pop(id(drv), (drv, []))
    if owner is not drv or not waiting:
        return
    memory = pool(drv)
    failure: TCError | None = None
    try:
        drv.synchronize()
    except TCLaunchError as e:
        failure = TCLaunchError(f"a call of {waiting[0][1]} that did not wait failed: {e}")
    for status, name in waiting:
        code = np.zeros(1, np.int32)
        if failure is None:
            drv.to_host(code, status)
        memory.release(status)
        if failure is None and code[0]:
            try:
                check_status(int(code[0]))
            except TCError as e:  # not a KernelFault: the call running now did not make it
                kind = TCInputError if isinstance(e, TCInputError) else type(e)
                failure = kind(f"a call of {name} that did not wait failed: {e}")
    if failure is not None:
        raise failure


class DeviceArray:
    """An array in GPU memory that tcpy allocated (the outputs of a call whose inputs
    were device arrays). It exposes `__cuda_array_interface__`, so PyTorch
    (`torch.as_tensor`) and CuPy (`cupy.asarray`) take it without a copy; `get()`
    copies it to a NumPy array. The memory is freed with the object."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, pointer: int, drv: Driver):
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.ndim = len(shape)
        self.pointer = pointer
        self._driver = drv

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "version": 3,
            "strides": None,
        }

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self._driver.to_host(out, self.pointer)
        return out

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # the context may be gone at interpreter exit
            self._driver.free(self.pointer)
