"""`MappingOptions`: the compiler's input, the tuner's genome, the options cache's value.

One frozen dataclass with every option of the original TC plus the CPU ones, validated
on construction (a `TCMappingError` names the field and the rule), with a JSON
round-trip and named presets. Targets use the fields that apply to them: the CPU
target reads the scheduling, tiling, unrolling and CPU fields; the GPU fields are
the CUDA target's.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tcpy.errors import TCMappingError, TCWarning, warn


class Fusion(enum.Enum):
    """How the isl scheduler may fuse statements into one loop nest."""

    MAX = "Max"  # fuse whatever can be fused
    PRESERVE3_COINCIDENT = "Preserve3Coincident"  # fuse only keeping outer loops parallel
    MIN = "Min"  # never fuse: one loop nest per statement


class TuningKind(enum.Enum):
    """How the tuner draws a field's values (`tcpy.genetic.space` turns each kind into
    genes, from the kernel's loop extents where sizes are involved)."""

    CHOICE = "choice"  # one of `Tuning.values`
    POWERS = "powers"  # 1, 2, 4, ... up to `Tuning.values[0]`
    TILE = "tile"  # one size per loop: 0 (untiled), powers of two, ceil-divisors of extents
    GRID = "grid"  # blocks along x, y, z: sizes from the loop extents
    BLOCK = "block"  # threads along x, y, z: powers of two, a warp to 1024 in all
    PERMUTATION = "permutation"  # an interchange of the point loops (empty: the mapping's)
    REGISTER = "register"  # a register block: 0 or one of `Tuning.values` per blocked loop


@dataclass(frozen=True, slots=True)
class Tuning:
    """Field metadata: how the tuner searches this field, on which targets. A field
    without it is not searched (it keeps the starting options' value)."""

    kind: TuningKind
    targets: tuple[str, ...]
    values: tuple[Any, ...] = ()


CPU_AND_CUDA = ("cpu", "cuda")
_FUSIONS = (Fusion.MAX, Fusion.PRESERVE3_COINCIDENT, Fusion.MIN)
_BOOLS = (False, True)
_DEPTHS = (0, 1, 2, 3, 4, 8)  # `shared_depth`, `private_depth`: clamped to the band
COPY_STAGES = (1, 2, 3, 4)
WARP_TILES = ((), (16, 32), (32, 16), (32, 32), (64, 32), (32, 64), (64, 64))
"""The warp tiles the tuner tries (`warp_tile`; empty: the mapping's)."""
INPUT_PRECISIONS = ("ieee", "tf32", "tf32x3")
MAX_WARP_TILE = 64 * 64
"""The most outputs a warp's tile may have (128 registers of accumulators a lane)."""
MAX_COPY_STAGES = 8
ONLINE_TILES = (0, 64, 256, 2048)
"""The tiles of a row `online_tile` is searched over (0: the row's chain not online;
64: a GPU block's tile, its keys and values in shared memory)."""
REGISTER_SIZES = (1, 2, 4, 8, 16, 32, 64)
MAX_REGISTER_BLOCK = 1024
"""The most elements a register block may hold (it lives on the stack when the
compiler cannot keep it in registers)."""
MAX_UNROLL = 1024
"""The largest unroll factor: more is never useful, and compilers refuse some (gcc
rejects `#pragma GCC unroll` of 65535 or more)."""


def block_elements(register_tile: tuple[int, ...] | list[int]) -> int:
    """How many outputs a register block of these sizes holds (0 counts as 1)."""
    n = 1
    for size in register_tile:
        n *= max(size, 1)
    return n


def _tuned(kind: TuningKind, targets: tuple[str, ...], *values: Any) -> dict[str, Tuning]:
    """The metadata of a searched field."""
    return {"tuning": Tuning(kind, targets, tuple(values))}


