"""CPU mapping: tiling, interchange for unit stride, OpenMP parallel and simd marks.

`map_to_cpu(schedule, scop, options)` expects a valid schedule of `scop` and returns
one that is still valid: the outermost bands tiled as `options.tile` says (or, when it
is empty, with sizes chosen from the loop extents), the point
loops of fused statements distributed when intra-tile fusion is `Min`, each innermost
permutable band reordered so that the loop walking the innermost array dimension is
innermost (or as `options.interchange` says), the outermost parallel loop of each nest
marked `omp_parallel`, and the innermost loop marked `omp_simd` when it is parallel.
Then register blocks (`tcpy.mapping.registers`), copies of operand tiles into the
threads' buffers (`pack:` marks, some of them transposed so that an input read across
the output rows is walked with unit stride) and temporaries that live in a row
(`scratch:` marks), both from `tcpy.mapping.promotion`.
Permutations stay inside permutable bands and marks change no order, so every
dependence is still respected; coincidence flags travel with their members.
"""

from __future__ import annotations

import islpy as isl

from tcpy import knobs
from tcpy.codegen.loops import COLLAPSE_MARK, PARALLEL_MARK, SIMD_MARK, transposed_tensors
from tcpy.mapping.locality import (
    is_reduction_member,
    is_window_member,
    stride_score,
    worst_stride,
)
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.mapping.promotion import pack_operands, scratch_temporaries, transposed_operands
from tcpy.mapping.registers import DEFAULT_VECTOR_BYTES, register_block
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement
from tcpy.poly.dependences import Dependences, respects
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import (
    distribute_point_bands,
    has_band_below,
    insert_mark,
    is_band,
    map_innermost_bands,
    map_outermost_bands,
    merge_child_bands,
    permute_band,
    tile_band,
    tile_outermost_bands,
)


def map_to_cpu(
    schedule: isl.Schedule,
    scop: Scop,
    deps: Dependences,
    options: MappingOptions,
    vector_bytes: int = DEFAULT_VECTOR_BYTES,
) -> isl.Schedule:
    """The mapped schedule (see the module docstring); `vector_bytes` is the width of
    the C compiler's vectors, which register blocks are sized by."""
    schedule = map_outermost_bands(schedule, lambda b: merge_child_bands(b, deps.validity))
    # inputs read across the vector loop, copied with their dimensions reversed; where
    # a copy cannot be placed (no tile, or too large a one), the nest is mapped without
    # (its vector loop would otherwise gather across the input: 20x slower, measured)
    transposed = transposed_operands(scop, options)
    mapped = _map(schedule, scop, deps, options, vector_bytes, transposed)
    if transposed and not transposed <= _copied_transposed(mapped):
        mapped = _map(schedule, scop, deps, options, vector_bytes, frozenset())
    return scratch_temporaries(mapped, scop)


def _map(
    schedule: isl.Schedule,
    scop: Scop,
    deps: Dependences,
    options: MappingOptions,
    vector_bytes: int,
    transposed: frozenset[str],
) -> isl.Schedule:
    if options.tile:
        schedule = tile_outermost_bands(schedule, options.tile)
    else:
        schedule = map_outermost_bands(schedule, lambda b: _auto_tile(b, scop, transposed))
    if options.intra_tile_schedule_fusion is Fusion.MIN:
        # Distributing point loops reorders statements inside a tile; a dependence from
        # a later statement back to an earlier one at a later point would forbid it.
        distributed = distribute_point_bands(schedule, deps.validity)
        if respects(distributed, deps.validity):
            schedule = distributed
    schedule = map_innermost_bands(schedule, lambda b: _order_band(b, scop, options, transposed))
    if options.register_tile != (0,):
        schedule = map_innermost_bands(
            schedule, lambda b: register_block(b, scop, options, vector_bytes)
        )
    if options.vectorize:
        schedule = map_innermost_bands(schedule, _mark_simd)
    if options.parallel:
        schedule = _mark_parallel(schedule.get_root()).get_schedule()
    # after the parallel marks: a copy goes only where no worksharing loop is below it
    return pack_operands(schedule, scop, options, transposed)


def _copied_transposed(schedule: isl.Schedule) -> set[str]:
    """The tensors some pack mark of `schedule` copies with their dimensions reversed."""
    found: set[str] = set()

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.mark:
            found.update(transposed_tensors(node.mark_get_id().get_name()))
        return True

    schedule.get_root().foreach_descendant_top_down(visit)
    return found


# --- the target's default options -------------------------------------------------------


