"""Copies of operand tiles into a GPU block's shared memory, as the `shared` marks of
the mapping decided (`tcpy.mapping.gpu.placement`): a synchronous copy between two
barriers (`print_shared_copy`), or, where the copy is a loop's body and the mark asks
for a ring of stages, the loop pipelined over that ring by `cp.async`
(`print_pipelined_loop`). Each thread copies every `threads`-th element or 16-byte
piece of a box (coalesced); only the part of a box inside the tensor is copied.
"""

from __future__ import annotations

import dataclasses
import math

import islpy as isl

from tcpy.codegen.ast_build import PackedBox
from tcpy.codegen.dialect import CUDA
from tcpy.codegen.exprs import LocalCopy, flat_index
from tcpy.codegen.isl_exprs import isl_expr
from tcpy.codegen.loops import Header, walk
from tcpy.codegen.matrix_tile import matrix_below
from tcpy.codegen.thread_tile import ThreadPrinter
from tcpy.mapping.gpu.device import STATIC_SHARED
from tcpy.mapping.gpu.matrix import kernel_contraction, operand_layout
from tcpy.mapping.marks import Mark, Rows, Shared, of_ast
from tcpy.naming import extent_name, tensor_name
from tcpy.types import ScalarType

THREAD = "(int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))"
"""A thread's index in its block, in C."""


def ring_stages(p: ThreadPrinter, node: isl.AstNode, header: str) -> int:
    """The stages of the ring of buffers the loop `node` fills while it computes:
    those of its body's copy into shared memory (`marks.Shared`), where every
    thread of the block runs the loop alike; else 1 (no pipeline)."""
    mark = of_ast(node.for_get_body())
    if not isinstance(mark, Shared) or p.divergent or "threadIdx" in header:
        return 1
    return mark.stages


def print_pipelined_loop(
    p: ThreadPrinter,
    node: isl.AstNode,
    loop: Header,
    depth: int,
    marks: tuple[Mark, ...],
    stages: int,
) -> None:
    """A loop whose body copies tiles into shared memory (a reduction's tile loop),
    pipelined over a ring of `stages` buffers: `tc_fill` issues the asynchronous
    copies (`cp.async`) of the tile of an iteration into a stage, and the loop
    fills the tile `stages - 1` iterations ahead while it computes its own. Each
    thread's copies of a tile are one commit group; an iteration waits until its
    tile's group has landed (all but the `stages - 2` newest), then one barrier makes
    it visible to the block and lets the stage filled next (the one the previous
    iteration read) be overwritten. A barrier after the loop ends the ring's use."""
    body = node.for_get_body()
    it, index = loop.iterator, p.dialect.index_type
    p.emit(depth, "{")
    boxes = tile_boxes(p, p.ast.packed(body), body.mark_get_node())
    rings = _rings(p, boxes, depth + 1, stages)
    _fill(p, rings, loop, depth + 1)
    p.emit(depth + 1, f"const {index} tc_first = {loop.init};")
    for k in range(stages - 1):
        p.emit(depth + 1, f"tc_fill(tc_first + {k} * ({loop.inc}), {k});")
        p.emit(depth + 1, "TC_CP_COMMIT();")
    p.emit(depth + 1, "int tc_stage = 0;")
    p.open_loop(depth + 1, loop.text)
    p.emit(depth + 2, f"TC_CP_WAIT({stages - 2});")
    p.emit(depth + 2, p.barrier)
    ahead = f"{it} + {stages - 1} * ({loop.inc})"
    p.emit(depth + 2, f"tc_fill({ahead}, (tc_stage + {stages - 1}) % {stages});")
    p.emit(depth + 2, "TC_CP_COMMIT();")
    copies = {}
    for b, buffer, padded, stage in rings:
        offsets = box_offsets(p, depth + 2, buffer, b)
        copies[b.tensor] = LocalCopy(
            buffer, offsets, padded, _turns(p, b), base=f"tc_stage * {stage}"
        )
    _compute_from(p, copies, body.mark_get_node(), depth + 2, marks)
    p.emit(depth + 2, f"tc_stage = tc_stage == {stages - 1} ? 0 : tc_stage + 1;")
    p.emit(depth + 1, "}")
    p.emit(depth + 1, "TC_CP_WAIT(0);")
    p.emit(depth + 1, p.barrier)
    p.emit(depth, "}")


