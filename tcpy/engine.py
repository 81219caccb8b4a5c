"""`ExecutionEngine`: define TC source once, call its definitions like functions.

`define` parses and checks the source (every error is a `TCError` with a caret). The
first call of a definition with a given set of input shapes and dtypes prepares a
kernel for the engine's target; later calls with the same signature reuse it.
Redefining a name replaces the definition and forgets its kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tcpy import targets
from tcpy.binding import bind, signature_key
from tcpy.errors import TCError
from tcpy.parser import CheckedDef, check_source
from tcpy.targets import Kernel


class ExecutionEngine:
    """Runs TC definitions on one target (`"reference"`: the NumPy interpreter)."""

    def __init__(self, target: str | None = None) -> None:
        self.target = target or targets.DEFAULT_TARGET
        self._prepare = targets.get(self.target)
        self._defs: dict[str, CheckedDef] = {}
        self._kernels: dict[tuple[str, tuple[Any, ...]], Kernel] = {}
        self.hits = 0
        self.misses = 0

    def define(self, source: str, filename: str | None = None) -> tuple[str, ...]:
        """Parse and check every def of `source`; returns their names."""
        defs = check_source(source, filename)
        for name in defs:
            self._kernels = {k: v for k, v in self._kernels.items() if k[0] != name}
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

    def run(self, entry: str, *inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run `entry` on `inputs`; one output is returned bare, several as a tuple."""
        cdef = self.checked(entry)
        try:
            binding = bind(cdef, inputs)
            key = (entry, signature_key(binding.arrays))
            kernel = self._kernels.get(key)
            if kernel is None:
                self.misses += 1
                kernel = self._kernels[key] = self._prepare(cdef, binding)
            else:
                self.hits += 1
            outputs = kernel(binding)
        except TCError as e:
            raise e.with_source(cdef.source) from None
        return outputs[0] if len(outputs) == 1 else outputs

    def __getattr__(self, name: str) -> Callable[..., Any]:
        defs = self.__dict__.get("_defs", {})
        if name in defs:
            return lambda *inputs: self.run(name, *inputs)
        raise AttributeError(f"{type(self).__name__} has no attribute or def {name!r}")

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self._defs]