def cpu_defaults(cdef: CheckedDef) -> MappingOptions:
    """The CPU preset, with `Max` outer fusion for a pipeline of several statements
    that has no contraction (softmax, layernorm): each row is then one pass, its
    statements fused in one parallel loop (measured 1.5x faster on both, with the
    invariant reads hoisted by the C printer). A contraction keeps `Min`, which leaves
    its reduction loops one permutable band to tile and register-block (`Max` measured
    up to 3x slower on matmul, MLP and convolutions)."""
    options = MappingOptions.cpu()
    if len(cdef.statements) > 1 and not any(contraction(st) for st in cdef.statements):
        return options.replace(outer_schedule_fusion=Fusion.MAX)
    return options


def contraction(st: CheckedStatement) -> bool:
    """A reduction that combines two or more tensors read along its reduction indices."""
    if st.op.reduction is None:
        return False
    along = {
        node.tensor
        for node in ast.walk(st.rhs)
        if isinstance(node, ast.Access)
        and any(
            isinstance(i, ast.Index) and i.name in st.reduction_indices
            for a in node.args
            for i in ast.walk(a)
        )
    }
    return len(along) > 1


# --- automatic tiling -----------------------------------------------------------------

VECTOR_TILE = 256  # the unit-stride loop: long enough for the vector units and prefetch
REDUCTION_TILE = 128  # a reduction loop: the slice of the operands kept in cache
OUTER_TILE = 32  # the innermost other parallel loop: rows sharing the cached slice
SMALL = 8  # loops this short (kernel windows) stay whole
# A contraction whose vector loop is parallel (matmul's n) is register-blocked, its
# operands' tiles packed: a tall, narrow tile keeps the packed B slice (K_TILE x
# N_TILE) in L1-L2 while M_TILE rows stream past it. Measured on 1024^3 and 2048^3
# (AVX-512, 2 cores): 256 x 128 x 256 ran 1.5x faster than 32 x 256 x 128.
CONTRACTION_VECTOR_TILE = 128
CONTRACTION_REDUCTION_TILE = 256
CONTRACTION_ROWS_TILE = 256


def _auto_tile(
    node: isl.ScheduleNode, scop: Scop, transposed: frozenset[str] = frozenset()
) -> isl.ScheduleNode:
    """Tile sizes from the loop extents when the options give none: the loop that
    walks memory with unit stride by VECTOR_TILE, reduction loops by REDUCTION_TILE,
    the innermost other parallel loop (the two innermost when the vector loop is a
    reduction) by OUTER_TILE; short loops and outer parallel loops stay whole (batch
    dimensions become the parallel tile loops)."""
    n = node.band_n_member()
    if not node.band_get_permutable():
        return node
    if n == 1 and has_band_below(node):
        # the rows of a fused row nest (softmax's n over its statements' own loops):
        # an outer parallel loop, left whole; a tile of unknown rows (a size-generic
        # kernel) would give every row to the first tile, on one thread
        return node
    extents = [member_extent(node, k) for k in range(n)]
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    vector = vector_member(node, scop, transposed)

    def fit(k: int, size: int) -> int:
        # a loop shorter than its tile becomes one tile: its point loop then takes
        # part in the interchange of the point band
        e = extents[k]
        return size if e is None else min(e, size)

    sizes = [0] * n
    short = [_short_member(node, k, scop) for k in range(n)]
    rows = [k for k in range(n) if coincident[k] and k != vector and not short[k]]
    # a reduction vector loop is register-blocked over two parallel loops, else one
    blocked = 1 if coincident[vector] else 2
    # a tall tile of rows pays where an operand the vector loop walks stays put along
    # them, to be copied once per tile (matmul's B); not for a gather's rows
    contraction = (
        coincident[vector]
        and not all(coincident)
        and len(rows) == 1
        and _sharing(node, scop, vector, rows[0]) > 0
    )
    tiled_rows = rows[-blocked:]
    if coincident[vector] and not all(coincident) and rows:
        # the rows of a register block: the member along which the vector loop's
        # operands are invariant (a convolution's filters, not its image rows), whose
        # point loop must then be in the point band
        best = max(reversed(rows), key=lambda k: _sharing(node, scop, vector, k))
        if _sharing(node, scop, vector, best) > 0:
            tiled_rows = [best]
    for k in range(n):
        if short[k]:
            continue
        if k == vector:
            size = CONTRACTION_VECTOR_TILE if contraction else VECTOR_TILE
            sizes[k] = fit(k, size if n > 1 else 16 * VECTOR_TILE)
        elif not coincident[k]:
            sizes[k] = fit(k, CONTRACTION_REDUCTION_TILE if contraction else REDUCTION_TILE)
        elif k in tiled_rows:
            sizes[k] = fit(k, _rows_tile(extents[k]) if contraction else OUTER_TILE)
    return tile_band(node, tuple(sizes))


