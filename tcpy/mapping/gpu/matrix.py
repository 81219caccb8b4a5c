"""Contractions on the tensor cores: a band whose statement is a contraction of
float16 or bfloat16 operands, or of float32 ones with `input_precision` tf32 or
tf32x3 (`tcpy.parser.contractions`: matmuls, tensordots, convolutions as implicit
matrix products), is tiled for warps that run `mma.sync` (m16n8k16, m16n8k8) on
operand tiles in shared memory; the pointwise statements after it that only replace
its outputs join its kernel as an epilogue (`absorb_epilogues`).

`matrix_plan` decides whether a band runs so and with which tiles: four warps a
block, two along the rows and two along the columns, each computing a `warp_tile`
of outputs (64x32 unless the options or small extents say otherwise) over a
reduction tile of `REDUCTION_BYTES`. `map_matrix_band` tiles the band by those tiles,
binds its tile loops to blocks and leaves the point loops unbound under a
`marks.MatrixTile`: codegen prints them as the warps' instructions
(`tcpy.codegen.matrix_tile`), the accumulators held across the reduction's tiles
(`marks.Private`) and the operands' tiles copied into shared memory per reduction
tile (`marks.Shared`, pipelined as `copy_stages` says). A band the plan does not
take is mapped on the CUDA cores, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from tcpy.mapping import marks
from tcpy.mapping.gpu.bind import bind_members, count_blocks, grid_sizes
from tcpy.mapping.gpu.device import WARP
from tcpy.mapping.gpu.kernel import MappedKernel
from tcpy.mapping.gpu.placement import (
    ASYNC_COPY_ARCH,
    copy_into_shared,
    mark_at,
    wanted_stages,
)
from tcpy.mapping.gpu.plan import Plan
from tcpy.mapping.gpu.sizes import FILL_WAVES
from tcpy.mapping.promotion import box_at
from tcpy.naming import BLOCK_PARAMS
from tcpy.parser import ast
from tcpy.parser.checked import CheckedDef, CheckedStatement
from tcpy.parser.contractions import Contraction, Operand, classify
from tcpy.parser.symbolic import Sym
from tcpy.poly.isl_helpers import statement_names
from tcpy.poly.schedule import member_extent, member_variables
from tcpy.poly.scop import Kind, Scop
from tcpy.poly.transforms import permute_band, tile_leading_members
from tcpy.types import ScalarType

KINDS = {ScalarType.FLOAT16: "f16", ScalarType.BFLOAT16: "bf16"}
"""The instruction kind of each half-precision operand type; float32 operands take the
kind `input_precision` names ("tf32" or "tf32x3"), if either."""
TF32_KINDS = ("tf32", "tf32x3")
WARPS = (2, 2)
"""A block's warps along the rows and the columns of its tile."""
REDUCTION_BYTES = 64
"""The bytes along the reduction of the operands' tiles a block copies at once: 32
half-precision elements (two m16n8k16 deep), 16 float32 ones (two m16n8k8 deep), so
that two stages of 128x64 tiles fit 48 KB of shared memory."""
DEFAULT_WARP_TILE = (64, 32)
"""Sixteen instructions a step, 64 accumulators a lane: NVRTC 13 builds the 4096^3
bfloat16 matmul in 162 registers without spills (64x64 spills at 255); a block's
tile is 128x64, CUTLASS's smaller Ampere tile. tf32x3's three products and two
roundings a fragment take 32x32 (`SPLIT_WARP_TILE`: 64x32 spills at 255 registers)."""
SPLIT_WARP_TILE = (32, 32)
SMALLEST_WARP_TILE = (16, 16)
SKEW_BYTES = 16
"""The bytes a row of an operand's tile in shared memory is longer than a whole number
of 16-byte pieces: the eight rows an `ldmatrix` reads then start in distinct groups
of four banks, and so do the rows a warp's tf32 fragments read, a lane each
(`tcpy.codegen.shared_copy`)."""


