"""`ExecutionEngine`: define TC source once, call its definitions like functions.

`define` parses and checks the source (every error is a `TCError` with a caret). The
first call of a definition with a given set of input shapes and dtypes prepares a
kernel for the engine's target; later calls with the same signature reuse it.
Redefining a name replaces the definition and forgets its kernels.
"""

from __future__ import annotations

import datetime
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tcpy import log, targets
from tcpy.arrays import Kind, kind_of, wrap
from tcpy.binding import (
    Binding,
    DeviceInput,
    bind,
    bind_out,
    generic_signature_key,
    overlaps_inputs,
    signature_key,
)
from tcpy.cache import tcpy_version
from tcpy.errors import TCError, TCInputError, TCWarning, warn
from tcpy.genetic.store import TunedStore, tuned_key
from tcpy.mapping.device import named
from tcpy.mapping.options import MappingOptions
from tcpy.parser import CheckedDef, check_source
from tcpy.parser.printer import canonical
from tcpy.runtime.empty import EmptyCall
from tcpy.runtime.status import KernelFault, explained
from tcpy.targets import Kernel

if TYPE_CHECKING:  # the tuner and its libraries load when a session starts
    from tcpy.genetic.tuner import TunerConfig, TuneResult

_log = logging.getLogger("tcpy.compile")

# Options as `run`, `compile` and `tune` take them (`MappingOptions.resolve`).
OptionsArg = MappingOptions | Mapping[str, Any] | str | None


