"""What the printers share about isl's loops: node kinds, a loop's depth and header,
and the counters of a counting build."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import islpy as isl

from tcpy.codegen.isl_exprs import expr_args, expr_id, expr_ids, expr_int, isl_expr
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
    """A `for` loop of the isl AST: its start, condition and step as isl expressions
    (`node`'s) and as printed with `names` (how ids print), and its header line."""

    iterator: str
    init: str
    cond: str
    inc: str
    text: str
    node: isl.AstNode = field(compare=False, repr=False)
    names: Mapping[str, str] = field(compare=False, repr=False)
    index_type: str = "long long"

    @classmethod
    def of(cls, node: isl.AstNode, names: Mapping[str, str], index_type: str) -> Header:
        """The header of `for` node `node`, its ids printed as `names` says."""
        iterator = isl_expr(node.for_get_iterator(), names)
        init = isl_expr(node.for_get_init(), names, top=True)
        cond = isl_expr(node.for_get_cond(), names, top=True)
        inc = isl_expr(node.for_get_inc(), names, top=True)
        step = f"{iterator}++" if inc == "1" else f"{iterator} += {inc}"
        text = f"for ({index_type} {iterator} = {init}; {cond}; {step}) {{"
        return cls(iterator, init, cond, inc, text, node, names, index_type)

    def with_cond(self, cond: str) -> str:
        """The loop's header line with the condition `cond` instead of its own."""
        step = f"{self.iterator}++" if self.inc == "1" else f"{self.iterator} += {self.inc}"
        return f"for ({self.index_type} {self.iterator} = {self.init}; {cond}; {step}) {{"

    @property
    def id(self) -> str:
        """The isl id of the loop's iterator."""
        return self.node.for_get_iterator().id_get_id().get_name()

    def uses(self, *ids: str) -> bool:
        """Whether the loop's start, condition or step uses one of the isl ids `ids`."""
        n = self.node
        used = expr_ids(n.for_get_init()) | expr_ids(n.for_get_cond()) | expr_ids(n.for_get_inc())
        return not used.isdisjoint(ids)

    @property
    def start(self) -> int | None:
        """The loop's first value, when it is a number."""
        return expr_int(self.node.for_get_init())

    @property
    def step(self) -> int | None:
        """The loop's step, when it is a number."""
        return expr_int(self.node.for_get_inc())

    def bound(self) -> tuple[bool, isl.AstExpr] | None:
        """The loop's condition as `iterator <= bound` (True) or `iterator < bound`
        (False), with the bound; None for a condition of another form."""
        cond = self.node.for_get_cond()
        for op, inclusive in ((isl.ast_expr_op_type.le, True), (isl.ast_expr_op_type.lt, False)):
            args = expr_args(cond, op)
            if args is not None and len(args) == 2 and expr_id(args[0]) == self.id:
                return inclusive, args[1]
        return None

    def last(self) -> int | None:
        """The loop's last value, when its bound is a number."""
        found = self.bound()
        value = None if found is None else expr_int(found[1])
        return None if found is None or value is None else value - (not found[0])

    def cond_at(self, value: str) -> str:
        """The loop's condition with its iterator replaced by the text `value`."""
        return isl_expr(self.node.for_get_cond(), {**self.names, self.id: value}, top=True)

    def first(self) -> str | None:
        """The test that the loop runs at least once (its condition at its first
        value); None where its bounds are numbers that show it does. Code hoisted
        out of a loop (an accumulator's load and store) must not run where the loop
        does not: isl's bounds on a loop may be all that keeps an element in range."""
        start, last = self.start, self.last()
        if start is not None and last is not None and start <= last:
            return None
        return self.cond_at(f"({self.init})")


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
