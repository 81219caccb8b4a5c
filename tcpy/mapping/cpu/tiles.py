"""The CPU's tiles and loop order: tile sizes from the loop extents where the options
give none (`auto_tile`), and each innermost band reordered so that the loop walking
memory with unit stride runs innermost (`order_band`)."""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import islpy as isl

from tcpy import knobs
from tcpy.mapping.locality import (
    is_reduction_member,
    is_window_member,
    stride_score,
    worst_stride,
)
from tcpy.mapping.marks import EMPTY, NO_VECTORS, Turns, Vectors
from tcpy.mapping.options import MappingOptions
from tcpy.mapping.promotion import PACK_BYTES
from tcpy.parser import ast
from tcpy.poly.isl_helpers import statement_names
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import has_band_below, permute_band, tile_band

VECTOR_TILE = 256  # the unit-stride loop: long enough for the vector units and prefetch
MIN_VECTOR_TILE = 64  # four 512-bit vectors of floats
COLUMN_TILE = 4096  # a column reduction's vector tile at most: 16 KB of floats in L1
REDUCTION_TILE = 128  # a reduction loop: the slice of the operands kept in cache
OUTER_TILE = 32  # the innermost other parallel loop: rows sharing the cached slice
SMALL = 8  # loops this short (kernel windows) stay whole
# A reduction that is the vector loop (a row's dot products: y(i) +=! A(i,j) * x(j))
# reads each row once: long runs along it keep the prefetcher streaming, while the
# slice of x it reuses across rows (16 KB) stays in L1. Measured on gesummv 1300^2:
# rows whole 1.4x faster than in runs of 256.
DOT_VECTOR_TILE = 4096
# A contraction whose vector loop is parallel (matmul's n) is register-blocked, its
# operands' tiles packed: a tall, narrow tile keeps the packed B slice (K_TILE x
# N_TILE) in L1-L2 while M_TILE rows stream past it. Measured on 1024^3 and 2048^3
# (AVX-512, 2 cores): 256 x 128 x 256 ran 1.5x faster than 32 x 256 x 128.
CONTRACTION_VECTOR_TILE = 128
CONTRACTION_REDUCTION_TILE = 256
CONTRACTION_ROWS_TILE = 256  # where the rows' extent is known only at the call
# Where it is known, the rows are cut into tiles of equal size, each
# CONTRACTION_MAX_ROWS_TILE at most, that the cores share evenly (`_rows_tile`).
CONTRACTION_MAX_ROWS_TILE = 512
BLOCK_ROWS = 8
"""The register block's rows (`tcpy.mapping.cpu.registers.block_rows`) a contraction's
rows tile is a multiple of, where the caller gives none: a tile of 32 rows in blocks of
6 ended in a block of 2 on the slow path of a partial block."""


class Block(NamedTuple):
    """The register block a contraction's tiles are cut for: its rows (the tiles of
    rows are multiples of them), the bytes of its row of vectors (0: tiles not cut
    by blocks of channels, `_channel_tiles`) and the index each statement runs as its
    vector loop where it is given (`tcpy.mapping.cpu.packing.channel_vectors`)."""

    rows: int = BLOCK_ROWS
    row_bytes: int = 0
    vectors: Vectors = NO_VECTORS


PLAIN = Block()  # blocks of BLOCK_ROWS rows, no tiles by blocks of channels


def auto_tile(
    node: isl.ScheduleNode, scop: Scop, transposed: Turns = EMPTY, block: Block = PLAIN
) -> isl.ScheduleNode:
    """Tile sizes from the loop extents when the options give none: the loop that
    walks memory with unit stride by VECTOR_TILE, reduction loops by REDUCTION_TILE,
    the innermost other parallel loop (the two innermost when the vector loop is a
    reduction) by OUTER_TILE; short loops and outer parallel loops stay whole (batch
    dimensions become the parallel tile loops), but a contraction's short reductions
    (a window, a few channels) and rows run whole inside its register block, loaded
    and stored once per channel tile (conv2d 1.3x faster, a grouped one 2.3x), as do
    those of a reduction jammed into its vector loop (a column sum); a vector loop
    whose tiles are the only parallel loop is cut so that they keep the cores busy:
    one tile per core's share of a column reduction's (`_column_tile`), else
    `_shared_vector_tile`. A contraction whose vector loop runs across its output's
    rows (a convolution's channels) is tiled by blocks of channels (`_channel_tiles`),
    as `block` says."""
    sizes = tile_sizes(node, scop, transposed, block)
    return node if sizes is None else tile_band(node, sizes)


