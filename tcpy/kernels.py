"""What a compiled definition runs at a call: a `Kernel`, which computes the outputs
of a binding, one class per way of running (the interpreter here, host code and
emulated CUDA in `tcpy.host_kernels`, the GPU here). `tcpy.targets` builds them;
`tcpy.compiled` calls them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tcpy import knobs
from tcpy.arrays import device_scratch, library_of, new_device_outputs
from tcpy.binding import Binding, DeviceCall, DeviceInput
from tcpy.codegen.one_kernel import GRID_WORDS
from tcpy.errors import TCError, TCLaunchError
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef
from tcpy.reference import interpreter
from tcpy.runtime import cuda as runtime
from tcpy.runtime import streams
from tcpy.runtime.launch import LaunchPlan, borrow
from tcpy.runtime.status import KernelFault, check_status
from tcpy.runtime.streams import PER_THREAD
from tcpy.runtime.words import words

# The destinations of `out=`, one per output, or None: new arrays.
Outputs = tuple[Any, ...] | None


class Kernel(Protocol):
    @property
    def source(self) -> str: ...

    @property
    def options(self) -> MappingOptions:
        """The options the kernel was built with: those asked for, as any fallback of
        the compiler changed them."""
        ...

    @property
    def generic(self) -> bool:
        """Whether the kernel serves every shape of its inputs' ranks and dtypes (the
        sizes are read at each call), not only the shapes it was built for."""
        ...

    @property
    def cache_key(self) -> str:
        """The key of the kernel's disk-cache entry ("" for the reference target)."""
        ...

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        """The outputs of the call: new arrays, or the destinations `out` (checked
        by `tcpy.binding.bind_out`, on the side the kernel runs on, and sharing no
        memory with the inputs), filled."""
        ...


Launch = tuple[tuple[int, int, int], tuple[int, int, int]]

RUNAWAY_FACTOR = 16
"""A counting run is a runaway when its loops iterate more than this many times the
statement instances and GPU threads of the call..."""
RUNAWAY_FLOOR = 10**6
"""... and more than this many times in all (a tiny def's loop overheads are not)."""


@dataclass(frozen=True)
class Iterations:
    """What a counting run of a compiled def executed (`Compiled.iterations`).

    `loops`: the iterations of each counted loop, in the order the loops are printed
    (`tcpy.codegen.loops.COUNT_LOOP`); `instances`: the statement instances of the def
    at the call's sizes (the work its domains hold); `threads`: the GPU threads its
    launches ran (0 on the CPU); `stopped`: the run passed `limit()` and was stopped
    there (the counts are then those up to the stop)."""

    loops: tuple[int, ...]
    instances: int
    threads: int = 0
    stopped: bool = False

    @property
    def total(self) -> int:
        return sum(self.loops)

    @staticmethod
    def limit(instances: int, threads: int) -> int:
        """The iterations beyond which loops run far more than the work of the def:
        `RUNAWAY_FACTOR` times its instances and threads, and at least `RUNAWAY_FLOOR`
        (a tiny def's loop overheads are no runaway)."""
        return max(RUNAWAY_FACTOR * (instances + threads), RUNAWAY_FLOOR)

    @property
    def runaway(self) -> bool:
        """Whether the loops ran past `limit()`: a loop bounded by something no
        domain reaches (a tile size meant to be out of reach, say)."""
        return self.stopped or self.total > self.limit(self.instances, self.threads)


@dataclass(frozen=True)
class ReferenceKernel:
    cdef: CheckedDef
    source: str
    options: MappingOptions
    generic: bool = False
    cache_key: str = ""

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        results = interpreter.run(self.cdef, binding)
        if out is None:
            return results
        for dest, result in zip(out, results, strict=True):
            np.copyto(dest, result)
        return out


def _overlapping(addresses: Sequence[int], extents: Sequence[int], outputs: int) -> bool:
    """Whether one of the `outputs` last arrays (`out=` destinations) shares memory
    with another array of the call: their device `addresses` and their bytes."""
    spans = [(a, a + n) for a, n in zip(addresses, extents, strict=True)]
    for k in range(len(spans) - outputs, len(spans)):
        lo, hi = spans[k]
        for j, (a, b) in enumerate(spans):
            if j != k and a < hi and lo < b and a < b and lo < hi:
                return True
    return False


