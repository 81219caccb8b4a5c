"""The targets an `ExecutionEngine` can run on, by name.

A target turns a checked definition and a call's binding into a `Kernel`, something
that computes the outputs from a binding. Targets share the front end and the call-time
checks; they differ in how they compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from tcpy.binding import Binding
from tcpy.errors import TCError
from tcpy.parser.checked import CheckedDef
from tcpy.reference import interpreter


class Kernel(Protocol):
    def __call__(self, binding: Binding) -> tuple[np.ndarray, ...]: ...


Prepare = Callable[[CheckedDef, Binding], Kernel]


def _reference(cdef: CheckedDef, binding: Binding) -> Kernel:
    return lambda b: interpreter.run(cdef, b)


TARGETS: dict[str, Prepare] = {"reference": _reference}

DEFAULT_TARGET = "reference"


def get(name: str) -> Prepare:
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(sorted(TARGETS))
        raise TCError(f"unknown target {name!r}; the targets are: {known}") from None