def tile_sizes(
    node: isl.ScheduleNode, scop: Scop, transposed: Turns = EMPTY, block: Block = PLAIN
) -> tuple[int, ...] | None:
    """The tile size of each member of band `node` that `auto_tile` chooses (0: not
    tiled); None where it leaves the band as it is."""
    n = node.band_n_member()
    if not node.band_get_permutable():
        return None
    if n == 1 and has_band_below(node):
        # a fused row nest's rows (softmax's n), left whole: a tile of unknown rows
        # (a size-generic kernel) would give every row to the first tile, one thread
        return None
    extents = [member_extent(node, k) for k in range(n)]
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    given = _given_vector(node, scop, block.vectors)
    if given is not None and block.row_bytes:
        by_channels = _channel_tiles(node, scop, given, block.row_bytes)
        if by_channels is not None:
            return by_channels
    vector = vector_member(node, scop, transposed)

    def fit(k: int, size: int) -> int:
        # a loop shorter than its tile becomes one tile: its point loop then takes
        # part in the interchange of the point band
        e = extents[k]
        return size if e is None else min(e, size)

    sizes = [0] * n
    short = [_short_member(node, k, scop) for k in range(n)]
    rows = [k for k in range(n) if coincident[k] and k != vector and not short[k]]
    # a tall tile of rows pays where an operand the vector loop walks stays put along
    # them, to be copied once per tile (matmul's B); not for a gather's rows
    row = _block_row(node, scop, vector, coincident, short)
    contraction = row is not None
    tiled_rows = [row] if row is not None else _tiled_rows(node, scop, vector, coincident, rows)
    reductions = _reduction_tiles(extents, coincident, short, vector)
    # a reduction whose vector loop is its only long parallel loop (a column sum) is
    # jammed (`tcpy.mapping.cpu.registers.jam`): its short reductions inside too
    columns = coincident[vector] and not rows and not all(coincident) and _one_sum(node, scop)
    for k, extent in enumerate(extents):
        if short[k]:
            inside = contraction or not coincident[vector] or columns  # registers' loops
            if inside and extent is not None and (not coincident[k] or k == row):
                sizes[k] = extent
            continue
        if k == vector:
            tile = _vector_tile(extent, n, contraction, coincident[vector], rows, columns)
            sizes[k] = fit(k, tile)
        elif not coincident[k] and contraction:
            sizes[k] = reductions[k]
        elif not coincident[k]:
            sizes[k] = fit(k, REDUCTION_TILE)
        elif k in tiled_rows:
            columns_tile = fit(vector, CONTRACTION_VECTOR_TILE)
            outer = math.prod(extents[j] or 1 for j in rows if j != k)
            rows_tile = _rows_tile(extent, extents[vector], columns_tile, outer, block.rows)
            sizes[k] = fit(k, rows_tile if contraction else OUTER_TILE)
    return tuple(sizes)


CHANNEL_WORK = 4
"""Tiles of a nest tiled by blocks of channels (`_channel_tiles`) per core at least:
the image's rows are split until there are as many."""