def _sharing(node: isl.ScheduleNode, scop: Scop, vector: int, member: int) -> int:
    """How many reads that move along band member `vector` stay put along `member`:
    the operands a register block's rows along `member` share."""
    along = member_variables(node, vector)
    count = 0
    for stmt_name, position in member_variables(node, member).items():
        vector_position = along.get(stmt_name)
        stmt = scop.statement(stmt_name)
        if position is None or vector_position is None or stmt.kind is not Kind.COMPUTE:
            continue
        var, inner = stmt.dims[position], stmt.dims[vector_position]
        for access in ast.walk(stmt.source(scop.cdef).rhs):
            if isinstance(access, ast.Access):
                names = {
                    i.name for a in access.args for i in ast.walk(a) if isinstance(i, ast.Index)
                }
                count += inner in names and var not in names
    return count


def _rows_tile(extent: int | None) -> int:
    """A contraction's rows tile: CONTRACTION_ROWS_TILE, less where the rows would
    then make fewer tiles than there are cores to share them (a multiple of 8, at
    least OUTER_TILE). Not smaller: each tile copies its operands' tiles again."""
    if extent is None:
        return CONTRACTION_ROWS_TILE
    share = -(-extent // max(2, knobs.cores()))
    return max(OUTER_TILE, min(CONTRACTION_ROWS_TILE, -(-share // 8) * 8))


def _short(extent: int | None) -> bool:
    return extent is not None and extent <= SMALL


def _short_member(node: isl.ScheduleNode, member: int, scop: Scop) -> bool:
    """Whether band member `member` is a short loop: of SMALL iterations or fewer, or,
    where its extent is a size known only at run time (a size-generic kernel), a
    window (`is_window_member`). Vectorising a window of 3 made a generic convolution
    40x slower than the fixed-size one."""
    extent = member_extent(node, member)
    if extent is not None:
        return extent <= SMALL
    return is_window_member(node, member, scop)


# --- interchange ----------------------------------------------------------------------


def vector_member(
    node: isl.ScheduleNode, scop: Scop, transposed: frozenset[str] = frozenset()
) -> int:
    """The band member to run innermost, as the vector loop. In order of preference:
    not a short loop (a kernel window), not a reduction loop that strides across an
    operand (a strided vector reduction gathers), the best worst-case stride over the
    accesses (`worst_stride`), the best total (`stride_score`), parallel, the later."""
    n = node.band_n_member()

    def key(k: int) -> tuple[bool, bool, int, int, bool, int]:
        worst = worst_stride(node, k, scop, transposed)
        strided_reduction = worst < 0 and is_reduction_member(node, k, scop)
        return (
            not _short_member(node, k, scop),
            not strided_reduction,
            worst,
            stride_score(node, k, scop, transposed),
            bool(node.band_member_get_coincident(k)),
            k,
        )

    return max(range(n), key=key)


def _order_band(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    transposed: frozenset[str] = frozenset(),
) -> isl.ScheduleNode:
    n = node.band_n_member()
    if n < 2 or not node.band_get_permutable():
        return node
    if options.interchange:
        if len(options.interchange) == n:
            return permute_band(node, list(options.interchange))
        return node
    best = vector_member(node, scop, transposed)
    order = [k for k in range(n) if k != best] + [best]
    return permute_band(node, order)


# --- marks ------------------------------------------------------------------------------


def _mark(node: isl.ScheduleNode, name: str, member: int) -> isl.ScheduleNode:
    """Mark band member `member`: the mark names the member's schedule depth, which is
    the loop the pragma belongs to (isl drops loops of a single iteration, so the first
    loop under a mark may come from elsewhere). Returns the mark node."""
    depth = node.get_schedule_depth() + member
    return insert_mark(node, f"{name}@{depth}").parent()


def _mark_simd(node: isl.ScheduleNode) -> isl.ScheduleNode:
    last = node.band_n_member() - 1
    if not node.band_member_get_coincident(last):
        return node
    return _mark(node, SIMD_MARK, last)


def _mark_parallel(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Mark the first coincident member of the outermost band of every nest (looking
    deeper where a band has none), and the member after it when that one is coincident
    too (`omp_collapse`: the printer shares both loops out as one where the second is
    directly inside the first and its bounds do not depend on it); returns the node at
    the position it was given. A size-generic MLP of 256 rows made one tile of rows
    and ran on one thread without it."""
    if is_band(node):
        n = node.band_n_member()
        # a loop of one iteration (a single tile) is dropped by isl: look past it
        first = next(
            (
                k
                for k in range(n)
                if node.band_member_get_coincident(k) and member_extent(node, k) != 1
            ),
            None,
        )
        if first is not None:
            marked = _mark(node, PARALLEL_MARK, first)
            if first + 1 < n and node.band_member_get_coincident(first + 1):
                marked = _mark(marked.child(0), COLLAPSE_MARK, first + 1).parent()
            return marked
    for i in range(node.n_children()):
        node = _mark_parallel(node.child(i)).parent()
    return node