@dataclass(frozen=True, slots=True)
class MatrixPlan:
    """A band on the tensor cores: its members giving the rows, the columns and the
    reduction, the block's tiles and the mark codegen reads."""

    rows: int
    columns: int
    reduction: int  # the band's last member, once reordered by `order`
    mark: marks.MatrixTile
    order: tuple[int, ...]  # the band's members, reordered: the point reduction's last

    def tiles(self, n: int) -> list[int]:
        """The tile of each of the band's `n` members (1 for every member but the
        point indices', `point_indices`)."""
        by_member = {self.rows: self.mark.tile[0], self.columns: self.mark.tile[1]}
        by_member[self.reduction] = self.mark.tile[2]
        return [by_member.get(m, 1) for m in range(n)]


def matrix_plan(node: isl.ScheduleNode, scop: Scop, plan: Plan) -> MatrixPlan | None:
    """The tensor-core plan of band `node` (reordered by the mapping's step 2), where
    `use_tensor_cores` and `use_shared_memory` allow it on a device with `cp.async`
    and `mma.sync` (sm_80 on), and the band runs one statement: a contraction of two
    float16 or two bfloat16 operands, or float32 ones with tf32 (`classify`), with
    point indices (`point_indices`: the others run one at a time), every parallel
    member on the grid, and the point reduction's member moved last in the band (a
    reduction step 2 spread over lanes runs on the tensor cores instead). None
    otherwise."""
    options, device = plan.options, plan.device
    if not (options.use_tensor_cores and options.use_shared_memory and plan.permutable):
        return None
    if int(device.arch.removeprefix("sm_")[:2]) < ASYNC_COPY_ARCH:
        return None
    found = _contraction(node, scop, options.input_precision in TF32_KINDS)
    if found is None:
        return None
    name, c, (row, column, reduction) = found
    n = node.band_n_member()
    by_index = {}
    for m in range(n):
        position = member_variables(node, m).get(name)
        if position is None:
            return None
        by_index[scop.statement(name).dims[position]] = m
    if sorted(plan.members) != list(range(plan.prefix)):
        return None  # a parallel member off the grid
    if any(i not in by_index for i in (row, column, *c.reduction)):
        return None  # an index of one value (a size 1): no member of the band runs it
    rows, columns, point = by_index[row], by_index[column], by_index[reduction]
    if any(by_index[r] < plan.prefix for r in c.reduction):
        return None
    order = (*range(point), *range(point + 1, n), point)
    extents = [member_extent(node, m, plan.at) for m in plan.members]
    kind = KINDS.get(c.left.scalar, options.input_precision)
    warp_tile = options.warp_tile or _warp_tile(plan, extents, rows, columns, kind)
    depth = REDUCTION_BYTES // itemsize(kind)
    tile = (WARPS[0] * warp_tile[0], WARPS[1] * warp_tile[1], depth)
    mark = marks.MatrixTile(kind, tile, WARPS, (c.left.tensor, c.right.tensor))
    return MatrixPlan(rows, columns, n - 1, mark, order)


def point_indices(c: Contraction) -> tuple[str, str, str] | None:
    """The indices a contraction's point loops run on the tensor cores, the others'
    tiles being 1: the row, the column and the reduction index. The reduction index
    is one both operands read alone in a subscript (a convolution's channel, not its
    window's `kh`), the column one the right operand reads alone, the row any of the
    left operand's (a window's `w` of `w + kw` too); of several, the one in the
    innermost dimension. None where there is none, where the row and the reduction
    index share a subscript, or where the row index is strided (`2*w + kw`).
    Strided indices that are not point indices (`2*h + kh`) run one at a time."""
    reductions = [r for r in c.reduction if c.left.plain(r) and c.right.plain(r)]
    columns = [i for i in c.columns if c.right.plain(i)]
    if not reductions or not columns or not c.rows:
        return None
    reduction = max(reductions, key=c.left.dimension)
    column = max(columns, key=c.right.dimension)
    row = max(c.rows, key=c.left.dimension)
    if c.left.dimension(row) == c.left.dimension(reduction) or c.left.stride(row) != 1:
        return None  # rows a stride apart: no `ldmatrix` reads them
    return row, column, reduction


