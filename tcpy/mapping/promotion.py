"""Promotion: copying the tile of a tensor that a loop nest reads into a local buffer.

The *footprint* of a tensor at a schedule node is what the statements below the node
access of it, as a function of the loops above the node (the node's prefix
schedule). Its *box* over-approximates it by a rectangle: for each tensor dimension,
the first element as a piecewise affine function of the outer loops, and a constant
extent. The box is what a copy moves: on the CPU a contiguous, thread-private buffer
("packing", this module's `pack_operands` pass); on the GPU the same analysis sizes
shared-memory tiles.

Whether a copy pays is decided from three facts, all computed here:
- *reuse*: some loop below the node leaves every access of the tensor invariant, so
  each element copied is read that many times (`reuse`);
- *stride*: the box is not contiguous in the tensor, and the rows of the box lie far
  apart in memory (`run_stride`): rows at a large power-of-two distance map to the
  same cache sets, so a tile read across them evicts itself;
- *size*: the boxes fit the budget of buffers a thread keeps (`PACK_BYTES`).

`pack_operands(schedule, scop, options)` expects a CPU-mapped schedule (tiled, with
its parallel marks) and returns it with a `pack:<tensors>` mark above the point
loops of each nest whose tiles it copies. Marks change no order: coincidence,
permutability and every dependence are as they were. The mark is only placed where
no worksharing loop is below it (each thread copies into its own buffer) and the
tensors it names are not written below it (the copy stays current).

`scratch_temporaries(schedule, scop)` is the same idea for a kernel-local temporary
that one iteration of a parallel loop writes and then reads back (the row maximum
and the exponentials of a softmax row): a `scratch:<tensors>` mark below the
parallel loop gives each thread a private buffer the size of one iteration's
footprint, with no copy in or out, so the temporary never goes to memory shared by
the threads and its whole-tensor allocation is never made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from tcpy.codegen.loops import PACK_MARK, PARALLEL_MARK, SCRATCH_MARK, TRANSPOSED
from tcpy.codegen.naming import tensor_name
from tcpy.mapping.locality import is_window_member
from tcpy.mapping.options import MappingOptions
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, Role
from tcpy.parser.ranges import guarded_accesses, linear_form
from tcpy.parser.symbolic import Sym
from tcpy.poly.isl_helpers import schedule_children, union_map_maps, union_set_sets
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import has_band_below, insert_mark, is_band, map_outermost_bands

PACK_BYTES = 192 * 1024
"""The buffers of one copy site, per thread (a matmul's 256 x 128 slice of B fits; its
256 x 256 tile of A, read by broadcasts, does not, and packing it too measured no
faster)."""
MIN_REUSE = 4
"""Reads of each copied element that make a copy worth its cost (a copy is a load
and a store per element)."""
LARGE_STRIDE = 4096
"""Bytes between the rows of a box above which its rows alias in the cache: measured
on matmul, one thread: rows of 4 KB 1.75x faster packed, rows of 2 KB no faster)."""


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
    dimension the loops below walk whole, of a size known only at run time), or when
    isl cannot bound it (its maximum only takes affine expressions with integer
    coefficients, and a strided access can give floor divisions)."""
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
    return Box(tensor, tuple(offsets), tuple(sizes))


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


# --- the CPU pass ------------------------------------------------------------------------


def pack_operands(
    schedule: isl.Schedule,
    scop: Scop,
    options: MappingOptions,
    transposed: frozenset[str] = frozenset(),
) -> isl.Schedule:
    """The schedule with a `pack:` mark (see the module docstring) above the point
    loops of every nest with tiles worth copying: with `options.pack_operands` None,
    the tensors whose boxes are reused and strided; True, every tensor that can be
    copied; False, none. The tensors in `transposed` (`transposed_operands`) are
    always copied where they can be, with their dimensions reversed (`W^T`)."""
    if options.pack_operands is False:
        return schedule

    def site(band: isl.ScheduleNode) -> isl.ScheduleNode:
        if not has_band_below(band):  # an untiled nest: no loops above a copy
            return band
        if any(is_window_member(band, k, scop) for k in range(band.band_n_member())):
            # a window loop above the copy would copy nearly the same box again at each
            # of its steps (a size-generic conv2d ran 2.5x slower copying)
            return band
        point = band.child(0)
        chosen = [
            t
            for t in candidates(point, scop)
            if options.pack_operands or t in transposed or _pays(point, t, scop)
        ]
        chosen = within_budget(point, chosen, scop)
        if not chosen:
            return band
        names = [f"{t}{TRANSPOSED}" if t in transposed else t for t in chosen]
        return insert_mark(point, f"{PACK_MARK}:{','.join(names)}").parent().parent()

    return map_outermost_bands(schedule, site)


