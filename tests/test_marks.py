"""The marks mapping leaves for codegen (`tcpy.mapping.marks`): each kind is written to
an isl mark's name and read back as the same mark, and a name that is no mark is an
internal error, never a mark of another kind."""

from __future__ import annotations

import islpy as isl
import pytest

from tcpy.errors import InternalError
from tcpy.mapping import marks

EVERY_KIND = [
    marks.Parallel(2),
    marks.Collapse(1),
    marks.Simd(3),
    marks.RegisterBlock((4, 16)),
    marks.RegisterBlock((6, 16), across=True),
    marks.Jam(4),
    marks.Pack(("A", "W", "V"), (("W", 1), ("V", 2))),
    marks.Pack(("I", "W"), (("W", 1),), (("I", 2),)),
    marks.Pack(("K",), (("K", 3),), once=True),
    marks.Shared(("A", "B")),
    marks.Scratch(("T",)),
    marks.ThreadRegisters(16),
    marks.ThreadRegisters(32, 4),
    marks.MatrixTile("bf16", (128, 64, 32), (2, 2), ("A", "B")),
    marks.Private(),
    marks.Lanes(),
    marks.Atomic(),
    marks.Rows(),
    marks.LaneZero(),
]


def test_every_kind_is_listed() -> None:
    """A new kind of mark is added to the list above (and so to the round trip)."""
    assert {type(m) for m in EVERY_KIND} == set(marks.Mark.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize("mark", EVERY_KIND, ids=lambda m: m.name)
def test_a_mark_reads_back_from_its_name_and_from_the_tree(mark: marks.Mark) -> None:
    assert marks.parse(mark.name) == mark
    ctx = isl.Context()
    domain = isl.UnionSet.read_from_str(ctx, "{ S[i] : 0 <= i < 4 }")
    node = isl.Schedule.from_domain(domain).get_root().child(0)
    below = marks.insert(node, mark)
    assert marks.of(below.parent()) == mark
    assert marks.of(below) is None


@pytest.mark.parametrize(
    "name",
    [
        "omp_parallel@x",
        "register_tile:",
        "register_tile:across/",
        "pack_once:",
        "thread_registers:many",
        "thread_registers:16x",
        "thread_registers:x4",
        "shared:",
        "tile",
        "matrix/bf16:64x64:2x2",
        "matrix/f16:64x64x32:2x2:A",
        "matrix/f16:64xax32:2x2:A,B",
    ],
)
def test_a_name_that_is_no_mark_is_an_internal_error(name: str) -> None:
    with pytest.raises(InternalError, match="no tcpy mark"):
        marks.parse(name)
