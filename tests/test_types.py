"""Type promotion (docs/language.md, Types) as a table, and storing rules."""

from __future__ import annotations

import pytest

from tcpy.types import ScalarType as T
from tcpy.types import assignable, builtin_result, promote


@pytest.mark.parametrize(
    ("a", "b", "result"),
    [
        (T.FLOAT32, T.FLOAT32, T.FLOAT32),
        (T.INT32, T.FLOAT32, T.FLOAT32),
        (T.INT64, T.FLOAT16, T.FLOAT16),
        (T.FLOAT32, T.FLOAT64, T.FLOAT64),
        (T.FLOAT16, T.FLOAT32, T.FLOAT32),
        (T.UINT8, T.UINT32, T.UINT32),
        (T.UINT64, T.INT8, T.INT64),
        (T.INT16, T.UINT8, T.INT16),
        (T.UINT32, T.INT32, T.INT32),
        (T.INT8, T.INT64, T.INT64),
        (T.BOOL, T.INT8, T.INT8),
        (T.BOOL, T.BOOL, T.BOOL),
    ],
)
def test_promote(a: T, b: T, result: T) -> None:
    assert promote(a, b) is result
    assert promote(b, a) is result


@pytest.mark.parametrize(
    ("value", "target", "ok"),
    [
        (T.INT32, T.FLOAT32, True),
        (T.FLOAT32, T.FLOAT32, True),
        (T.FLOAT64, T.FLOAT32, False),
        (T.FLOAT32, T.INT32, False),
        (T.INT64, T.INT32, False),
        (T.BOOL, T.FLOAT32, True),
        (T.FLOAT32, T.FLOAT16, False),
    ],
)
def test_assignable(value: T, target: T, ok: bool) -> None:
    assert assignable(value, target) is ok


def test_builtins_compute_in_float_or_double() -> None:
    assert builtin_result((T.INT32,)) is T.FLOAT32
    assert builtin_result((T.FLOAT32, T.FLOAT64)) is T.FLOAT64


@pytest.mark.parametrize(
    ("name", "ty"), [("float", T.FLOAT32), ("double", T.FLOAT64), ("uint16", T.UINT16)]
)
def test_names(name: str, ty: T) -> None:
    assert T.from_name(name) is ty


def test_bits_and_compute() -> None:
    assert [t.bits for t in (T.BOOL, T.UINT8, T.INT16, T.FLOAT32, T.FLOAT64)] == [1, 8, 16, 32, 64]
    assert T.FLOAT16.compute is T.FLOAT32 and T.INT8.compute is T.INT8