def _address(array: Any) -> int:
    """The device address of a PyTorch tensor or CuPy array."""
    pointer = getattr(array, "data_ptr", None)
    return int(pointer()) if pointer is not None else int(array.data.ptr)


@dataclass(frozen=True)
class GpuKernels:
    """Compiled CUDA kernels of one definition on the GPU. NumPy inputs are copied to
    the device and the outputs back; device inputs are used in place, and the outputs
    then stay on the device (new arrays of the inputs' library, from its allocator,
    made by `tcpy.compiled`; else `DeviceArray`s from the driver's pool).

    A call's launches at given sizes are a `runtime.launch.LaunchPlan`, built on the
    first call at those sizes and replayed. Every copy, memset and launch is queued on
    the caller's current stream (`runtime.streams.call_streams`), the kernels back to
    back. A call whose arrays all stay on the device returns once its work is queued
    (`asynchronous`, the default): its status word is read lazily
    (`runtime.words`), and a failure raised at a later call, at `ExecutionEngine.
    synchronize` or when host data is read. A call with NumPy inputs or outputs, or
    with `asynchronous=False` or `TCPY_LAUNCH_BLOCKING=1`, synchronises its stream
    after its last kernel and checks its status word then. Outputs and temporaries
    start at zero, except the tensors the kernels write whole before reading them
    (`written`; with `TCPY_POISON=1`, filled with all-ones bytes instead)."""

    cdef: CheckedDef
    source: str
    functions: list[Any]
    launches: list[Launch]
    options: MappingOptions
    written: frozenset[str] = frozenset()
    asynchronous: bool = True
    generic: bool = False
    cache_key: str = ""
    # the def's one kernel, launched cooperatively (`runtime.cooperative`)
    cooperative: bool = False
    accepts_device_out: ClassVar[bool] = True
    # launch plans by the values of the sizes and the driver; what steady calls reuse,
    # by the sizes object of the engine's known call (`_steady_at`)
    _plans: dict[tuple[Any, ...], Any] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _steady: dict[int, tuple[Any, ...]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        drv = runtime.driver()
        words(drv).check()  # an earlier call's failure is reported before this one runs
        dests = out or (None,) * len(self.cdef.outputs)
        # the caller's stream (and those of other libraries' arrays among the inputs)
        ordered = streams.call_streams((*binding.arrays, *dests))
        streams.enter(drv, ordered)
        try:
            return self._run(drv, binding, dests, ordered[0])
        finally:
            streams.leave(drv, ordered)

    def device_call(self, sizes: Mapping[str, int], call: DeviceCall) -> Any:
        """The steady call on GPU arrays (`Compiled.device_call`): the arrays were
        checked at these sizes by an earlier call with the same `device_signature`.
        Outputs: the `out=` arrays when `call` holds them after the inputs (None, for
        the caller to check the call whole, when they share memory with an input or
        with each other), else new arrays of the inputs' library (PyTorch, CuPy), else
        `DeviceArray`s from the pool; one output bare, several as a tuple. The path of
        every call in a training loop: kept lean."""
        drv = runtime.driver()
        found = self._steady.get(id(sizes))
        if found is None or found[0] is not sizes or found[1].drv is not drv:
            found = self._steady_at(drv, sizes)
        plan = found[1]
        try:
            plan.status.check()  # an earlier call's failure, before this one runs
            stream = call.stream
            owners = call.owners
            capturing = drv.capturing(stream)
            addresses = list(call.addresses)
            scratch = None
            count = len(self.cdef.inputs)
            if len(owners) > count:  # out= destinations
                if _overlapping(addresses, found[3], len(owners) - count):
                    return None
                outputs = owners[count:]
                owners = owners[:count]
                for owner in outputs:
                    if type(owner) is runtime.DeviceArray:
                        owner.used_on(stream)
                if plan.temporaries:
                    scratch = device_scratch(owners)
            elif call.library:  # PyTorch's or CuPy's outputs, from its allocator
                made = new_device_outputs(library_of(owners[0]), owners, found[2])
                assert made is not None
                outputs = made
                addresses += map(_address, outputs)
                if plan.temporaries:
                    scratch = device_scratch(owners)
            else:
                outputs = self._device_arrays(drv, plan, found[2], stream, capturing, addresses)
                for owner in owners:  # tcpy's own arrays among the inputs
                    if type(owner) is runtime.DeviceArray:
                        owner.used_on(stream)
            ordered = None
            if call.many or drv.work_stream(stream) != stream:
                ordered = tuple(dict.fromkeys(s for s in call.streams if s is not None))
            code = plan.run(addresses, stream, scratch, self.waits(stream), capturing, ordered)
            if code:
                check_status(code)
        except KernelFault as e:  # the inputs are on the GPU: nothing to interpret
            hint = KernelFault(f"{e}; the reference target names the index values")
            raise self.cdef.located(hint) from None
        except TCError as e:
            raise self.cdef.located(e) from None
        return outputs[0] if len(outputs) == 1 else outputs

    @staticmethod
    def _device_arrays(
        drv: Any, plan: Any, specs: list[tuple[tuple[int, ...], Any, int]], stream: int,
        capturing: bool, addresses: list[int],
    ) -> tuple[Any, ...]:  # fmt: skip
        """New `DeviceArray`s of `specs` from the pool for work on `stream`, their
        addresses appended to `addresses`."""
        memory = plan.memory
        made = []
        for shape, dtype, nbytes in specs:
            if capturing:
                pointer = borrow(memory, nbytes, stream, capturing)
            else:
                pointer = memory.acquire(nbytes, stream)
            made.append(runtime.DeviceArray(shape, dtype, pointer, drv, stream, capturing, memory))
            addresses.append(pointer)
        return tuple(made)

    def _steady_at(self, drv: Any, sizes: Mapping[str, int]) -> tuple[Any, ...]:
        """What the steady calls at `sizes` reuse: the plan, each output's shape, dtype
        and bytes, and the bytes of each input and then each output."""
        plan = self.plan(drv, [sizes[s] for s in self.cdef.size_symbols])
        specs = [
            (tuple(max(d.evaluate(sizes), 0) for d in t.shape), t.scalar.dtype, nbytes)
            for t, nbytes in zip(self.cdef.outputs, plan.buffers, strict=False)
        ]
        extents = [
            math.prod(max(d.evaluate(sizes), 0) for d in t.shape) * t.scalar.dtype.itemsize
            for t in self.cdef.inputs
        ] + [nbytes for _, _, nbytes in specs]
        if len(self._steady) >= 64:
            self._steady.clear()
        found = self._steady[id(sizes)] = (sizes, plan, specs, extents)
        return found

    def plan(self, drv: Any, sizes: Sequence[int]) -> Any:
        """The launch plan at `sizes` (the values of the def's size symbols)."""
        key = (*sizes, id(drv))
        found = self._plans.get(key)
        if found is not None and found.drv is drv:
            return found
        cdef = self.cdef
        values = dict(zip(cdef.size_symbols, sizes, strict=True))
        tensors = (*cdef.outputs, *cdef.temporaries)
        buffers = [
            math.prod(max(d.evaluate(values), 0) for d in t.shape) * t.scalar.dtype.itemsize
            for t in tensors
        ]
        zeroed = [t.name not in self.written for t in tensors]
        if self.cooperative:  # the grid barrier's words, zero at each launch
            buffers.append(GRID_WORDS * 4)
            zeroed.append(True)
        if len(self._plans) >= 64:
            self._plans.clear()
        found = self._plans[key] = LaunchPlan(
            cdef.name, self.functions, self.launches, list(sizes), len(cdef.inputs),
            len(cdef.outputs), buffers, zeroed, drv, self.cooperative,
        )  # fmt: skip
        return found

    def waits(self, stream: int) -> bool:
        """Whether a call on the device queued on `stream` waits for its kernels: with
        `asynchronous=False`, `TCPY_LAUNCH_BLOCKING=1`, or on the per-thread default
        stream (which only the thread that queued the call can name)."""
        return not self.asynchronous or knobs.launch_blocking() or stream == PER_THREAD

    def _run(
        self, drv: Any, binding: Binding, dests: tuple[Any, ...], stream: int
    ) -> tuple[Any, ...]:
        """The call's work, every operation queued on `stream` in order."""
        memory = runtime.pool(drv)
        cdef = self.cdef
        plan = self.plan(drv, [binding.sizes[s] for s in cdef.size_symbols])
        captured = drv.capturing(stream)
        given = (*binding.arrays, *(d for d in dests if d is not None))
        if captured and not all(isinstance(a, DeviceInput) for a in given):
            raise TCLaunchError(
                f"a call of {cdef.name} being captured into a CUDA graph cannot copy host "
                "arrays or wait for its kernels: pass arrays on the device"
            )
        borrowed: list[int] = []  # given back to the pool when the call ends
        handed: list[int] = []  # the caller's, unless the call fails
        owners = []

        def lend(nbytes: int) -> int:
            borrowed.append(memory.acquire(nbytes, stream))
            return borrowed[-1]

        try:
            addresses = []
            for a in binding.arrays:
                if isinstance(a, DeviceInput):
                    addresses.append(a.pointer)
                    owners.append(a.owner)
                else:
                    addresses.append(lend(a.nbytes))
                    drv.to_device(addresses[-1], a, stream)
            stays = True
            for nbytes, dest in zip(plan.buffers, dests, strict=False):
                if isinstance(dest, DeviceInput):
                    addresses.append(dest.pointer)
                    owners.append(dest.owner)
                elif dest is None and binding.on_device:  # a DeviceArray
                    addresses.append(borrow(memory, nbytes, stream, captured))
                    handed.append(addresses[-1])
                else:
                    addresses.append(lend(nbytes))
                    stays = False
            for owner in owners:
                if isinstance(owner, runtime.DeviceArray):
                    owner.used_on(stream)
            wait = not (binding.on_device and stays) or self.waits(stream)
            pointers = addresses[len(binding.arrays) :]  # the outputs'
            code = plan.run(addresses, stream, device_scratch(owners), wait, captured)
            if code:
                check_status(code)
            outputs = self._collect(drv, binding, pointers, dests, stream, captured)
            handed.clear()
            return tuple(outputs)
        finally:
            for pointer in borrowed:
                memory.release(pointer, stream)
            for pointer in handed:  # the call failed before handing them over
                if not captured:
                    memory.release(pointer, stream)

    def _collect(
        self, drv: Any, binding: Binding, pointers: list[int], dests: tuple[Any, ...],
        stream: int, captured: bool,
    ) -> list[Any]:  # fmt: skip
        """The outputs: the destinations given (a host one copied into), else new
        arrays on the device for device inputs, on the host for host inputs."""

        outputs: list[Any] = []
        for t, pointer, dest in zip(self.cdef.outputs, pointers, dests, strict=True):
            shape = binding.shape_of(t)
            if isinstance(dest, DeviceInput):
                outputs.append(dest)
            elif dest is not None or not binding.on_device:
                host = np.empty(shape, t.scalar.dtype) if dest is None else dest
                drv.to_host(host, pointer, stream)
                outputs.append(host)
            else:
                array = runtime.DeviceArray(shape, t.scalar.dtype, pointer, drv, stream, captured)
                outputs.append(array)
        return outputs


@dataclass(frozen=True)
class NoGpu:
    """CUDA kernels compiled on a machine without a GPU: the source (and a cubin for
    `TCPY_CUDA_ARCH`) exist, running them is an error."""

    source: str
    options: MappingOptions
    generic: bool = False
    cache_key: str = ""

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:

        runtime.driver()  # raises the TCLaunchError that says why there is no GPU
        raise TCError("a GPU appeared after these kernels were compiled; compile again")
