"""Random inputs for a definition, for `tcpy run`, tests and benchmarks.

Floats are uniform in [0, 1) (so that log and sqrt stay real); an integer input used
directly as a subscript of another tensor (a gather such as `LUT(I(b, l), d)`) gets
values inside the extent it indexes, other integers are in [1, 10).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tcpy.errors import TCInputError
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, TensorInfo

DEFAULT_SIZE = 32


def resolve_sizes(cdef: CheckedDef, given: Mapping[str, int]) -> dict[str, int]:
    """Every size symbol of `cdef`: the given value, else DEFAULT_SIZE."""
    unknown = set(given) - set(cdef.size_symbols)
    if unknown:
        raise TCInputError(
            f"{cdef.name} has no size {', '.join(sorted(unknown))}; its sizes are "
            f"{', '.join(cdef.size_symbols) or 'none'}"
        )
    return {s: int(given.get(s, DEFAULT_SIZE)) for s in cdef.size_symbols}


def random_inputs(
    cdef: CheckedDef, sizes: Mapping[str, int], rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    bounds = _gather_bounds(cdef, sizes)
    return tuple(_random(info, sizes, bounds.get(info.name), rng) for info in cdef.inputs)


def _random(
    info: TensorInfo, sizes: Mapping[str, int], bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    shape = tuple(d.evaluate(sizes) for d in info.shape)
    ty = info.scalar
    if ty.is_float:
        return rng.random(shape).astype(ty.dtype)
    if ty.is_bool:
        return rng.random(shape) < 0.5
    lo, hi = (0, bound) if bound is not None else (1, 10)
    return rng.integers(lo, max(hi, lo + 1), size=shape).astype(ty.dtype)


def _gather_bounds(cdef: CheckedDef, sizes: Mapping[str, int]) -> dict[str, int]:
    bounds: dict[str, int] = {}
    for st in cdef.statements:
        for node in (n for e in st.expressions for n in ast.walk(e)):
            if not isinstance(node, ast.Access):
                continue
            extents = cdef.tensor(node.tensor).shape
            for k, arg in enumerate(node.args):
                if isinstance(arg, ast.Access):
                    extent = extents[k].evaluate(sizes)
                    bounds[arg.tensor] = min(bounds.get(arg.tensor, extent), extent)
    return bounds
