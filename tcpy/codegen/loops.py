"""What the printers share about isl's loops: node kinds, the marks the mappings
leave on loops, and a printed loop's header."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import islpy as isl

from tcpy.poly.isl_helpers import ast_children

if TYPE_CHECKING:
    from tcpy.codegen.ast_build import Ast

FOR = isl.ast_node_type.for_  # type: ignore[attr-defined]
IF = isl.ast_node_type.if_  # type: ignore[attr-defined]
PARALLEL_MARK = "omp_parallel"
REGISTER_MARK = "register_tile"
PACK_MARK = "pack"  # `pack:A,B`: copy these tensors' tiles into local buffers here
SHARED_MARK = "shared"  # `shared:A,B`: copy them into the block's shared memory here
SIMD_MARK = "omp_simd"
COLLAPSE_MARK = "omp_collapse"
"""Marks a parallel loop directly inside the worksharing loop: the two share out as one
(`collapse(2)`), so that a nest whose outer loop has fewer iterations than there are
threads (one tile of rows, or a size known only at the call) still uses them all."""
SCRATCH_MARK = "scratch"  # `scratch:T,U`: these temporaries live in shared memory here
LANES_MARK = "lane_reduction"
"""Marks the point band of a reduction spread over the lanes of a warp."""
ATOMIC_MARK = "atomic_reduction"
"""Marks the point band of a reduction split across blocks: each thread reduces its
chunk into a register, then adds it to the element with an atomic."""
PRIVATE_MARK = "private"
"""Marks where a thread's register tile is loaded and stored, above the reduction's
tile loops it is held across (`tcpy.codegen.thread_tile.print_held_tile`)."""
ROWS_MARK = "warp_rows"
"""Marks the statements of a row kernel (`tcpy.mapping.rows`): one warp runs them in
order over each row, meeting at `__syncwarp()` between them."""


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


def loop_marks(marks: tuple[str, ...], iterator: str) -> tuple[str, ...]:
    """The marks that belong to the loop of `iterator` (`omp_simd@3` to `c3`)."""
    return tuple(m.split("@")[0] for m in marks if m.endswith(f"@{iterator.lstrip('c')}"))


def register_sizes(mark: str) -> list[int] | None:
    """The block sizes a register-block mark carries (`register_tile:4x16`)."""
    name, _, sizes = mark.partition(":")
    if name != REGISTER_MARK or not sizes:
        return None
    return [int(s) for s in sizes.split("x")]


TRANSPOSED = "^T"  # `pack:A,W^T`: W's copy has its dimensions reversed


def pack_tensors(mark: str) -> list[str]:
    """The tensors a copy mark copies (`pack:A,B` into a thread's buffers, `shared:A,B`
    into a block's shared memory) or places (`scratch:T`, temporaries in shared
    memory); empty for another mark."""
    return [t.removesuffix(TRANSPOSED) for t in _mark_tensors(mark)]


def transposed_tensors(mark: str) -> set[str]:
    """The tensors a copy mark copies with their dimensions reversed (`W^T`)."""
    return {t.removesuffix(TRANSPOSED) for t in _mark_tensors(mark) if t.endswith(TRANSPOSED)}


def _mark_tensors(mark: str) -> list[str]:
    name, _, tensors = mark.partition(":")
    marks = (PACK_MARK, SHARED_MARK, SCRATCH_MARK)
    return tensors.split(",") if name in marks and tensors else []


def contains_for(node: isl.AstNode) -> bool:
    """Whether `node` prints a loop (a pack mark prints its copy loops)."""
    kind = node.get_type()
    if kind == FOR:
        return True
    if kind == isl.ast_node_type.block:
        return any(contains_for(c) for c in ast_children(node))
    if kind == IF:
        return contains_for(node.if_get_then_node()) or (
            node.if_has_else_node() and contains_for(node.if_get_else_node())
        )
    if kind == isl.ast_node_type.mark:
        return bool(pack_tensors(node.mark_get_id().get_name())) or contains_for(
            node.mark_get_node()
        )
    return False


def user_statements(node: isl.AstNode, ast: Ast) -> list[str]:
    kind = node.get_type()
    if kind == isl.ast_node_type.user:
        return [ast.user(node).statement]
    if kind == FOR:
        return user_statements(node.for_get_body(), ast)
    if kind == isl.ast_node_type.block:
        return [s for c in ast_children(node) for s in user_statements(c, ast)]
    if kind == IF:
        out = user_statements(node.if_get_then_node(), ast)
        if node.if_has_else_node():
            out += user_statements(node.if_get_else_node(), ast)
        return out
    if kind == isl.ast_node_type.mark:
        return user_statements(node.mark_get_node(), ast)
    return []