@dataclass(frozen=True, slots=True)
class MappingOptions:
    # --- scheduling -------------------------------------------------------------------
    outer_schedule_fusion: Fusion = dataclasses.field(
        default=Fusion.PRESERVE3_COINCIDENT,
        metadata=_tuned(TuningKind.CHOICE, CPU_AND_CUDA, *_FUSIONS),
    )
    """Fusion strategy of the isl scheduler for the whole kernel."""
    intra_tile_schedule_fusion: Fusion = dataclasses.field(
        default=Fusion.PRESERVE3_COINCIDENT,
        metadata=_tuned(TuningKind.CHOICE, ("cpu",), *_FUSIONS),
    )
    """Fusion inside a tile (`cpu`): MIN distributes the point loops of the fused
    statements, one point-loop nest per statement under the shared tile loops. The
    GPU mapping chooses the point loops of a tile itself."""
    allow_skewing: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, CPU_AND_CUDA, *_BOOLS)
    )
    """Accept schedules that combine several indices in one loop (i + j)."""
    positive_orthant: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, CPU_AND_CUDA, *_BOOLS)
    )
    """Accept only schedules whose loops run forwards over every index."""
    fix_parameters_before_scheduling: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, CPU_AND_CUDA, *_BOOLS)
    )
    """Schedule (and generate code) for the call's sizes as constants rather than
    for any size. With False, the `cpu` target builds one size-generic kernel that
    reads the sizes at each call and serves every shape of the same input ranks and
    dtypes (a new batch size costs no compile; `Compiled.generic`), unless isl's
    parametric analysis fails and the build falls back to the call's sizes. The CUDA
    targets compile per shape either way."""

    # --- tiling and unrolling ---------------------------------------------------------
    tile: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.TILE, CPU_AND_CUDA)
    )
    """Tile sizes of the outermost permutable band, member by member; 0 (or a missing
    entry) leaves that loop untiled, so (0,) asks for no tiling at all. Empty: the
    target chooses (the CPU mapping picks sizes from the loop extents)."""
    unroll: int = dataclasses.field(default=1, metadata=_tuned(TuningKind.POWERS, CPU_AND_CUDA, 64))
    """Unroll factor requested for the innermost loops (1: no unrolling). The code
    generators lower it, to a power of two, for a loop whose body is large
    (`tcpy.codegen.c.unroll_factor`)."""
    interchange: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.PERMUTATION, ("cpu",))
    )
    """A permutation of the members of the tiled band's point loops, outermost first;
    empty lets the mapping choose (the unit-stride loop innermost)."""
    register_tile: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.REGISTER, ("cpu", "cuda"), *REGISTER_SIZES)
    )
    """Register blocking of a reduction: block sizes of the parallel point loops around
    the reduction loops, outermost first and aligned to the innermost loop (the last
    size is the vector loop's). The block of outputs stays in registers across the
    whole reduction. 0 leaves a loop unblocked, so (0,) turns blocking off; empty: the
    target chooses. On CUDA, with shared-memory tiles, the outputs each thread computes
    along threadIdx.y's loop and threadIdx.x's (the tile is the block times these),
    kept in registers with `use_private_memory`."""
    pack_operands: bool | None = dataclasses.field(
        default=None, metadata=_tuned(TuningKind.CHOICE, ("cpu",), None, True, False)
    )
    """Copy the tile of each operand a loop nest reads into a contiguous buffer of each
    thread before the tile's loops (`tcpy.mapping.promotion`). None: the operands
    whose tiles are reused and read across rows far apart in memory; True: every
    operand read affinely that fits the buffers; False: none."""

    # --- GPU mapping (the CUDA target) ------------------------------------------------
    map_to_blocks: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.GRID, ("cuda",))
    )
    """Grid size: blocks along x, y, z; only that many parallel loops go on blocks.
    Empty: every parallel loop, those beyond two folded into z, as many blocks as
    the loops need."""
    map_to_threads: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.BLOCK, ("cuda",))
    )
    """Block size: threads along x, y, z (at most 1024 in all). Empty: the mapping
    chooses (up to 32x8, fewer when the grid would not fill the device)."""
    reduce_across_threads: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Spread a reduction over the lanes of a warp (partial results in registers,
    combined with shuffles) when it, and no parallel loop, reads its operands with
    unit stride: a softmax's row maximum, an MLP's dot products; and run a nest fused
    over rows as a row kernel, one warp per row (`tcpy.mapping.gpu.rows`). Needs the tiles
    and the block's x (a warp) left to the mapping."""
    split_reductions: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Split a long reduction across blocks when the parallel loops alone would not
    fill the device (BiasAddGrad: few columns, many rows), the blocks' partial results
    added with atomics (`+` on 32-bit integers and floats and on doubles, `min`/`max`
    on 32-bit integers). Such results depend on the order blocks run in: False keeps
    them deterministic."""
    use_shared_memory: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Copy the tiles of the operands a block reuses into shared memory, once per tile
    of the reduction (`tcpy.mapping.gpu`, `tcpy.mapping.gpu.shared.shared_tensors`)."""
    use_private_memory: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Keep the outputs each thread computes (the elements of its tile that it reduces
    into, one after another) in registers across their reduction loop, which then
    combines all of them at each step: the values of an operand they share are loaded
    once per step (`tcpy.codegen.cuda`; the CPU keeps its register blocks by
    `register_tile`)."""
    unroll_copy_shared: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Unroll the copies into shared memory: each thread loads `COPY_BATCH` (4) of its
    elements before it stores them, so that many loads are in flight
    (`tcpy.codegen.cuda`; on an H200, softmax at 32768x1024 0.133 -> 0.105 ms, a 4096^3
    matmul 7.6 -> 6.1 ms). False: one element at a time (fewer registers)."""
    max_shared_memory: int = 0
    """Bytes of shared memory a block may use (0: the device's limit)."""
    copy_stages: int = dataclasses.field(
        default=2, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *COPY_STAGES)
    )
    """The buffers of a reduction's operand tiles in shared memory, filled by
    asynchronous copies (`cp.async`, sm_80 and later): with 2 or more, the copies of
    the next `copy_stages - 1` tiles are in flight while a tile is computed, one
    barrier per tile (`tcpy.codegen.cuda`). 1: one buffer, copied synchronously before
    each tile. Fewer where shared memory cannot hold them, or where the device has no
    `cp.async` (`tcpy.mapping.gpu.placement.copy_stages`)."""
    use_tensor_cores: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Run contractions (`tcpy.parser.contractions`) whose operands are float16 or
    bfloat16, and float32 ones when `input_precision` asks, on the tensor cores
    (`mma.sync`, sm_80 and later), with `use_shared_memory`: each warp computes a
    `warp_tile` of the block's outputs from operand tiles in shared memory, in float32
    (`tcpy.mapping.gpu.matrix`). A contraction the instructions cannot take runs on
    the CUDA cores as before. False: always the CUDA cores."""
    warp_tile: tuple[int, ...] = dataclasses.field(
        default=(), metadata=_tuned(TuningKind.CHOICE, ("cuda",), *WARP_TILES)
    )
    """On the tensor cores: the outputs each warp computes, rows then columns
    (multiples of 16 and 8); a block has four warps, two by two. Empty: the mapping
    chooses (64x32, smaller for small contractions or to fill the device)."""
    input_precision: str = "ieee"
    """How float32 operands of a contraction are multiplied (Triton's names):
    "ieee" on the CUDA cores, exactly as written; "tf32" on the tensor cores, each
    operand rounded to TF32 (10 bits of mantissa, as `cvt.rna.tf32.f32` rounds);
    "tf32x3" on the tensor cores in three TF32 products (each operand split into a
    TF32 part and its rounded rest), close to float32's accuracy. Not searched by
    the tuner (it changes the results); targets without tensor cores read it not."""
    use_readonly_cache: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Read tensors that are only read through the read-only data cache (__ldg)."""
    one_kernel: bool = dataclasses.field(
        default=False, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_BOOLS)
    )
    """Run the def's kernels as one persistent kernel, launched cooperatively on the
    blocks the device holds at once, a grid-wide barrier between the kernels' parts
    (`tcpy.codegen.one_kernel`): one launch for a def of many kernels (a whole layer
    at a small batch), the intermediate tensors still in global memory. Where the
    kernels cannot be one (their shared memory together is past a kernel's, or a
    kernel working in step has threads that are not whole warps), or the device
    cannot launch cooperatively, they run as kernels of their own."""
    shared_depth: int = dataclasses.field(
        default=0, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_DEPTHS)
    )
    """Where the copies into shared memory are made, as a depth in the kernel's tile
    band (its members on the grid first, then the reduction's tile loops): below its
    first `shared_depth` members. 0 (the default): below all of them, a copy per tile
    of the reduction. A smaller depth copies the operands' footprint over the tile
    loops below it at once (fewer barriers, more shared memory); where the operands
    copied per tile do not all fit `max_shared_memory` there, the copies stay per
    tile. Depths are clamped to the band: one among the grid's members is theirs."""
    private_depth: int = dataclasses.field(
        default=0, metadata=_tuned(TuningKind.CHOICE, ("cuda",), *_DEPTHS)
    )
    """Where a thread's register tile (`use_private_memory`) is loaded and stored, as a
    depth in the kernel's tile band, as `shared_depth`: the tile is held in registers
    across the reduction's tile loops below it. 0 (the default): the grid's members,
    so each output is loaded and stored once; the band's size or more: inside each
    tile of the reduction (loaded and stored once per tile)."""

    # --- CPU mapping ------------------------------------------------------------------
    parallel: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cpu",), *_BOOLS)
    )
    """Run the outermost parallel loop of each loop nest with `omp parallel for`."""
    vectorize: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, CPU_AND_CUDA, *_BOOLS)
    )
    """Use the machine's vectors. `cpu`: mark the innermost loop `omp simd` when its
    iterations are independent. `cuda`: copy a float32 or int32 tile whose rows are
    whole 16-byte vectors into shared memory with vector loads (`float4`), where at
    run time its rows start on one, element by element elsewhere; and where a thread
    computes 2 or 4 outputs along x (`register_tile`, `use_private_memory`), make
    them adjacent, loaded, stored and read from shared memory as one `float2` or
    `float4` where the accesses allow (`tcpy.mapping.gpu.placement.thread_runs`); and
    take such a thread's reduction 4 (or 2) steps at a time, each of its rows of an
    operand read along them as one vector (`placement.reduction_steps`)."""
    fuse_rows: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cpu", "cuda"), *_BOOLS)
    )
    """Run consecutive nests that share their rows, where a row reduction needs the
    rows whole (a softmax, a layer norm, an attention head), as one nest over their
    rows (`tcpy.mapping.rows`): `cpu`, over blocks of rows, their temporaries in a
    thread's buffers; `cuda`, as a row kernel, a warp per row, the temporaries in
    shared memory (`tcpy.mapping.gpu.rows`)."""
    fuse_epilogues: bool = dataclasses.field(
        default=True, metadata=_tuned(TuningKind.CHOICE, ("cpu",), *_BOOLS)
    )
    """`cpu`: run the point-wise statements that follow a contraction over its outputs
    (a bias, an activation, a residual) in the contraction's tiles, right after each
    tile's reduction, and its initialisation just before (`tcpy.mapping.cpu.epilogues`)."""
    online_tile: int = dataclasses.field(
        default=0, metadata=_tuned(TuningKind.CHOICE, ("cpu", "cuda"), *ONLINE_TILES)
    )
    """Where a def computes a row's maximum and sums of exponentials against it (a
    softmax, an attention head, a log-sum-exp), read the row once, in tiles of this
    many values, the sums rescaled as each tile raises the maximum
    (`tcpy.poly.online`); 0: not. On `cuda`, such a chain with its first and last
    statements is one kernel, a warp a row, a tile at a time in shared memory
    (`tcpy.mapping.gpu.online`)."""
    threads: int = 0
    """The threads a `cpu` kernel runs on (0: chosen at each call, from
    `TCPY_NUM_THREADS`, else `OMP_NUM_THREADS`, else the cores; see `tcpy.knobs`). The
    generated code does not depend on it: kernels differing only here are one build."""

    def __post_init__(self) -> None:
        _validate(self)

    # --- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = (
                value.value
                if isinstance(value, Fusion)
                else (list(value) if isinstance(value, tuple) else value)
            )
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MappingOptions:
        """Options from their JSON form (`to_dict`). A field tcpy no longer has
        (`REMOVED`), which an old options file, a stored tuning record or a fuzz
        replay may name, is ignored with a `TCWarning`."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        data = _without_removed(data)
        _check_names(data)
        values: dict[str, Any] = {}
        for name, value in data.items():
            default = names[name].default
            if isinstance(default, Fusion):
                try:
                    values[name] = Fusion(value)
                except ValueError:
                    choices = ", ".join(f.value for f in Fusion)
                    raise TCMappingError(
                        f"{name} must be one of {choices}, not {value!r}"
                    ) from None
            elif isinstance(default, tuple):
                if not isinstance(value, list | tuple):
                    raise TCMappingError(f"{name} must be a list of integers, not {value!r}")
                values[name] = tuple(value)
            else:
                values[name] = value
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> MappingOptions:
        return cls.from_dict(cls._json_object(text))

    @staticmethod
    def _json_object(text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TCMappingError(f"mapping options are not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise TCMappingError("mapping options must be a JSON object")
        return data

    def replace(self, **changes: Any) -> MappingOptions:
        changes = _without_removed(changes)
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    def layered(self, changes: Mapping[str, Any]) -> MappingOptions:
        """These options with the fields `changes` names (in Python or JSON form, as
        `from_dict` takes them) changed, the whole checked again."""
        return MappingOptions.from_dict({**self.to_dict(), **changes})

    # --- presets ----------------------------------------------------------------------
    @classmethod
    def naive(cls) -> MappingOptions:
        """No tiling or fusion decisions beyond isl's; 32x8 threads, strided grid."""
        return cls(
            outer_schedule_fusion=Fusion.PRESERVE3_COINCIDENT,
            map_to_threads=(32, 8),
            map_to_blocks=(256, 256),
        )

    @classmethod
    def pointwise(cls) -> MappingOptions:
        """Elementwise kernels: fuse everything, 32-wide tiles."""
        return cls(
            outer_schedule_fusion=Fusion.MAX,
            tile=(32, 32, 32),
            map_to_threads=(32, 4),
            map_to_blocks=(256, 256),
            unroll=4,
        )

    @classmethod
    def mlp(cls) -> MappingOptions:
        """Fully connected layers: keep the reduction inside the tile."""
        return cls(
            outer_schedule_fusion=Fusion.MAX,
            tile=(16, 32, 32),
            map_to_threads=(32, 8),
            map_to_blocks=(128, 128),
            unroll=4,
            use_readonly_cache=True,
        )

    @classmethod
    def conv(cls) -> MappingOptions:
        """Convolutions: tile the output's spatial dimensions."""
        return cls(
            outer_schedule_fusion=Fusion.MAX,
            tile=(1, 8, 8, 32),
            map_to_threads=(32, 4, 2),
            map_to_blocks=(64, 32, 32),
            unroll=2,
        )

    @classmethod
    def cpu(cls) -> MappingOptions:
        """The CPU default: sizes fixed, one loop nest per statement (so a reduction's
        loops form one band), tile sizes chosen from the loop extents, the unit-stride
        loop innermost and vectorised, the outermost parallel loop on OpenMP threads.
        The `cpu` target's defaults add `Max` fusion for pipelines without a
        contraction (`tcpy.mapping.cpu.cpu_defaults`)."""
        return cls(
            outer_schedule_fusion=Fusion.MIN,
            fix_parameters_before_scheduling=True,
            unroll=4,
        )

    @classmethod
    def cuda(cls) -> MappingOptions:
        """The CUDA preset: sizes fixed, one kernel per statement, every parallel loop
        on the grid (the unit-stride one on threadIdx.x), blocks of up to 32x8 threads
        each computing one element, narrowed until the grid fills the device;
        reductions over a warp's lanes where they read with unit stride, else
        sequential in each thread, their reused operands' tiles in shared memory
        (`tcpy.mapping.gpu`). The CUDA targets' defaults add `Max` outer fusion for
        pipelines without a contraction, which then run as row kernels
        (`tcpy.mapping.gpu.cuda_defaults`, `tcpy.mapping.gpu.rows`)."""
        return cls(
            outer_schedule_fusion=Fusion.MIN,
            fix_parameters_before_scheduling=True,
            unroll=4,
            use_shared_memory=True,
            use_private_memory=True,
        )

    @classmethod
    def resolve(
        cls, given: MappingOptions | Mapping[str, Any] | str, defaults: Callable[[], MappingOptions]
    ) -> MappingOptions:
        """Options as a user gives them, complete: a `MappingOptions` as it is; a mapping,
        or the text of a JSON object, of the fields to change on `defaults()` (the
        target's default options for the def); or the name of a preset."""
        if isinstance(given, MappingOptions):
            return given
        if isinstance(given, str):
            if not given.lstrip().startswith("{"):
                return cls.preset(given)
            given = cls._json_object(given)
        if not isinstance(given, Mapping):
            raise TCMappingError(
                "options must be MappingOptions, a dict of the fields to change, a JSON "
                f"object or a preset name, not {type(given).__name__}"
            )
        return defaults().layered(given)

    @classmethod
    def preset(cls, name: str) -> MappingOptions:
        if name not in PRESETS:
            raise TCMappingError(f"unknown preset {name!r}; the presets are {', '.join(PRESETS)}")
        made: MappingOptions = getattr(cls, name)()
        return made


