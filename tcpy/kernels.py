"""What a compiled definition runs at a call: a `Kernel`, which computes the outputs
of a binding, one class per way of running (the interpreter, host code, emulated CUDA,
the GPU). `tcpy.targets` builds them; `tcpy.compiled` calls them."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tcpy import knobs
from tcpy.binding import Binding, empty_at
from tcpy.empty import EmptyCall
from tcpy.errors import TCError
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef, Role, TensorInfo
from tcpy.poly.scop import instances
from tcpy.reference import interpreter
from tcpy.runtime.cpu import address
from tcpy.runtime.loop_counts import LoopCounters

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
                np.empty(shape, dtype) if written else np.zeros(shape, dtype)
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
        return np.empty(shape, dtype)

    def _temporaries(self, shapes: list[tuple[int, ...]], poison: bool) -> list[np.ndarray]:
        temporaries = self.cdef.temporaries
        if not temporaries:
            return []
        kept: list[np.ndarray] | None = getattr(self._scratch, "buffers", None)
        if kept is None or [b.shape for b in kept] != shapes:
            kept = [np.empty(s, t.scalar.dtype) for s, t in zip(shapes, temporaries, strict=True)]
            self._scratch.buffers = kept
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
        kernel, shapes = self.kernel, self.temporaries

        def with_scratch(addresses: Sequence[int]) -> None:
            scratch = kernel._temporaries(shapes, poison=False)
            call([*addresses, *map(address, scratch)])

        return with_scratch


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
    then stay on the device (`DeviceArray`, which PyTorch and CuPy take without copy).

    A call borrows what it does not hand to the caller from the driver's memory pool
    (`runtime.pool`): the copies of host inputs, the temporaries, host outputs on their
    way back and the status word. Outputs and temporaries start at zero, except the
    tensors the kernels write whole before reading them (`written`), which are not
    filled (with `TCPY_POISON=1`, filled with all-ones bytes, so that an element the
    kernels failed to write shows). Every copy, memset and launch of a call is queued
    on the caller's current stream (`runtime.streams.call_streams`), the kernels back
    to back; the call synchronises that stream once, after the last, and then checks
    the status word. With `asynchronous`, a call whose outputs all stay on the device
    returns without waiting: its status word is read at the next call on the GPU or at
    `runtime.settle` (`ExecutionEngine.synchronize`), which synchronise its stream and
    raise its failure then; the memory it borrowed goes back to the pool pending on its
    stream."""

    cdef: CheckedDef
    source: str
    functions: list[Any]
    launches: list[Launch]
    options: MappingOptions
    written: frozenset[str] = frozenset()
    asynchronous: bool = False
    generic: bool = False
    cache_key: str = ""
    accepts_device_out: ClassVar[bool] = True

    def __call__(self, binding: Binding, out: Outputs = None) -> tuple[Any, ...]:
        from tcpy.runtime import cuda as runtime
        from tcpy.runtime import streams

        drv = runtime.driver()
        runtime.settle(drv)  # an earlier call's failure is reported before this one runs
        dests = out or (None,) * len(self.cdef.outputs)
        # the caller's stream (and those of other libraries' arrays among the inputs)
        ordered = streams.call_streams((*binding.arrays, *dests))
        streams.enter(drv, ordered)
        try:
            return self._run(drv, binding, dests, ordered[0])
        finally:
            streams.leave(drv, ordered)

    def _run(
        self, drv: Any, binding: Binding, dests: tuple[Any, ...], stream: int
    ) -> tuple[Any, ...]:
        """The call's work, every operation queued on `stream` in order."""
        from tcpy.binding import DeviceInput
        from tcpy.runtime import cuda as runtime
        from tcpy.runtime.status import check_status
        from tcpy.runtime.streams import PER_THREAD

        memory = runtime.pool(drv)
        cdef = self.cdef
        borrowed: list[int] = []  # given back to the pool when the call ends
        handed: list[int] = []  # the caller's, unless the call fails
        pending: int | None = stream  # the stream whose queued work may use `borrowed`

        def borrow(nbytes: int) -> int:
            borrowed.append(memory.acquire(nbytes, stream))
            return borrowed[-1]

        try:
            pointers = []
            for a in binding.arrays:
                if isinstance(a, DeviceInput):
                    pointers.append(a.pointer)
                else:
                    pointers.append(borrow(a.nbytes))
                    drv.to_device(pointers[-1], a, stream)
            results = []
            tensors = (*cdef.outputs, *cdef.temporaries)
            for t, dest in zip(tensors, (*dests, *(None,) * len(cdef.temporaries)), strict=True):
                shape = binding.shape_of(t)
                nbytes = int(np.prod(shape, dtype=np.int64)) * t.scalar.dtype.itemsize
                if isinstance(dest, DeviceInput):
                    pointer = dest.pointer
                elif t.role is Role.OUTPUT and dest is None and binding.on_device:
                    pointer = drv.alloc(max(nbytes, 1))  # a DeviceArray of the caller's
                    handed.append(pointer)
                else:
                    pointer = borrow(nbytes)
                if t.name not in self.written:
                    drv.memset(pointer, 0, nbytes, stream)
                elif knobs.poison_buffers():
                    drv.memset(pointer, 0xFF, nbytes, stream)
                results.append((t, shape, pointer, dest))
                pointers.append(pointer)
            status = borrow(4)
            drv.memset(status, 0, 4, stream)
            args = [("i64", binding.sizes[s]) for s in cdef.size_symbols]
            args += [("ptr", p) for p in pointers] + [("ptr", status)]
            for function, (grid, block) in zip(self.functions, self.launches, strict=True):
                drv.launch(function, grid, block, args, stream)
            stays = all(dest is None or isinstance(dest, DeviceInput) for dest in dests)
            # another thread could not synchronise this thread's per-thread stream
            if self.asynchronous and binding.on_device and stays and stream != PER_THREAD:
                runtime.defer(drv, borrowed.pop(), cdef.name, stream)  # read later
            else:
                runtime.wait(drv, stream)  # once per call: a failed launch raises here
                pending = None
                code = np.zeros(1, np.int32)
                drv.to_host(code, status, stream)
                check_status(int(code[0]))
            outputs = self._collect(drv, binding, results, stream)
            handed.clear()
            return tuple(outputs)
        finally:
            for pointer in borrowed:
                memory.release(pointer, pending)
            for pointer in handed:  # the call failed before handing them over
                drv.free(pointer)

    @staticmethod
    def _collect(drv: Any, binding: Binding, results: list[Any], stream: int) -> list[Any]:
        """The outputs: the destinations given (a host one copied into), else new
        arrays on the device for device inputs, on the host for host inputs."""
        from tcpy.binding import DeviceInput
        from tcpy.runtime import cuda as runtime

        outputs: list[Any] = []
        for t, shape, pointer, dest in results:
            if isinstance(dest, DeviceInput):
                outputs.append(dest)
            elif t.role is not Role.OUTPUT:
                continue
            elif dest is not None or not binding.on_device:
                host = np.empty(shape, t.scalar.dtype) if dest is None else dest
                drv.to_host(host, pointer, stream)
                outputs.append(host)
            else:
                outputs.append(runtime.DeviceArray(shape, t.scalar.dtype, pointer, drv, stream))
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
        from tcpy.runtime import cuda as runtime

        runtime.driver()  # raises the TCLaunchError that says why there is no GPU
        raise TCError("a GPU appeared after these kernels were compiled; compile again")