def _contraction(
    node: isl.ScheduleNode, scop: Scop, tf32: bool
) -> tuple[str, Contraction, tuple[str, str, str]] | None:
    """The one statement of the band, the contraction it is and its point indices
    (`point_indices`), with operands of one type the tensor cores take (float32 with
    `tf32`) and a point reduction over the whole of both operands; else None. (An
    operand's tile in shared memory has its dimensions of tile 1 and its rows along
    its innermost other dimension, along the point reduction or its own point index:
    `ldmatrix` loads rows of 8 adjacent elements along one or the other,
    `operand_layout`.)"""
    name = one_statement(node.get_domain())
    if name is None:
        return None
    statement = scop.statement(name)
    if statement.kind is not Kind.COMPUTE:
        return None
    c = classify(statement.source(scop.cdef), scop.cdef)
    points = point_indices(c) if c is not None else None
    if c is None or points is None:
        return None
    takes = set(KINDS) | ({ScalarType.FLOAT32} if tf32 else set())
    if c.left.scalar != c.right.scalar or c.left.scalar not in takes:
        return None
    st = statement.source(scop.cdef)
    if not all(_whole(st, scop.cdef, operand, points[2]) for operand in (c.left, c.right)):
        return None
    return name, c, points


def _whole(st: CheckedStatement, cdef: CheckedDef, operand: Operand, index: str) -> bool:
    """Whether `index` runs over the whole of `operand`'s dimension it subscripts (from
    0 to its extent): the tiles along it then hold nothing but the reduction's values
    and the zeros past the tensor's end."""
    extent = cdef.tensor(operand.tensor).shape[operand.dimension(index)]
    span = st.range_of(index)
    return span.lo == Sym.of(0) and span.hi == extent


def along_reduction(c: Contraction, operand: Operand) -> bool:
    """Whether the innermost dimension of `operand`'s tile longer than 1 (along a
    point index, `point_indices`) is the point reduction's: the tile's rows in shared
    memory then run along the reduction, else along its row or column index."""
    points = point_indices(c)
    assert points is not None
    inner = max(operand.dimension(i) for i in points if i in operand.indices)
    return points[2] in operand.subscripts[inner]


def operand_layout(
    c: Contraction, mark: marks.MatrixTile, tensor: str
) -> tuple[tuple[int, ...], int] | None:
    """The tile of operand `tensor` of `mark`'s contraction `c` in shared memory: its
    extents per dimension of the tensor (the block's rows along the left operand's
    point row index, its columns along the right one's point column index, the
    reduction tile along the point reduction index, 1 elsewhere), and the elements
    its rows are longer than whole 16-byte pieces (`SKEW_BYTES`; a float32 tile whose
    rows run along the rows or columns, which the tf32 fragments read down a column,
    32 bytes: the lanes reading the column then hit distinct banks). None for another
    tensor."""
    points = point_indices(c)
    if tensor not in mark.tensors or points is None:
        return None
    row, column, reduction = points
    operand, own, size = (
        (c.left, row, mark.tile[0]) if tensor == c.left.tensor else (c.right, column, mark.tile[1])
    )
    extents = tuple(
        mark.tile[2] if reduction in sub else size * operand.stride(own) if own in sub else 1
        for sub in operand.subscripts
    )
    bytes_ = itemsize(mark.kind)
    across = bytes_ == 4 and not along_reduction(c, operand)
    return extents, skew(bytes_) * (2 if across else 1)


