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
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tcpy import log, targets
from tcpy.binding import (
    Binding,
    DeviceCall,
    bind,
    device_signature,
    generic_signature_key,
    host_tensors,
    signature_key,
)
from tcpy.cache import TunedStore, tcpy_version, tuned_key
from tcpy.compiled import Compiled, Origin, plain_arrays, plain_signature, signature_of
from tcpy.empty import EmptyCall
from tcpy.errors import TCError, TCInputError, TCWarning, warn
from tcpy.kernels import Kernel
from tcpy.mapping.gpu.device import named
from tcpy.mapping.options import MappingOptions
from tcpy.parser import CheckedDef, check_source
from tcpy.parser.printer import canonical

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
    the GPU the kernels are mapped for (`tcpy.mapping.gpu.device.PROFILES`; default
    `TCPY_CUDA_DEVICE`, else "h100"). Option of cuda only: `asynchronous` (default
    True) lets a call whose inputs and outputs are on the device return once its
    kernels are queued on the caller's current stream (`tcpy.runtime.streams`); a
    failure they meet (an out-of-range gather, a division by zero, a failed launch) is
    raised at a later call, by `synchronize()`, or when host data is read, naming the
    def and the call. `asynchronous=False` (or `TCPY_LAUNCH_BLOCKING=1`) makes every
    call wait and check, as calls on NumPy arrays always do."""

    def __init__(
        self,
        target: str | None = None,
        emu_check: bool | None = None,
        device: str | None = None,
        asynchronous: bool | None = None,
    ) -> None:
        name = target or targets.default_target()
        chosen = targets.get(name)
        for option, value in (("emu_check", emu_check), ("device", device)):
            if value is not None and name != "cuda-emu":
                raise TCError(f"{option} is an option of the cuda-emu target, not of {name}")
        if asynchronous is not None and name != "cuda":
            raise TCError(f"asynchronous is an option of the cuda target, not of {name}")
        if emu_check is not None or device is not None:
            if device is not None:
                named(device)  # an unknown name is an error now, not at the first call
            chosen = targets.CudaEmu(check=emu_check, device=device)
        if asynchronous is not None:
            chosen = targets.Cuda(asynchronous=asynchronous)
        self._setup(name, chosen)

    @classmethod
    def for_target(cls, name: str, target: targets.Target) -> ExecutionEngine:
        """An engine with no defs on `target`: the target instance of an engine of the
        target `name`, as that engine made it (with its options, such as `emu_check` or
        `asynchronous`). What `rebuilt_kernel` rebuilds a pickled kernel on."""
        engine = cls.__new__(cls)
        engine._setup(name, target)
        return engine

    def synchronize(self) -> None:
        """Wait for the GPU's calls that did not wait (`asynchronous`), synchronising
        the streams they were queued on, and raise the first failure among them (or
        among the replays of captured CUDA graphs). Nothing to do on other targets, or
        when no call is in flight."""
        if self.target != "cuda":
            return
        from tcpy.runtime import cuda as runtime
        from tcpy.runtime.words import settle

        try:
            drv = runtime.driver()
        except TCError:
            return  # no GPU here: nothing ever ran
        settle(drv)

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
                self._entries[name] = entry = self._entry_function(name)
                if name not in _ATTRIBUTES and not name.startswith("_"):
                    # found without `__getattr__`: a call in a loop saves its lookup
                    self.__dict__[name] = entry
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
        return tune(self, entry, inputs, config, start, engine_class=ExecutionEngine)

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
        hit = self._known_call(entry, inputs, options, out)
        if hit is None:
            return self._checked_call(entry, inputs, options, out)
        return self._known_run(hit, entry, inputs, options, out)

    def _known_run(
        self,
        hit: tuple[Compiled, Mapping[str, int], DeviceCall | None, tuple[Any, ...]],
        entry: str,
        inputs: tuple[Any, ...],
        options: OptionsArg,
        out: Any,
    ) -> Any:
        """A call `_known_call` found checked before, run: GPU arrays by the steady
        path, NumPy inputs by `Compiled.plain_call`, others through a binding."""
        compiled, sizes, call, arrays = hit
        steady = compiled.device_call
        if call is not None and steady is not None:  # GPU arrays: the steady path
            done = steady(sizes, call)
            return done if done is not None else self._checked_call(entry, inputs, options, out)
        if out is None and arrays is inputs:  # NumPy arrays and scalars
            return compiled.plain_call(inputs, sizes)
        binding = Binding(plain_arrays(compiled.input_dtypes, arrays), sizes)
        return compiled.call(binding, inputs, out)

    def _checked_call(
        self, entry: str, inputs: tuple[Any, ...], options: OptionsArg, out: Any
    ) -> Any:
        """A call checked whole (and compiled when new); a call on GPU arrays with
        `out=` that passed is remembered for the steady path (`_known_call`)."""
        compiled, binding = self._compile(entry, inputs, options)
        result = compiled.call(binding, inputs, out)
        if out is not None and binding.on_device and compiled.device_call is not None:
            call = device_signature((*inputs, *(out if isinstance(out, tuple) else (out,))))
            fast = options is None or isinstance(options, MappingOptions)
            if call is not None and fast and not binding.empty:
                self._calls[(entry, options, ("out", call.key))] = (compiled, binding.sizes)
        return result

    def compile(self, entry: str, *inputs: Any, options: OptionsArg = None) -> Compiled:
        """The kernel of `entry` for the shapes and dtypes of `inputs` (compiled on the
        first request, then reused from memory or from the disk cache); `options` as
        for `run`, and the same errors."""
        return self._compile(entry, inputs, options)[0]

    def _known_call(
        self, entry: str, inputs: tuple[Any, ...], options: OptionsArg, out: Any
    ) -> tuple[Compiled, Mapping[str, int], DeviceCall | None, tuple[Any, ...]] | None:
        """The kernel and sizes of a call whose inputs have the shapes and dtypes of an
        earlier call with the same options (those were checked then, and every check of
        a call depends only on them), with the arrays to bind: NumPy inputs as they
        are, CPU PyTorch tensors as NumPy views (`host_tensors`). For GPU arrays whose
        `device_signature` (with the `out=` arrays after the inputs) is that of an
        earlier call, the `DeviceCall` is the third item (else None)."""
        if options is not None and not isinstance(options, MappingOptions):
            return None
        signature = plain_signature(inputs)
        arrays = inputs
        if signature is None:
            if out is None:
                call = device_signature(inputs)
            else:  # the `out=` arrays after the inputs
                call = device_signature((*inputs, *(out if isinstance(out, tuple) else (out,))))
            if call is not None:
                key = call.key if out is None else ("out", call.key)
                known = self._calls.get((entry, options, key))
                if known is None:
                    return None
                self._session.stats.memory_hits += 1
                return known[0], known[1], call, inputs
            host = host_tensors(inputs)
            if host is None:
                return None
            signature, arrays = host
        known = self._calls.get((entry, options, signature))
        if known is None:
            return None
        self._session.stats.memory_hits += 1
        return known[0], known[1], None, arrays

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
        origin = Origin(self.target, self._target, rebuilt_kernel)
        compiled = Compiled(cdef, kernel, signature_of(kernel, binding), binding.sizes, origin)
        plain = plain_signature(inputs)
        fast = given is None or isinstance(given, MappingOptions)
        if plain is None and hasattr(kernel, "device_call"):
            call = device_signature(inputs)
            plain = None if call is None else call.key  # GPU arrays: `device_call` runs it
        if plain is None and not binding.on_device:
            host = host_tensors(inputs)  # CPU PyTorch tensors, bound as NumPy views
            plain = None if host is None else host[0]
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

        known, checked, run = self._known_call, self._checked_call, self._known_run

        def call(*inputs: Any, options: OptionsArg = None, out: Any = None) -> Any:
            # `run`, inlined: this is the path of every call in a user's loop
            hit = known(name, inputs, options, out)
            if hit is None:
                return checked(name, inputs, options, out)
            return run(hit, name, inputs, options, out)

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


def rebuilt_kernel(
    target_name: str,
    target: targets.Target,
    source: str,
    filename: str | None,
    name: str,
    options: MappingOptions,
    inputs: list[tuple[tuple[int, ...], np.dtype]],
) -> Compiled:
    """A pickled `Compiled` again (its `Origin.rebuild`): its def defined on a new engine
    of its target, and compiled for inputs of the shapes and dtypes it was compiled for."""
    engine = ExecutionEngine.for_target(target_name, target)
    with warnings.catch_warnings():  # shown when the def was first defined
        warnings.simplefilter("ignore", TCWarning)
        engine.define(source, filename)
    return engine.compile(name, *(np.zeros(s, d) for s, d in inputs), options=options)


_KNOWN_CALLS = 4096  # the calls remembered for the fast path, per engine

# What `engine.<name>` finds before a def of that name (methods, properties, attributes).
_ATTRIBUTES = frozenset(n for n in [*dir(ExecutionEngine), "target"] if not n.startswith("_"))


def _shadowed(name: str) -> str:
    return (
        f"def {name} cannot be called as engine.{name}(...), which is the engine's own "
        f"{name}; call it as engine.run({name!r}, ...)"
    )


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


def _signature(binding: Binding) -> list[list[Any]]:
    return [[list(a.shape), str(a.dtype)] for a in binding.arrays]
