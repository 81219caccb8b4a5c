"""What the printers share about isl's loops: node kinds, a loop's depth and header,
and the counters of a counting build."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import islpy as isl

from tcpy.mapping import marks
from tcpy.poly.isl_helpers import ast_children

if TYPE_CHECKING:
    from tcpy.codegen.ast_build import Ast

FOR = isl.ast_node_type.for_  # type: ignore[attr-defined]
IF = isl.ast_node_type.if_  # type: ignore[attr-defined]
USER = isl.ast_node_type.user

COUNT_LOOP = "TC_COUNT_LOOP"
"""In a counting build (`count_loops`), the first statement of the body of every loop
whose trip count the data or the sizes decide: it adds one to that loop's counter.
Loops of a constant trip count the printers make themselves (a warp's shuffles, a
register tile's outputs, a copy's batch) are not counted. Once all loops together
pass the run's limit (`LOOP_LIMIT`) the run is stopped: every counted loop skips the
rest of its iterations (`continue` in C, where OpenMP forbids leaving a worksharing
or simd loop; `break` in the emulator's C++), so that a runaway ends in moments."""
LOOP_COUNTS = "tc_loop_counts"
"""The counters of a counting build: a 64-bit integer per counted loop, in the order
the loops are printed (`tcpy.runtime.loop_counts` reads them)."""
LOOP_COUNT_N = "tc_loop_count_n"
"""The number of counters of a counting build (an `int`)."""
LOOP_LIMIT = "tc_loop_limit"
"""The iterations after which a counting run stops (a `long long`, set before a run)."""
LOOP_STOPPED = "tc_loop_stopped"
"""Set (an `int`) when a counting run passed its limit and stopped."""


def loop_count_declarations(n: int, cxx: bool = False) -> str:
    """The counters and the counting macro of a counting build of `n` loops, for C or
    (`cxx`) for the emulator's C++; relaxed atomics, as the loops run on many threads.
    Not for NVRTC: only host builds count."""
    counters = (
        f"long long {LOOP_COUNTS}[{max(1, n)}]; int {LOOP_COUNT_N} = {n}; "
        f"long long {LOOP_LIMIT}; long long tc_loop_total; int {LOOP_STOPPED};"
    )
    declared = f'extern "C" {{ {counters} }}' if cxx else counters
    return f"""{declared}
static inline int tc_count_loop(int k) {{
  if (__atomic_load_n(&{LOOP_STOPPED}, __ATOMIC_RELAXED)) return 1;
  __atomic_fetch_add(&{LOOP_COUNTS}[k], 1, __ATOMIC_RELAXED);
  if (__atomic_add_fetch(&tc_loop_total, 1, __ATOMIC_RELAXED) <= {LOOP_LIMIT}) return 0;
  __atomic_store_n(&{LOOP_STOPPED}, 1, __ATOMIC_RELAXED);
  return 1;
}}
#define {COUNT_LOOP}(k) if (tc_count_loop(k)) {"break" if cxx else "continue"}"""


@dataclass(frozen=True)
class Header:
    """A printed `for` loop: its parts and its header line."""

    iterator: str
    init: str
    cond: str
    inc: str
    text: str

    def first(self) -> str | None:
        """The test that the loop runs at least once (its condition at its first
        value); None where its bounds are numbers that show it does. Code hoisted
        out of a loop (an accumulator's load and store) must not run where the loop
        does not: isl's bounds on a loop may be all that keeps an element in range."""
        bound = re.fullmatch(rf"{self.iterator} (<=?) (-?\d+)", self.cond)
        if bound is not None and re.fullmatch(r"-?\d+", self.init):
            last = int(bound.group(2)) - (bound.group(1) == "<")
            if int(self.init) <= last:
                return None
        return re.sub(rf"\b{self.iterator}\b", f"({self.init})", self.cond)


def loop_depth(node: isl.AstNode) -> int:
    """The schedule depth of the loop of a `for` node: isl names its iterator `c<depth>`
    (the depth a loop mark names, `tcpy.mapping.marks.LoopMark`)."""
    return int(node.for_get_iterator().get_id().get_name().removeprefix("c"))


def walk(
    node: isl.AstNode, above: tuple[marks.Mark, ...] = ()
) -> Iterator[tuple[isl.AstNode, tuple[marks.Mark, ...]]]:
    """`node` and every node below it, with the marks above each (`above`, then those
    met on the way down), in the order the code they stand for runs: a node before
    its children, a block's children in turn, `then` before `else`."""
    yield node, above
    kind = node.get_type()
    if kind == FOR:
        yield from walk(node.for_get_body(), above)
    elif kind == IF:
        yield from walk(node.if_get_then_node(), above)
        if node.if_has_else_node():
            yield from walk(node.if_get_else_node(), above)
    elif kind == isl.ast_node_type.block:
        for child in ast_children(node):
            yield from walk(child, above)
    elif kind == isl.ast_node_type.mark:
        mark = marks.of_ast(node)
        yield from walk(node.mark_get_node(), above if mark is None else (*above, mark))


def contains_for(node: isl.AstNode) -> bool:
    """Whether `node` prints a loop (a copy mark prints its copy loops)."""
    return any(
        n.get_type() == FOR or isinstance(marks.of_ast(n), marks.Copy) for n, _ in walk(node)
    )


def user_statements(node: isl.AstNode, ast: Ast) -> list[str]:
    """The isl statements below `node`, in the order they run."""
    return [ast.user(n).statement for n, _ in walk(node) if n.get_type() == USER]
