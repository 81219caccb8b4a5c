"""CPU mapping: tiling, interchange for unit stride, OpenMP parallel and simd marks.

`map_to_cpu(schedule, scop, options)` expects a valid schedule of `scop` and returns
one that is still valid: runs of nests fused over their rows (`tcpy.mapping.rows`), the
outermost bands tiled as `options.tile` says (or, when it is empty, with sizes chosen
from the loop extents, a contraction's point-wise epilogues first fused into its tiles,
`tcpy.mapping.cpu.epilogues`), the point
loops of fused statements distributed when intra-tile fusion is `Min`, each innermost
permutable band reordered so that the loop walking the innermost array dimension is
innermost (or as `options.interchange` says), the outermost parallel loop of each nest
marked `omp_parallel`, and the innermost loop marked `omp_simd` when it is parallel.
Then register blocks (`tcpy.mapping.cpu.registers`), copies of operand tiles into the
threads' buffers (`pack:` marks, some of them transposed so that an input read across
the output rows is walked with unit stride) and temporaries that live in a row
(`scratch:` marks), both from `tcpy.mapping.promotion`.
Permutations stay inside permutable bands and marks change no order, so every
dependence is still respected; coincidence flags travel with their members.
"""

from __future__ import annotations

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.cpu.epilogues import fuse_epilogues
from tcpy.mapping.cpu.loops import mark_parallel, mark_simd, split_row_reductions
from tcpy.mapping.cpu.packing import (
    channel_vectors,
    pack_operands,
    scratch_temporaries,
    transposed_operands,
)
from tcpy.mapping.cpu.registers import (
    DEFAULT_VECTOR_BYTES,
    VECTORS,
    block_rows,
    register_block,
)
from tcpy.mapping.cpu.tiles import Block, auto_tile, order_band
from tcpy.mapping.marks import Turns, Vectors
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.mapping.rows import fuse_rows
from tcpy.parser.checked import CheckedDef, contraction
from tcpy.poly.dependences import Dependences, respects
from tcpy.poly.scop import Scop
from tcpy.poly.transforms import (
    distribute_point_bands,
    map_innermost_bands,
    map_outermost_bands,
    merge_child_bands,
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
    if options.fuse_rows:
        schedule = fuse_rows(schedule, scop, deps)
    schedule = map_outermost_bands(schedule, lambda b: merge_child_bands(b, deps.validity))
    # inputs read across the vector loop, copied with their dimensions reversed; where
    # a copy cannot be placed (no tile, or too large a one), the nest is mapped without
    # (its vector loop would otherwise gather across the input: 20x slower, measured)
    vectors = channel_vectors(scop, options, vector_bytes)
    transposed = transposed_operands(scop, options, vectors)
    # another vector loop only with its copy planned (else its operands would gather)
    vectors = {k: index for k, index in vectors.items() if any(s == k for s, _ in transposed)}
    mapped = _map(schedule, scop, deps, options, vector_bytes, transposed, vectors)
    if transposed and not {t for _, t in transposed} <= _copied_transposed(mapped):
        mapped = _map(schedule, scop, deps, options, vector_bytes, {}, {})
    return scratch_temporaries(mapped, scop)


def _map(
    schedule: isl.Schedule,
    scop: Scop,
    deps: Dependences,
    options: MappingOptions,
    vector_bytes: int,
    transposed: Turns,
    vectors: Vectors,
) -> isl.Schedule:
    tiled: frozenset[str] = frozenset()  # contractions tiled inside a fused run
    # a contraction's rows tile: whole register blocks; blocks of channels with the
    # automatic blocks only (sizes asked for keep the tiles of rows and columns)
    row_bytes = 0 if options.register_tile else VECTORS * vector_bytes
    block = Block(block_rows(vector_bytes, options.register_tile), row_bytes, vectors)
    if options.tile:
        schedule = tile_outermost_bands(schedule, options.tile)
    else:
        if options.fuse_epilogues:
            schedule, tiled = fuse_epilogues(schedule, scop, deps, transposed, block)
        schedule = map_outermost_bands(schedule, lambda b: auto_tile(b, scop, transposed, block))
    if options.intra_tile_schedule_fusion is Fusion.MIN:
        # Distributing point loops reorders statements inside a tile; a dependence from
        # a later statement back to an earlier one at a later point would forbid it.
        distributed = distribute_point_bands(schedule, deps.validity)
        if respects(distributed, deps.validity):
            schedule = distributed
    schedule = map_innermost_bands(
        schedule, lambda b: order_band(b, scop, options, transposed, vectors)
    )
    schedule = split_row_reductions(schedule, scop, deps)
    if options.register_tile != (0,):
        schedule = map_innermost_bands(
            schedule, lambda b: register_block(b, scop, options, vector_bytes)
        )
    if options.vectorize:
        schedule = map_innermost_bands(schedule, mark_simd)
    if options.parallel:
        schedule = mark_parallel(schedule.get_root()).get_schedule()
    # after the parallel marks: a copy goes only where no worksharing loop is below it
    return pack_operands(schedule, scop, options, transposed, tiled)


def _copied_transposed(schedule: isl.Schedule) -> set[str]:
    """The tensors some pack mark of `schedule` copies with their dimensions reversed."""
    found: set[str] = set()

    def visit(node: isl.ScheduleNode) -> bool:
        mark = marks.of(node)
        if isinstance(mark, marks.Pack):
            found.update(t for t, _ in mark.transposed)
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
