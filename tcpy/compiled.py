"""`Compiled`: the kernel of a def for one signature, callable on its own.

`ExecutionEngine.compile` returns it: `.source` is the generated code, `.options` the
mapping options it was built with, `.cache_key` its disk-cache entry. A call checks its
inputs (or, with `unchecked=True`, nothing), runs the kernel and returns the outputs in
the library of the inputs. It pickles as what rebuilds it (the target, the def's source
and the options, for a function of the engine that made it: this module never imports
the engine), and is loaded again from the disk cache in the receiving process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tcpy import targets
from tcpy.arrays import Kind, kind_of, new_device_outputs, wrap
from tcpy.binding import (
    Binding,
    DeviceCall,
    DeviceInput,
    bind,
    bind_out,
    device_input,
    device_signature,
    generic_signature_key,
    overlaps_inputs,
    signature_key,
)
from tcpy.empty import EmptyCall
from tcpy.errors import TCError, TCInputError
from tcpy.host_kernels import Prepared, Steady
from tcpy.kernels import Iterations, Kernel
from tcpy.parser import CheckedDef
from tcpy.reference import interpreter
from tcpy.runtime.status import KernelFault


@dataclass(frozen=True)
class Origin:
    """Where a kernel came from, as its pickle carries it: the engine's target, by name
    and as the instance with its options, and `rebuild`, a module-level function of
    the engine's (pickled by its name) that makes the kernel again in another process:
    `rebuild(target_name, target, source, filename, name, options, inputs)`, where
    `inputs` are the `(shape, dtype)` of each input it was compiled at."""

    target_name: str
    target: targets.Target
    rebuild: Callable[..., Compiled]


class Compiled:
    """A kernel for one signature: `.source` is the generated code, `.options` the
    mapping options it was built with (those asked for, as any fallback of the
    compiler changed them); call it with inputs of that signature: the shapes and
    dtypes it was compiled for, or, when `.generic`, any shapes of those ranks and
    dtypes."""

    def __init__(
        self,
        cdef: CheckedDef,
        kernel: Kernel,
        signature: Any,
        sizes: Mapping[str, int],
        origin: Origin | None = None,
    ) -> None:
        self.cdef = cdef
        self._origin = origin  # how to rebuild it; None: it cannot be pickled
        self.options = kernel.options
        self._kernel = kernel
        # the steady path on GPU arrays (`GpuKernels.device_call`: the arrays' checks
        # made by an earlier call with the same `device_signature`), None elsewhere
        self.device_call: Callable[[Mapping[str, int], DeviceCall], Any] | None = getattr(
            kernel, "device_call", None
        )
        self._signature = signature
        self._sizes = sizes
        # the shapes and dtypes of NumPy inputs calls were checked at (fixed sizes only:
        # several where scalars came as Python floats and as NumPy scalars), and the
        # host kernel's calls on such inputs made ready (`HostKernel.steady`)
        self._plain: set[tuple[Any, ...]] = set()
        self._steady: Steady | None = None
        self._steady_tried = False
        # the `device_signature` key of GPU inputs a call was checked at, and its sizes
        self._device: tuple[tuple[Any, ...], Mapping[str, int]] | None = None
        # where an unchecked call of a generic kernel reads each size: (input, dim)
        self._size_dims = {
            name: (k, d)
            for k, info in reversed(list(enumerate(cdef.inputs)))
            for d, dim in reversed(list(enumerate(info.shape)))
            if not dim.is_const
            for name in dim.symbols()
        }
        # the inputs of rank 0: a NumPy scalar there is passed as a 0-d array unchecked too
        self._scalars = tuple(k for k, info in enumerate(cdef.inputs) if not info.shape)
        self.input_dtypes = tuple(info.scalar.dtype for info in cdef.inputs)
        """Each input's NumPy dtype (what a scalar given for it becomes)."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as what rebuilds it: the target, the def and the options, with the
        shapes and dtypes of the call it was compiled at, for its origin's `rebuild`;
        the receiving process loads the kernel from the disk cache, or compiles it where
        the cache lacks it."""
        origin = self._origin
        if origin is None:
            raise TypeError("this kernel was not made by an engine, and cannot be pickled")
        dtypes = [dtype for _, dtype in self._signature]
        shapes = [tuple(d.evaluate(self._sizes) for d in t.shape) for t in self.cdef.inputs]
        where = (self.cdef.source, self.cdef.filename, self.cdef.name)
        inputs = list(zip(shapes, dtypes, strict=True))
        return (origin.rebuild, (origin.target_name, origin.target, *where, self.options, inputs))

    @property
    def source(self) -> str:
        return self._kernel.source

    @property
    def cache_key(self) -> str:
        """The key of the kernel's entry in the disk cache ("" on the reference target)."""
        return self._kernel.cache_key

    @property
    def generic(self) -> bool:
        """Whether the kernel reads the sizes at each call and serves every shape
        (`fix_parameters_before_scheduling=False` on the cpu target)."""
        return self._kernel.generic

    def __call__(self, *inputs: Any, out: Any = None, unchecked: bool = False) -> Any:
        """Run on `inputs` (`out` as for `ExecutionEngine.run`). With `unchecked=True`
        nothing about the inputs is checked or converted: for hot loops that pass
        C-contiguous NumPy arrays of exactly the dtypes and shapes this kernel was
        compiled for (NumPy scalars of the exact dtype for scalar inputs), and `out`
        arrays of the
        outputs' shapes that share no memory with the inputs. Anything else is
        undefined: wrong results, or a crash."""
        if unchecked:
            dests = out if out is None else _tuple(out)
            host = self._steady_made(lambda: self._unchecked(inputs))
            if host is not None:
                return _single(host(inputs, dests), out)
            return _single(self._kernel(self._unchecked(inputs), dests), out)
        if out is None and self._plain and plain_signature(inputs) in self._plain:
            return self.plain_call(inputs, self._sizes)  # the signature checked before
        steady = self.device_call
        if out is None and self._device is not None and steady is not None:
            call = device_signature(inputs) if plain_signature(inputs) is None else None
            if call is not None and call.key == self._device[0]:  # checked before
                return steady(self._device[1], call)
        return self.call(self._bind(inputs), inputs, out)

    def __repr__(self) -> str:
        if self.generic:  # the signature holds ranks: show the declared shapes
            shapes = ", ".join(
                f"{t.name}: {dtype}({', '.join(map(str, t.shape))})"
                for t, (_, dtype) in zip(self.cdef.inputs, self._signature, strict=True)
            )
            what = "any sizes"
        else:
            shapes = ", ".join(
                f"{t.name}: {dtype}{list(shape)}"
                for t, (shape, dtype) in zip(self.cdef.inputs, self._signature, strict=True)
            )
            what = "these shapes"
        return f"<Compiled {self.cdef.name}({shapes}) for {what}, key {self.cache_key[:12] or '-'}>"

    def call(self, binding: Binding, inputs: tuple[Any, ...], out: Any) -> Any:
        """Run on inputs already bound (and checked) for this kernel's signature; the
        outputs in the library of `inputs`, or written into `out`."""
        # an empty call runs no compiled code, whatever kernel this is
        kernel = EmptyCall(self.cdef, self.options) if binding.empty else self._kernel
        try:
            if out is None:
                kind = kind_of(inputs)
                made = self._library_outputs(binding, inputs, kind)
                if made is not None:  # written in place, as out= would be
                    infos = self.cdef.outputs
                    kernel(binding, tuple(map(device_input, infos, made, ("out",) * len(made))))
                    return _single(made, None)
                outputs = kernel(binding)
                return _single(outputs if kind is Kind.NUMPY else wrap(outputs, kind), None)
            dests = bind_out(self.cdef, binding, out)
            device = any(isinstance(d, DeviceInput) for d in dests)
            if device and not getattr(kernel, "accepts_device_out", False):
                raise TCInputError(
                    f"out= is in GPU memory, and this kernel of {self.cdef.name} runs on "
                    "the host; pass host arrays"
                )
            if overlaps_inputs(binding, dests):  # computed aside, then copied in
                for dest, result in zip(dests, kernel(binding), strict=True):
                    _copy_into(dest, result)
            else:
                kernel(binding, dests)
            return _single(_tuple(out), out)
        except KernelFault as e:  # where the values made the kernel fault
            raise self.cdef.located(explained(self.cdef, binding, e)) from None
        except TCError as e:
            raise self.cdef.located(e) from None

    def _library_outputs(
        self, binding: Binding, inputs: tuple[Any, ...], kind: Kind
    ) -> tuple[Any, ...] | None:
        """New outputs from the caching allocator of the inputs' library, for a call on
        the GPU with PyTorch or CuPy inputs (`arrays.new_device_outputs`); else None."""
        if kind is Kind.NUMPY or binding.empty or not binding.on_device:
            return None
        if not getattr(self._kernel, "accepts_device_out", False):
            return None
        specs = [(binding.shape_of(t), t.scalar.dtype) for t in self.cdef.outputs]
        return new_device_outputs(kind, inputs, specs)

    def plain_call(self, inputs: tuple[Any, ...], sizes: Mapping[str, int]) -> Any:
        """Run on NumPy inputs of a plain signature (`plain_signature`) that a call
        checked before, at that call's `sizes`; the outputs new NumPy arrays. A
        fixed-size host kernel runs by its `Steady` (made at the first such call),
        others through a binding."""
        steady = self._steady_made(lambda: Binding(plain_arrays(self.input_dtypes, inputs), sizes))
        if steady is None:
            return self.call(Binding(plain_arrays(self.input_dtypes, inputs), sizes), inputs, None)
        try:
            return _single(steady(inputs), None)
        except KernelFault as e:
            binding = Binding(plain_arrays(self.input_dtypes, inputs), sizes)
            raise self.cdef.located(explained(self.cdef, binding, e)) from None
        except TCError as e:
            raise self.cdef.located(e) from None

    def _steady_made(self, binding: Callable[[], Binding]) -> Steady | None:
        """The kernel's `Steady` calls, made at the first call that asks (from the
        `binding` of its inputs); None for a kernel without them or a generic one."""
        if not self._steady_tried:
            make = getattr(self._kernel, "steady", None)
            if make is not None and not self._kernel.generic:
                self._steady = make(binding())
            self._steady_tried = True
        return self._steady

    def run(self, binding: Binding) -> Any:
        """Run on inputs already bound (and checked) for this kernel's signature; the
        outputs as NumPy arrays (or device arrays)."""
        return self.call(binding, (), None)

    def profile(self, *inputs: Any) -> list[dict[str, Any]]:
        """Run once on the `cuda-emu` target, counting: one dict per kernel launch, with
        `kernel`, `grid`, `block`, `global_load_bytes`, `global_store_bytes`,
        `global_requests`, `global_sectors`, `shared_bytes`, `bank_conflicts`,
        `barriers`, `shuffles`, `atomics` and the footprint's `distinct_load_sectors`,
        `distinct_store_sectors` and `distinct_sectors` (see `tcpy.runtime.emulator`)."""
        binding = self._bind(inputs)
        profile = getattr(self._kernel, "profile", None)
        if profile is None:
            raise TCError("profiles are counted by the emulator: compile on the cuda-emu target")
        try:
            return list(profile(binding))
        except TCError as e:
            raise self.cdef.located(e) from None

    def prepared(self, *inputs: Any) -> Prepared | None:
        """This kernel's call on inputs of these shapes and dtypes, checked once and
        made ready (`host_kernels.Prepared`): for a caller that allocates the outputs and
        calls again and again at one signature. None where there is none to make: a
        kernel that does not run on the host, or an empty call."""
        binding = self._bind(inputs)
        prepare = getattr(self._kernel, "prepare", None)
        if prepare is None or binding.empty:
            return None
        return prepare(binding)

    def iterations(self, *inputs: Any) -> Iterations:
        """Run once with a counting build of this kernel (on `cpu` and `cuda-emu`; built
        on first use, and cached) and return what it executed: the iterations of each
        of its loops, against the statement instances the def holds at these sizes and
        the GPU threads launched (`Iterations.runaway`: far more loop iterations than
        work, the symptom of a loop bounded by something no domain reaches). The
        outputs of that run are dropped; the kernel's own calls are not counted."""
        binding = self._bind(inputs)
        count = getattr(self._kernel, "iterations", None)
        if count is None:
            raise TCError("loops are counted on the cpu and cuda-emu targets")
        try:
            return count(binding)
        except TCError as e:
            raise self.cdef.located(e) from None

    def _bind(self, inputs: tuple[Any, ...]) -> Binding:
        plain = plain_signature(inputs)
        if plain is not None and plain in self._plain:  # checked at these shapes before
            return Binding(plain_arrays(self.input_dtypes, inputs), self._sizes)
        try:
            binding = bind(self.cdef, inputs)
        except TCError as e:
            raise self.cdef.located(e) from None
        if signature_of(self._kernel, binding) != self._signature:
            what = "ranks" if self._kernel.generic else "shapes"
            raise TCInputError(
                f"this kernel of {self.cdef.name} was compiled for other input {what} or "
                "dtypes; compile it again (or call the engine) for these"
            )
        fixed = not self._kernel.generic
        if fixed and plain is not None and len(self._plain) < PLAIN_SIGNATURES:
            self._plain.add(plain)
        if plain is None and not binding.empty and self.device_call is not None:
            call = device_signature(inputs)
            if call is not None:
                self._device = (call.key, binding.sizes)
        return binding

    def _unchecked(self, inputs: tuple[Any, ...]) -> Binding:
        if self._scalars:  # `alpha` as `np.float32(0.5)`: a 0-d array (no buffer else)
            inputs = tuple(
                np.asarray(a) if k in self._scalars and isinstance(a, np.generic) else a
                for k, a in enumerate(inputs)
            )
        if not self._kernel.generic:
            return Binding(inputs, self._sizes)
        sizes = {name: inputs[k].shape[d] for name, (k, d) in self._size_dims.items()}
        return Binding(inputs, sizes)