class ExecutionEngine:
    """Runs TC definitions on one target: `"cuda"` (the default on a machine with a
    GPU), `"cpu"` (the default elsewhere: C with OpenMP), `"cuda-emu"` (the CUDA kernels
    emulated on the CPU) or `"reference"` (the NumPy interpreter). Options of cuda-emu
    only: `emu_check` (default `TCPY_EMU_CHECK=1`) checks every emulated launch for
    out-of-bounds accesses, shared-memory races and divergent barriers; `device` names
    the GPU the kernels are mapped for (`tcpy.mapping.device.PROFILES`; default
    `TCPY_CUDA_DEVICE`, else "h100")."""

    def __init__(
        self, target: str | None = None, emu_check: bool | None = None, device: str | None = None
    ) -> None:
        name = target or targets.default_target()
        chosen = targets.get(name)
        for option, value in (("emu_check", emu_check), ("device", device)):
            if value is not None and name != "cuda-emu":
                raise TCError(f"{option} is an option of the cuda-emu target, not of {name}")
        if emu_check is not None or device is not None:
            if device is not None:
                named(device)  # an unknown name is an error now, not at the first call
            chosen = targets.CudaEmu(check=emu_check, device=device)
        self._setup(name, chosen)

    def _setup(self, name: str, target: targets.Target) -> None:
        self.target = name
        self._target = target
        self._defs: dict[str, CheckedDef] = {}
        self._entries: dict[str, Callable[..., Any]] = {}
        self._sources: list[tuple[str, str | None]] = []
        self._kernels: dict[tuple[str, tuple[Any, ...], str], Kernel] = {}
        self._building: dict[tuple[str, tuple[Any, ...], str], Future[None]] = {}
        self._lock = threading.Lock()
        # the options calls without options resolve to, per def and signature
        self._resolved: dict[tuple[str, tuple[Any, ...]], MappingOptions] = {}
        # calls seen before, by def, options and the shapes and dtypes of NumPy inputs
        self._calls: dict[tuple[str, Any, tuple[Any, ...]], tuple[Compiled, Mapping[str, int]]] = {}
        self._session = targets.Session(targets.open_disk_cache())
        self._tuned = TunedStore(self._session.disk)

    @property
    def stats(self) -> targets.Stats:
        """Kernels reused from memory, loaded from the disk cache, and compiled."""
        return self._session.stats

    def define(self, source: str, filename: str | None = None) -> tuple[str, ...]:
        """Parse and check every def of `source` (`filename` names it in errors);
        returns their names. A def of an existing name replaces it and its kernels.

        Raises `TCSyntaxError`, `TCSemanticError` (`TCTypeError`) or `TCRangeError`,
        each showing the line and a caret; warns (`TCWarning`) about legal code that is
        probably not what was meant."""
        start = time.perf_counter()
        defs = check_source(source, filename)
        for cdef in defs.values():
            if cdef.name in _ATTRIBUTES:
                warn(TCWarning(_shadowed(cdef.name), cdef.span, source, filename))
        _log.debug(
            "parsed and checked %s in %.1f ms", ", ".join(defs), (time.perf_counter() - start) * 1e3
        )
        with self._lock:
            for name in defs:
                self._kernels = {k: v for k, v in self._kernels.items() if k[0] != name}
                self._forget(name)
            self._defs.update(defs)
            for name in defs:
                self._entries[name] = self._entry_function(name)
            if (source, filename) in self._sources:  # the same text again: once is enough
                self._sources.remove((source, filename))
            self._sources.append((source, filename))
        return tuple(defs)

    def _forget(self, name: str | None = None) -> None:
        """Forget what calls of `name` (of every def when None) resolved to."""
        self._resolved = {k: v for k, v in self._resolved.items() if name not in (None, k[0])}
        self._calls = {k: v for k, v in self._calls.items() if name not in (None, k[0])}

    @property
    def entries(self) -> tuple[str, ...]:
        return tuple(self._defs)

    def checked(self, entry: str) -> CheckedDef:
        try:
            return self._defs[entry]
        except KeyError:
            known = ", ".join(self._defs) or "none yet"
            raise TCError(f"no def named {entry!r} is defined (defined: {known})") from None

    def default_options(self, entry: str, *inputs: Any) -> MappingOptions:
        """The target's default options for `entry` (what a call without options uses
        when no tuned options exist); `.replace(...)` them to change a few fields. They
        are the same at every size (fields such as `tile=()` leave the choice to the
        compile, which sees the sizes); `inputs`, when given, are checked against the
        def as a call checks them, raising as `run` does."""
        cdef = self.checked(entry)
        if inputs:
            try:
                bind(cdef, inputs)
            except TCError as e:
                raise cdef.located(e) from None
        return self._target.default_options(cdef)

    def device(self) -> str:
        """The device kernels run on, as tuned options are keyed by it."""
        return self._target.device()

    # --- tuning -------------------------------------------------------------------------
    def tune(
        self,
        entry: str,
        *inputs: Any,
        config: TunerConfig | None = None,
        starting_options: OptionsArg = None,
    ) -> TuneResult:
        """Search the mapping options of `entry` for the shapes and dtypes of `inputs`
        (which every candidate is checked and timed on); the best are stored, and later
        calls with those shapes, in this process and later ones, use them.
        `starting_options` (as `run` takes options) joins the search's first
        generation."""
        from tcpy.genetic.tuner import tune

        start = None
        if starting_options is not None:
            cdef = self.checked(entry)
            start = MappingOptions.resolve(
                starting_options, lambda: self._target.default_options(cdef)
            )
        return tune(self, entry, inputs, config, start)

    def tuned_options(self, entry: str, *inputs: Any) -> MappingOptions | None:
        """The stored tuned options of `entry` for these shapes on this target and
        device, if a tuning session stored some."""
        cdef = self.checked(entry)
        return self._tuned.get(self._tuned_key(cdef, bind(cdef, inputs)))

    def tuned_starting_points(self, entry: str, *inputs: Any) -> list[MappingOptions]:
        """Where a tuning session of these shapes starts besides the target's options:
        the stored tuned options for them, else those of the nearest tuned shapes."""
        cdef = self.checked(entry)
        binding = bind(cdef, inputs)
        exact = self._tuned.get(self._tuned_key(cdef, binding))
        if exact is not None:
            return [exact]
        near = self._tuned.nearest(canonical(cdef), _signature(binding), self.target, self.device())
        return [near] if near is not None else []

    def store_tuned(self, result: TuneResult) -> None:
        """Keep `result`'s options for its def, shapes, target and device."""
        record = {
            **result.to_dict(),
            "tcpy": tcpy_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        key = tuned_key(result.definition, result.inputs, result.target, result.device)
        self._tuned.put(key, record)
        self._forget()  # calls without options now resolve to the tuned options

    def load_tuned(self, path: str | Path) -> None:
        """Import tuned options saved with `TuneResult.save` (on this or another
        machine): they serve the def, shapes, target and device they were tuned for."""
        try:
            record = json.loads(Path(path).read_text())
            key = tuned_key(record["def"], record["inputs"], record["target"], record["device"])
            MappingOptions.from_dict(record["options"])
        except (OSError, ValueError, KeyError, TypeError, TCError) as e:
            raise TCError(f"cannot load tuned options from {path}: {e}") from None
        self._tuned.put(key, record)
        self._forget()  # calls without options now resolve to the tuned options

    def _tuned_key(self, cdef: CheckedDef, binding: Binding) -> str:
        return tuned_key(canonical(cdef), _signature(binding), self.target, self.device())

    def run(
        self,
        entry: str,
        *inputs: Any,
        options: OptionsArg = None,
        out: Any = None,
    ) -> Any:
        """Run `entry` on `inputs`; one output is returned bare, several as a tuple, in
        the library of the inputs (`tcpy.arrays`). `options`: complete `MappingOptions`,
        or a dict (or JSON object text) of the fields to change on the target's
        defaults for `entry`, or a preset name; None: the tuned options for these
        shapes if any, else the target's defaults. `out`: arrays to write the outputs
        into (one, or a tuple of one per output) and return.

        The first call with given shapes, dtypes and options compiles a kernel (or
        loads it from the disk cache); later ones reuse it. Raises `TCInputError` for
        inputs or `out` arrays that do not fit the def, `TCRangeError` for sizes at
        which the program is undefined, `TCMappingError` for invalid options,
        `TCCompileError` or `TCLaunchError` when the generated code does not build
        or run."""
        hit = self._known_call(entry, inputs, options)
        compiled, binding = hit if hit is not None else self._compile(entry, inputs, options)
        return compiled.call(binding, inputs, out)

    def compile(self, entry: str, *inputs: Any, options: OptionsArg = None) -> Compiled:
        """The kernel of `entry` for the shapes and dtypes of `inputs` (compiled on the
        first request, then reused from memory or from the disk cache); `options` as
        for `run`, and the same errors."""
        return self._compile(entry, inputs, options)[0]

    def _known_call(
        self, entry: str, inputs: tuple[Any, ...], options: OptionsArg
    ) -> tuple[Compiled, Binding] | None:
        """The kernel and binding of a call whose NumPy inputs have the shapes and
        dtypes of an earlier call with the same options: those were checked then, and
        every check of a call depends only on them."""
        if options is not None and not isinstance(options, MappingOptions):
            return None
        signature = _plain_signature(inputs)
        known = self._calls.get((entry, options, signature)) if signature is not None else None
        if known is None:
            return None
        self._session.stats.memory_hits += 1
        return known[0], Binding(inputs, known[1])

    def _compile(
        self, entry: str, inputs: tuple[Any, ...], given: OptionsArg
    ) -> tuple[Compiled, Binding]:
        cdef = self.checked(entry)
        try:
            binding = bind(cdef, inputs)
            signature = signature_key(binding.arrays)
            if given is None:
                # the options this signature resolves to (tuned ones for these shapes,
                # else the target's), remembered until a redefinition or a tuning
                options = self._resolved.get((entry, signature))
                if options is None:
                    tuned = self._tuned.get(self._tuned_key(cdef, binding))
                    options = tuned or self._target.default_options(cdef)
                    self._resolved[(entry, signature)] = options
            else:
                options = MappingOptions.resolve(given, lambda: self._target.default_options(cdef))
            if binding.on_device and not self._target.accepts_device_arrays:
                raise TCInputError(
                    f"the {self.target} target takes host arrays, and an input of "
                    f"{entry} is in GPU memory; use the cuda target or copy it to the host"
                )
            if binding.empty:  # nothing to compile: the reference interpreter runs it
                kernel: Kernel = EmptyCall(cdef, options)
            else:
                kernel = self._kernel(cdef, binding, signature, options)
        except TCError as e:
            raise cdef.located(e) from None
        compiled = Compiled(cdef, kernel, _signature_of(kernel, binding), binding.sizes)
        plain = _plain_signature(inputs)
        fast = given is None or isinstance(given, MappingOptions)
        if plain is not None and fast and not binding.empty:
            if len(self._calls) >= _KNOWN_CALLS:
                self._calls.clear()
            self._calls[(entry, given, plain)] = (compiled, binding.sizes)
        return compiled, binding

    def _kernel(
        self, cdef: CheckedDef, binding: Binding, signature: Any, options: MappingOptions
    ) -> Kernel:
        """The kernel for these options and shapes: from memory, else prepared by the
        target (from the disk cache or compiled), once: a call that needs a kernel
        another thread is preparing waits for it."""
        key = (cdef.name, signature, options.to_json())
        # a size-generic kernel serves every shape of its inputs' ranks and dtypes
        generic = (cdef.name, generic_signature_key(binding.arrays), key[2])
        wants_generic = (
            self._target.generic_kernels and not options.fix_parameters_before_scheduling
        )
        while True:
            with self._lock:
                kernel = self._kernels.get(key)
                if kernel is None and self._target.generic_kernels:
                    kernel = self._kernels.get(generic)
                if kernel is not None:
                    self._session.stats.memory_hits += 1
                    return kernel
                building = generic if wants_generic else key
                pending = self._building.get(building)
                if pending is None:
                    reason = self._reason(key)
                    pending = self._building[building] = Future()
                    break
            pending.result()  # raises what the preparing thread raised
        try:
            kernel = self._prepare(cdef, binding, options, reason)
            with self._lock:
                self._kernels[generic if kernel.generic else key] = kernel
            pending.set_result(None)
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                del self._building[building]
        return kernel

    def _reason(self, key: tuple[str, Any, str]) -> str:
        """Why a kernel is prepared: what its def's other kernels in memory lack."""
        mine = [k for k in self._kernels if k[0] == key[0]]
        if any(k[2] == key[2] for k in mine):
            return "new shapes"
        if any(k[1] == key[1] for k in mine):
            return "new options"
        return "first call" if not mine else "new shapes and options"

    def _prepare(
        self, cdef: CheckedDef, binding: Binding, options: MappingOptions, reason: str
    ) -> Kernel:
        start = time.perf_counter()
        with log.timed() as stages:
            kernel = self._target.prepare(cdef, binding, options, self._session)
        if _log.isEnabledFor(logging.INFO):
            how = "compiled" if stages else "loaded from the disk cache"
            shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in binding.arrays)
            _log.info(
                "%s(%s) on %s: %s (%s) in %.1f ms%s%s",
                cdef.name, shapes, self.target, how, reason,
                (time.perf_counter() - start) * 1e3,
                ": " if stages else "", log.stage_summary(stages),
            )  # fmt: skip
        return kernel

    def _entry_function(self, name: str) -> Callable[..., Any]:
        """`engine.<name>`: a function with the def's signature and a docstring."""
        cdef = self._defs[name]

        def call(*inputs: Any, options: OptionsArg = None, out: Any = None) -> Any:
            return self.run(name, *inputs, options=options, out=out)

        kinds = inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.KEYWORD_ONLY
        call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(t.name, kinds[0]) for t in cdef.inputs]
            + [inspect.Parameter(p, kinds[1], default=None) for p in ("options", "out")]
        )
        call.__name__ = call.__qualname__ = name
        call.__doc__ = _docstring(cdef, self.target)
        return call

    def __getattr__(self, name: str) -> Callable[..., Any]:
        entries = self.__dict__.get("_entries", {})
        if name in entries:
            return entries[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or def {name!r}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._defs]

    def __repr__(self) -> str:
        defs = ", ".join(self._defs) or "none"
        return (
            f"ExecutionEngine(target={self.target!r}, defs: {defs}, kernels: {len(self._kernels)})"
        )

    # --- pickling: the definitions and the target travel, kernels are loaded again --
    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target, "_target": self._target, "sources": self._sources}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["target"], state["_target"])
        for source, filename in state["sources"]:
            self.define(source, filename)


