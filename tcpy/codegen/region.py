"""The kernel's one OpenMP parallel region: every nest of a kernel with parallel loops
runs inside one `#pragma omp parallel` of `tc_threads` threads (chosen at each call),
so threads are started once per call, not once per nest, and wait for each other only
where a nest needs what an earlier one wrote."""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.isl_exprs import isl_expr
from tcpy.codegen.loops import FOR, IF, loop_depth, user_statements, walk
from tcpy.codegen.printer import Printer
from tcpy.mapping.marks import Mark, Parallel, loop_marks, of_ast
from tcpy.parser import ast as tc
from tcpy.poly.isl_helpers import ast_children


def print_region(p: Printer, depth: int, private: tuple[str, ...] = ()) -> None:
    """The nests inside one `omp parallel` region of `tc_threads` threads (read at
    call time): a nest's parallel loop is a worksharing loop, the loops around it
    run in every thread (their bounds depend only on the sizes and on outer loops),
    and code outside any parallel loop runs in one thread (`omp single`). Inside a
    nest every construct ends at a barrier; between nests there is one only where
    a nest touches a tensor that an earlier nest since the last barrier writes, or
    writes one that it reads. `private` are declarations made in every thread."""
    p.emit(depth, "#pragma omp parallel num_threads(tc_threads)")
    p.emit(depth, "{")
    for line in private:
        p.emit(depth + 1, line)
    unordered: list[_Touches] = []
    for nest in p.nests():
        touches = _touches(p, nest)
        if any(touches.conflicts(t) for t in unordered):
            p.emit(depth + 1, "#pragma omp barrier")
            unordered = []
        unordered.append(touches)
        for comment in p.comments(nest):
            p.emit(depth + 1, comment)
        _replicated(p, nest, depth + 1, (), " nowait")
    p.emit(depth, "}")


def _replicated(
    p: Printer, node: isl.AstNode, depth: int, marks: tuple[Mark, ...], end: str
) -> None:
    """`node`, run by every thread of the region: its parallel loop shared among
    them, the rest of its code in one of them. `end` is the clause of the last
    construct (`" nowait"` at the end of a nest, else nothing: a barrier)."""
    kind = node.get_type()
    if not has_parallel_loop(p, node, marks):
        p.emit(depth, f"#pragma omp single{end}")
        p.emit(depth, "{")
        p.node(node, depth + 1, marks)
        p.emit(depth, "}")
    elif kind == FOR:
        if _parallel(node, marks):
            p.for_(node, depth, marks, shared=end)
            return
        p.open_loop(depth, p.loop_header(node).text)
        _replicated(p, node.for_get_body(), depth + 1, marks, "")
        p.emit(depth, "}")
    elif kind == isl.ast_node_type.block:
        children = list(ast_children(node))
        for k, child in enumerate(children):
            _replicated(p, child, depth, marks, end if k == len(children) - 1 else "")
    elif kind == IF:
        p.emit(depth, f"if ({isl_expr(node.if_get_cond(), p.names, top=True)}) {{")
        _replicated(p, node.if_get_then_node(), depth + 1, marks, end)
        if node.if_has_else_node():
            p.emit(depth, "} else {")
            _replicated(p, node.if_get_else_node(), depth + 1, marks, end)
        p.emit(depth, "}")
    else:  # a mark (a register block with a parallel loop inside is not blocked)
        _replicated(p, node.mark_get_node(), depth, (*marks, _mark(node)), end)


def has_parallel_loop(p: Printer, node: isl.AstNode, marks: tuple[Mark, ...]) -> bool:
    """Whether `node` has a loop that the marks above it make parallel."""
    return any(n.get_type() == FOR and _parallel(n, above) for n, above in walk(node, marks))


def _touches(p: Printer, nest: isl.AstNode) -> _Touches:
    """The tensors the statements of `nest` read and write."""
    reads: set[str] = set()
    writes: set[str] = set()
    for name in user_statements(nest, p.ast):
        source = p.scop.statement(name).source(p.scop.cdef)
        writes.add(source.tensor)
        reads.add(source.tensor)  # a reduction reads what it updates
        reads.update(n.tensor for n in tc.walk(source.rhs) if isinstance(n, tc.Access))
    return _Touches(frozenset(reads), frozenset(writes))


@dataclass(frozen=True)
class _Touches:
    """The tensors a nest reads and writes."""

    reads: frozenset[str]
    writes: frozenset[str]

    def conflicts(self, earlier: _Touches) -> bool:
        """Whether this nest must wait for `earlier` to finish."""
        return bool(earlier.writes & (self.reads | self.writes) or earlier.reads & self.writes)


def _parallel(loop: isl.AstNode, marks: tuple[Mark, ...]) -> bool:
    """Whether the marks above make `loop` the worksharing loop of its nest."""
    return any(isinstance(m, Parallel) for m in loop_marks(marks, loop_depth(loop)))


def _mark(node: isl.AstNode) -> Mark:
    mark = of_ast(node)
    assert mark is not None
    return mark
