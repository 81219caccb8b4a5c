"""Register blocking of reductions: a block of outputs kept in registers across the
whole reduction.

`register_block(band, scop, options)` rewrites an innermost permutable band of one
reduction statement, such as matmul's point band (m, n, k), into

    band (m_o, n_o)                 the block loops: parallel, as before
      mark register_tile:RxV
        band (k)                    the reduction loops
          band (m_r, n_r)           the block: R x V outputs, n_r the vector loop

The C printer turns the subtree under the mark into a local array of R x V
accumulators, loaded before the reduction loops and stored after them, so that the
loop over k reads each operand once per block instead of loading and storing the
output at every step (`tcpy.codegen.c`). Reordering and tiling a permutable band
respects every dependence; the block members are coincident, so the outputs of a
block are distinct elements.

When the innermost member is a reduction that reads every operand with unit stride
(an MLP's `O(b,n) +=! I(b,k) * W(n,k)`), it becomes the vector loop instead: it is
tiled by the vector's lanes, the lane loop goes innermost under the block of two
parallel members, and each output of the block keeps one partial result per lane,
added into the output after the reduction loops (TC lets a reduction reassociate).

Sizes come from `options.register_tile` (aligned to the innermost parallel member),
or else: `VECTORS` of the compiler's vectors on the innermost member (a parallel
vector loop) and `ROWS` (`WIDE_ROWS` with AVX-512) on the parallel member along which
most operands of the vector loop are invariant (the rows of matmul, the filters of a
convolution), whose vector loads the rows then share; with a reduction vector loop,
`LANE_ROWS` and `COLUMNS` on the two parallel members whose blocks share the most
operands.
"""

from __future__ import annotations

import math

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.locality import worst_stride
from tcpy.mapping.options import MappingOptions
from tcpy.parser import ast
from tcpy.poly.isl_helpers import statement_names, union_set_sets
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, PolyStatement, Scop
from tcpy.poly.transforms import permute_band, tile_band

ROWS = 6
"""Rows of a block with 16 vector registers (SSE, AVX2): 6 x 2 accumulators, the two
vectors of the operand the rows share and one broadcast take 15. On a Zen 3 (AVX2) a
512^3 matmul ran 1.6-1.9x faster than with 4 x 2 (8 accumulators: as many FMAs as two
units hold in flight, none to spare), a 3x3 convolution 1.2x."""
WIDE_ROWS = 8  # with 64-byte vectors (AVX-512: 32 registers): 8 x 2 accumulators
VECTORS = 2  # vectors of a block's row: with its rows, enough FMAs in flight
LANE_ROWS = 4  # with a reduction vector loop: 4 x 2 vectors of partial sums
COLUMNS = 2
MAX_BLOCK = 256
"""Elements of a register block at most (16 x 16 floats: 32 AVX2 vectors, twice the
registers; the automatic sizes stay within it)."""
DEFAULT_VECTOR_BYTES = 16
JAM = 4  # steps of a reduction per output load and store (`jam`)
BLOCKED_REDUCTIONS = (ast.Reduction.SUM, ast.Reduction.PROD)
"""Reductions kept in a block; min and max keep their scalar accumulator, which also
tracks NaN across vector lanes."""


def register_block(
    node: isl.ScheduleNode,
    scop: Scop,
    options: MappingOptions,
    vector_bytes: int = DEFAULT_VECTOR_BYTES,
) -> isl.ScheduleNode:
    """The band rewritten as the module docstring shows, or unchanged when it is not
    one reduction statement's band with a parallel innermost member. Returns the node
    at the band's position."""
    plan = _plan(node, scop, options, vector_bytes)
    if plan is None:
        return node if options.register_tile else jam(node, scop)
    parallel, reductions, sizes, across = plan
    vector = node.band_n_member() - 1
    node = permute_band(node, parallel + reductions)
    order = parallel + reductions
    tiles = tuple(sizes.get(k, 1) for k in order)
    node = tile_band(node, tiles).band_split(len(parallel))
    # the block's members in their order, the lanes last
    blocked = sorted(
        (i for i, k in enumerate(order) if k in sizes), key=lambda i: order[i] == vector
    )
    mark = marks.RegisterBlock(tuple(sizes[order[i]] for i in blocked), across)
    point = marks.insert(node.child(0), mark).child(0)
    rest = [i for i in range(len(order)) if i not in blocked]
    point = permute_band(point, rest + blocked)
    return point.parent().parent().parent()