def transposed_operands(scop: Scop, options: MappingOptions) -> frozenset[str]:
    """The inputs a contraction reads across its vector loop, which a copy with the
    dimensions reversed makes unit-stride: `W` in an MLP's `O(b,n) +=! I(b,k) *
    W(n,k)`, a matrix read once, as `W(n, k)` with `n` the output's innermost index
    and `k` a reduction index. The nest then runs `n` as its vector loop and keeps a
    block of `O` in registers across `k` (an outer product, as a matmul), where
    running `k` innermost would leave a sum per lane to merge for every output: 2x
    faster on the suite's MLP. Empty when `pack_operands` is False (no copy)."""
    if options.pack_operands is False:
        return frozenset()
    reads: dict[str, int] = {}
    candidates = set()
    for st in scop.cdef.statements:
        for access, guarded in guarded_accesses(st.rhs):
            reads[access.tensor] = reads.get(access.tensor, 0) + 1
            info = scop.cdef.tensor(access.tensor)
            names = [a.name if isinstance(a, ast.Index) else None for a in access.args]
            if (
                not guarded
                and st.op.reduction is ast.Reduction.SUM
                and info.role is Role.INPUT
                and len(names) == 2
                and st.indices
                and names[0] == st.indices[-1]
                and names[1] in st.reduction_indices
            ):
                candidates.add(access.tensor)
    return frozenset(t for t in candidates if reads[t] == 1)


def scratch_temporaries(schedule: isl.Schedule, scop: Scop) -> isl.Schedule:
    """The schedule with a `scratch:` mark below the parallel loop of each nest (below
    its outer loops when it has none), naming the temporaries that live and die in one
    iteration there: a softmax's `expDist` row is then written to and read from a
    buffer of the thread (`tcpy.codegen.pack`), in its cache, and never reaches
    memory. A temporary qualifies when it is local to the nest (`kernel_local`),
    every read of it is affine and unconditional, each iteration reads only elements
    it wrote itself and writes no element another iteration writes, and its box fits
    the budget; not where a pack site is on the
    way or below (each site has the thread's buffers to itself)."""
    temporaries = [t.name for t in scop.cdef.temporaries]
    if not temporaries:
        return schedule

    def site(band: isl.ScheduleNode) -> isl.ScheduleNode:
        node = _row_body(band)
        if node is None or _has_mark(node, PACK_MARK) or _has_parallel_mark(node):
            return band
        accesses = scop.reads.union(scop.writes)
        local = [t for t in temporaries if _scratch_fits(node, t, scop)]
        chosen = within_budget(node, local, scop, accesses=accesses)
        if not chosen:
            return band
        depth = node.get_tree_depth() - band.get_tree_depth()
        node = insert_mark(node, f"{SCRATCH_MARK}:{','.join(chosen)}")
        for _ in range(depth + 1):
            node = node.parent()
        return node

    return map_outermost_bands(schedule, site)


def without_scratch(schedule: isl.Schedule) -> isl.Schedule:
    """`schedule` without its `scratch:` marks (the temporaries go back to memory)."""

    def walk(node: isl.ScheduleNode) -> isl.ScheduleNode:
        mark = node.get_type() == isl.schedule_node_type.mark
        if mark and node.mark_get_id().get_name().startswith(SCRATCH_MARK):
            node = node.delete()
        for i in range(node.n_children()):
            node = walk(node.child(i)).parent()
        return node

    return walk(schedule.get_root()).get_schedule()


def _row_body(band: isl.ScheduleNode) -> isl.ScheduleNode | None:
    """Below `band` (an outermost band), the first node past its chain of bands and
    marks: what one iteration of the loops above runs. None when the chain has no
    parallel loop though the nest has one, or a pack mark, or ends in a leaf (one
    statement: no temporary lives and dies there)."""
    passed = not _has_parallel_mark(band)
    node = band
    while is_band(node) or node.get_type() == isl.schedule_node_type.mark:
        if node.get_type() == isl.schedule_node_type.mark:
            name = node.mark_get_id().get_name()
            if name.startswith(PACK_MARK):
                return None
            passed = passed or name.startswith(PARALLEL_MARK)
        node = node.child(0)
    if not passed or node.get_type() == isl.schedule_node_type.leaf:
        return None
    return node