class Compiled:
    """A kernel for one signature: `.source` is the generated code, `.options` the
    mapping options it was built with (those asked for, as any fallback of the
    compiler changed them); call it with inputs of that signature: the shapes and
    dtypes it was compiled for, or, when `.generic`, any shapes of those ranks and
    dtypes."""

    def __init__(
        self, cdef: CheckedDef, kernel: Kernel, signature: Any, sizes: Mapping[str, int]
    ) -> None:
        self.cdef = cdef
        self.options = kernel.options
        self._kernel = kernel
        self._signature = signature
        self._sizes = sizes
        # the shapes and dtypes of NumPy inputs a call was checked at (fixed sizes only)
        self._plain: tuple[Any, ...] | None = None
        # where an unchecked call of a generic kernel reads each size: (input, dim)
        self._size_dims = {
            name: (k, d)
            for k, info in reversed(list(enumerate(cdef.inputs)))
            for d, dim in reversed(list(enumerate(info.shape)))
            if not dim.is_const
            for name in dim.symbols()
        }

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
        compiled for, and `out` arrays of the
        outputs' shapes that share no memory with the inputs. Anything else is
        undefined: wrong results, or a crash."""
        if unchecked:
            binding = self._unchecked(inputs)
            return _single(self._kernel(binding, out if out is None else _tuple(out)), out)
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

    def run(self, binding: Binding) -> Any:
        """Run on inputs already bound (and checked) for this kernel's signature; the
        outputs as NumPy arrays (or device arrays)."""
        return self.call(binding, (), None)

    def profile(self, *inputs: Any) -> list[dict[str, Any]]:
        """Run once on the `cuda-emu` target, counting: one dict per kernel launch, with
        `kernel`, `grid`, `block`, `global_load_bytes`, `global_store_bytes`,
        `global_requests`, `global_sectors`, `shared_bytes`, `bank_conflicts`,
        `barriers`, `shuffles` and `atomics` (see `tcpy.runtime.emulator`)."""
        binding = self._bind(inputs)
        profile = getattr(self._kernel, "profile", None)
        if profile is None:
            raise TCError("profiles are counted by the emulator: compile on the cuda-emu target")
        try:
            return list(profile(binding))
        except TCError as e:
            raise self.cdef.located(e) from None

    def _bind(self, inputs: tuple[Any, ...]) -> Binding:
        plain = _plain_signature(inputs)
        if plain is not None and plain == self._plain:  # checked at these shapes before
            return Binding(inputs, self._sizes)
        try:
            binding = bind(self.cdef, inputs)
        except TCError as e:
            raise self.cdef.located(e) from None
        if _signature_of(self._kernel, binding) != self._signature:
            what = "ranks" if self._kernel.generic else "shapes"
            raise TCInputError(
                f"this kernel of {self.cdef.name} was compiled for other input {what} or "
                "dtypes; compile it again (or call the engine) for these"
            )
        if not self._kernel.generic:
            self._plain = plain
        return binding

    def _unchecked(self, inputs: tuple[Any, ...]) -> Binding:
        if not self._kernel.generic:
            return Binding(inputs, self._sizes)
        sizes = {name: inputs[k].shape[d] for name, (k, d) in self._size_dims.items()}
        return Binding(inputs, sizes)


_KNOWN_CALLS = 4096  # the calls remembered for the fast path, per engine

# What `engine.<name>` finds before a def of that name (methods, properties, attributes).
_ATTRIBUTES = frozenset(n for n in [*dir(ExecutionEngine), "target"] if not n.startswith("_"))


def _shadowed(name: str) -> str:
    return (
        f"def {name} cannot be called as engine.{name}(...), which is the engine's own "
        f"{name}; call it as engine.run({name!r}, ...)"
    )


def _plain_signature(inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The shapes and dtypes of a call's inputs when all are C-contiguous NumPy arrays
    (which binding uses as they are), else None."""
    signature = []
    for a in inputs:
        if type(a) is not np.ndarray or not a.flags.c_contiguous:
            return None
        signature.append((a.shape, a.dtype))
    return tuple(signature)


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