PLAIN_SIGNATURES = 8
"""The plain signatures a fixed-size kernel remembers as checked (they differ only in
how scalars come: Python floats or NumPy scalars)."""


def plain_signature(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The shapes and dtypes of a call's inputs when each is a C-contiguous NumPy
    array, a NumPy scalar or a Python float (which binding takes as they are, the
    scalars as 0-d arrays: `plain_arrays`), else None."""
    signature: list[Any] = []
    for a in inputs:
        kind = type(a)
        if kind is np.ndarray:
            if not a.flags.c_contiguous:
                return None
            signature.append((a.shape, a.dtype))
        elif kind is float:  # converted to the input's type, which a float must be
            signature.append(float)
        elif isinstance(a, np.generic):
            signature.append(((), a.dtype))
        else:
            return None
    return tuple(signature)


def plain_arrays(dtypes: Sequence[np.dtype[Any]], inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs of a plain signature, checked at an earlier call of that signature,
    as binding makes them: each scalar a 0-d array of its input's dtype (`dtypes`;
    taking a scalar this way saved 15 us of a call with two scalars)."""
    if all(type(a) is np.ndarray for a in inputs):
        return inputs
    return tuple(
        a if type(a) is np.ndarray else np.asarray(a, dtype)
        for dtype, a in zip(dtypes, inputs, strict=True)
    )


def _tuple(out: Any) -> tuple[Any, ...]:
    return out if isinstance(out, tuple) else (out,)


def _single(outputs: tuple[Any, ...], out: Any) -> Any:
    """One output bare, several as a tuple (`out` as the caller gave it)."""
    if out is not None:
        return out
    return outputs[0] if len(outputs) == 1 else outputs


def _copy_into(dest: Any, result: Any) -> None:
    if isinstance(dest, np.ndarray):
        np.copyto(dest, result if isinstance(result, np.ndarray) else result.get())
    else:
        raise TCInputError("out= in GPU memory shares memory with an input; give a separate array")


def signature_of(kernel: Kernel, binding: Binding) -> tuple[Any, ...]:
    """What the inputs of a call must match to run `kernel`: their ranks and dtypes
    for a size-generic kernel, else their shapes and dtypes."""
    arrays = binding.arrays
    return generic_signature_key(arrays) if kernel.generic else signature_key(arrays)


EXPLAIN_POINTS = 1 << 26
"""The most statement instances `explained` interprets (a few seconds of NumPy at
most); a larger call keeps the kernel's own message."""


def explained(cdef: CheckedDef, binding: Binding, fault: KernelFault) -> TCError:
    """The error the reference interpreter raises on the call that made a compiled
    kernel fault; the fault itself, with a hint, when the inputs are in GPU memory, the
    call is too large to interpret quickly, or the interpreter finds nothing."""
    points = sum(
        math.prod(max(hi - lo, 0) for lo, hi in binding.ranges(st).values())
        for st in cdef.statements
    )
    if points <= EXPLAIN_POINTS and not any(isinstance(a, DeviceInput) for a in binding.arrays):
        try:
            interpreter.run(cdef, binding)
        except TCError as e:
            return e
    return KernelFault(f"{fault}; the reference target names the index values")