def _rings(
    p: ThreadPrinter, boxes: list[tuple[PackedBox, int | None]], depth: int, stages: int
) -> list[tuple[PackedBox, str, tuple[int, ...], int]]:
    """Declares a ring of `stages` buffers in shared memory for each box (with its
    rows' skew, `tile_boxes`); returns each box, its buffer, the extents of a stage's
    tile and a stage's elements."""
    assert p.kernel is not None
    stepped = _stepped_rows_fit(p, boxes, stages)
    rings = []
    for b, skew in boxes:
        buffer = f"tc_shared{p.copies}"
        p.copies += 1
        scalar = p.scop.cdef.tensor(b.tensor).scalar
        itemsize = scalar.dtype.itemsize
        padded = _padded(p, b, itemsize, skew, stepped and b.tensor in p.kernel.stepped)
        stage = _stage_elements(math.prod(padded), itemsize)
        p.declare_shared(depth, scalar, buffer, stages * stage)
        rings.append((b, buffer, padded, stage))
    return rings


def _fill(
    p: ThreadPrinter,
    rings: list[tuple[PackedBox, str, tuple[int, ...], int]],
    loop: Header,
    depth: int,
) -> None:
    """`tc_fill(iterator, stage)`: the copies of the tiles of the loop's iteration
    `iterator` (none past the loop's end) into `stage` of each ring, by `cp.async`;
    the copies' offsets are the loop body's, evaluated at that iteration."""
    assert p.kernel is not None
    index = p.dialect.index_type
    p.emit(depth, f"auto tc_fill = [&](const {index} {loop.iterator}, const int tc_s) {{")
    p.emit(depth + 1, f"if (!({loop.cond})) return;")
    for b, buffer, padded, stage in rings:
        p.emit(depth + 1, "{")
        copy = LocalCopy(buffer, box_offsets(p, depth + 2, buffer, b), padded, _turns(p, b))
        _async_copy(p, depth + 2, b, copy, max(1, p.kernel.threads), f"tc_s * {stage}")
        p.emit(depth + 1, "}")
    p.emit(depth, "};")


def _compute_from(
    p: ThreadPrinter,
    copies: dict[str, LocalCopy],
    inner: isl.AstNode,
    depth: int,
    marks: tuple[Mark, ...],
) -> None:
    """`inner` reading the tensors of `copies` from shared memory, under the guards
    sunk into the copy's scope (`if_`); below a row kernel's statements, whose lanes
    must all reach each `__syncwarp()`, the guards stay sunk to its statements."""
    saved, sunk = p.bodies, p.sunk
    p.bodies = dataclasses.replace(saved, copies={**saved.copies, **copies})
    if any(isinstance(of_ast(n), Rows) for n, _ in walk(inner)):
        p.node(inner, depth, marks)
        p.bodies = saved
        return
    p.sunk = []
    if sunk:
        p.emit(depth, f"if ({' && '.join(f'({c})' for c in sunk)}) {{")
    diverges = any("threadIdx.x" in c for c in sunk)  # the sunk guard splits the warp
    p.divergent += diverges
    p.node(inner, depth + bool(sunk), marks)
    p.divergent -= diverges
    if sunk:
        p.emit(depth, "}")
    p.bodies, p.sunk = saved, sunk


