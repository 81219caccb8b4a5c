"""tcpy: a polyhedral compiler for Tensor Comprehensions.

import tcpy
engine = tcpy.ExecutionEngine()
engine.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
C = engine.mm(A, B)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tcpy.errors import (
    InternalError,
    Span,
    TCCompileError,
    TCEmulationError,
    TCError,
    TCGradientError,
    TCInputError,
    TCLaunchError,
    TCMappingError,
    TCRangeError,
    TCSemanticError,
    TCSyntaxError,
    TCTypeError,
    TCWarning,
)
from tcpy.log import configure as configure_logging
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.types import ScalarType

if TYPE_CHECKING:
    from tcpy.autodiff import gradient
    from tcpy.compiled import Compiled
    from tcpy.engine import ExecutionEngine
    from tcpy.genetic.tuner import TunerConfig, TuneResult
    from tcpy.parser import CheckedDef, check_source

__version__ = "0.1.0"

configure_logging()  # TCPY_LOG=info|debug: the tcpy loggers on stderr

__all__ = [
    "CheckedDef",
    "Compiled",
    "ExecutionEngine",
    "Fusion",
    "InternalError",
    "MappingOptions",
    "ScalarType",
    "Span",
    "TCCompileError",
    "TCEmulationError",
    "TCError",
    "TCGradientError",
    "TCInputError",
    "TCLaunchError",
    "TCMappingError",
    "TCRangeError",
    "TCSemanticError",
    "TCSyntaxError",
    "TCTypeError",
    "TCWarning",
    "TuneResult",
    "TunerConfig",
    "check_source",
    "gradient",
]


# Loaded at first use, so that `import tcpy` stays cheap: the front end, the engine
# and its targets load with the first engine, the tuner (and the libraries it needs)
# with the first tuning.
_LAZY = {
    "CheckedDef": "tcpy.parser",
    "Compiled": "tcpy.compiled",
    "ExecutionEngine": "tcpy.engine",
    "TuneResult": "tcpy.genetic.tuner",
    "TunerConfig": "tcpy.genetic.tuner",
    "check_source": "tcpy.parser",
    "gradient": "tcpy.autodiff",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tcpy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
