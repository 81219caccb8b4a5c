"""tcpy: a polyhedral compiler for Tensor Comprehensions.

import tcpy
engine = tcpy.ExecutionEngine()
engine.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
C = engine.mm(A, B)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tcpy.compiled import Compiled
from tcpy.engine import ExecutionEngine
from tcpy.errors import (
    InternalError,
    Span,
    TCCompileError,
    TCEmulationError,
    TCError,
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
from tcpy.parser import CheckedDef, check_source
from tcpy.types import ScalarType

if TYPE_CHECKING:
    from tcpy.genetic.tuner import TunerConfig, TuneResult

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
]


def __getattr__(name: str) -> Any:
    """`TunerConfig` and `TuneResult`, imported at first use: the tuner (and the
    libraries it loads) are not needed to compile and run kernels."""
    if name in ("TunerConfig", "TuneResult"):
        from tcpy.genetic import tuner

        return getattr(tuner, name)
    raise AttributeError(f"module 'tcpy' has no attribute {name!r}")