REMOVED = {
    "tile_imperfectly_nested": "no mapping ever tiled a band its loops do not all enclose",
    "match_library_calls": "no target replaces operations by library calls",
}
"""Fields of earlier versions that nothing read, with why they went."""


def _without_removed(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` less the fields tcpy no longer has, each dropped with a `TCWarning`."""
    for name in sorted(set(data) & set(REMOVED)):
        warn(TCWarning(f"mapping option {name!r} no longer exists ({REMOVED[name]}); ignored"))
    return {k: v for k, v in data.items() if k not in REMOVED}


def _check_names(names: Iterable[str]) -> None:
    """A `TCMappingError` for names that are not fields, with the field each is
    closest to (`tiel`: did you mean 'tile'?)."""
    fields = [f.name for f in dataclasses.fields(MappingOptions)]
    unknown = sorted(set(names) - set(fields))
    if not unknown:
        return
    hints, lost = [], False
    for name in unknown:
        close = difflib.get_close_matches(name, fields, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        lost |= not close
    listed = f"; the options are {', '.join(fields)}" if lost else ""
    raise TCMappingError(f"unknown mapping option(s): {', '.join(hints)}{listed}")


# The names `MappingOptions.preset` takes: each is a classmethod of that name.
PRESETS = ("naive", "pointwise", "mlp", "conv", "cpu", "cuda")


def _validate(o: MappingOptions) -> None:
    def fail(message: str) -> None:
        raise TCMappingError(message)

    for name in ("outer_schedule_fusion", "intra_tile_schedule_fusion"):
        if not isinstance(getattr(o, name), Fusion):
            fail(f"{name} must be a Fusion, not {getattr(o, name)!r}")
    for name in ("allow_skewing", "positive_orthant", "fix_parameters_before_scheduling",
                 "use_shared_memory", "use_private_memory", "unroll_copy_shared",
                 "use_readonly_cache", "reduce_across_threads", "split_reductions",
                 "use_tensor_cores", "one_kernel",
                 "parallel", "vectorize", "fuse_rows", "fuse_epilogues"):  # fmt: skip
        if not isinstance(getattr(o, name), bool):
            fail(f"{name} must be true or false, not {getattr(o, name)!r}")
    for name in ("tile", "map_to_blocks", "map_to_threads", "interchange", "register_tile",
                 "warp_tile"):  # fmt: skip
        value = getattr(o, name)
        if not isinstance(value, tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            fail(f"{name} must be a tuple of integers, not {value!r}")
    for name in ("unroll", "max_shared_memory", "shared_depth", "private_depth", "threads",
                 "copy_stages", "online_tile"):  # fmt: skip
        value = getattr(o, name)
        if not isinstance(value, int) or isinstance(value, bool):
            fail(f"{name} must be an integer, not {value!r}")
    _validate_tensor_cores(o, fail)
    if o.online_tile < 0:
        fail(f"online_tile must be 0 (off) or positive, not {o.online_tile}")
    if not 1 <= o.copy_stages <= MAX_COPY_STAGES:
        fail(f"copy_stages must be 1 to {MAX_COPY_STAGES}, not {o.copy_stages}")
    if any(t < 0 for t in o.tile):
        fail(f"tile sizes must be 0 (untiled) or positive, not {o.tile}")
    if any(r < 0 for r in o.register_tile) or block_elements(o.register_tile) > MAX_REGISTER_BLOCK:
        fail(
            f"register_tile sizes must be 0 (unblocked) or positive, with at most "
            f"{MAX_REGISTER_BLOCK} elements in a block, not {o.register_tile}"
        )
    if not (o.pack_operands is None or isinstance(o.pack_operands, bool)):
        fail(f"pack_operands must be null, true or false, not {o.pack_operands!r}")
    if not 1 <= o.unroll <= MAX_UNROLL:
        fail(f"unroll must be 1 to {MAX_UNROLL}, not {o.unroll}")
    if len(o.map_to_blocks) > 3 or any(b < 1 for b in o.map_to_blocks):
        fail(f"map_to_blocks takes 1 to 3 positive sizes, not {o.map_to_blocks}")
    if len(o.map_to_threads) > 3 or any(t < 1 for t in o.map_to_threads):
        fail(f"map_to_threads takes 1 to 3 positive sizes, not {o.map_to_threads}")
    threads = 1
    for t in o.map_to_threads:
        threads *= t
    if threads > 1024:
        fail(f"map_to_threads {o.map_to_threads} asks for {threads} threads a block; at most 1024")
    if sorted(o.interchange) != list(range(len(o.interchange))):
        fail(
            f"interchange must be a permutation of 0..{len(o.interchange) - 1}, not {o.interchange}"
        )
    for name in ("max_shared_memory", "shared_depth", "private_depth", "threads"):
        if getattr(o, name) < 0:
            fail(f"{name} must not be negative")


def _validate_tensor_cores(o: MappingOptions, fail: Callable[[str], None]) -> None:
    """The rules of `input_precision` and `warp_tile`."""
    if o.input_precision not in INPUT_PRECISIONS:
        choices = ", ".join(INPUT_PRECISIONS)
        fail(f"input_precision must be one of {choices}, not {o.input_precision!r}")
    if o.warp_tile and (
        len(o.warp_tile) != 2 or o.warp_tile[0] % 16 or o.warp_tile[1] % 8 or min(o.warp_tile) < 8
        or o.warp_tile[0] * o.warp_tile[1] > MAX_WARP_TILE
    ):  # fmt: skip
        fail(
            f"warp_tile takes rows (a multiple of 16) and columns (a multiple of 8), at most "
            f"{MAX_WARP_TILE} outputs, not {o.warp_tile}"
        )