def _docstring(cdef: CheckedDef, target: str) -> str:
    def shape(t: Any) -> str:
        return f"{t.scalar.value}({', '.join(map(str, t.shape))})"

    inputs = "\n".join(f"    {t.name}: {shape(t)}" for t in cdef.inputs)
    outputs = "\n".join(f"    {t.name}: {shape(t)}" for t in cdef.outputs)
    body = "\n".join(f"    {st.text}" for st in cdef.statements)
    returns = "the output" if len(cdef.outputs) == 1 else "a tuple of the outputs"
    return (
        f"Run the TC def {cdef.name} on the {target} target; returns {returns}.\n\n"
        f"Inputs:\n{inputs}\n\nOutputs:\n{outputs}\n\nStatements:\n{body}\n\n"
        "Keyword arguments: options (MappingOptions, a dict of fields to change on the "
        "target's defaults, or a preset name) and out (arrays to write the outputs into)."
    )


def _signature_of(kernel: Kernel, binding: Binding) -> tuple[Any, ...]:
    """What the inputs of a call must match to run `kernel`: their ranks and dtypes
    for a size-generic kernel, else their shapes and dtypes."""
    arrays = binding.arrays
    return generic_signature_key(arrays) if kernel.generic else signature_key(arrays)


def _signature(binding: Binding) -> list[list[Any]]:
    return [[list(a.shape), str(a.dtype)] for a in binding.arrays]