def _plan(
    node: isl.ScheduleNode, scop: Scop, options: MappingOptions, vector_bytes: int
) -> tuple[list[int], list[int], dict[int, int], bool] | None:
    """The parallel members, the reduction members, the block size of each blocked
    member and whether the vector loop runs across the output's rows
    (`marks.RegisterBlock.across`: a parallel member that is not the output's
    innermost index); None when the band is not blocked. Automatic blocks across rows
    take their rows by `_short_rows` and put the vector member first among the
    parallel ones: the blocks of channels outside the blocks of pixels."""
    stmt = _one_statement(node, scop)
    if stmt is None:
        return None
    n, name = node.band_n_member(), stmt.name
    source = stmt.source(scop.cdef)
    if source.op.reduction not in BLOCKED_REDUCTIONS or _reads(source.rhs, source.tensor):
        return None
    coincident = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    parallel = [k for k in range(n) if coincident[k]]
    reductions = [k for k in range(n) if not coincident[k]]
    if not parallel or not reductions:
        return None
    variables = []
    for k in range(n):
        position = member_variables(node, k).get(name)
        if position is None and member_extent(node, k) != 1:
            return None  # a member that combines indices (skewed)
        variables.append("" if position is None else stmt.dims[position])  # "": constant
    lanes = max(1, vector_bytes // scop.cdef.tensor(source.tensor).scalar.dtype.itemsize)
    # the vector loop: the innermost member, parallel, or a reduction that reads every
    # operand with unit stride (its lanes then hold partial results)
    inner = n - 1
    if not variables[inner] or (not coincident[inner] and worst_stride(node, inner, scop) < 2):
        return None
    if options.register_tile:
        asked = dict(zip(reversed(parallel), reversed(options.register_tile), strict=False))
    else:
        rows = block_rows(vector_bytes)
        asked = _automatic(parallel, variables, source.rhs, inner, VECTORS * lanes, rows)
    if not coincident[inner] and asked:
        asked[inner] = lanes
    sizes = {}
    for k, size in asked.items():
        extent = member_extent(node, k)
        size = size if extent is None else min(size, extent)
        if size > 1:
            sizes[k] = size
    sizes = _within_budget(sizes, inner)
    if not coincident[inner] and (inner not in sizes or len(sizes) < 2):
        return None
    across = coincident[inner] and variables[inner] not in source.indices[-1:]
    if across and not options.register_tile:
        sizes = {
            k: size if k == inner else _short_rows(size, member_extent(node, k))
            for k, size in sizes.items()
        }
        # the blocks of channels outermost: each block's slice of the filters stays
        # in cache across the blocks of pixels, which read the image by broadcasts
        parallel = [inner, *(k for k in parallel if k != inner)]
    return (parallel, reductions, sizes, across) if sizes else None


def fresh_blocks(schedule: isl.Schedule, scop: Scop) -> isl.Schedule:
    """`schedule` with each register block whose outputs each run their whole reduction
    in one visit of the block marked `fresh` (started at the identity), and the
    instances of its statement's initialisation that its outputs cover left out.

    Without it an output is zeroed in a pass of its own, a barrier of the team after
    it, then loaded into the block: a batch of 32 matmuls of 128^3 on AVX-512 ran 1.17x
    faster fresh. A block qualifies when every instance of its statement (a `!`
    reduction into elements it names directly) is under its mark and the instances
    that write one output have the same schedule above the mark: no reduction loop
    outside the block, so each output is computed whole where it starts at the
    identity. Its initialisation is the statement's own (the one just before it in
    program order: no other statement reads or writes the output between the two).
    Outputs the reduction does not reach (an empty range) keep their initialisation.
    After the schedule's check, which expects every instance. An isl failure (its
    operation budget) leaves the schedule as it was: the blocks then load."""
    try:
        return _fresh(schedule, scop)
    except isl.Error:
        return schedule


def _fresh(schedule: isl.Schedule, scop: Scop) -> isl.Schedule:
    """`fresh_blocks`' work; raises isl's errors."""
    dropped = isl.UnionSet.empty(schedule.get_domain().get_space())

    def visit(node: isl.ScheduleNode) -> isl.ScheduleNode:
        nonlocal dropped
        mark = marks.of(node)
        if not isinstance(mark, marks.RegisterBlock):
            return node
        covered = _initialised_by(node, scop, mark)
        if covered is None:
            return node
        dropped = dropped.union(covered)
        fresh = marks.RegisterBlock(mark.sizes, mark.across, fresh=True)
        return marks.insert(node.delete(), fresh).parent()

    marked = schedule.get_root().map_descendant_bottom_up(visit).get_schedule()
    if dropped.is_empty():
        return schedule
    return marked.intersect_domain(marked.get_domain().subtract(dropped))


def _initialised_by(
    node: isl.ScheduleNode, scop: Scop, mark: marks.RegisterBlock
) -> isl.UnionSet | None:
    """The instances of the initialisation whose outputs the register block at mark
    `node` computes whole (`fresh_blocks`); None where the block does not qualify."""
    names = statement_names(node.get_domain())
    if len(names) != 1:
        return None
    stmt = scop.statement(names.pop())
    inits = [s for s in scop.statements if s.kind is Kind.INIT and s.index == stmt.index]
    if stmt.kind is not Kind.COMPUTE or not inits or stmt.source(scop.cdef).scatter:
        return None
    instances = isl.UnionSet(stmt.domain)
    if not instances.is_subset(node.get_domain()):
        return None  # some instances run elsewhere
    writes = scop.writes.intersect_domain(instances)
    same_output = writes.apply_range(writes.reverse())
    prefix = node.get_prefix_schedule_union_map().intersect_domain(instances)
    if not same_output.apply_domain(prefix).apply_range(prefix).is_identity():
        return None
    if mark.across and not _rows_in_cache(node, stmt, scop, writes, mark.sizes[-1]):
        return None
    initialised = scop.writes.intersect_domain(isl.UnionSet(inits[0].domain))
    return initialised.intersect_range(writes.range()).domain()


L1_SET_SPAN = 4096
"""Bytes between two addresses in the same set of the L1 data cache (64 sets of 64-byte
lines: x86 cores' 32 and 48 KB caches)."""
L1_WAYS = 8


def _rows_in_cache(
    node: isl.ScheduleNode, stmt: PolyStatement, scop: Scop, writes: isl.UnionMap, rows: int
) -> bool:
    """Whether the `rows` of the output that the vectors of an across block at mark
    `node` run over (`marks.RegisterBlock.across`) fall in sets of the L1 cache that
    hold a line of each. Started at the identity, such a block stores into lines it
    never read: at rows 4 KB apart (a 3x3 convolution of 32 x 32 images) all 32 rows
    share one set, and the block's stores, each into a line not in the cache, ran the
    convolution 1.4x slower than loading its zeroed outputs; at rows 3,136 bytes apart
    (28 x 28 images) 1.07x faster. False where the sizes are known only at the call."""
    band, below = None, node.child(0)
    while below.get_type() in (isl.schedule_node_type.band, isl.schedule_node_type.mark):
        if below.get_type() == isl.schedule_node_type.band:
            band = below
        below = below.child(0)
    if band is None:
        return False
    position = member_variables(band, band.band_n_member() - 1).get(stmt.name)
    source = stmt.source(scop.cdef)
    if position is None or stmt.dims[position] not in source.indices:
        return False
    outputs = union_set_sets(writes.range())
    if len(outputs) != 1:
        return False
    extents = []
    for d in range(source.indices.index(stmt.dims[position]) + 1, len(source.indices)):
        low, high = outputs[0].dim_min_val(d), outputs[0].dim_max_val(d)
        if not (low.is_int() and high.is_int()):
            return False
        extents.append(high.to_python() - low.to_python() + 1)
    itemsize = scop.cdef.tensor(source.tensor).scalar.dtype.itemsize
    apart = math.prod(extents) * itemsize
    return rows <= L1_WAYS * (L1_SET_SPAN // math.gcd(apart, L1_SET_SPAN))


SPARED_SLOTS = 1.1
"""How many more outputs blocks of `rows` must compute than blocks of one row more for
`_short_rows` to take the latter: a block of 7 rows ran 7% slower a row than one of 6
(a 3x3 convolution at 56 x 56 x 64 in blocks of 7, 56 outputs a row, against 9 blocks
of 6 and one of 2 run as 6, 60)."""


def _short_rows(rows: int, extent: int | None) -> int:
    """The rows of a block across the output's rows (`marks.RegisterBlock.across`)
    along a member of `extent`: `rows`, or, where blocks of `rows` leave a last block
    short (run on a path of its own, its reads masked), one more or one fewer where
    that many cover the extent in whole blocks: one more where blocks of `rows` would
    compute SPARED_SLOTS times as many outputs (rows of 14 in blocks of 6 end in a
    block of 2 run as 6; in blocks of 7 a 3x3 convolution at 14 x 14 x 256 ran 1.2x
    faster, its 14 vectors of accumulators, the broadcast and the filters' loads folded
    into the FMAs in 16 registers), else one fewer (rows of 10 in blocks of 5: a 3x3
    convolution of 192 to 96 channels on two 10 x 10 images 1.1x faster than in blocks
    of 6 and 4). Never a last block
    short of rows + 1: its masked reads spilled the block (rows of 32 in blocks of 7,
    4.4x slower)."""
    if extent is None or extent <= rows:
        return rows if extent is None else extent
    more, fewer = rows + 1, rows - 1
    blocks = -(-extent // rows) * rows
    if extent % rows == 0:
        return rows
    if extent % more == 0 and blocks >= SPARED_SLOTS * extent:
        return more
    return fewer if extent % fewer == 0 and fewer >= 4 else rows


def block_rows(vector_bytes: int, asked: tuple[int, ...] = ()) -> int:
    """The rows of a block over a parallel vector loop (the tiles of rows are multiples
    of it): those `asked` (`options.register_tile`, rows then columns) gives, or the
    automatic choice for the compiler's vectors of `vector_bytes`; WIDE_ROWS where the
    options give the block one row or turn it off (tiles of rows as before blocks of 6)."""
    if asked:
        return asked[-2] if len(asked) >= 2 and asked[-2] > 1 else WIDE_ROWS
    return WIDE_ROWS if vector_bytes >= 64 else ROWS


def jam(node: isl.ScheduleNode, scop: Scop) -> isl.ScheduleNode:
    """The band of one reduction whose innermost member is a parallel vector loop and
    that no register block takes (no rows share its operands: `y(j) +=! A(i,j) * t(i)`,
    a column sum), its innermost reduction member tiled by JAM and the tile's steps run
    inside the vector loop, under a `jam:R` mark:

        band (..., i_o, j)          ->      band (..., i_o)
                                              mark jam:4
                                                band (j)
                                                  band (i_r)     4 steps

    so that each output of the vector loop is loaded and stored once per JAM steps
    instead of at each (`tcpy.codegen.jam`); each output still takes the steps in
    their order. Reordering and tiling a permutable band respects every dependence.
    Returns the node at the band's position, unchanged where the band is not one."""
    member = _jam_member(node, scop)
    if member is None:
        return node
    n = node.band_n_member()
    node = permute_band(node, [k for k in range(n) if k not in (member, n - 1)] + [member, n - 1])
    extent = member_extent(node, n - 2)
    size = JAM if extent is None else min(JAM, extent)
    node = tile_band(node, (*[1] * (n - 2), size, 1)).band_split(n - 1)
    vector = marks.insert(node.child(0), marks.Jam(size))
    return vector.parent().parent()


def _jam_member(node: isl.ScheduleNode, scop: Scop) -> int | None:
    """The member `jam` runs inside the vector loop: the innermost reduction member of
    two steps or more, where the band is one reduction statement's (one that does not
    read its own output), its innermost member parallel; None where there is none."""
    stmt = _one_statement(node, scop)
    if stmt is None:
        return None
    n, name = node.band_n_member(), stmt.name
    source = stmt.source(scop.cdef)
    if (
        source.op.reduction is None
        or source.scatter
        or _reads(source.rhs, source.tensor)
        or not node.band_member_get_coincident(n - 1)
    ):
        return None
    positions = [member_variables(node, k).get(name) for k in range(n)]
    if positions[-1] is None or any(
        p is None and member_extent(node, k) != 1 for k, p in enumerate(positions)
    ):
        return None  # a member that combines indices (skewed)
    for k in reversed(range(n - 1)):
        position, extent = positions[k], member_extent(node, k)
        if node.band_member_get_coincident(k) or position is None:
            continue
        if stmt.dims[position] in source.indices or (extent is not None and extent < 2):
            return None
        return k
    return None


def _one_statement(node: isl.ScheduleNode, scop: Scop) -> PolyStatement | None:
    """The statement of a permutable band of two members or more that runs one
    statement, a computation (not an initialisation); else None."""
    if node.band_n_member() < 2 or not node.band_get_permutable():
        return None
    names = statement_names(node.get_domain())
    if len(names) != 1:
        return None
    stmt = scop.statement(names.pop())
    return stmt if stmt.kind is Kind.COMPUTE else None


def _within_budget(sizes: dict[int, int], inner: int) -> dict[int, int]:
    """`sizes` with the largest block size other than the vector loop's halved until
    the block holds at most `MAX_BLOCK` elements. The block is unrolled whole: a
    32 x 8 x 8 block asked for by the options was 256 copies of a vector loop, which
    gcc took 90 s to compile (a pair the fuzzer stopped)."""
    sizes = dict(sizes)
    while math.prod(sizes.values()) > MAX_BLOCK:
        others = [k for k in sizes if k != inner and sizes[k] > 1] or [inner]
        k = max(others, key=lambda m: (sizes[m], m))
        sizes[k] = max(1, sizes[k] // 2)
    return {k: size for k, size in sizes.items() if size > 1}


def _automatic(
    parallel: list[int], variables: list[str], rhs: ast.Expr, inner: int, vector: int, rows: int
) -> dict[int, int]:
    """Block sizes when the options give none: with a parallel vector loop, `vector`
    on it and `rows` on the member whose rows share the most operands (no block when
    no member's rows share one); with a reduction vector loop (its lanes are sized by
    the caller), LANE_ROWS and COLUMNS on the two parallel members whose blocks share
    the most operands. On a CPU with AVX-512 (32 vector registers) 8 x 2 vectors ran
    a 512^3 matmul 1.4x faster than 4 x 2; with 16 registers 8 x 2 would spill."""
    accesses = [
        {i.name for a in node.args for i in ast.walk(a) if isinstance(i, ast.Index)}
        for node in ast.walk(rhs)
        if isinstance(node, ast.Access)
    ]

    def shared(k: int) -> int:
        """Operands read in the vector loop that the rows along member k share."""
        if not variables[k]:
            return 0
        return sum(variables[inner] in a and variables[k] not in a for a in accesses)

    if inner in parallel:
        # a block of one row reuses nothing across its vectors: measured slower than
        # the unblocked nest when the reduction strides (tensordot, convolutions)
        member = max(reversed(parallel[:-1]), key=shared, default=None)
        if member is None or shared(member) == 0:
            return {}
        return {inner: vector, member: rows}
    ranked = sorted((k for k in parallel if shared(k) > 0), key=lambda k: (shared(k), k))
    return dict(zip(reversed(ranked), (LANE_ROWS, COLUMNS), strict=False))


def _reads(rhs: ast.Expr, tensor: str) -> bool:
    return any(isinstance(n, ast.Access) and n.tensor == tensor for n in ast.walk(rhs))
