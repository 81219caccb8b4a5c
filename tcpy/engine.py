"""`ExecutionEngine`: define TC source once, call its definitions like functions.

`define` parses and checks the source (every error is a `TCError` with a caret). The
first call of a definition with a given set of input shapes and dtypes prepares a
kernel for the engine's target; later calls with the same signature reuse it.
Redefining a name replaces the definition and forgets its kernels.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tcpy import targets
from tcpy.binding import Binding, bind, generic_signature_key, signature_key
from tcpy.cache import tcpy_version
from tcpy.errors import TCError, TCInputError
from tcpy.genetic.store import TunedStore, tuned_key
from tcpy.mapping.device import named
from tcpy.mapping.options import MappingOptions
from tcpy.parser import CheckedDef, check_source
from tcpy.parser.printer import canonical
from tcpy.targets import Kernel

if TYPE_CHECKING:  # the tuner and its libraries load when a session starts
    from tcpy.genetic.tuner import TunerConfig, TuneResult


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
        self.target = target or targets.default_target()
        self._target = targets.get(self.target)
        for name, value in (("emu_check", emu_check), ("device", device)):
            if value is not None and self.target != "cuda-emu":
                raise TCError(f"{name} is an option of the cuda-emu target, not of {self.target}")
        if emu_check is not None or device is not None:
            if device is not None:
                named(device)  # an unknown name is an error now, not at the first call
            self._target = targets.CudaEmu(check=emu_check, device=device)
        self._defs: dict[str, CheckedDef] = {}
        self._kernels: dict[tuple[str, tuple[Any, ...], str], Kernel] = {}
        self._resolved: dict[tuple[str, tuple[Any, ...]], Kernel] = {}  # calls without options
        self._session = targets.Session(targets.open_disk_cache())
        self._tuned = TunedStore(self._session.disk)

    @property
    def stats(self) -> targets.Stats:
        """Kernels reused from memory, loaded from the disk cache, and compiled."""
        return self._session.stats

    def define(self, source: str, filename: str | None = None) -> tuple[str, ...]:
        """Parse and check every def of `source`; returns their names."""
        defs = check_source(source, filename)
        for name in defs:
            self._kernels = {k: v for k, v in self._kernels.items() if k[0] != name}
            self._resolved = {k: v for k, v in self._resolved.items() if k[0] != name}
        self._defs.update(defs)
        return tuple(defs)

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
        when no tuned options exist); `.replace(...)` them to change a few fields."""
        return self._target.default_options(self.checked(entry))

    def device(self) -> str:
        """The device kernels run on, as tuned options are keyed by it."""
        return self._target.device()

    # --- tuning -------------------------------------------------------------------------
    def tune(
        self,
        entry: str,
        *inputs: Any,
        config: TunerConfig | None = None,
        starting_options: MappingOptions | None = None,
    ) -> TuneResult:
        """Search the mapping options of `entry` for the shapes and dtypes of `inputs`
        (which every candidate is checked and timed on); the best are stored, and later
        calls with those shapes, in this process and later ones, use them."""
        from tcpy.genetic.tuner import tune

        return tune(self, entry, inputs, config, starting_options)

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
        self._resolved.clear()  # calls without options now resolve to the tuned options

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
        self._resolved.clear()  # calls without options now resolve to the tuned options

    def _tuned_key(self, cdef: CheckedDef, binding: Binding) -> str:
        return tuned_key(canonical(cdef), _signature(binding), self.target, self.device())

    def run(
        self, entry: str, *inputs: Any, options: MappingOptions | None = None
    ) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run `entry` on `inputs`; one output is returned bare, several as a tuple."""
        compiled, binding = self._compile(entry, inputs, options)
        return compiled.run(binding)

    def compile(self, entry: str, *inputs: Any, options: MappingOptions | None = None) -> Compiled:
        """The kernel of `entry` for the shapes and dtypes of `inputs` (compiled on the
        first request, then reused from memory or from the disk cache)."""
        return self._compile(entry, inputs, options)[0]

    def _compile(
        self, entry: str, inputs: tuple[Any, ...], options: MappingOptions | None
    ) -> tuple[Compiled, Binding]:
        cdef = self.checked(entry)
        try:
            binding = bind(cdef, inputs)
            signature = signature_key(binding.arrays)
            if options is None:
                # the kernel this signature resolved to (tuned options for these shapes,
                # else the target's), remembered until a redefinition or a tuning
                known = self._resolved.get((entry, signature))
                if known is not None:
                    self._session.stats.memory_hits += 1
                    signature = _signature_of(known, binding)
                    return Compiled(cdef, known.options, known, signature), binding
                tuned = self._tuned.get(self._tuned_key(cdef, binding))
                resolved = self._compile(entry, inputs, tuned or self._target.default_options(cdef))
                self._resolved[(entry, signature)] = resolved[0]._kernel
                return resolved
            if binding.on_device and not self._target.accepts_device_arrays:
                raise TCInputError(
                    f"the {self.target} target takes NumPy arrays, and an input of "
                    f"{entry} is in GPU memory; use the cuda target or copy it to the host"
                )
            key = (entry, signature, options.to_json())
            # a size-generic kernel serves every shape of its inputs' ranks and dtypes
            generic = (entry, generic_signature_key(binding.arrays), key[2])
            kernel = self._kernels.get(key)
            if kernel is None and self._target.generic_kernels:
                kernel = self._kernels.get(generic)
            if kernel is None:
                kernel = self._target.prepare(cdef, binding, options, self._session)
                self._kernels[generic if kernel.generic else key] = kernel
            else:
                self._session.stats.memory_hits += 1
        except TCError as e:
            raise e.with_source(cdef.source) from None
        return Compiled(cdef, kernel.options, kernel, _signature_of(kernel, binding)), binding

    def __getattr__(self, name: str) -> Callable[..., Any]:
        defs = self.__dict__.get("_defs", {})
        if name in defs:
            return lambda *inputs, options=None: self.run(name, *inputs, options=options)
        raise AttributeError(f"{type(self).__name__} has no attribute or def {name!r}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._defs]


class Compiled:
    """A kernel for one signature: `.source` is the generated code, `.options` the
    mapping options it was built with (those asked for, as any fallback of the
    compiler changed them); call it with inputs of that signature: the shapes and
    dtypes it was compiled for, or, when `.generic`, any shapes of those ranks and
    dtypes."""

    def __init__(self, cdef: CheckedDef, options: MappingOptions, kernel: Kernel, signature: Any):
        self.cdef = cdef
        self.options = options
        self._kernel = kernel
        self._signature = signature

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

    def __call__(self, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        return self.run(self._bind(inputs))

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
            raise e.with_source(self.cdef.source) from None

    def _bind(self, inputs: tuple[Any, ...]) -> Binding:
        try:
            binding = bind(self.cdef, inputs)
        except TCError as e:
            raise e.with_source(self.cdef.source) from None
        if _signature_of(self._kernel, binding) != self._signature:
            what = "ranks" if self._kernel.generic else "shapes"
            raise TCInputError(
                f"this kernel of {self.cdef.name} was compiled for other input {what} or "
                "dtypes; compile it again (or call the engine) for these"
            )
        return binding

    def run(self, binding: Binding) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run on inputs already bound (and checked) for this kernel's signature."""
        try:
            outputs = self._kernel(binding)
        except TCError as e:
            raise e.with_source(self.cdef.source) from None
        return outputs[0] if len(outputs) == 1 else outputs


def _signature_of(kernel: Kernel, binding: Binding) -> tuple[Any, ...]:
    """What the inputs of a call must match to run `kernel`: their ranks and dtypes
    for a size-generic kernel, else their shapes and dtypes."""
    arrays = binding.arrays
    return generic_signature_key(arrays) if kernel.generic else signature_key(arrays)


def _signature(binding: Binding) -> list[list[Any]]:
    return [[list(a.shape), str(a.dtype)] for a in binding.arrays]