def _warp_tile(
    plan: Plan, extents: list[int | None], rows: int, columns: int, kind: str
) -> tuple[int, int]:
    """`DEFAULT_WARP_TILE` (`SPLIT_WARP_TILE` for tf32x3), each side halved (down to
    `SMALLEST_WARP_TILE`) while the block's tile along it is twice the extent or
    more, then the larger side halved while the grid would not fill the device
    `FILL_WAVES` times over."""
    wanted = list(SPLIT_WARP_TILE if kind == "tf32x3" else DEFAULT_WARP_TILE)
    sides = (rows, columns)
    for k, member in enumerate(sides):
        extent = extents[plan.members.index(member)]
        while (
            extent is not None
            and wanted[k] > SMALLEST_WARP_TILE[k]
            and (WARPS[k] * wanted[k] >= 2 * extent)
        ):
            wanted[k] //= 2
    fill = FILL_WAVES * plan.device.sms

    def blocks() -> int:
        tile = [1] * (max(plan.members) + 1)
        tile[rows], tile[columns] = WARPS[0] * wanted[0], WARPS[1] * wanted[1]
        return count_blocks(extents, tile, plan.members)

    while blocks() < fill:
        k = 0 if wanted[0] >= wanted[1] and wanted[0] > SMALLEST_WARP_TILE[0] else 1
        if wanted[k] <= SMALLEST_WARP_TILE[k]:
            break
        wanted[k] //= 2
    return wanted[0], wanted[1]


def map_matrix_band(
    node: isl.ScheduleNode, scop: Scop, plan: Plan, matrix: MatrixPlan, bind: bool
) -> tuple[isl.ScheduleNode, tuple[int, ...], tuple[int, ...]] | None:
    """The band tiled as `matrix` says and, with `bind`, its tile loops on the grid,
    its point loops under the `MatrixTile` mark, the operands copied into shared
    memory per reduction tile and the accumulators held above the reduction's tile
    loop. Returns the node at the band's position, the grid and the block; None
    where the operands' tiles would not fit shared memory."""
    n, options = node.band_n_member(), plan.options
    node = tile_leading_members(permute_band(node, list(matrix.order)), matrix.tiles(n))
    grid = grid_sizes(options, [member_extent(node, m, plan.at) for m in plan.members])
    block = (WARP, WARPS[0] * WARPS[1])
    tensors = matrix.mark.tensors
    if any(box_at(node.child(0), t, scop) is None for t in tensors):
        return None
    if _tile_bytes(matrix.mark) > plan.budget:
        return None
    if not bind:
        return node, tuple(grid), block
    node = bind_members(node, plan.members, grid, BLOCK_PARAMS)
    node = marks.insert(node.child(0), matrix.mark).parent().parent()
    stages = wanted_stages(options, plan.device)
    while stages > 1 and stages * _tile_bytes(matrix.mark) > plan.budget:
        stages -= 1
    node = copy_into_shared(node, n, tensors, stages)
    node = mark_at(node, plan.prefix, marks.Private())
    return node.parent(), tuple(grid), block


def itemsize(kind: str) -> int:
    """The bytes of an operand's element for an instruction kind."""
    return 4 if kind in TF32_KINDS else 2


def skew(itemsize: int) -> int:
    """The elements of `SKEW_BYTES`."""
    return SKEW_BYTES // itemsize


def _tile_bytes(mark: marks.MatrixTile) -> int:
    """The most bytes one stage of both operands' tiles takes, their rows skewed
    (`operand_layout`) whichever of their dimensions is innermost."""
    rows, columns, depth = mark.tile
    size = itemsize(mark.kind)
    s = 2 * skew(size)
    return size * (rows + s + columns + s) * (depth + s)


