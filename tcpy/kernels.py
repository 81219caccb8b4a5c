"""What a compiled definition runs at a call: a `Kernel`, which computes the outputs
of a binding, one class per way of running (the interpreter, host code, emulated CUDA,
the GPU). `tcpy.targets` builds them; `tcpy.compiled` calls them."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tcpy import knobs
from tcpy.arrays import device_scratch, library_of, new_device_outputs
from tcpy.binding import Binding, DeviceCall, DeviceInput, empty_at
from tcpy.codegen.one_kernel import GRID_WORDS
from tcpy.empty import EmptyCall
from tcpy.errors import TCError, TCLaunchError
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef, TensorInfo
from tcpy.poly.scop import instances
from tcpy.reference import interpreter
from tcpy.runtime import cuda as runtime
from tcpy.runtime import streams
from tcpy.runtime.cpu import address
from tcpy.runtime.host_pool import POOL
from tcpy.runtime.launch import LaunchPlan, borrow
from tcpy.runtime.loop_counts import LoopCounters
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


@dataclass(frozen=True)
class HostKernel:
    """Compiled code that runs on the host (C, or emulated CUDA): `run(sizes, buffers)`
    fills the outputs and temporaries.

    Buffers start at zero, except those of the tensors the kernel writes whole before
    reading them (`written`, from `tcpy.poly.coverage`), which are not filled: with
    `TCPY_POISON=1` (the tests, the fuzzer) they are filled with all-ones bytes instead
    (NaN, -1), so that an element the kernel failed to write shows. Outputs are new
    arrays on every call (they are the caller's); temporaries are allocated once per
    thread (calls may run in several threads at once) and kept while their shapes
    hold. A `generic` kernel reads the sizes at each call and serves every shape (see
    `Target.generic_kernels`)."""

    cdef: CheckedDef
    source: str
    run: Callable[[list[int], list[np.ndarray]], None]
    options: MappingOptions
    written: frozenset[str] = frozenset()
    generic: bool = False
    cache_key: str = ""
    # the counting build of the same kernel, when this is not one (`iterations`)
    counting: Callable[[], HostKernel] | None = field(default=None, compare=False, repr=False)
    _scratch: threading.local = field(
        default_factory=threading.local, init=False, compare=False, repr=False
    )
    # the shapes of the outputs and temporaries, by the values of the sizes (None: empty)
    _shapes: dict[tuple[int, ...], list[tuple[int, ...]] | None] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        shapes = self._shapes_at(binding)
        if shapes is None:
            # only an unchecked call of a generic kernel gets here at sizes where a range
            # is empty; the kernel was built for non-empty ranges (`tcpy.poly.scop`)
            return EmptyCall(self.cdef, self.options)(binding, out)
        sizes, buffers, outputs = self._buffers(binding, shapes, out)
        self.run(sizes, buffers)
        return outputs

    def prepare(self, binding: Binding) -> Prepared | None:
        """A call of this kernel at `binding`'s sizes made ready once, for a caller
        that allocates the outputs itself (`tcpy.torch`); None for an empty call."""
        shapes = self._shapes_at(binding)
        if shapes is None:
            return None
        count = len(self.cdef.outputs)
        sizes = [binding.sizes[s] for s in self.cdef.size_symbols]
        return Prepared(self, sizes, shapes[:count], shapes[count:])

    def steady(self, binding: Binding) -> Steady | None:
        """This kernel's calls at `binding`'s signature on plain NumPy inputs, made
        ready once (`Steady`); None for a generic kernel, an empty call, or compiled
        code that is not called by address."""
        at = getattr(self.run, "at", None)
        if self.generic or at is None:
            return None
        prepared = self.prepare(binding)
        if prepared is None:
            return None
        count = len(self.cdef.inputs) + len(prepared.shapes) + len(prepared.temporaries)
        return Steady(prepared, at(prepared.sizes, count))

    def iterations(self, binding: Binding) -> Iterations:
        """Run once with the counting build (this kernel's, or `counting`'s) and return
        what its loops executed."""
        counters: LoopCounters | None = getattr(self.run, "counters", None)
        if counters is None:
            if self.counting is None:
                raise TCError("this kernel has no counting build")
            return self.counting().iterations(binding)
        shapes = self._shapes_at(binding)
        if shapes is None:  # an empty call runs nothing
            return Iterations((0,) * counters.n, 0)
        sizes, buffers, _ = self._buffers(binding, shapes)
        work = instances(self.cdef, binding.sizes)
        threads = sum(math.prod(g) * math.prod(b) for g, b in getattr(self.run, "launches", ()))
        with counters.lock:
            counters.reset(Iterations.limit(work, threads))
            try:
                self.run(sizes, buffers)
            except TCError:
                if not counters.stopped:
                    raise  # a stopped run leaves values half computed: not an error
            loops, stopped = counters.read(), counters.stopped
        return Iterations(loops, work, threads, stopped)

    def _shapes_at(self, binding: Binding) -> list[tuple[int, ...]] | None:
        """The shapes of the outputs and temporaries at the call's sizes; None where the
        call is empty (`tcpy.binding.empty_at`)."""
        key = tuple(binding.sizes[s] for s in self.cdef.size_symbols)
        try:
            return self._shapes[key]
        except KeyError:
            pass
        if len(self._shapes) >= 256:
            self._shapes.clear()
        cdef = self.cdef
        shapes = None
        if not empty_at(cdef, binding.sizes):
            shapes = [binding.shape_of(t) for t in (*cdef.outputs, *cdef.temporaries)]
        self._shapes[key] = shapes
        return shapes

    def _buffers(
        self, binding: Binding, shapes: list[tuple[int, ...]], out: Outputs = None
    ) -> tuple[list[int], list[np.ndarray], tuple[np.ndarray, ...]]:
        """The sizes and buffers of a call, and its outputs (among the buffers)."""
        cdef = self.cdef
        sizes = [binding.sizes[s] for s in cdef.size_symbols]
        poison = knobs.poison_buffers()
        count = len(cdef.outputs)
        if out is None and not poison:  # the common case, kept lean
            outputs = tuple(
                POOL.empty(shape, dtype) if written else np.zeros(shape, dtype)
                for shape, (dtype, written) in zip(shapes, self._kinds, strict=False)
            )
        else:
            dests = out or (None,) * count
            outputs = tuple(
                self._output(t, shape, d, poison)
                for t, shape, d in zip(cdef.outputs, shapes, dests, strict=False)
            )
        temporaries = self._temporaries(shapes[count:], poison)
        return sizes, [*binding.host_arrays, *outputs, *temporaries], outputs

    @functools.cached_property
    def _kinds(self) -> tuple[tuple[np.dtype[Any], bool], ...]:
        """Each output's dtype, and whether the kernel writes it whole."""
        return tuple((t.scalar.dtype, t.name in self.written) for t in self.cdef.outputs)

    def _output(
        self, tensor: TensorInfo, shape: tuple[int, ...], dest: np.ndarray | None, poison: bool
    ) -> np.ndarray:
        written = tensor.name in self.written
        if dest is not None:
            if not written:
                dest.fill(0)
            elif poison:
                dest.reshape(-1).view(np.uint8).fill(0xFF)
            return dest
        dtype = tensor.scalar.dtype
        if not written:
            return np.zeros(shape, dtype)
        if poison:
            return _poisoned(shape, dtype)
        return POOL.empty(shape, dtype)

    def _temporaries(self, shapes: list[tuple[int, ...]], poison: bool) -> list[np.ndarray]:
        temporaries = self.cdef.temporaries
        if not temporaries:
            return []
        kept: list[np.ndarray] | None = getattr(self._scratch, "buffers", None)
        if kept is None or getattr(self._scratch, "shapes", None) != shapes:
            kept = [np.empty(s, t.scalar.dtype) for s, t in zip(shapes, temporaries, strict=True)]
            self._scratch.buffers, self._scratch.shapes = kept, shapes
        for tensor, buffer in zip(temporaries, kept, strict=True):
            if tensor.name not in self.written:
                buffer.fill(0)
            elif poison:
                buffer.reshape(-1).view(np.uint8).fill(0xFF)
        return kept


@dataclass(frozen=True)
class Prepared:
    """A kernel's call at fixed sizes: `outputs` gives the output shapes and whether
    each must start at zero (the kernel does not write it whole), and calling it runs
    the kernel on inputs and outputs the caller checked and allocated so."""

    kernel: HostKernel
    sizes: list[int]
    shapes: list[tuple[int, ...]]
    temporaries: list[tuple[int, ...]]

    @property
    def outputs(self) -> list[tuple[tuple[int, ...], bool]]:
        kinds = self.kernel._kinds
        return [(shape, not kind[1]) for shape, kind in zip(self.shapes, kinds, strict=True)]

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        scratch = self.kernel._temporaries(self.temporaries, poison=False)
        self.kernel.run(self.sizes, [*inputs, *outputs, *scratch])

    def by_address(self) -> Callable[[Sequence[int]], None] | None:
        """This call taking the addresses of the inputs and outputs (contiguous, of
        the checked shapes and types), for a kernel that can be called so (a C
        kernel's, `CpuKernel.at`); None for others."""
        at = getattr(self.kernel.run, "at", None)
        if at is None:
            return None
        count = len(self.kernel.cdef.inputs) + len(self.shapes) + len(self.temporaries)
        call: Callable[[Sequence[int]], None] = at(self.sizes, count)
        if not self.temporaries:
            return call
        kernel, shapes, mine = self.kernel, self.temporaries, threading.local()

        def with_scratch(addresses: Sequence[int]) -> None:
            scratch = kernel._temporaries(shapes, poison=False)
            if getattr(mine, "scratch", None) is not scratch:  # new buffers: new addresses
                mine.scratch, mine.addresses = scratch, [address(b) for b in scratch]
            call([*addresses, *mine.addresses])

        return with_scratch


class Steady:
    """A fixed-size host kernel's calls on plain NumPy inputs (`plain_signature`) of
    the signature a call checked once: each allocates the outputs as
    `HostKernel._buffers` does and passes the buffers' addresses to the compiled code
    (`CpuKernel.at`), with none of a binding's work: a call of gesummv at 16 x 16
    (two scalars) took 15.2 us through a binding, 7.8 so (the compiled code: 1.5).
    Scalars are written into 0-d arrays each calling thread keeps (`_Scalars`)."""

    def __init__(self, prepared: Prepared, call: Callable[[Sequence[int]], None]) -> None:
        kernel = prepared.kernel
        self._kernel, self._call = kernel, call
        cdef = kernel.cdef
        self._outputs = [
            (shape, dtype, written)
            for shape, (dtype, written) in zip(prepared.shapes, kernel._kinds, strict=True)
        ]
        self._infos = cdef.outputs
        self._temporaries = prepared.temporaries
        # each input's dtype where it is a scalar, None for an array
        self._scalars = [None if info.shape else info.scalar.dtype for info in cdef.inputs]
        self._any_scalar = any(d is not None for d in self._scalars)
        self._held = threading.local()

    def __call__(self, inputs: Sequence[Any], out: Outputs = None) -> tuple[np.ndarray, ...]:
        """The outputs of a call on `inputs`: new arrays, or `out`'s (of the outputs'
        shapes and dtypes, C-contiguous, apart from the inputs: not checked)."""
        kernel = self._kernel
        poison = knobs.poison_buffers()
        if out is not None or poison:
            dests = out or (None,) * len(self._infos)
            outputs = tuple(
                kernel._output(t, shape, d, poison)
                for t, (shape, _, _), d in zip(self._infos, self._outputs, dests, strict=True)
            )
        else:
            outputs = tuple(
                POOL.empty(shape, dtype) if written else np.zeros(shape, dtype)
                for shape, dtype, written in self._outputs
            )
        if self._any_scalar:
            addresses = self._scalar_slots().addresses(inputs)
            addresses += map(address, outputs)
        else:
            addresses = [*map(address, inputs), *map(address, outputs)]
        if self._temporaries:
            addresses += map(address, kernel._temporaries(self._temporaries, poison))
        self._call(addresses)
        return outputs

    def _scalar_slots(self) -> _Scalars:
        try:
            slots: _Scalars = self._held.slots
        except AttributeError:
            slots = self._held.slots = _Scalars(self._scalars)
        return slots


class _Scalars:
    """A calling thread's 0-d arrays for the scalar inputs of a `Steady` call (a Python
    float or a NumPy scalar written into its input's dtype, as `np.asarray` converts
    it), and their addresses."""

    def __init__(self, dtypes: list[np.dtype[Any] | None]) -> None:
        self.arrays = [None if d is None else np.zeros((), d) for d in dtypes]
        self.fixed = [0 if a is None else address(a) for a in self.arrays]

    def addresses(self, inputs: Sequence[Any]) -> list[int]:
        """The inputs' addresses, each scalar written into its array first."""
        found = []
        for a, array, fixed in zip(inputs, self.arrays, self.fixed, strict=True):
            if array is None or type(a) is np.ndarray:
                found.append(address(a))
            else:
                array[()] = a
                found.append(fixed)
        return found


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


def _poisoned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A buffer of all-ones bytes: NaN for floats, -1 for integers."""
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return np.full(size, 0xFF, np.uint8).view(dtype).reshape(shape)


@dataclass(frozen=True)
class EmulatedKernel(HostKernel):
    """CUDA kernels run by the emulator. `profile` counts their memory traffic, with
    the instrumented build (`twin` gives it when this one is not)."""

    twin: Callable[[], EmulatedKernel] | None = field(default=None, compare=False, repr=False)

    def profile(self, binding: Binding) -> list[dict[str, Any]]:
        from tcpy.runtime.emulator import EmulatedKernels

        run = self.run
        assert isinstance(run, EmulatedKernels)
        if not run.instrumented:
            assert self.twin is not None
            return self.twin().profile(binding)
        shapes = self._shapes_at(binding)
        if shapes is None:  # an empty call launches nothing
            return []
        sizes, buffers, _ = self._buffers(binding, shapes)
        return run.profile(sizes, buffers)


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
