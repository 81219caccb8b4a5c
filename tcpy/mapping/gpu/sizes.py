"""The sizes of a band mapped to the GPU: its tile sizes, member by member, and the
block of threads that runs a tile (`choose_sizes`); the chunk of a reduction split
across blocks (`split_chunk`).

The defaults are measured choices (the constants say where each was measured); the
options' sizes, where they give them, win.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tcpy.errors import InternalError
from tcpy.mapping.gpu.bind import count_blocks
from tcpy.mapping.gpu.device import WARP, DeviceProfile
from tcpy.mapping.options import MappingOptions

DEFAULT_BLOCK = (32, 8, 1)
FILL_WAVES = 2
"""Blocks a grid should have per SM when the problem allows: with fewer, SMs idle."""
ELEMENTS_PER_THREAD = 4
"""In a nest of parallel loops alone (an elementwise kernel) whose grid would still
fill the device twice over with resident threads: the elements each thread computes
along x, a block's width apart (each access stays coalesced, and a thread has that
many loads in flight: measured on an H200, a 128 MB gelu went from 53% to 89% of the
copy bandwidth)."""
SHARED_TILE = 32
"""With shared memory: a block's tile along threadIdx.x's member."""
SHARED_ROWS = 4
"""With shared memory: the elements each thread computes along threadIdx.y's member
(32x8 threads compute 32x32 outputs; narrowed to fill the device, never below 32x4
threads computing 32x16)."""
NARROWEST_SHARED_TILE = SHARED_TILE * 4 * SHARED_ROWS
"""The fewest outputs a block computes with shared memory (32x4 threads, 32x16)."""
LARGE_THREAD_TILE = (8, 4)
"""With shared memory, where the grid still fills the device with it: the outputs
each thread computes along y and x (32x8 threads, 64x128 outputs; the tiles of A and B
take 48 KB at the reduction tile of 64; a thread's four outputs along x adjacent,
`MappedKernel.runs`). NVRTC's PTX then makes 9 shared loads per 32 FMAs (8 of A, one
float4 of B), against 1.25 per FMA at 4x1. Measured on an H200 at 4096 cubed: 6.1 ms,
against 7.5 at 8x2 and 8.2 at 8x8 (the tuner searches `register_tile`)."""
SHARED_REDUCTION_TILE = 64
"""With shared memory: the tile of the first reduction member, along which a block
copies its operands' tiles (a matmul's 32x64 and 64x32: 16 KB; each output is loaded
and stored once per tile)."""
MIN_CHUNK = 64
"""The fewest values of a reduction a block runs when the reduction is split."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """The tile sizes of a band (member by member; 0: not tiled, the loop whole in the
    tile band; None: not tiled, the loop whole in the point band, and so are the
    members after it) and the block (threads along x, y, z) of the members mapped to
    threads."""

    tile: list[int | None]
    block: list[int]

    def leading(self) -> list[int]:
        """The sizes of the members tiled (`tile_leading_members`): those before the
        first None, a 0 as 1 (the tile loop is the whole loop)."""
        n = self.tile.index(None) if None in self.tile else len(self.tile)
        if any(t is not None for t in self.tile[n:]):
            raise InternalError(f"members left whole before tiled ones: {self.tile}")
        return [t or 1 for t in self.tile[:n] if t is not None]


@dataclass(frozen=True, slots=True)
class Request:
    """What a band's sizes are chosen from: the options, the band's `n` members of
    which the first `prefix` are parallel, the `members` on the grid (x first) and
    their `extents`, the device, the `lanes` member (a reduction over a warp's
    lanes), whether operand tiles go to shared memory with the first reduction
    member tiled by `reduction_tile`, and the chunk of a `split` reduction."""

    options: MappingOptions
    n: int
    prefix: int
    members: list[int]
    extents: list[int | None]
    device: DeviceProfile
    lanes: int | None = None
    shared: bool = False
    split: int | None = None
    reduction_tile: int = SHARED_REDUCTION_TILE

    @property
    def on_threads(self) -> list[int]:
        """The members on threadIdx.x, .y, .z: the lanes first, where there are some."""
        return self.members if self.lanes is None else [self.lanes, *self.members]

    @property
    def shape(self) -> list[int | None]:
        """The extents along threadIdx.x, .y, .z (a warp for the lanes)."""
        return self.extents if self.lanes is None else [WARP, *self.extents]

    @property
    def chosen(self) -> bool:
        """Whether the mapping chooses the tiles and the block (the options give none)."""
        o = self.options
        return not (o.register_tile or o.tile or o.map_to_threads)


def choose_sizes(req: Request) -> Sizes:
    """The options' sizes where they give them; else, in this order:

    1. each thread computes one element of its tile (a member on threads is tiled by
       the block's size along it, one on blocks only by 1), a reduction's loops stay
       whole in the thread, and the block (32x8) is tightened to the loops it runs;
    2. with shared memory, the large register tile (`LARGE_THREAD_TILE`) where its
       grid still fills the device `FILL_WAVES` times over;
    3. with shared memory, the block as it is where even the narrowest tiles would not
       fill the device (the reuse is worth more than the blocks);
    4. an elementwise nest that fills the device twice over with resident threads:
       `ELEMENTS_PER_THREAD` elements per thread along x;
    5. else the block's y halves while the grid would not fill the device (never
       below a warp of threads, nor below `SHARED_ROWS` with shared memory).
    """
    wanted = _wanted_block(req)
    block = _tightened(req, wanted)
    fill = FILL_WAVES * req.device.sms
    if req.shared and req.chosen and len(block) > 1:
        large = _large_thread_tile(req, wanted, fill)
        if large is not None:
            return large
    if req.shared and len(block) > 1 and not _narrowest_fills(req, block, fill):
        return Sizes(_tiles(req, block), block)
    if req.chosen and not req.shared and req.lanes is None and req.prefix == req.n and block:
        coarse = _elements_per_thread(req, block)
        if coarse is not None:
            return coarse
    if not req.options.tile and not req.options.map_to_threads:
        block = _halved_to_fill(req, block, fill)
    return Sizes(_tiles(req, block), block)


def _wanted_block(req: Request) -> list[int]:
    """The block asked for: the options' threads, else `DEFAULT_BLOCK`, one size per
    member on threads (at most two without the options)."""
    o = req.options
    threads = min(len(req.members) + (req.lanes is not None), len(o.map_to_threads) or 2)
    wanted = list(o.map_to_threads or DEFAULT_BLOCK)[:threads]
    return wanted + [1] * (threads - len(wanted))


def _tiles(
    req: Request, block: list[int], per_thread: tuple[int, ...] | None = None
) -> list[int | None]:
    """The tile sizes for `block`, with `per_thread` outputs per thread with shared
    memory (default: the options' `register_tile`); the options' tiles where given."""
    o = req.options
    if o.tile:
        return [o.tile[k] if k < len(o.tile) else 0 for k in range(req.n)]
    per_thread = o.register_tile if per_thread is None else per_thread
    tile: list[int | None] = [1 if k < req.prefix else None for k in range(req.n)]
    for j, size in enumerate(block):
        member = req.on_threads[j]
        if member != req.lanes:
            tile[member] = shared_tile(j, size, per_thread) if req.shared else size
    if req.shared:
        tile[req.prefix] = req.reduction_tile
    if req.split:
        tile[req.prefix] = req.split
    return tile


def _tightened(
    req: Request, block: list[int], per_thread: tuple[int, ...] | None = None
) -> list[int]:
    """Each size of `block` at most the extent of the point loop it runs (a tile of 0
    leaves one point per tile; a whole loop runs its extent)."""
    tile = _tiles(req, block, per_thread)
    out = []
    for j, size in enumerate(block):
        point, e = tile[req.on_threads[j]], req.shape[j]
        point = size if point is None else point or 1
        out.append(max(1, min(size, point, e if e is not None else point)))
    return out


def _large_thread_tile(req: Request, wanted: list[int], fill: int) -> Sizes | None:
    """Step 2: the whole block asked for, each thread computing `LARGE_THREAD_TILE`,
    where no loop narrows it and its grid still fills the device."""
    large = _tiles(req, wanted, LARGE_THREAD_TILE)
    if _tightened(req, wanted, LARGE_THREAD_TILE) != wanted:
        return None
    return Sizes(large, wanted) if count_blocks(req.extents, large, req.members) >= fill else None


def _narrowest_fills(req: Request, block: list[int], fill: int) -> bool:
    """Step 3: whether the narrowest shared-memory tiles (`SHARED_ROWS` along y) give
    the device enough blocks."""
    narrowest = _tightened(req, [block[0], min(block[1], SHARED_ROWS), *block[2:]])
    return count_blocks(req.extents, _tiles(req, narrowest), req.members) >= fill


def _elements_per_thread(req: Request, block: list[int]) -> Sizes | None:
    """Step 4: `ELEMENTS_PER_THREAD` elements per thread along x, a block's width
    apart, where the loop is that long and the grid still holds the device's resident
    threads `FILL_WAVES` times over."""
    coarse = _tiles(req, block)
    x = req.on_threads[0]
    coarse[x] = along_x = (coarse[x] or 1) * ELEMENTS_PER_THREAD
    if (req.extents[req.members.index(x)] or 0) < along_x:
        return None
    threads = count_blocks(req.extents, coarse, req.members) * math.prod(block)
    return Sizes(coarse, block) if threads >= FILL_WAVES * req.device.resident_threads else None


def _halved_to_fill(req: Request, block: list[int], fill: int) -> list[int]:
    """Step 5: the block with its y halved while the grid would not fill the device,
    down to a warp of threads (and `SHARED_ROWS` rows with shared memory)."""
    while (
        len(block) > 1
        and block[1] > (SHARED_ROWS if req.shared else 1)
        and block[0] * block[1] // 2 >= WARP
        and count_blocks(req.extents, _tiles(req, block), req.members) < fill
    ):
        block = _tightened(req, [block[0], block[1] // 2, *block[2:]])
    return block


def shared_tile(axis: int, threads: int, register_tile: tuple[int, ...] = ()) -> int:
    """With shared memory, the tile of the member on thread axis `axis` (x, y, z)
    run by `threads` threads: `SHARED_TILE` along x and `SHARED_ROWS` elements per
    thread along y, or the elements per thread `register_tile` gives (its last size
    along x, the one before along y; 0 for one), which `use_private_memory` keeps in
    registers across the reduction."""
    if axis >= 2:
        return threads
    if len(register_tile) > axis:
        return threads * max(1, register_tile[-1 - axis])
    return (SHARED_TILE, threads * SHARED_ROWS)[axis]


def split_chunk(blocks: int, threads: int, extent: int | None, device: DeviceProfile) -> int | None:
    """The chunk of a reduction of `extent` values each block of `threads` runs when a
    grid of `blocks` would not fill the device: fewer than `FILL_WAVES` blocks per SM,
    or fewer threads than the device keeps resident (a reduction's threads each walk
    a long chunk: only many of them at once keep enough loads in flight). None when
    it fills it, or when the reduction is too short to give chunks of `MIN_CHUNK`."""
    wanted = max(FILL_WAVES * device.sms, -(-device.resident_threads // max(threads, 1)))
    if extent is None or blocks >= wanted:
        return None
    parts = min(-(-wanted // blocks), extent // MIN_CHUNK)
    return -(-extent // parts) if parts >= 2 else None