def absorb_epilogues(
    kernels: list[MappedKernel], scop: Scop, sizes: Mapping[str, int] | None
) -> list[MappedKernel]:
    """`kernels`, each tensor-core kernel followed by kernels that only apply an
    epilogue to its outputs (`epilogue_of`) taking their statements
    (`MappedKernel.epilogue`: codegen applies them to each output as it stores it) in
    their place, and the kernel initialising a `+=!` tensor-core contraction's outputs
    dropped (its accumulators start at the identity, and it stores every output), the
    kernels numbered again. Only at known `sizes` where the contraction's reduction is
    not empty, so that it stores every output."""
    out: list[MappedKernel] = []
    for kernel in kernels:
        last = out[-1] if out else None
        statement = one_statement(kernel.domain)
        if last is None or sizes is None or statement is None:
            out.append(kernel)
            continue
        if last.matrix:
            contraction = one_statement(last.domain)
            assert contraction is not None
            if epilogue_of(scop, contraction, (*last.epilogue, statement), sizes):
                out[-1] = dataclasses.replace(last, epilogue=(*last.epilogue, statement))
                continue
        if kernel.matrix and _initialises(scop, one_statement(last.domain), statement, sizes):
            out[-1] = kernel
            continue
        out.append(kernel)
    return [dataclasses.replace(k, index=i) for i, k in enumerate(out)]


def _initialises(scop: Scop, init: str | None, contraction: str, sizes: Mapping[str, int]) -> bool:
    """Whether statement `init` is the initialisation of the `+=!` contraction
    `contraction`, whose reduction is not empty at `sizes`: every output the
    initialisation writes the contraction's kernel then stores."""
    if init is None:
        return False
    first, then = scop.statement(init), scop.statement(contraction)
    if first.kind is not Kind.INIT or first.index != then.index:
        return False
    return _reduces(then.source(scop.cdef), sizes)


def one_statement(domain: isl.UnionSet) -> str | None:
    """The name of the one statement with instances in `domain`, or None."""
    names = statement_names(domain)
    return next(iter(names)) if len(names) == 1 else None


def kernel_contraction(scop: Scop, kernel: MappedKernel) -> Contraction | None:
    """The contraction a tensor-core kernel runs (its one statement's), or None for
    another kernel."""
    name = one_statement(kernel.domain) if kernel.matrix else None
    return None if name is None else classify(scop.statement(name).source(scop.cdef), scop.cdef)


def _reduces(st: CheckedStatement, sizes: Mapping[str, int]) -> bool:
    """Whether every reduction index of `st` takes some value at `sizes`: its
    contraction's kernel then stores every output."""
    return all(
        (r.hi - r.lo).evaluate(sizes) > 0 for r in st.ranges if r.var in st.reduction_indices
    )


def epilogue_of(
    scop: Scop, contraction: str, statements: tuple[str, ...], sizes: Mapping[str, int]
) -> bool:
    """Whether `statements`, in order after the contraction statement `contraction`,
    each compute one value per output of the contraction from values at that output
    alone (`O(b,n) = fmax(O(b,n) + bias(n), 0)`, a cast `Oh(b,n) = float16(O(b,n))`):
    a `=` over the same ranges as the contraction's outputs, with no reduction, into
    a tensor the contraction does not read, reading each tensor the contraction or a
    statement before it writes at that element only (so each output's chain of
    values is its own, whatever order the outputs run in); and the contraction's
    reduction is not empty at `sizes` (every output is stored)."""
    st = scop.statement(contraction).source(scop.cdef)
    if not _reduces(st, sizes):
        return False
    written = {st.tensor}
    operands = {node.tensor for node in ast.walk(st.rhs) if isinstance(node, ast.Access)}
    for name in statements:
        poly = scop.statement(name)
        e = poly.source(scop.cdef)
        if poly.kind is not Kind.COMPUTE or e.op is not ast.AssignOp.ASSIGN or e.scatter:
            return False
        if e.reduction_indices or len(e.indices) != len(st.indices):
            return False
        for mine, theirs in zip(e.indices, st.indices, strict=True):
            a, b = e.range_of(mine), st.range_of(theirs)
            if a.lo != b.lo or a.hi != b.hi:
                return False
        if e.tensor in operands:
            return False  # other blocks may still be reading its tiles
        written.add(e.tensor)
        for node in ast.walk(e.rhs):
            if isinstance(node, ast.Access) and node.tensor in written:
                at = tuple(a.name if isinstance(a, ast.Index) else None for a in node.args)
                if at != e.indices:
                    return False
    return True
