"""Printing a jammed reduction (`tcpy.mapping.cpu.registers.jam`): under a `jam:R`
mark, a vector loop of distinct outputs, each loaded into a register once, reduced
over the R steps of the reduction loop inside it, and stored once.

    for j (vector)                      const float tc_h0[4] = t[i .. i+3]
      for r < R                   ->    for j (vector):
        y[j] += A[i+r][j] * t[i+r]        acc = y[j]; acc += A[i][j] * tc_h0[0]; ...
                                          y[j] = acc

Each output still takes the reduction's steps in their order, so the result is the
unjammed nest's, bit for bit. The reads that the vector loop does not move (`t`) are
loaded before it, a local array of R along the reduction loop: the C compiler keeps
them in registers only when they are locals.
"""

from __future__ import annotations

from typing import NamedTuple

import islpy as isl

from tcpy.codegen.exprs import CheckedLocal, Read, StatementParts, local_for
from tcpy.codegen.loops import FOR, Header, loop_depth
from tcpy.codegen.printer import Instance, Printer
from tcpy.codegen.register_block import full_tile
from tcpy.mapping.marks import Mark, loop_marks, of_ast


def print_jam(
    p: Printer, node: isl.AstNode, depth: int, marks: tuple[Mark, ...], size: int
) -> bool:
    """Print the vector loop `node` under a `jam:size` mark as the module docstring
    shows; returns False, printing nothing, where the AST does not have that shape
    (`_shape`), which then prints as it is."""
    shape = _shape(p, node, marks)
    if shape is None:
        return False
    vector, step, found = shape
    plain = p.bodies.parts(found.source, found.values, ids=found.ids())
    scalars, arrays = _invariant(p, plain, vector, step)
    substitute = {r.text: local for r, local in scalars}
    substitute |= {r.text: _element(local, step) for r, local in arrays}
    parts = p.bodies.parts(found.source, found.values, substitute=substitute)
    p.emit(depth, "{")
    for line in p.hoisted(scalars, vector):
        p.emit(depth + 1, line)
    _fill(p, depth + 1, arrays, vector, step, size)
    full = full_tile(step, size)
    if full is not None and full.test:
        p.emit(depth + 1, f"if ({full.test}) {{")
        _reduce(p, depth + 2, parts, vector, full.loop.text, size)
        p.emit(depth + 1, "} else {")
        _reduce(p, depth + 2, parts, vector, step.text, size)
        p.emit(depth + 1, "}")
    else:
        _reduce(p, depth + 1, parts, vector, step.text, size)
    p.emit(depth, "}")
    return True


class _Shape(NamedTuple):
    """A jam as the AST has it: the vector loop, the reduction loop, the statement."""

    vector: Header
    step: Header
    found: Instance


def _shape(p: Printer, node: isl.AstNode, marks: tuple[Mark, ...]) -> _Shape | None:
    """The vector loop, the reduction loop inside it and the statement they run; None
    unless `node` is a loop of step 1 with no loop mark of its own (a worksharing
    loop prints as such), around (marks of loops isl dropped aside) a loop of step 1
    with none either, whose bounds do not use it, around one reduction whose element
    moves with the vector loop and not with the other."""
    if node.get_type() != FOR or loop_marks(marks, loop_depth(node)):
        return None
    inner = node.for_get_body()
    while inner.get_type() == isl.ast_node_type.mark:  # the marks of dropped loops
        mark = of_ast(inner)
        assert mark is not None
        marks, inner = (*marks, mark), inner.mark_get_node()
    if inner.get_type() != FOR or loop_marks(marks, loop_depth(inner)):
        return None
    vector, step = p.loop_header(node), p.loop_header(inner)
    found = p.reduction_at(inner.for_get_body())
    if (
        found is None
        or vector.step != 1
        or step.step != 1
        or step.uses(vector.id)
        or not found.element_uses(vector.id)
        or found.element_uses(step.id)
    ):
        return None
    return _Shape(vector, step, found)


def _invariant(
    p: Printer, parts: StatementParts, vector: Header, step: Header
) -> tuple[list[tuple[Read, str]], list[tuple[Read, str]]]:
    """The reads the vector loop does not move, each with the local it is loaded into:
    those the reduction loop does not move either (a scalar), and those it does (an
    array along it). A read checked at run time (`tc_index`) stays in place; a
    gather's index is checked as it is loaded (`CheckedLocal`)."""
    scalars: dict[str, tuple[Read, str]] = {}
    arrays: dict[str, tuple[Read, str]] = {}
    for r in parts.reads:
        if r.array == parts.array or vector.id in r.ids or r.checked:
            continue
        chosen = arrays if step.id in r.ids else scalars
        if r.text not in chosen:
            chosen[r.text] = (r, local_for(r, parts.reads, f"tc_h{p.locals}"))
            p.locals += 1
    return list(scalars.values()), list(arrays.values())


def _fill(
    p: Printer,
    depth: int,
    arrays: list[tuple[Read, str]],
    vector: Header,
    step: Header,
    size: int,
) -> None:
    """The arrays of the reads the reduction loop moves, loaded along it; only where
    the vector loop runs (its bounds may be all that keeps an element in range)."""
    if not arrays:
        return
    for read, local in arrays:
        p.emit(depth, f"{p.local_type(read, local)} {local}[{size}];")
    first = vector.first()
    inside = depth if first is None else depth + 1
    if first is not None:
        p.emit(depth, f"if ({first}) {{")
    p.open_loop(inside, step.text)
    for read, local in arrays:
        p.emit(inside + 1, f"{_element(local, step)} = {p.local_value(read, local)};")
    p.emit(inside, "}")
    if first is not None:
        p.emit(depth, "}")


def _reduce(
    p: Printer, depth: int, parts: StatementParts, vector: Header, header: str, size: int
) -> None:
    """The vector loop: each output loaded, reduced over the loop `header`, stored."""
    if p.options.vectorize:
        p.emit(depth, "#pragma omp simd")
    p.open_loop(depth, vector.text)
    p.emit(depth + 1, f"{parts.compute} tc_acc = {parts.current};")
    p.emit(depth + 1, f"#pragma GCC unroll {size}")
    p.open_loop(depth + 1, header)
    p.emit(depth + 2, parts.wrap(f"tc_acc = {parts.combine('tc_acc')};"))
    p.emit(depth + 1, "}")
    p.emit(depth + 1, f"{parts.target} = {parts.store('tc_acc')};")
    p.emit(depth, "}")


def _element(local: str, step: Header) -> str:
    """The element of the local array `local` at the reduction loop's position (a
    `CheckedLocal`'s is one too)."""
    element = f"{local}{_offset(step)}"
    return CheckedLocal(element) if isinstance(local, CheckedLocal) else element


def _offset(step: Header) -> str:
    """The reduction loop's position in a local array: its iterator less its start."""
    return f"[{step.iterator}]" if step.start == 0 else f"[{step.iterator} - ({step.init})]"
