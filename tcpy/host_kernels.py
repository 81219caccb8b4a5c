"""The kernels that run on the host (`tcpy.kernels`): compiled C (`HostKernel`), its
calls made ready for a caller that holds the buffers (`Prepared`, `Steady`), and
CUDA run by the emulator (`EmulatedKernel`)."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tcpy import knobs
from tcpy.binding import Binding, empty_at
from tcpy.empty import EmptyCall
from tcpy.errors import TCError
from tcpy.kernels import Iterations, Outputs
from tcpy.mapping.options import MappingOptions
from tcpy.parser.checked import CheckedDef, TensorInfo
from tcpy.poly.scop import instances
from tcpy.runtime.cpu import address, addresses
from tcpy.runtime.host_pool import POOL
from tcpy.runtime.loop_counts import LoopCounters


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
            call([*addresses, *scratch_addresses(kernel, shapes, False, mine)])

        return with_scratch


def scratch_addresses(
    kernel: HostKernel, shapes: list[tuple[int, ...]], poison: bool, held: threading.local
) -> list[int]:
    """The addresses of the calling thread's temporaries of `shapes`, made ready for a
    call (`HostKernel._temporaries`); `held` keeps them while the buffers stay."""
    scratch = kernel._temporaries(shapes, poison)
    if getattr(held, "scratch", None) is not scratch:  # new buffers: new addresses
        held.scratch, held.addresses = scratch, [address(b) for b in scratch]
    addresses: list[int] = held.addresses
    return addresses


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
        # how each new output is made: uninitialised where the kernel writes it whole
        self._fresh = [
            (POOL.empty if written else np.zeros, shape, dtype)
            for shape, dtype, written in self._outputs
        ]
        self._temporaries = prepared.temporaries
        # each input's dtype where it is a scalar, None for an array
        self._scalars = [None if info.shape else info.scalar.dtype for info in cdef.inputs]
        self._any_scalar = any(d is not None for d in self._scalars)
        self._held = threading.local()

    def __call__(self, inputs: Sequence[Any], out: Outputs = None) -> tuple[np.ndarray, ...]:
        """The outputs of a call on `inputs`: new arrays, or `out`'s (of the outputs'
        shapes and dtypes, C-contiguous, apart from the inputs: not checked)."""
        poison = knobs.poison_buffers()
        if out is not None or poison:
            dests = out or (None,) * len(self._infos)
            outputs = tuple(
                self._kernel._output(t, shape, d, poison)
                for t, (shape, _, _), d in zip(self._infos, self._outputs, dests, strict=True)
            )
        else:
            outputs = tuple([make(shape, dtype) for make, shape, dtype in self._fresh])
        if self._any_scalar:
            found = self._scalar_slots().addresses(inputs)
            found += addresses(outputs)
        else:
            found = addresses((*inputs, *outputs))
        if self._temporaries:
            found += scratch_addresses(self._kernel, self._temporaries, poison, self._held)
        self._call(found)
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
