"""Scalar types of TC and the promotion rules of docs/language.md ("Types").

`ScalarType` is the closed set of element types. `promote` is the one place that
decides the type of mixed arithmetic; `assignable` says whether a value of one type
may be stored into a tensor of another without a cast.
"""

from __future__ import annotations

import enum
import functools

import numpy as np


class ScalarType(enum.Enum):
    BOOL = "bool"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @classmethod
    def from_name(cls, name: str) -> ScalarType:
        """The type a TC type keyword names (`float` is float32, `double` float64)."""
        return _ALIASES.get(name) or cls(name)

    @property
    def is_bool(self) -> bool:
        return self is ScalarType.BOOL

    @property
    def is_float(self) -> bool:
        return self in (
            ScalarType.FLOAT16,
            ScalarType.BFLOAT16,
            ScalarType.FLOAT32,
            ScalarType.FLOAT64,
        )

    @property
    def is_half(self) -> bool:
        """A 16-bit float: a storage type, computed in float32."""
        return self in (ScalarType.FLOAT16, ScalarType.BFLOAT16)

    @property
    def is_integer(self) -> bool:
        return not self.is_float and not self.is_bool

    @property
    def is_signed(self) -> bool:
        return self.is_float or self.value.startswith("int")

    @property
    def bits(self) -> int:
        if self.is_bool:
            return 1
        return 16 if self.is_half else int("".join(c for c in self.value if c.isdigit()))

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of tensors of this type."""
        return _dtype(self.value)

    @property
    def compute(self) -> ScalarType:
        """The type arithmetic on this type is carried out in: float16 and bfloat16
        are storage types, computed in float32."""
        return ScalarType.FLOAT32 if self.is_half else self

    @classmethod
    def from_dtype(cls, dtype: np.dtype) -> ScalarType | None:
        try:
            return cls(np.dtype(dtype).name)
        except (ValueError, TypeError):
            return None


_ALIASES = {"float": ScalarType.FLOAT32, "double": ScalarType.FLOAT64}

TYPE_KEYWORDS = tuple(t.value for t in ScalarType) + tuple(_ALIASES)

_INTEGERS = {
    (signed, bits): t
    for t in ScalarType
    if t.is_integer
    for signed, bits in [(t.is_signed, t.bits)]
}


def promote(a: ScalarType, b: ScalarType) -> ScalarType:
    """The type of arithmetic mixing `a` and `b`.

    Equal types stay; bool gives way to anything; an integer with a float gives the
    float; two floats give the wider (float16 with bfloat16 gives float32, which holds
    both exactly); two unsigned give the wider unsigned; a signed
    with any integer gives a signed integer of the wider width.
    """
    if a is b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float or b.is_float:
        if a.is_half and b.is_half:  # float16 with bfloat16: neither holds the other
            return ScalarType.FLOAT32
        if a.is_float and b.is_float:
            return a if a.bits >= b.bits else b
        return a if a.is_float else b
    bits = max(a.bits, b.bits)
    if not a.is_signed and not b.is_signed:
        return _INTEGERS[(False, bits)]
    return _INTEGERS[(True, bits)]


def assignable(value: ScalarType, target: ScalarType) -> bool:
    """Whether a value of type `value` may be stored into `target` without a cast:
    exactly when storing would not need a wider type than `target`."""
    return promote(value, target) is target


def builtin_result(args: tuple[ScalarType, ...]) -> ScalarType:
    """The type of a builtin's value: the promoted type of its float arguments
    (double if any is double; a half type where all are of it), float32 where none is
    a float. It computes in that type's compute type."""
    floats = [a for a in args if a.is_float]
    if not floats:
        return ScalarType.FLOAT32
    result = floats[0]
    for a in floats[1:]:
        result = promote(result, a)
    return result


@functools.cache
def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":  # NumPy has none: ml_dtypes' (JAX's), imported when needed
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