def _channel_tiles(
    node: isl.ScheduleNode, scop: Scop, vector: int, row_bytes: int
) -> tuple[int, ...] | None:
    """The tiles of a contraction whose vector loop, band member `vector`, runs across
    its output's rows (the index `tcpy.mapping.cpu.packing.channel_vectors` chose, never
    the output's innermost: a convolution's output channels, `f` in `O(n,f,h,w)`),
    where its filters (what the vector loop reads: the vector's extent times the
    reductions') exceed a thread's copy
    (`PACK_BYTES`): the vector loop in tiles of one register block's channels
    (`row_bytes`), the members along which the filters stay put (the pixels) whole in
    the tile, those the threads share split until the tiles number CHANNEL_WORK per
    core, the windows whole and the other reductions cut so that the tile of the
    filters fits `PACK_BYTES`. The copy of each tile then holds one block's filters
    contiguous, `[c][kh][kw][16]` (oneDNN's blocked layout), read once per tile from
    the tensor and by every block of pixels from the cache: a 3x3 convolution at
    7 x 7 x 512 ran 6.6 -> 3.1 ms on two threads of a Zen 3 (PyTorch 3.7), at
    14 x 14 x 256 3.2 -> 2.6, against the filters copied once with rows of all
    channels and the image's rows outside the tiles. None where the filters fit (a 1x1
    convolution of 64 channels: its image, read once per tile, is then what costs,
    0.26 -> 0.7 ms tiled so), or an extent is known only at the call or is not whole
    blocks."""
    n = node.band_n_member()
    known = [member_extent(node, k) for k in range(n)]
    (name,) = statement_names(node.get_domain())  # one statement (`_given_vector`)
    output = scop.cdef.tensor(scop.statement(name).source(scop.cdef).tensor)
    itemsize = output.scalar.dtype.itemsize
    channels = row_bytes // itemsize
    if any(e is None for e in known):
        return None
    extents = [e or 0 for e in known]
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    reduced = [k for k in range(n) if not coincident[k]]
    filters = extents[vector] * math.prod(extents[k] for k in reduced) * itemsize
    if extents[vector] % channels or filters <= PACK_BYTES:
        return None
    tiles = [0] * n
    tiles[vector] = channels
    pixels = [
        k for k in range(n) if coincident[k] and k != vector and _sharing(node, scop, vector, k)
    ]
    work = extents[vector] // channels
    least = CHANNEL_WORK * max(2, knobs.cores())
    # the threads share the two outermost loops (`loops.mark_parallel`): the pixels
    # among them split, the outer first; the innermost, the block's rows, whole
    shared = [k for k in range(n) if coincident[k] and extents[k] != 1][:2]
    for k in pixels:
        tiles[k] = extents[k]
        if k in shared and k != pixels[-1]:
            parts = min(extents[k], -(-least // work))
            tiles[k] = -(-extents[k] // parts)
            work *= -(-extents[k] // tiles[k])
    short = [_short_member(node, k, scop) for k in range(n)]
    window = math.prod(extents[k] for k in reduced if short[k])
    left = max(1, PACK_BYTES // (row_bytes * window))
    for k in reversed(reduced):
        parts = 1 if short[k] else -(-extents[k] // min(extents[k], left))
        tiles[k] = -(-extents[k] // parts)
        left = max(1, left // tiles[k]) if not short[k] else left
    return tuple(tiles)


def _one_sum(node: isl.ScheduleNode, scop: Scop) -> bool:
    """Whether the band runs one statement, a reduction of its inputs (`+=!`, `max=!`,
    not a scatter)."""
    names = statement_names(node.get_domain())
    if len(names) != 1:
        return False
    stmt = scop.statement(names.pop())
    source = stmt.source(scop.cdef)
    return stmt.kind is Kind.COMPUTE and source.op.reduction is not None and not source.scatter


def _tiled_rows(
    node: isl.ScheduleNode, scop: Scop, vector: int, coincident: list[bool], rows: list[int]
) -> list[int]:
    """The parallel members `rows` tiled by OUTER_TILE where no contraction's rows are:
    the innermost (the two innermost when the vector loop is a reduction, which is
    register-blocked over two parallel loops), or, with a parallel vector loop and
    reductions, the rows of a register block: the member along which the vector loop's
    operands are invariant (a convolution's filters, not its image rows), whose point
    loop must then be in the point band."""
    tiled = rows[-(1 if coincident[vector] else 2) :]
    if coincident[vector] and not all(coincident) and rows:
        best = max(reversed(rows), key=lambda k: _sharing(node, scop, vector, k))
        if _sharing(node, scop, vector, best) > 0:
            return [best]
    return tiled


def _reduction_tiles(
    extents: list[int | None], coincident: list[bool], short: list[bool], vector: int
) -> dict[int, int]:
    """A contraction's tiles of its reduction members (neither coincident nor short,
    nor the vector loop): their product one reduction tile at most, the innermost
    whole first, so that the operands' tiles of a contraction reduced along several
    members (an output projection's heads and their width) still fit the copies'
    budget."""
    left, tiles = CONTRACTION_REDUCTION_TILE, {}
    for k in reversed(range(len(extents))):
        if coincident[k] or short[k] or k == vector:
            continue
        e = extents[k]
        tiles[k] = max(1, left) if e is None else min(e, max(1, left))
        left //= tiles[k]
    return tiles


def _block_row(
    node: isl.ScheduleNode, scop: Scop, vector: int, coincident: list[bool], short: list[bool]
) -> int | None:
    """The rows of a contraction's register block: of the parallel members but the
    vector loop and short windows, the one along which an operand the vector loop
    walks stays put (matmul's m; a convolution's filters, even a few of them), the
    innermost such member that is not short where several are (a batch of sequences
    sharing a projection's weights: the sequence, not the batch), the innermost where
    all are short (a 7 x 7 image's rows: with none, each pixel ran alone against all of
    its filters, 10x slower than PyTorch at 512 channels). Other parallel
    members, along which every operand moves (a batch, a projection's heads), run
    outside, whole. None where the vector loop is a reduction, the band has no
    reduction, or no member shares."""
    if not coincident[vector] or all(coincident):
        return None
    shared = [
        k
        for k in range(node.band_n_member())
        if coincident[k]
        and k != vector
        and not (short[k] and is_window_member(node, k, scop))
        and _sharing(node, scop, vector, k) > 0
    ]
    long = [k for k in shared if not short[k]]
    return (long or shared)[-1] if shared else None


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


def _rows_tile(
    extent: int | None,
    columns: int | None = None,
    columns_tile: int = 0,
    outer: int = 1,
    block: int = BLOCK_ROWS,
) -> int:
    """A contraction's rows tile: the rows cut into tiles of equal size (a multiple of
    `block`, the register block's rows; at least OUTER_TILE), as few as can be of
    CONTRACTION_MAX_ROWS_TILE at most (then rounded up to whole blocks), so that the
    threads, sharing the tiles of rows and of `columns` (the vector loop's extent, in
    tiles of `columns_tile`), `outer`
    times over (the other parallel loops: a projection's heads), in equal runs, get
    equal work (`_balance`, 0.9 at least). Fewer tiles copy the operands less often: a
    projection's 384 rows of 36 heads in one tile, 7.25 -> 6.9 ms. Tiles of 256 left
    800 rows as 256 + 256 to one core and 256 + 32 to the other: an 800 x 1000 x 900
    matmul on 2 cores 10.8 ms, in 2 tiles of 400 8.0 (NumPy 8.4); 600 x 512 x 512 2.14
    -> 1.64 ms."""
    if extent is None:
        return -(-CONTRACTION_ROWS_TILE // block) * block
    least = -(-OUTER_TILE // block) * block
    cores = max(2, knobs.cores())
    fewest = -(-extent // CONTRACTION_MAX_ROWS_TILE)
    best: tuple[float, int] = (0.0, least)
    for count in range(fewest, fewest + 4 * cores + 1):  # a few tries: a bounded search
        share = -(-extent // count)
        size = max(least, -(-share // block) * block)
        balance = _balance(extent, size, columns, columns_tile, cores, outer)
        if size == least or balance >= 0.9:
            return size
        best = max(best, (balance, size))
    return best[1]


def _balance(
    rows: int, rows_tile: int, columns: int | None, columns_tile: int, cores: int, outer: int
) -> float:
    """The average core's work over the busiest's, where `outer` times the tiles of
    `rows` by `rows_tile` times those of `columns` by `columns_tile` (one tile where
    either is unknown or 0) are shared among `cores` in runs of consecutive tiles, as
    OpenMP's static schedule shares a collapsed loop. Computed from the sums of the
    tiles' heights and widths, not tile by tile (any sizes: in time linear in the
    tiles of rows and of columns)."""
    heights = [min(rows_tile, rows - r) for r in range(0, rows, rows_tile)]
    step = columns_tile if columns and columns_tile else (columns or 1)
    widths = [min(step, columns - c) for c in range(0, columns, step)] if columns else [1]
    above = list(itertools.accumulate(heights, initial=0))  # rows of the tiles before
    left = list(itertools.accumulate(widths, initial=0))  # columns of the tiles before
    period, whole = len(heights) * len(widths), above[-1] * left[-1]

    def work(items: int) -> int:  # of the first `items` tiles in the collapsed order
        rounds, rest = divmod(items, period)
        r, c = divmod(rest, len(widths))
        return rounds * whole + above[r] * left[-1] + (heights[r] * left[c] if c else 0)

    share, extra = divmod(outer * period, cores)
    loads, start = [], 0
    for core in range(cores):
        end = start + share + (core < extra)
        loads.append(work(end) - work(start))
        start = end
    return outer * whole / cores / max(loads)


def _vector_tile(
    extent: int | None,
    members: int,
    contraction: bool,
    parallel: bool,
    rows: list[int],
    reduced: bool,
) -> int:
    """The vector loop's tile in a band of `members`: a contraction's, a parallel
    loop's (shared by the threads where no other parallel loop `rows` is: whole
    shares where the band is one reduction's, `reduced`), or a reduction's
    (DOT_VECTOR_TILE); a band of one loop, long runs."""
    if members == 1:
        return 16 * VECTOR_TILE
    if not parallel:
        return DOT_VECTOR_TILE
    if contraction:
        return CONTRACTION_VECTOR_TILE
    if rows:
        return VECTOR_TILE
    return _column_tile(extent) if reduced else _shared_vector_tile(extent, VECTOR_TILE)


def _column_tile(extent: int | None) -> int:
    """The vector loop's tile where it is the only parallel loop of a reduction
    (`y(j) +=! A(i,j) * t(i)`, a column sum): each core's share of the columns whole,
    in one tile (a multiple of 16), so that each row's slice is one long run for the
    prefetcher, up to COLUMN_TILE, past which the tiles are shared
    (`_shared_vector_tile`). Measured on `A^T t` at 1900 x 2100, 2 cores, jammed
    (`tcpy.mapping.cpu.registers.jam`): 2 tiles of 1056 columns 145-155 us, 17 of 128
    175-200, 9 of 256 200-245."""
    if extent is None:
        return VECTOR_TILE
    share = -(-extent // max(2, knobs.cores()))
    share = -(-share // 16) * 16
    return share if share <= COLUMN_TILE else _shared_vector_tile(extent, COLUMN_TILE)


def _shared_vector_tile(extent: int | None, size: int) -> int:
    """The vector loop's tile where its tiles are what the threads share (a column
    sum's columns, no other parallel loop): `size`, halved down to MIN_VECTOR_TILE
    while the tiles would leave a core idle a tenth of the time or more (a layer norm's
    gradients of its 768 scales in 3 tiles of 256 on 2 cores: one core idle a third of
    the time; in 6 of 128, its backward 122 -> 110 us)."""
    if extent is None:
        return size
    cores = max(2, knobs.cores())

    def balance(tile: int) -> float:  # the average core's columns over the busiest's
        busiest = min(extent, -(-extent // tile // cores) * tile)
        return extent / cores / busiest

    while size > MIN_VECTOR_TILE and balance(size) < 0.9:
        size //= 2
    return size


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


def vector_member(node: isl.ScheduleNode, scop: Scop, transposed: Turns = EMPTY) -> int:
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


def order_band(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    transposed: Turns = EMPTY,
    vectors: Vectors = NO_VECTORS,
) -> isl.ScheduleNode:
    """The band with its vector loop innermost: the options' interchange, or the
    member walking the index `vectors` gives its statement, or `vector_member`'s."""
    n = node.band_n_member()
    if n < 2 or not node.band_get_permutable():
        return node
    if options.interchange:
        if len(options.interchange) == n:
            return permute_band(node, list(options.interchange))
        return node
    best = _given_vector(node, scop, vectors)
    if best is None:
        best = vector_member(node, scop, transposed)
    order = [k for k in range(n) if k != best] + [best]
    return permute_band(node, order)


def _given_vector(node: isl.ScheduleNode, scop: Scop, vectors: Vectors) -> int | None:
    """The member of `node` that walks the index `vectors` names for its one statement
    (None: none named, or no member walks it alone)."""
    names = statement_names(node.get_domain())
    if len(names) != 1:
        return None
    stmt = scop.statement(names.pop())
    index = vectors.get(stmt.index)
    for k in range(node.band_n_member()):
        position = member_variables(node, k).get(stmt.name)
        if index is not None and position is not None and stmt.dims[position] == index:
            return k
    return None
