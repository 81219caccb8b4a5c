"""Promotion: copying the tile of a tensor that a loop nest reads into a local buffer.

The *footprint* of a tensor at a schedule node is what the statements below the node
access of it, as a function of the loops above the node (the node's prefix
schedule). Its *box* over-approximates it by a rectangle: for each tensor dimension,
the first element as a piecewise affine function of the outer loops, and a constant
extent. The box is what a copy moves: on the CPU a contiguous, thread-private buffer
(`tcpy.mapping.cpu.packing`); on the GPU a block's tile in shared memory
(`tcpy.mapping.gpu.shared`).

Whether a copy pays is decided from three facts, all computed here:
- *reuse*: some loop below the node leaves every access of the tensor invariant, so
  each element copied is read that many times (`reuse`);
- *stride*: the box is not contiguous in the tensor, and the rows of the box lie far
  apart in memory (`run_stride`): rows at a large power-of-two distance map to the
  same cache sets, so a tile read across them evicts itself;
- *size*: the boxes fit the budget of the buffers (`within_budget`; a CPU thread's
  `PACK_BYTES` by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from tcpy.mapping import marks
from tcpy.naming import tensor_name
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, Role
from tcpy.parser.linear import linear_form
from tcpy.parser.ranges import guarded_accesses
from tcpy.parser.symbolic import Sym
from tcpy.poly.isl_helpers import (
    schedule_children,
    statement_names,
    union_map_maps,
)
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import is_band

PACK_BYTES = 192 * 1024
"""The buffers of one copy site, per thread (a matmul's 256 x 128 slice of B fits; its
256 x 256 tile of A, read by broadcasts, does not, and packing it too measured no
faster)."""
MIN_REUSE = 4
"""Reads of each copied element that make a copy worth its cost (a copy is a load
and a store per element)."""


@dataclass(frozen=True, slots=True)
class Box:
    """A rectangle holding a footprint: per tensor dimension, its first element (a
    function of the loops outside the copy) and its constant extent."""

    tensor: str
    offsets: tuple[isl.PwAff, ...]
    sizes: tuple[int, ...]

    @property
    def elements(self) -> int:
        return math.prod(self.sizes)


def footprint(prefix: isl.UnionMap, accesses: isl.UnionMap, tensor: str) -> isl.Map | None:
    """Outer loop values -> the elements of `tensor` accessed there; `prefix` maps the
    statement instances below the copy site to the outer loop values. None when no
    statement there accesses the tensor."""
    name = tensor_name(tensor)
    found = [
        m
        for m in union_map_maps(prefix.reverse().apply_range(accesses))
        if m.get_tuple_name(isl.dim_type.out) == name
    ]
    return found[0] if found else None


def box(footprint: isl.Map, tensor: str) -> Box | None:
    """The box of a footprint; None when an extent is not bounded by a constant (a
    dimension the loops below walk whole, of a size known only at run time), when
    isl cannot bound it (its maximum only takes affine expressions with integer
    coefficients, and a strided access can give floor divisions), or when the
    footprint is a slice of its box of fewer dimensions (`_sliced`), or when it is
    pieces far apart (`_scattered`): a copy of the box would move far more than is read."""
    found = _extents(footprint)
    if found is None:
        return None
    offsets, sizes = found
    if _sliced(footprint, sizes) or _scattered(footprint, sizes):
        return None
    return Box(tensor, tuple(offsets), tuple(sizes))


def _extents(footprint: isl.Map) -> tuple[list[isl.PwAff], list[int]] | None:
    """The least offset of a footprint in each dimension and the most elements it
    spans there, at any value of the outer loops; None where isl cannot bound them."""
    offsets, sizes = [], []
    for d in range(footprint.dim(isl.dim_type.out)):
        lo, hi = footprint.dim_min(d), footprint.dim_max(d)
        try:
            widest = hi.sub(lo).max_val()
        except isl.Error:
            return None
        if not widest.is_int():
            return None
        offsets.append(lo)
        sizes.append(int(widest.to_python()) + 1)
    return offsets, sizes


SCATTER = 4
"""How many times the elements of its pieces' own boxes a footprint's box may hold."""


def _scattered(footprint: isl.Map, sizes: list[int]) -> bool:
    """Whether a footprint made of pieces (reads of one tensor by different subscripts)
    has a box of more than `SCATTER` times the elements of the pieces' own boxes: the
    pieces lie far apart (`U(c0 + c4, c1, c0 + c4)` and `U(c3, c0 + c4, c1)` spanned a
    37 x 33 x 33 box to read 56 elements; packed at each iteration, its copies ran 16
    times the work of its def, found by the fuzzer)."""
    pieces = footprint.get_basic_maps()
    if len(pieces) < 2:
        return False
    parts = 0
    for piece in pieces:
        found = _extents(isl.Map.from_basic_map(piece))
        if found is None:
            return False
        parts += math.prod(found[1])
    return math.prod(sizes) > SCATTER * parts


def _sliced(footprint: isl.Map, sizes: list[int]) -> bool:
    """Whether the elements a footprint reaches at each value of the outer loops lie
    on a slice of fewer dimensions than its box spans: more affine equalities among
    the elements' coordinates than the box has dimensions of one element (a diagonal
    `LUT(c, c)` reads 64 elements of a 64 x 64 box; copied, each tile moved 4096
    values to read 64, and ran 17 times the work of its def, found by the fuzzer)."""
    n = footprint.dim(isl.dim_type.out)
    equalities = sum(
        1
        for c in footprint.affine_hull().get_constraints()
        if c.is_equality() and c.involves_dims(isl.dim_type.out, 0, n)
    )
    return equalities > sum(1 for s in sizes if s == 1)


def run_stride(b: Box, shape: tuple[int | None, ...], itemsize: int) -> int | None:
    """The bytes between the contiguous runs of elements a box covers (the tensor's
    row length, or more when the box covers whole rows); 0 when the box is one run;
    None when a size it depends on is known only at run time."""
    stride = itemsize
    for d in reversed(range(len(shape))):
        extent = shape[d]
        if extent is None:
            return None
        if b.sizes[d] < extent:
            return 0 if all(s == 1 for s in b.sizes[:d]) else stride * extent
        stride *= extent
    return 0


def has_mark(node: isl.ScheduleNode, kind: type[marks.Mark]) -> bool:
    """Whether `node` or a node below it is a mark of `kind`."""
    if isinstance(marks.of(node), kind):
        return True
    return any(has_mark(c, kind) for c in schedule_children(node))


def marks_below(node: isl.ScheduleNode, kind: type[marks.Mark]) -> list[isl.ScheduleNode]:
    """The marks of `kind` at or below `node`, outermost first."""
    found = [node] if isinstance(marks.of(node), kind) else []
    for c in schedule_children(node):
        found.extend(marks_below(c, kind))
    return found


def kernel_local(node: isl.ScheduleNode, tensor: str, scop: Scop, outputs: bool = False) -> bool:
    """Whether a temporary lives and dies below `node`: every statement of the
    definition that touches it runs there (a reduction's initialisation too), one of
    them writes it (with `=` or an initialised reduction), the others only read it or
    rewrite elements it wrote with `=` (an attention's scores scaled in place), after
    that one in program order, only elements it wrote, and each read affine and
    unconditional (the code generators read a checked subscript from global memory,
    where the values never went: a tie count read under `?:` in a max's backward
    read poison on the GPU, the gradient fuzzer's find). Its values then never need
    global memory. With `outputs`, the same rules for an output, whose values then
    need global memory only at the end (`tcpy.mapping.gpu.shared.written_by_block`)."""
    cdef = scop.cdef
    if cdef.tensor(tensor).role is not Role.TEMPORARY and not outputs:
        return False
    for st in cdef.statements:
        for access, guarded in (g for e in st.expressions for g in guarded_accesses(e)):
            if access.tensor == tensor and (
                guarded or any(linear_form(a) is None for a in access.args)
            ):
                return False
    below = statement_indices(node, scop)
    writers = [k for k, st in enumerate(cdef.statements) if st.tensor == tensor]
    readers = [
        k for k, st in enumerate(cdef.statements) if subscript_indices(st, tensor) is not None
    ]
    if not writers or not set(writers + readers) <= set(below):
        return False
    if not _rewrites_in_place(writers, scop, tensor):
        return False
    # an initialisation scheduled in a nest of its own would write global memory,
    # and the buffer below would start from whatever it held
    names = statement_names(node.get_domain())
    if any(s.index == writers[0] and s.name not in names for s in scop.statements):
        return False
    writer = cdef.statements[writers[0]]
    if writer.op.is_reduction and not writer.op.initializes:
        return False
    if any(k <= writers[0] for k in readers):
        return False
    name = tensor_name(tensor)
    written = scop.writes.range().extract_set(_space(scop, name))
    read = scop.reads.range().extract_set(_space(scop, name))
    return read.is_subset(written)


def _rewrites_in_place(writers: list[int], scop: Scop, tensor: str) -> bool:
    """Whether every statement of `writers` after the first (positions in the
    definition) assigns with `=` elements the first one wrote (or, run together with
    it over tiles, `tcpy.poly.online`, adds into them: an attention's scores of a tile,
    set to 0 and then summed)."""
    if len(writers) == 1:
        return True
    cdef = scop.cdef
    if any(
        cdef.statements[k].op.is_reduction
        and (cdef.group_of(k) is None or cdef.statements[k].op.initializes)
        for k in writers[1:]
    ):
        return False
    space = _space(scop, tensor_name(tensor))

    def written(k: int) -> isl.Set:
        found = isl.Set.empty(space)
        for s in scop.statements:
            if s.index == k:
                writes = scop.writes.intersect_domain(isl.UnionSet.from_set(s.domain))
                found = found.union(writes.range().extract_set(space))
        return found

    first = written(writers[0])
    return all(written(k).is_subset(first) for k in writers[1:])


def _space(scop: Scop, array: str) -> isl.Space:
    """The space of an array's elements, as the access relations name it."""
    for m in union_map_maps(scop.writes):
        if m.get_tuple_name(isl.dim_type.out) == array:
            return m.get_space().range()
    raise KeyError(array)


def candidates(node: isl.ScheduleNode, scop: Scop, min_rank: int = 2) -> list[str]:
    """The tensors of rank `min_rank` or more that the statements below `node` read and do not
    write, every read affine and unconditional (so each element read is in the box and
    in the tensor); none when a worksharing loop is below `node`."""
    if has_parallel_mark(node):
        return []
    statements = statements_below(node, scop)
    written = {st.tensor for st in statements}  # an initialisation's is its reduction's
    reads: dict[str, bool] = {}
    for st in statements:
        for access, guarded in (g for e in st.expressions for g in guarded_accesses(e)):
            affine = all(linear_form(a) is not None for a in access.args)
            ok = affine and not guarded and reads.get(access.tensor, True)
            reads[access.tensor] = ok
    return sorted(
        t
        for t, ok in reads.items()
        if ok and t not in written and len(scop.cdef.tensor(t).shape) >= min_rank
    )


def reuse(node: isl.ScheduleNode, tensor: str, scop: Scop) -> int:
    """The most iterations of one loop below `node` along which every access of
    `tensor` stays put: a lower bound on how often each element of its footprint is
    read (a loop of a size known only at run time counts as MIN_REUSE)."""
    best = 1
    for band in _bands_below(node):
        for k in range(band.band_n_member()):
            if stays_along(band, k, tensor, scop):
                extent = member_extent(band, k)
                best = max(best, MIN_REUSE if extent is None else extent)
    return best


def stays_along(band: isl.ScheduleNode, member: int, tensor: str, scop: Scop) -> bool:
    """Whether every access of `tensor` stays put along band member `member`, a member
    that runs some statement."""
    return bool(member_variables(band, member)) and not _moves(band, member, tensor, scop)


def _moves(band: isl.ScheduleNode, member: int, tensor: str, scop: Scop) -> bool:
    """Whether some statement's access of `tensor` changes along band member `member`
    (a member that combines indices counts as changing it)."""
    for name, position in member_variables(band, member).items():
        stmt = scop.statement(name)
        if stmt.kind is not Kind.COMPUTE:
            continue
        uses = subscript_indices(stmt.source(scop.cdef), tensor)
        if uses is not None and (position is None or stmt.dims[position] in uses):
            return True
    return False


def within_budget(
    node: isl.ScheduleNode,
    tensors: list[str],
    scop: Scop,
    budget: int = PACK_BYTES,
    accesses: isl.UnionMap | None = None,
) -> list[str]:
    """The tensors whose boxes (of their reads, or of `accesses`) fit `budget` bytes
    together, smallest first."""
    sized = []
    for t in tensors:
        b = box_at(node, t, scop, accesses)
        if b is not None:
            sized.append((b.elements * scop.cdef.tensor(t).scalar.dtype.itemsize, t))
    chosen, used = [], 0
    for size, t in sorted(sized):
        if used + size <= budget:
            chosen.append(t)
            used += size
    return sorted(chosen)


def box_at(
    node: isl.ScheduleNode, tensor: str, scop: Scop, accesses: isl.UnionMap | None = None
) -> Box | None:
    prefix = node.get_prefix_schedule_union_map().intersect_domain(node.get_domain())
    found = footprint(prefix, scop.reads if accesses is None else accesses, tensor)
    return None if found is None else box(found, tensor)


def extent_value(scop: Scop, extent: Sym) -> int | None:
    """A tensor extent's value, when the sizes are fixed (else None)."""
    if extent.is_const:
        return extent.const
    return None if scop.sizes is None else extent.evaluate(scop.sizes)


def statements_below(node: isl.ScheduleNode, scop: Scop) -> list[CheckedStatement]:
    """The TC statements with instances below `node` (computed or initialised)."""
    return [scop.cdef.statements[k] for k in statement_indices(node, scop)]


def statement_indices(node: isl.ScheduleNode, scop: Scop) -> list[int]:
    """The positions in the definition of the TC statements with instances below
    `node`, in program order."""
    names = statement_names(node.get_domain())
    return sorted({scop.statement(n).index for n in names})


def subscript_indices(st: CheckedStatement, tensor: str) -> set[str] | None:
    """The indices the statement's accesses of `tensor` use; None when it reads none."""
    found = None
    for node in (n for e in st.expressions for n in ast.walk(e)):
        if isinstance(node, ast.Access) and node.tensor == tensor:
            found = found or set()
            found |= {i.name for a in node.args for i in ast.walk(a) if isinstance(i, ast.Index)}
    return found


def _bands_below(node: isl.ScheduleNode) -> list[isl.ScheduleNode]:
    found = []
    for c in schedule_children(node):
        if is_band(c):
            found.append(c)
        found.extend(_bands_below(c))
    return found


def has_parallel_mark(node: isl.ScheduleNode) -> bool:
    """Whether `node` or a node below it is a parallel mark."""
    return has_mark(node, marks.Parallel)