def _async_copy(
    p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, threads: int, base: str
) -> None:
    """The copy of box `b` into `copy` from element `base` on, by `cp.async`, each
    thread taking every `threads`-th piece: 16 bytes at a time where (with
    `vectorize`) the box's and the buffer's rows are whole 16-byte pieces and, at
    run time, the rows start on one (as `_cooperative_copy` decides); else pairs of
    2-byte elements (4 bytes, the least a copy takes) where the rows allow them
    alike; else element by element, a `cp.async` of each element of 4 bytes or more,
    a load and a store of a 2-byte one."""
    itemsize = p.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
    widths = [16 // itemsize] if p.options.vectorize and not copy.turns else []
    widths += [2] if itemsize == 2 and not copy.turns else []
    last = len(b.sizes) - 1
    opened = 0
    for lanes in widths:
        if b.sizes[-1] % lanes or copy.sizes[-1] % lanes:
            continue
        aligned = (
            f"({copy.offsets[last]}) % {lanes} == 0 && "
            f"{extent_name(b.tensor, last)} % {lanes} == 0 && "
            f"((unsigned long long){tensor_name(b.tensor)} & {lanes * itemsize - 1}) == 0"
        )
        p.emit(depth + opened, f"if ({aligned}) {{")
        _async_loop(p, depth + opened + 1, b, copy, threads, base, lanes)
        p.emit(depth + opened, "} else {")
        opened += 1
    _async_loop(p, depth + opened, b, copy, threads, base, 1)
    for k in reversed(range(opened)):
        p.emit(depth + k, "}")


def _async_loop(
    p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, threads: int, base: str, lanes: int
) -> None:
    """Each thread's pieces of `lanes` elements of the box (`_async_copy`)."""
    itemsize = p.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
    sizes = [*b.sizes[:-1], b.sizes[-1] // lanes]
    total = math.prod(sizes)
    p.open_loop(depth, f"for (int tc_e = {THREAD}; tc_e < {total}; tc_e += {threads}) {{")
    local, inside, index = _element(p, depth + 1, b, copy, sizes, lanes)
    target = f"{base} + {copy.place(p.dialect, local)}"
    array = tensor_name(b.tensor)
    p.emit(depth + 1, f"if ({' && '.join(inside)}) {{")
    if lanes * itemsize >= 4:
        statement = f"TC_CP_ASYNC({copy.buffer}, {target}, {array}, {index}, {lanes * itemsize});"
    else:
        statement = (
            f"TC_SST({copy.buffer}, {target}) = {CUDA.load.format(array=array, index=index)};"
        )
    p.emit(depth + 2, statement)
    if _zero_filled(p):
        p.emit(depth + 1, "} else {")
        zero = _zero(p, b)
        p.emit(
            depth + 2,
            " ".join(f"TC_SST({copy.buffer}, {target} + {j}) = {zero};" for j in range(lanes)),
        )
    p.emit(depth + 1, "}")
    p.emit(depth, "}")


def _zero(p: ThreadPrinter, b: PackedBox) -> str:
    """A zero of the element type of box `b`'s tensor, in C (value-initialised)."""
    return CUDA.ctype(p.scop.cdef.tensor(b.tensor).scalar) + "{}"


def _zero_filled(p: ThreadPrinter) -> bool:
    """Whether a copy stores zeros where its box leaves the tensor: for the tensor
    cores (`MappedKernel.matrix`), which multiply whole tiles, the elements past a
    reduction's end included."""
    return p.kernel is not None and p.kernel.matrix


def tile_boxes(
    p: ThreadPrinter, boxes: tuple[PackedBox, ...], inner: isl.AstNode
) -> list[tuple[PackedBox, int | None]]:
    """`boxes`, each with the skew of its rows in shared memory: for an operand of a
    matrix tile under `inner` (`operand_layout`), the box made as large as its tile
    (the warps read whole tiles, and a box clamped to a loop shorter than the tile is
    shorter: its rest is past the tensor, zeros) and its skew; else the box as it is
    and None."""
    c = kernel_contraction(p.scop, p.kernel) if p.kernel is not None else None
    mark = matrix_below(inner) if c is not None else None
    out: list[tuple[PackedBox, int | None]] = []
    for b in boxes:
        layout = operand_layout(c, mark, b.tensor) if c is not None and mark else None
        if layout is None:
            out.append((b, None))
            continue
        tile, skew = layout
        out.append((dataclasses.replace(b, sizes=tuple(map(max, b.sizes, tile))), skew))
    return out


def box_offsets(p: ThreadPrinter, depth: int, buffer: str, b: PackedBox) -> tuple[str, ...]:
    """Declares the first element of box `b` of `buffer`; returns their names."""
    offsets = tuple(f"{buffer}_o{d}" for d in range(len(b.sizes)))
    for o, expr in zip(offsets, b.offsets, strict=True):
        value = isl_expr(expr, p.names, top=True)
        p.emit(depth, f"const {p.dialect.index_type} {o} = {value};")
    return offsets


def print_shared_copy(
    p: ThreadPrinter,
    boxes: tuple[PackedBox, ...],
    inner: isl.AstNode,
    depth: int,
    marks: tuple[Mark, ...],
) -> None:
    """The operand tiles of a block (`tcpy.mapping.gpu.shared.shared_tensors`) copied
    into shared memory by all its threads, then `inner` reading them there. A
    barrier before the copy lets the previous tile's readers finish, one after it
    makes the copy visible; every thread of the block reaches both, as the mark
    sits above the thread filter. Each thread copies every `threads`-th element,
    so consecutive threads read consecutive elements (coalesced); only the part of
    a box inside the tensor is copied (it holds every element read). Rows get the
    length of `_row_length`."""
    assert p.kernel is not None
    threads = max(1, p.kernel.threads)
    p.emit(depth, "{")
    p.emit(depth + 1, p.barrier)
    copies = {}
    found = tile_boxes(p, boxes, inner)
    stepped = _stepped_rows_fit(p, found, 1)
    for b, skew in found:
        buffer = f"tc_shared{p.copies}"
        p.copies += 1
        itemsize = p.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
        padded = _padded(p, b, itemsize, skew, stepped and b.tensor in p.kernel.stepped)
        p.declare_shared(depth + 1, p.scop.cdef.tensor(b.tensor).scalar, buffer, math.prod(padded))
        copy = LocalCopy(buffer, box_offsets(p, depth + 1, buffer, b), padded, _turns(p, b))
        _cooperative_copy(p, depth + 1, b, copy, threads)
        copies[b.tensor] = copy
    p.emit(depth + 1, p.barrier)
    _compute_from(p, copies, inner, depth + 1, marks)
    p.emit(depth, "}")


def store_box(p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, threads: int) -> None:
    """The part of box `b` inside its tensor stored from `copy` in shared memory to
    global memory, each thread taking every `threads`-th element (coalesced)."""
    sizes = list(b.sizes)
    total = math.prod(sizes)
    p.open_loop(depth, f"for (int tc_e = {THREAD}; tc_e < {total}; tc_e += {threads}) {{")
    local, inside, index = _element(p, depth + 1, b, copy, sizes, 1)
    source = copy.place(p.dialect, local)
    p.emit(depth + 1, f"if ({' && '.join(inside)}) {{")
    store = CUDA.store.format(array=tensor_name(b.tensor), index=index)
    p.emit(depth + 2, f"{store} = TC_SLD({copy.buffer}, {source});")
    p.emit(depth + 1, "}")
    p.emit(depth, "}")


def _cooperative_copy(
    p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, threads: int
) -> None:
    """The copy of box `b` into `copy`, each thread taking every `threads`-th
    element. With `vectorize`, where the box's rows are a whole number of 16-byte
    vectors, it reads them as vectors (`float4`, `int4`) when, at run time, the
    rows start on a vector (the box's offset, the tensor's row length and its
    address all allow it: the same for the whole block), else one element at a
    time."""
    vector = _VECTOR_TYPES.get(p.scop.cdef.tensor(b.tensor).scalar)
    if not p.options.vectorize or vector is None or b.sizes[-1] % VECTOR_LANES or copy.turns:
        _copy_loop(p, depth, b, copy, threads, None)
        return
    last = len(b.sizes) - 1
    aligned = (
        f"({copy.offsets[last]}) % {VECTOR_LANES} == 0 && "
        f"{extent_name(b.tensor, last)} % {VECTOR_LANES} == 0 && "
        f"((unsigned long long){tensor_name(b.tensor)} & 15) == 0"
    )
    p.emit(depth, f"if ({aligned}) {{")
    _copy_loop(p, depth + 1, b, copy, threads, vector)
    p.emit(depth, "} else {")
    _copy_loop(p, depth + 1, b, copy, threads, None)
    p.emit(depth, "}")


def _copy_loop(
    p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, threads: int, vector: str | None
) -> None:
    """Each thread loads `COPY_BATCH` elements (or vectors) of the box, a block's
    threads apart, into registers, then stores them: that many loads in flight
    (one with `unroll_copy_shared=False`)."""
    lanes = VECTOR_LANES if vector else 1
    sizes = [*b.sizes[:-1], b.sizes[-1] // lanes]  # in vectors along the last
    total = math.prod(sizes)
    wanted = COPY_BATCH if p.options.unroll_copy_shared else 1
    batch = max(1, min(wanted, -(-total // threads)))
    step = threads * batch
    p.open_loop(depth, f"for (int tc_e0 = {THREAD}; tc_e0 < {total}; tc_e0 += {step}) {{")
    ctype = vector or CUDA.ctype(p.scop.cdef.tensor(b.tensor).scalar)
    p.emit(depth + 1, f"{ctype} tc_v[{batch}];")
    for storing in (False, True):
        p.emit(depth + 1, "#pragma unroll")
        p.emit(depth + 1, f"for (int tc_u = 0; tc_u < {batch}; tc_u++) {{")
        _copy_element(p, depth + 2, b, copy, sizes, threads, vector, storing)
        p.emit(depth + 1, "}")
    p.emit(depth, "}")


def _copy_element(
    p: ThreadPrinter,
    depth: int,
    b: PackedBox,
    copy: LocalCopy,
    sizes: list[int],
    threads: int,
    vector: str | None,
    storing: bool,
) -> None:
    """Element `tc_e0 + tc_u * threads` of a copy: its load into `tc_v[tc_u]`, or
    (`storing`) its store from there into the shared buffer."""
    lanes = VECTOR_LANES if vector else 1
    p.emit(depth, f"const int tc_e = tc_e0 + tc_u * {threads};")
    local, inside, index = _element(p, depth, b, copy, sizes, lanes)
    target = copy.place(p.dialect, local)
    if storing and _zero_filled(p):  # every element of a vector outside the tensor
        zero = _zero(p, b)
        p.emit(depth, f"if (tc_e < {math.prod(sizes)} && !({' && '.join(inside)})) {{")
        for j in range(lanes):
            p.emit(depth + 1, f"TC_SST({copy.buffer}, {target} + {j}) = {zero};")
        p.emit(depth, "}")
    p.emit(depth, f"if ({' && '.join([f'tc_e < {math.prod(sizes)}', *inside])}) {{")
    if not storing:
        load = (
            CUDA.load.format(array=tensor_name(b.tensor), index=index)
            if vector is None
            else f"TC_LDV({vector}, {tensor_name(b.tensor)}, {index})"
        )
        p.emit(depth + 1, f"tc_v[tc_u] = {load};")
    elif vector is None:
        p.emit(depth + 1, f"TC_SST({copy.buffer}, {target}) = tc_v[tc_u];")
    else:
        # a vector lies inside the tensor or outside it whole: it starts on a
        # multiple of the lanes, as the tensor's rows end on one. Its elements are
        # stored in an order rotated by the lane and the word it starts at, so
        # that each of the four stores of a warp hits 32 distinct banks (stored
        # in order, lanes four words apart would share them)
        p.emit(depth + 1, f"const {vector} tc_x = tc_v[tc_u];")
        p.emit(depth + 1, f"const int tc_w = {target};")
        p.emit(depth + 1, "const int tc_r = (tc_e >> 3) - tc_w;")
        pick = "tc_c == 0 ? tc_x.x : tc_c == 1 ? tc_x.y : tc_c == 2 ? tc_x.z : tc_x.w"
        for k in range(lanes):
            p.emit(depth + 1, f"{{ const int tc_c = ({k} + tc_r) & 3;")
            p.emit(depth + 2, f"TC_SST({copy.buffer}, tc_w + tc_c) = {pick}; }}")
    p.emit(depth, "}")


def _element(
    p: ThreadPrinter, depth: int, b: PackedBox, copy: LocalCopy, sizes: list[int], lanes: int
) -> tuple[list[str], list[str], str]:
    """Declares `tc_i<d>`, the place in box `b` of piece `tc_e` of a copy of `sizes`
    pieces of `lanes` elements; returns those names, the conditions that the piece lies
    inside the tensor (it lies inside or outside whole: it starts on a multiple of the
    lanes, as the tensor's rows end on one), and its index in the tensor."""
    n = len(b.sizes)
    local: list[str] = []
    inside: list[str] = []
    rest = "tc_e"
    for d in reversed(range(n)):
        i = f"tc_i{d}"
        scaled = f" * {lanes}" if d == n - 1 and lanes > 1 else ""
        p.emit(depth, f"const int {i} = {rest} % {sizes[d]}{scaled};")
        rest = f"{rest} / {sizes[d]}"
        local.insert(0, i)
        at = f"{copy.offsets[d]} + {i}"
        inside.insert(0, f"{at} >= 0 && {at} < {extent_name(b.tensor, d)}")
    source = [f"{o} + {i}" for o, i in zip(copy.offsets, local, strict=True)]
    index = flat_index(p.dialect, source, [extent_name(b.tensor, d) for d in range(n)])
    return local, inside, index


def _padded(
    p: ThreadPrinter, b: PackedBox, itemsize: int, skew: int | None, stepped: bool
) -> tuple[int, ...]:
    """The extents of a buffer holding box `b`: its rows lengthened (`row_length`), the
    rows along the last dimension (the one before it where the copy is turned,
    `_turns`: the buffer then holds the last first), or for a tensor-core operand
    (`skew` given) along the last dimension longer than 1 (batch dimensions have
    tiles of 1), so that its row and reduction indices are the tile's rows and
    columns."""
    sizes = b.sizes
    last = len(sizes) - 1 - _turns(p, b)
    if skew is not None:
        last = max((d for d, n in enumerate(sizes) if n > 1), default=last)
    row = row_length(p, sizes[last], itemsize, skew, stepped)
    return (*sizes[:last], row, *sizes[last + 1 :])


def row_length(
    p: ThreadPrinter, elements: int, itemsize: int, skew: int | None, stepped: bool
) -> int:
    """The length of a row of `elements` of `itemsize` bytes of a tile in shared memory
    in the kernel being printed: for the tensor cores' operands, whole 16-byte pieces
    and `skew` elements more (`tile_boxes`), so that every row an `ldmatrix` reads
    starts on 16 bytes and the rows it (or a warp's tf32 fragments) reads at once
    fall in distinct banks; for an operand the threads read along its rows several
    steps at a time (`stepped`, `MappedKernel.stepped`: 4-byte elements),
    `_stepped_row`; else
    `_row_length`."""
    assert p.kernel is not None
    if skew is not None:
        piece = 16 // itemsize
        return -(-elements // piece) * piece + skew
    if stepped:
        return _stepped_row(elements)
    return _row_length(elements, p.kernel.runs, itemsize)


def _turns(p: ThreadPrinter, b: PackedBox) -> int:
    """How many of box `b`'s innermost dimensions its copy holds first: 1 for an
    operand the threads read along the dimension before its last
    (`MappedKernel.turned`: `A(k,m)`, whose copy's rows then run along k), else 0."""
    assert p.kernel is not None
    return int(b.tensor in p.kernel.turned)


def _stepped_row(elements: int) -> int:
    """The length of a row of 4-byte elements read 4 at a time as vectors: whole
    vectors, an odd number of them, so that every vector starts on 16 bytes and the
    8 lanes a vector load serves at once, reading 8 consecutive rows, fall in 32
    distinct banks (rows of 16 words take 20)."""
    vectors = -(-elements // VECTOR_LANES)
    return (vectors + (vectors % 2 == 0)) * VECTOR_LANES


def _stepped_rows_fit(
    p: ThreadPrinter, boxes: list[tuple[PackedBox, int | None]], stages: int
) -> bool:
    """Whether the kernel's operands read several steps at a time (`MappedKernel.stepped`)
    among `boxes` get rows of `_stepped_row`: where, with `stages` buffers each, the
    boxes still fit the shared memory the options allow beside what the kernel declared
    already (the mapping's budget allows only `_row_length`'s padding)."""
    assert p.kernel is not None
    if not any(b.tensor in p.kernel.stepped and skew is None for b, skew in boxes):
        return False
    total = p.shared_bytes
    for b, skew in boxes:
        itemsize = p.scop.cdef.tensor(b.tensor).scalar.dtype.itemsize
        padded = _padded(p, b, itemsize, skew, b.tensor in p.kernel.stepped)
        total += stages * _stage_elements(math.prod(padded), itemsize) * itemsize
    limit = min(p.options.max_shared_memory or STATIC_SHARED, STATIC_SHARED)
    return total <= limit


def _row_length(elements: int, runs: int, itemsize: int = 4) -> int:
    """The length of a row of a tile of `elements` in shared memory: one word more for
    rows of an even number of words, 16 or more (one element; two of 2 bytes, which
    keeps rows on 4 bytes), so that threads walking a column of the tile hit distinct
    banks (rows of 16 words unpadded put a warp's column in 2 banks); at most 1/17
    more, which `device.shared_budget` leaves room for. Where threads read runs of
    adjacent elements (`MappedKernel.runs`), which the mapping gives only where no
    thread walks a column, a multiple of 4 instead, so that every run starts on a
    vector. A padded row is no whole 16-byte pieces: a pipelined copy fills it 4
    bytes at a time."""
    if runs > 1:
        return -(-elements // VECTOR_LANES) * VECTOR_LANES
    word = max(1, 4 // itemsize)
    words = -(-elements // word)
    return elements + word * (words >= 16 and words % 2 == 0)


VECTOR_LANES = 4
COPY_BATCH = 4
"""The elements (or vectors) each thread of a cooperative copy loads before storing
them (`unroll_copy_shared`). One at a time, each load waits for the store of the one
before, which waits for its load: a single load in flight per thread."""
_VECTOR_TYPES = {ScalarType.FLOAT32: "float4", ScalarType.INT32: "int4"}
"""The 16-byte vectors a shared-memory copy reads, by the tensor's element type."""


def _stage_elements(elements: int, itemsize: int) -> int:
    """The elements of a stage of a ring of buffers holding `elements`: a whole number
    of 16-byte pieces, so that every stage starts on one."""
    per = 16 // itemsize if itemsize <= 16 else 1
    return -(-elements // per) * per
