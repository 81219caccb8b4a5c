"""Printing a pack mark (`tcpy.mapping.promotion`): each tensor the mark names is
copied, for the tile that the loops outside the mark select, into a buffer of the
thread running it, and the statements inside read it from there.

The buffers of every thread are carved out of one arena, allocated once per call
before any work starts (`arena_bytes` per thread; a failed allocation returns a
status, so no thread is left without its buffers inside the parallel region). They
are reached through pointers: GCC keeps a register block in registers beside a
pointer, not beside a large local array (measured: 2.4x slower with the buffers on
the stack). A copy made once above a nest (`pack_once:`) has its buffers after every
thread's part, in one part the threads share (`shared_starts`); inside the parallel
region the threads share out its copy loop and wait for each other before reading it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import islpy as isl

from tcpy.codegen.ast_build import Ast, PackedBox
from tcpy.codegen.exprs import LocalCopy, flat_index
from tcpy.codegen.isl_exprs import isl_expr
from tcpy.codegen.loops import walk
from tcpy.codegen.printer import Printer
from tcpy.mapping.marks import Mark, Pack, innermost_first, of_ast
from tcpy.naming import extent_name, tensor_name
from tcpy.parser.checked import CheckedDef
from tcpy.poly.isl_helpers import ast_children

ALIGN = 64  # a cache line: each buffer starts on one
ARENA = "tc_arena"  # every thread's buffers, allocated once per call
MINE = "tc_mine"  # the calling thread's part of the arena
SHARED = "tc_shared"  # the part of the arena of the copies made once, which every thread reads


def arena_bytes(ast: Ast, cdef: CheckedDef) -> int:
    """The bytes of buffers a thread needs: the most that copy sites inside one
    another hold together (a row block's temporaries and a statement's operand tile
    below them)."""

    def held(node: isl.AstNode) -> int:
        kind = node.get_type()
        if kind == isl.ast_node_type.mark:
            boxes = () if _once(node) else ast.packed(node)
            own = _site_bytes(boxes, cdef)[-1] if boxes else 0
            return own + held(node.mark_get_node())
        if kind == isl.ast_node_type.for_:  # type: ignore[attr-defined]
            return held(node.for_get_body())
        if kind == isl.ast_node_type.if_:  # type: ignore[attr-defined]
            other = node.if_get_else_node() if node.if_has_else_node() else None
            return max(held(node.if_get_then_node()), 0 if other is None else held(other))
        if kind == isl.ast_node_type.block:
            return max((held(c) for c in ast_children(node)), default=0)
        return 0

    return held(ast.root)


def shared_starts(ast: Ast, cdef: CheckedDef) -> dict[str, int]:
    """Where the buffers of each copy made once (`pack_once:`) start in the shared
    part of the arena, by the mark's key, and under "" the bytes of that part: each
    copy has its own buffers (a thread may still read one nest's copy while another
    fills the next nest's)."""
    starts, end = {}, 0
    for node, _ in walk(ast.root):
        if node.get_type() == isl.ast_node_type.mark and _once(node) and ast.packed(node):
            starts[node.get_annotation().get_name()] = end
            end += _site_bytes(ast.packed(node), cdef, once=True)[-1]
    return {**starts, "": end}


def _once(node: isl.AstNode) -> bool:
    """Whether a mark node is a copy made once above a nest (`pack_once:`)."""
    mark = of_ast(node)
    return isinstance(mark, Pack) and mark.once


def _site_bytes(boxes: tuple[PackedBox, ...], cdef: CheckedDef, once: bool = False) -> list[int]:
    """Where each box's buffer starts in the thread's part of the arena (`once`: in the
    shared part, `_held`), then the end."""
    starts = [0]
    for b in boxes:
        itemsize = cdef.tensor(b.tensor).scalar.dtype.itemsize
        size = math.prod(_held(b, itemsize, once)) * itemsize
        starts.append(starts[-1] + -(-size // ALIGN) * ALIGN)
    return starts


ALIASING_ROWS = 512
"""Bytes of which a copy's rows may not be a multiple (`_held`)."""


def _held(b: PackedBox, itemsize: int, once: bool) -> tuple[int, ...]:
    """The extents of `b`'s buffer: its held extents, and, for a copy made once whose
    rows (its innermost dimension as held) are a multiple of ALIASING_ROWS bytes, a
    cache line more in each row. A block reads a vector from each row of such a copy
    (a convolution's filters, `[c][kh][kw][f]`, 16 channels at a time): rows of 1 KB
    put all 2,304 of a block's reads in 64 of the L2 cache's 1,024 sets, 8 ways each,
    and every block read them again from L3; rows of 1,088 bytes spread them over all."""
    held = b.held
    n = len(held)
    inner = innermost_first(list(range(n)), b.turns)[-1] if b.turns else n - 1
    if not once or n < 2 or b.phases > 1 or (held[inner] * itemsize) % ALIASING_ROWS:
        return held
    return tuple(e + ALIGN // itemsize if d == inner else e for d, e in enumerate(held))


def print_pack(
    p: Printer,
    boxes: tuple[PackedBox, ...],
    inner: isl.AstNode,
    depth: int,
    marks: tuple[Mark, ...],
    copy_in: bool = True,
    once: str | None = None,
    body: Callable[[isl.AstNode, int, tuple[Mark, ...]], None] | None = None,
    wait: str | None = None,
) -> None:
    """The copies of `boxes`, then `inner` reading them (printed by `body`, by default
    `p.node`), in a scope of their own (the buffers live as long as the tile). The box
    of a tile at the edge of the domain may reach past the tensor: only the part
    inside it is copied, which holds every element the statements read (their reads
    are proven in bounds). Without `copy_in` (a `scratch:` mark: temporaries that live
    and die in the tile) the buffers are only placed: `inner` writes them before it
    reads them. `once`, the key of a `pack_once:` mark: the buffers are the shared
    ones of that mark (`shared_starts`); with `wait`, inside the parallel region, the
    threads share out the copy loops and meet at `wait` before `inner`."""
    p.emit(depth, "{")
    copies = {}
    base, first = (SHARED, p.shared_starts[once]) if once is not None else (MINE, p.arena_at)
    starts = [first + start for start in _site_bytes(boxes, p.scop.cdef, once is not None)]
    wait = wait if once is not None else None  # only a copy made once is shared out
    for b, start in zip(boxes, starts, strict=False):
        buffer = f"tc_pack{p.copies}"
        p.copies += 1
        offsets = tuple(f"{buffer}_o{d}" for d in range(len(b.sizes)))
        for name, expr in zip(offsets, b.offsets, strict=True):
            p.emit(depth + 1, f"const int64_t {name} = {isl_expr(expr, p.names, top=True)};")
        itemsize = p.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
        held = _held(b, itemsize, once is not None)
        copy = LocalCopy(buffer, offsets, held, turns=b.turns, phases=b.phases)
        ctype = p.dialect.ctype(p.scop.cdef.tensor(b.tensor).scalar)
        p.emit(depth + 1, f"{ctype} *restrict {buffer} = ({ctype} *)({base} + {start});")
        if copy_in:
            _copy(p, depth + 1, b.tensor, copy, WORKSHARING if wait else None)
        copies[b.tensor] = copy
    if wait:
        p.emit(depth + 1, wait)
    saved, outside = p.bodies, p.arena_at
    p.bodies = dataclasses.replace(saved, copies={**saved.copies, **copies})
    if once is None:
        p.arena_at = starts[-1]  # the sites inside take the buffers after these
    (body or p.node)(inner, depth + 1, marks)
    p.bodies, p.arena_at = saved, outside
    p.emit(depth, "}")


WORKSHARING = "#pragma omp for schedule(static) nowait"
"""The outermost loop of a copy made once inside the parallel region: its iterations
shared out among the threads, who then wait for each other before reading."""


def _copy(p: Printer, depth: int, tensor: str, copy: LocalCopy, outer: str | None = None) -> None:
    """The loops filling a buffer: one loop per dimension, from the first element
    inside the tensor to the last inside both box and tensor; `outer`, a pragma of the
    outermost loop (`WORKSHARING`)."""
    n = len(copy.sizes)
    local = [f"tc_i{d}" for d in range(n)]
    for d, (o, size) in enumerate(zip(copy.offsets, copy.sizes, strict=True)):
        room = f"{extent_name(tensor, d)} - {o}"
        p.emit(depth, f"const int64_t {copy.buffer}_l{d} = {o} < 0 ? -{o} : 0;")
        p.emit(depth, f"const int64_t {copy.buffer}_u{d} = {room} < {size} ? {room} : {size};")
    order = innermost_first(range(n), copy.turns) if copy.turns else list(range(n))
    source = [f"{o} + {i}" for o, i in zip(copy.offsets, local, strict=True)]
    extents = [extent_name(tensor, d) for d in range(n)]
    within = flat_index(p.dialect, [local[d] for d in order], [str(copy.sizes[d]) for d in order])
    read = flat_index(p.dialect, source, extents)
    assignment = f"{copy.buffer}[{within}] = {tensor_name(tensor)}[{read}];"
    if copy.turns:
        _transposing_copy(p, depth, copy, local, assignment, outer)
        return
    if outer is not None:
        p.emit(depth, outer)
    if copy.phases > 1:
        _phased_copy(p, depth, copy, tensor)
        return
    for d, i in enumerate(local):
        if d == n - 1 and p.options.vectorize and not (d == 0 and outer is not None):
            p.emit(depth + d, "#pragma omp simd")
        bounds = f"{i} = {copy.buffer}_l{d}; {i} < {copy.buffer}_u{d}"
        p.open_loop(depth + d, f"for (int64_t {bounds}; {i}++) {{")
    p.emit(depth + n, assignment)
    for d in reversed(range(n)):
        p.emit(depth + d, "}")


def _phased_copy(p: Printer, depth: int, copy: LocalCopy, tensor: str) -> None:
    """The loops filling a buffer whose rows are held in phases (`LocalCopy.phases`):
    for each phase, the row's elements at that phase, read at the stride of the phases
    and written unit-stride."""
    n, phases = len(copy.sizes), copy.phases
    local = [f"tc_i{d}" for d in range(n - 1)]
    for d, i in enumerate(local):
        p.open_loop(
            depth + d, f"for (int64_t {i} = {copy.buffer}_l{d}; {i} < {copy.buffer}_u{d}; {i}++) {{"
        )
    inner = depth + n - 1
    last = n - 1
    p.open_loop(inner, f"for (int64_t tc_p = 0; tc_p < {phases}; tc_p++) {{")
    # the first and last step of the phase inside the copied part (its bounds are >= 0)
    first = f"({copy.buffer}_l{last} + {phases - 1} - tc_p) / {phases}"
    end = f"({copy.buffer}_u{last} + {phases - 1} - tc_p) / {phases}"
    if p.options.vectorize:
        p.emit(inner + 1, "#pragma omp simd")
    p.open_loop(inner + 1, f"for (int64_t tc_q = {first}; tc_q < {end}; tc_q++) {{")
    held = [*local, f"tc_p * {copy.sizes[-1] // phases} + tc_q"]
    within = flat_index(p.dialect, held, [str(s) for s in copy.sizes])
    source = [
        f"{o} + {i}" for o, i in zip(copy.offsets, [*local, f"tc_q * {phases} + tc_p"], strict=True)
    ]
    read = flat_index(p.dialect, source, [extent_name(tensor, d) for d in range(n)])
    p.emit(inner + 2, f"{copy.buffer}[{within}] = {tensor_name(tensor)}[{read}];")
    for d in reversed(range(n + 1)):
        p.emit(depth + d, "}")


TRANSPOSE_BLOCK = 16
"""The copy of a transposed tile moves blocks of this many elements of a tensor's row:
each row is read a cache line at a time, and the lines of the buffer it writes stay
in cache across the rows of the block."""


def _transposing_copy(
    p: Printer,
    depth: int,
    copy: LocalCopy,
    local: list[str],
    assignment: str,
    shared: str | None = None,
) -> None:
    """The loops filling a buffer that holds a tile with its `copy.turns` innermost
    dimensions first: those but the innermost outermost, then blocks of TRANSPOSE_BLOCK
    along the innermost, each copied row after row (the other dimensions, in the
    tensor's order); `shared`, the pragma of the outermost loop but that of the blocks
    (that one where there is no other). The buffer's rows are then written along their
    length: a convolution's filters `K(f,c,kh,kw)` into `[c][kh][kw][f]`, 9.4 MB, took
    3.7 ms copied `f` outermost (each `f` writing a float to 4,608 rows) and 1.6 ms
    so, on two threads of a Zen 3."""
    n = len(local)
    turned, rows, inner = local[n - copy.turns : -1], local[: n - copy.turns], local[-1]
    lo, hi, block = f"{copy.buffer}_l", f"{copy.buffer}_u", TRANSPOSE_BLOCK
    outer = [*turned, "tc_b", *rows]
    sharing = outer[0] if turned or not rows else rows[0]
    for d, i in enumerate(outer):
        if i == sharing and shared is not None:
            p.emit(depth + d, shared)
        if i == "tc_b":
            last = f"{hi}{n - 1}"
            p.open_loop(
                depth + d, f"for (int64_t tc_b = {lo}{n - 1}; tc_b < {last}; tc_b += {block}) {{"
            )
            p.emit(
                depth + d + 1,
                f"const int64_t tc_e = tc_b + {block} < {last} ? tc_b + {block} : {last};",
            )
            continue
        k = local.index(i)
        p.open_loop(depth + d, f"for (int64_t {i} = {lo}{k}; {i} < {hi}{k}; {i}++) {{")
    if p.options.vectorize:  # distinct elements of the buffer: no check of overlap needed
        p.emit(depth + len(outer), "#pragma omp simd")
    p.open_loop(depth + len(outer), f"for (int64_t {inner} = tc_b; {inner} < tc_e; {inner}++) {{")
    p.emit(depth + len(outer) + 1, assignment)
    for d in reversed(range(len(outer) + 1)):
        p.emit(depth + d, "}")