def _scratch_fits(node: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether `tensor` can live in a buffer of each iteration of the loops above
    `node` (see `scratch_temporaries`)."""
    if not kernel_local(node, tensor, scop):
        return False
    for st in scop.cdef.statements:
        for access, guarded in guarded_accesses(st.rhs):
            if access.tensor == tensor and (
                guarded or any(linear_form(a) is None for a in access.args)
            ):
                return False
    prefix = node.get_prefix_schedule_union_map().intersect_domain(node.get_domain())
    read = footprint(prefix, scop.reads, tensor)
    written = footprint(prefix, scop.writes, tensor)
    if read is None or written is None or not read.is_subset(written):
        return False
    # Each element written in one iteration only: an initialisation scheduled for
    # every row at once (fused with the first iteration) would otherwise land in the
    # first iteration's buffer and leave the others' stale.
    return bool(written.reverse().is_single_valued())


def _has_mark(node: isl.ScheduleNode, prefix: str) -> bool:
    """Whether `node` or a node below it is a mark whose name starts with `prefix`."""
    mark = node.get_type() == isl.schedule_node_type.mark
    if mark and node.mark_get_id().get_name().startswith(prefix):
        return True
    return any(_has_mark(c, prefix) for c in schedule_children(node))


def kernel_local(node: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether a temporary lives and dies below `node`: every statement of the
    definition that touches it runs there (a reduction's initialisation too), one of
    them writes it (with `=` or an initialised reduction), the others only read it,
    after that one in program order, and only elements it wrote. Its values then
    never need global memory."""
    cdef = scop.cdef
    if cdef.tensor(tensor).role is not Role.TEMPORARY:
        return False
    below = _statement_indices(node, scop)
    writers = [k for k, st in enumerate(cdef.statements) if st.tensor == tensor]
    readers = [
        k for k, st in enumerate(cdef.statements) if subscript_indices(st, tensor) is not None
    ]
    if len(writers) != 1 or not set(writers + readers) <= set(below):
        return False
    # an initialisation scheduled in a nest of its own would write global memory,
    # and the buffer below would start from whatever it held
    names = {s.get_tuple_name() for s in union_set_sets(node.get_domain())}
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
    if _has_parallel_mark(node):
        return []
    statements = statements_below(node, scop)
    written = {st.tensor for st in statements}  # an initialisation's is its reduction's
    reads: dict[str, bool] = {}
    for st in statements:
        for access, guarded in guarded_accesses(st.rhs):
            affine = all(linear_form(a) is not None for a in access.args)
            ok = affine and not guarded and reads.get(access.tensor, True)
            reads[access.tensor] = ok
    return sorted(
        t
        for t, ok in reads.items()
        if ok and t not in written and len(scop.cdef.tensor(t).shape) >= min_rank
    )


def _pays(node: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether copying `tensor` at `node` pays: its elements are reused and its box
    is strided (a size known only at run time counts as large)."""
    b = box_at(node, tensor, scop)
    if b is None or reuse(node, tensor, scop) < MIN_REUSE:
        return False
    info = scop.cdef.tensor(tensor)
    shape = tuple(_extent(scop, e) for e in info.shape)
    stride = run_stride(b, shape, info.scalar.dtype.itemsize)
    return stride is None or stride >= LARGE_STRIDE


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


def _extent(scop: Scop, extent: Sym) -> int | None:
    """A tensor extent's value, when the sizes are fixed (else None)."""
    if extent.is_const:
        return extent.const
    return None if scop.sizes is None else extent.evaluate(scop.sizes)


def statements_below(node: isl.ScheduleNode, scop: Scop) -> list[CheckedStatement]:
    """The TC statements with instances below `node` (computed or initialised)."""
    return [scop.cdef.statements[k] for k in _statement_indices(node, scop)]


def _statement_indices(node: isl.ScheduleNode, scop: Scop) -> list[int]:
    """The positions in the definition of the TC statements with instances below
    `node`, in program order."""
    names = {s.get_tuple_name() for s in union_set_sets(node.get_domain())}
    return sorted({scop.statement(n).index for n in names})


def subscript_indices(st: CheckedStatement, tensor: str) -> set[str] | None:
    """The indices the statement's accesses of `tensor` use; None when it reads none."""
    found = None
    for node in ast.walk(st.rhs):
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


def _has_parallel_mark(node: isl.ScheduleNode) -> bool:
    """Whether `node` or a node below it is a parallel mark."""
    return _has_mark(node, PARALLEL_MARK)
