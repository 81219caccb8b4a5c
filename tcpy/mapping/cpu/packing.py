"""The CPU's copies (`tcpy.mapping.promotion` decides what a copy holds): operand tiles
packed into each thread's buffers (`pack_operands`), the operands a contraction reads
across its vector loop copied transposed (`transposed_operands`), and temporaries
that live in one iteration of a parallel loop kept in a thread's buffer
(`scratch_temporaries`).

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

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.locality import is_window_member
from tcpy.mapping.marks import EMPTY, NO_VECTORS, Turns, Vectors
from tcpy.mapping.options import MappingOptions
from tcpy.mapping.promotion import (
    MIN_REUSE,
    box_at,
    candidates,
    extent_value,
    footprint,
    has_parallel_mark,
    kernel_local,
    marks_below,
    reuse,
    run_stride,
    statement_indices,
    statements_below,
    subscript_indices,
    within_budget,
)
from tcpy.parser import ast
from tcpy.parser.checked import CheckedStatement, contraction
from tcpy.parser.linear import linear_form
from tcpy.parser.ranges import guarded_accesses
from tcpy.poly.isl_helpers import statement_names
from tcpy.poly.schedule import member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import has_band_below, is_band, map_outermost_bands

LINE = 64  # bytes of a cache line
ROWS_COPY_BYTES = 16 * 1024
"""The buffer of a register block's rows (`_block_rows_copy`): with the vector loop's
operand, in the L1 cache."""
WINDOW_VECTORS = 2
"""Vectors of output channels that a convolution whose rows are whole vectors needs to
run them as its vector loop (`channel_vectors`): a block's two vectors of a row, as
`tcpy.mapping.cpu.registers` blocks outputs."""
ONCE_BYTES = 16 << 20
"""The buffers of the copies made once per call above a nest (`_copied_once`), which
the threads share: a copy made once need not fit a thread's cache, as a tile copied at
every step of the loops around it must (`PACK_BYTES`)."""
LARGE_STRIDE = 2048
"""Bytes between the rows of a box from which its rows alias in the cache, measured on
matmul: rows of 4 KB 1.75x faster packed on one thread of a Zen 4 (L2 of 1 MB), rows of
2 KB no faster there; on a Zen 3 (L2 of 512 KB, 8 ways) a 512^3 matmul's rows of 2 KB
ran 1.25x faster packed (2.2 -> 1.75 ms on two threads), rows of 1 KB no faster."""


def pack_operands(
    schedule: isl.Schedule,
    scop: Scop,
    options: MappingOptions,
    transposed: Turns = EMPTY,
    tiled: frozenset[str] = frozenset(),
) -> isl.Schedule:
    """The schedule with a `pack:` mark (see the module docstring) above the point
    loops of every nest with tiles worth copying: with `options.pack_operands` None,
    the tensors whose boxes are reused and strided; True, every tensor that can be
    copied; False, none. The tensors in `transposed` (`transposed_operands`) are
    always copied where they can be, with their innermost dimensions first (`W^T`).
    In a fused nest, a statement of `tiled` (a contraction with its own tiles under
    the nest's, `tcpy.mapping.cpu.epilogues`) gets its copies above its point loops."""
    if options.pack_operands is False:
        return schedule

    def site(band: isl.ScheduleNode) -> isl.ScheduleNode:
        if not has_band_below(band):  # an untiled nest: no loops above a copy
            return band
        if any(is_window_member(band, k, scop) for k in range(band.band_n_member())):
            # a window loop above the copy would copy nearly the same box again at each
            # of its steps (a size-generic conv2d ran 2.5x slower copying)
            return band
        once: dict[str, tuple[int, int]] = {}
        point = band.child(0)
        if point.get_type() == isl.schedule_node_type.sequence:
            # a row-fused nest (`tcpy.mapping.rows`): a site above each statement's
            # own loops, copying what that statement reads of a block of rows, but not
            # what the nest writes (it may live in a thread's buffer, not in memory)
            written = {st.tensor for st in statements_below(band, scop)}
            for i in range(point.n_children()):
                branch = point.child(i).child(0)
                own = statement_names(point.child(i).filter_get_filter()) <= tiled
                if own and is_band(branch) and has_band_below(branch):
                    inner = _copy_site(branch.child(0), scop, options, transposed, written)
                    point = inner.parent().parent().parent()
                elif is_band(branch):
                    branch = _copy_site(branch, scop, options, transposed, written)
                    point = branch.parent().parent()
            return point.parent()
        point = _copy_site(point, scop, options, transposed, top=band, once=once)
        return _copied_once(point.parent(), once)

    return map_outermost_bands(schedule, site)


def _copy_site(
    point: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    transposed: Turns,
    written: set[str] | None = None,
    top: isl.ScheduleNode | None = None,
    once: dict[str, tuple[int, int]] | None = None,
) -> isl.ScheduleNode:
    """A `pack:` mark above `point` where a tile is worth copying there (see
    `pack_operands`), of none of the tensors `written`; returns the node at `point`'s
    position (the mark, if any). A tile whose box is the whole of what the nest at
    `top` reads of its tensor is left out of the mark and added to `once`, with its
    turns and phases, to be copied once above the nest (`_copied_once`)."""
    tensors = [t for t in candidates(point, scop) if t not in (written or set())]
    turns = {t: _site_turns(point, t, transposed, scop) for t in tensors}
    phases = {t: 1 if turns[t] else _phases(point, t, scop) for t in tensors}
    chosen = [
        t
        for t, turned in turns.items()
        if options.pack_operands or turned or _pays(point, t, scop, phases[t])
    ]
    if top is not None and once is not None:
        for t in _once_at(top, point, chosen, turns, scop):
            once[t] = (turns[t], phases[t])
            chosen.remove(t)
    chosen = within_budget(point, chosen, scop)
    point = _block_rows_copy(point, scop, options, {*chosen, *(once or {}), *(written or set())})
    if not chosen:
        return point
    turned = tuple((t, turns[t]) for t in chosen if turns[t])
    phased = tuple((t, phases[t]) for t in chosen if phases[t] > 1)
    return marks.insert(point, marks.Pack(tuple(chosen), turned, phased)).parent()


def _once_at(
    top: isl.ScheduleNode,
    point: isl.ScheduleNode,
    chosen: list[str],
    turns: dict[str, int],
    scop: Scop,
) -> list[str]:
    """Of the tensors `chosen` to copy at `point`, those to copy once above the nest at
    `top` (within `ONCE_BYTES` together): a tile that is the whole of what the nest
    reads (`_same_box`), and a turned tile too large for a thread's buffers
    (`PACK_BYTES`), which the nest's vector loop needs (`transposed_operands`): the
    filters of a 3x3 convolution of 512 channels, tiled 256 x 128 x 3 x 3 (1.2 MB),
    whose nest without the copy ran rows of 7 as its vectors, 8x slower than PyTorch."""
    fits = within_budget(point, chosen, scop)
    whole = [t for t in chosen if _same_box(top, point, t, scop) or (turns[t] and t not in fits)]
    return within_budget(top, whole, scop, budget=ONCE_BYTES)


def _same_box(top: isl.ScheduleNode, point: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether the box of `tensor` a tile at `point` reads is as large as the box the
    whole nest at `top` reads: the same at every iteration of the loops between them
    (a convolution's filters under its loops over images and rows)."""
    whole, tile = box_at(top, tensor, scop), box_at(point, tensor, scop)
    return whole is not None and tile is not None and whole.elements <= tile.elements


def _copied_once(band: isl.ScheduleNode, once: dict[str, tuple[int, int]]) -> isl.ScheduleNode:
    """`band` with a `pack_once:` mark above it holding the tensors of `once` (each
    with its turns and phases), where there are any; returns the node at `band`'s
    position. Their copies are made once per call, before the nest, by the threads
    together (`marks.Pack.once`), where a mark at the tile would copy the same box at
    every tile: the 32 x 32 x 3 x 3 filters of a strided convolution, read across
    their output channels, were copied transposed for each of its 256 rows of output
    (2x slower than copying none)."""
    if not once:
        return band
    tensors = tuple(sorted(once))
    turned = tuple((t, once[t][0]) for t in tensors if once[t][0])
    phased = tuple((t, once[t][1]) for t in tensors if once[t][1] > 1)
    return marks.insert(band, marks.Pack(tensors, turned, phased, once=True)).parent()


def _block_rows_copy(
    point: isl.ScheduleNode, scop: Scop, options: MappingOptions, taken: set[str]
) -> isl.ScheduleNode:
    """`point`, a register block's loops (`tcpy.mapping.cpu.registers`), split before
    its vector loop's blocks with a `pack:` mark there, where an operand the block's
    rows broadcast (invariant along the vector loop), not in `taken`, is read in runs
    shorter than a cache line far apart (`_sparse_rows`; with `pack_operands` True,
    every such operand): `A(k,m)` in `C(m,n) +=! A(k,m) * B(n,k)`, where a block of 6
    rows reads 24 bytes of each row of A, rows 2 KB apart that alias in the cache, as a
    weight gradient's `X(b,k)` in `dW(k,n) +=! X(b,k) * dY(b,n)` does. The copy holds
    those elements together for every block of the rows (the 512^3 `A^T B^T` on a Zen 3,
    2 threads: 2.0-2.2 -> 1.72-1.75 ms). Returns the node at `point`'s position; `point`
    as it is where there is no such operand."""
    n = point.band_n_member() if is_band(point) else 0
    if n < 2 or not isinstance(marks.of(point.child(0)), marks.RegisterBlock):
        return point
    # the block loops are the parallel members, the vector loop's last; where the
    # vector loop is a reduction instead, the blocks hold lanes
    vectors = _vector_indices(point, scop)
    below = statement_indices(point, scop)
    if any(vectors.get(k) not in scop.cdef.statements[k].indices for k in below):
        return point

    inner = point.band_split(n - 1).child(0)
    found = [
        t
        for t in candidates(inner, scop)
        if t not in taken
        and _broadcast(vectors, t, scop)
        and reuse(inner, t, scop) >= MIN_REUSE
        and (options.pack_operands or _sparse_rows(inner, t, scop))
    ]
    chosen = within_budget(inner, found, scop, budget=ROWS_COPY_BYTES)
    if not chosen:
        return point
    return marks.insert(inner, marks.Pack(tuple(chosen))).parent().parent()


def _broadcast(vectors: dict[int, str], tensor: str, scop: Scop) -> bool:
    """Whether no statement of `vectors` (`_vector_indices`: the index each runs as
    its vector loop) reads `tensor` along its vector loop, and one reads it: each of
    its values is broadcast to a vector. (`stays_along` cannot tell: a block's vector
    loop is a tiled member, `16 floor(n/16)`, which it counts as moving everything.)"""
    reading = False
    for k, index in vectors.items():
        used = subscript_indices(scop.cdef.statements[k], tensor)
        if used is not None and index in used:
            return False
        reading = reading or used is not None
    return reading


def _sparse_rows(node: isl.ScheduleNode, tensor: str, scop: Scop) -> bool:
    """Whether the box of `tensor` at `node` is runs of fewer bytes than a cache line
    (`LINE`), LARGE_STRIDE or more apart (or at a distance known only at the call)."""
    b = box_at(node, tensor, scop)
    if b is None:
        return False
    info = scop.cdef.tensor(tensor)
    shape = tuple(extent_value(scop, e) for e in info.shape)
    itemsize = info.scalar.dtype.itemsize
    run = itemsize
    for size, extent in reversed(list(zip(b.sizes, shape, strict=True))):
        run *= size
        if extent is None or size < extent:
            break
    stride = run_stride(b, shape, itemsize)
    return run < LINE and (stride is None or stride >= LARGE_STRIDE)


def _phases(point: isl.ScheduleNode, tensor: str, scop: Scop) -> int:
    """In how many phases a copy of `tensor` at `point` should hold its innermost
    dimension (`marks.Pack.phased`): the stride, 2 or more, at which every vector loop
    below reads it along that dimension and no other (`I(n,c,2*h+kh,2*w+kw)` under a
    loop over `w`: 2); 1 where a read moves otherwise. Each phase is then a run of
    unit stride in the copy, where the tensor's elements alternate."""
    vectors = _vector_indices(point, scop)
    strides = set()
    for k in statement_indices(point, scop):
        st = scop.cdef.statements[k]
        for access, _ in (g for e in st.expressions for g in guarded_accesses(e)):
            if access.tensor != tensor:
                continue
            index = vectors.get(k)
            forms = [linear_form(a) for a in access.args]
            if index is None or any(f is None for f in forms):
                return 1
            moving = [dict(f.coeffs).get(index, 0) for f in forms if f is not None]
            if any(moving[:-1]):
                return 1
            strides.add(moving[-1])
    stride = strides.pop() if len(strides) == 1 else 1
    return stride if stride >= 2 else 1


def _vector_indices(node: isl.ScheduleNode, scop: Scop) -> dict[int, str]:
    """The index each TC statement below `node` walks in its vector loop (the last
    member of the band below a `Simd` mark), by its position in the definition."""
    found: dict[int, str] = {}
    for band in (n.child(0) for n in marks_below(node, marks.Simd)):
        member = band.band_n_member() - 1
        for name, position in member_variables(band, member).items():
            stmt = scop.statement(name)
            if position is not None and stmt.kind is Kind.COMPUTE:
                found[stmt.index] = stmt.dims[position]
    return found


def channel_vectors(scop: Scop, options: MappingOptions, vector_bytes: int) -> dict[int, str]:
    """The contractions, at fixed sizes, whose rows are short and ragged (the output's
    innermost index runs fewer than four vectors of `vector_bytes` and no whole number
    of them: a 3x3 convolution's rows of 30) or read in a window (`_windowed`: every
    convolution, its channels two vectors at least, `WINDOW_VECTORS`), and which have
    another output index whose
    extent is whole vectors, read only by operands that a transposed copy makes
    unit-stride along it (a convolution's filters `Wt(f,c,kh,kw)`, along its output
    channels `f`) and not read by another (the image, whose values the vectors then
    share by broadcast): that index, by statement, to run as the vector loop. A block
    of output pixels times vectors of channels then has only whole vectors (rows of 30
    in lanes of 16 left 14 to half-empty registers: a 3x3 convolution of 16 channels on
    32 x 32 images ran 2x faster so; with rows of 32 at a stride of 2, 1.3x, and
    rows of 62 at a stride of 1, 1.1x, the filters copied once per call and the image
    read in place). None where copies are off (`pack_operands` False) or a size is
    known only at the call."""
    if options.pack_operands is False or scop.sizes is None:
        return {}
    found: dict[int, str] = {}
    for k, st in enumerate(scop.cdef.statements):
        if st.op.reduction is not ast.Reduction.SUM or not st.indices or not contraction(st):
            continue
        extent = {r.var: r.hi.evaluate(scop.sizes) - r.lo.evaluate(scop.sizes) for r in st.ranges}
        lanes = max(1, vector_bytes // scop.cdef.tensor(st.tensor).scalar.dtype.itemsize)
        inner = extent[st.indices[-1]]
        ragged = inner % lanes != 0 and inner < 4 * lanes
        if not ragged and not _windowed(st, st.indices[-1]):
            continue
        # whole rows read in a window take vectors of channels where a block gets two
        # of them (a grouped convolution's 8 channels a group, one vector of 8 lanes:
        # 5% slower so than with rows of 32 as its vectors)
        least = lanes if ragged else WINDOW_VECTORS * lanes
        reads = [
            _index_names(access)
            for e in st.expressions
            for access, _ in guarded_accesses(e)
            if access.tensor != st.tensor
        ]
        for index in reversed(st.indices[:-1]):
            across = [names for names in reads if index in names]
            if (
                extent[index] % lanes == 0
                and extent[index] >= least
                and across
                and len(across) < len(reads)
                and all(_reduced_after(names, index, st.reduction_indices) for names in across)
            ):
                found[k] = index
                break
    return found


def transposed_operands(
    scop: Scop, options: MappingOptions, vectors: Vectors = NO_VECTORS
) -> dict[tuple[int, str], int]:
    """The tensors a contraction reads across its vector loop, which a copy with the
    innermost dimensions first makes unit-stride, with how many come first, by
    statement (`marks.Turns`): `W` in an MLP's `O(b,n) +=! I(b,k) * W(n,k)`, read as
    `W(..., n, k...)` with `n` the output's innermost index and only reduction indices
    after it (a projection's `W(t,h,e,d)`, one; an output projection's `Wo(n,h,e)`,
    two; an attention's keys `QKV(1,b,h,j,e)`, one, the queries of the same tensor
    then read from the same copy). The nest
    then runs `n` as its vector loop and keeps a block of `O` in registers across
    `k` (an outer product, as a matmul), where
    running `k` innermost would leave a sum per lane to merge for every output: 2x
    faster on the suite's MLP. Only where an output index is not the input's (`b`):
    a matrix-vector product reads each element once, and its copy would cost more
    than the product (8x slower than the rows summed in vector lanes, measured at
    2000 x 2000). A statement of `vectors` has the index given there in `n`'s place
    (`channel_vectors`). Empty when `pack_operands` is False (no copy)."""
    if options.pack_operands is False:
        return {}
    found: dict[tuple[int, str], set[int]] = {}
    for k, st in enumerate(scop.cdef.statements):
        for access, guarded in (g for e in st.expressions for g in guarded_accesses(e)):
            names = _index_names(access)
            if (
                not guarded
                and st.op.reduction is ast.Reduction.SUM
                and st.indices
                and _reduced_after(names, vectors.get(k, st.indices[-1]), st.reduction_indices)
                and not set(st.indices) <= set(names)
            ):
                turns = len(names) - 1 - names.index(vectors.get(k, st.indices[-1]))
                found.setdefault((k, access.tensor), set()).add(turns)
    return {key: turns.pop() for key, turns in found.items() if len(turns) == 1}


def _site_turns(node: isl.ScheduleNode, tensor: str, transposed: Turns, scop: Scop) -> int:
    """The turns of `tensor`'s copy at `node`: those of the statements below that read
    it, where they agree (0, a plain copy, where they do not)."""
    below = {
        s.index
        for s in scop.statements
        if s.name in statement_names(node.get_domain())
        and subscript_indices(scop.cdef.statements[s.index], tensor) is not None
    }
    turns = {transposed.get((k, tensor), 0) for k in below}
    return turns.pop() if len(turns) == 1 else 0


def _windowed(st: CheckedStatement, index: str) -> bool:
    """Whether an operand of `st` reads along `index` together with another index in
    one subscript: a window's `w + kw` or `2*w + kw`."""
    for e in st.expressions:
        for access, _ in guarded_accesses(e):
            for arg in access.args:
                form = linear_form(arg)
                coeffs = {} if form is None else {i: c for i, c in form.coeffs if c}
                if index in coeffs and len(coeffs) > 1:
                    return True
    return False


def _index_names(access: ast.Access) -> list[str | None]:
    """The index each subscript of `access` is alone (None: another expression)."""
    return [a.name if isinstance(a, ast.Index) else None for a in access.args]


def _reduced_after(names: list[str | None], index: str, reduced: tuple[str, ...]) -> bool:
    """Whether `index` is among `names` and every name after it (one at least) is a
    reduction index: `W(n,h,e)` for an output's `n` reduced over `h` and `e`."""
    if index not in names:
        return False
    after = names[names.index(index) + 1 :]
    return bool(after) and all(n in reduced for n in after)


def scratch_temporaries(schedule: isl.Schedule, scop: Scop) -> isl.Schedule:
    """The schedule with a `scratch:` mark below the parallel loop of each nest (below
    its outer loops when it has none), naming the temporaries that live and die in one
    iteration there: a softmax's `expDist` row is then written to and read from a
    buffer of the thread (`tcpy.codegen.pack`), in its cache, and never reaches
    memory. A temporary qualifies when it is local to the nest (`kernel_local`),
    every read of it is affine and unconditional, each iteration reads only elements
    it wrote itself and writes no element another iteration writes, and its box fits
    the budget; not where a pack site is on the way (a pack site below takes the
    thread's buffers after the scratch's, `tcpy.codegen.pack`)."""
    temporaries = [t.name for t in scop.cdef.temporaries]
    if not temporaries:
        return schedule

    def site(band: isl.ScheduleNode) -> isl.ScheduleNode:
        node = _row_body(band)
        if node is None or has_parallel_mark(node):
            return band
        accesses = scop.reads.union(scop.writes)
        local = [t for t in temporaries if _scratch_fits(node, t, scop)]
        chosen = within_budget(node, local, scop, accesses=accesses)
        if not chosen:
            return band
        depth = node.get_tree_depth() - band.get_tree_depth()
        node = marks.insert(node, marks.Scratch(tuple(chosen)))
        for _ in range(depth + 1):
            node = node.parent()
        return node

    return map_outermost_bands(schedule, site)


def without_scratch(schedule: isl.Schedule) -> isl.Schedule:
    """`schedule` without its `scratch:` marks (the temporaries go back to memory)."""

    def walk(node: isl.ScheduleNode) -> isl.ScheduleNode:
        if isinstance(marks.of(node), marks.Scratch):
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
    passed = not has_parallel_mark(band)
    node = band
    while is_band(node) or node.get_type() == isl.schedule_node_type.mark:
        mark = marks.of(node)
        if isinstance(mark, marks.Pack):
            return None
        passed = passed or isinstance(mark, marks.Parallel)
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
        for access, guarded in (g for e in st.expressions for g in guarded_accesses(e)):
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


def _pays(node: isl.ScheduleNode, tensor: str, scop: Scop, phases: int = 1) -> bool:
    """Whether copying `tensor` at `node` pays: its elements are reused and its box
    is strided (a size known only at run time counts as large) or its vector loops
    read it strided, `phases` > 1 (a stride-2 convolution whose channels are 3.6 KB
    apart, 32 of 7 x 130: 1.4x faster copied in phases than read in place). Not where
    every vector loop below runs across the output's rows (`channel_vectors`) and
    reads it by broadcast (`_broadcast`): a convolution's image under a vector loop of
    output channels, whose box is whole rows of the window and whose values, one per
    row of a block, serve no vector load (copying its rows for each row of output took
    10% of a stride-2 convolution's time); `_block_rows_copy` handles broadcast rows
    that alias in the cache."""
    b = box_at(node, tensor, scop)
    if b is None or reuse(node, tensor, scop) < MIN_REUSE:
        return False
    if phases > 1:
        return True
    vectors = _vector_indices(node, scop)
    across = all(index not in scop.cdef.statements[k].indices[-1:] for k, index in vectors.items())
    below = set(statement_indices(node, scop))
    if vectors and vectors.keys() == below and across and _broadcast(vectors, tensor, scop):
        return False
    info = scop.cdef.tensor(tensor)
    shape = tuple(extent_value(scop, e) for e in info.shape)
    stride = run_stride(b, shape, info.scalar.dtype.itemsize)
    return stride is None or stride >= LARGE_STRIDE
