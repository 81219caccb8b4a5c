"""The marks mapping leaves on the schedule tree for codegen: the contract between the two.

Mapping decides; codegen prints what it decided. Each decision that a loop nest's
shape does not say by itself is a mark above the band it concerns, one frozen
dataclass per kind, written to the isl mark's name and read back from it here and
nowhere else (`insert`, `of`). isl carries the mark into its AST, where codegen
meets it as a mark node (`of_ast`).

CPU (`tcpy.mapping.cpu`, `registers`, `promotion`):

- `Parallel(d)`, `omp_parallel@d`: the worksharing loop (`#pragma omp for`);
- `Collapse(d)`, `omp_collapse@d`: a loop shared out with the one outside it;
- `Simd(d)`, `omp_simd@d`: a vector loop;
- `RegisterBlock(sizes, across, fresh)`, `register_tile:4x16`: a block of outputs in
  registers (`register_tile:across/6x16`: started at the identity, added into the output
  at the end; `register_tile:fresh/4x16`: started at the identity, its outputs'
  initialisation left out);
- `Jam(size)`, `jam:4`: a vector loop of outputs, each reduced over `size` steps of a
  reduction loop inside it;
- `Pack(tensors, transposed, phased)`, `pack:A,W^T`: operand tiles in a thread's buffers
  (`W^T2`: W's last two dimensions first; `I%2`: I's innermost dimension held as its
  even elements, then its odd ones); `pack_once:W^T` (`once`), above a nest: copied
  once per call, by the threads together, into a buffer they share.

GPU (`tcpy.mapping.gpu`, `rows`, `placement`):

- `Shared(tensors, stages)`, `shared:A,B` or `shared/2:A,B`: operand tiles copied into
  shared memory (into a ring of `stages` buffers);
- `Scratch(tensors, stored)`, `scratch:T,A>`: a row kernel's temporaries in shared memory,
  and outputs there stored to global memory once its rows are done (`A>`);
- `ThreadRegisters(outputs, steps)`, `thread_registers:16` or `thread_registers:16x4`: a
  thread's point loops, whose outputs (16 at most) it keeps in registers across their
  reduction (4 of its steps at a time);
- `Private()`, `private`: where a thread's register tile is loaded and stored;
- `MatrixTile(kind, tile, warps, tensors)`, `matrix/bf16:64x64x32:2x2:A,B`: a block's
  point loops of a contraction, run by its warps on the tensor cores;
- `Lanes()`, `lane_reduction`: a reduction over the 32 lanes of a warp;
- `Atomic()`, `atomic_reduction`: a reduction split across blocks;
- `Rows()`, `warp_rows`: a row kernel's statements, a warp per row;
- `LaneZero()`, `lane_zero`: a row kernel's statement of the row alone, run by lane 0.

A mark of a loop (`Parallel`, `Collapse`, `Simd`) names the schedule depth of the
member it marks, which is the loop it belongs to: isl drops loops of a single
iteration, so the first loop below a mark may come from elsewhere. A new kind is a new
dataclass here, with its `name` and a case in `parse`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import islpy as isl

from tcpy.errors import InternalError

Turns = Mapping[tuple[int, str], int]
"""How many innermost dimensions of a tensor a statement reads from a transposed copy,
by (the statement's position in the definition, the tensor)."""
EMPTY: Turns = MappingProxyType({})  # no tensor copied transposed
Vectors = Mapping[int, str]
"""The output index a contraction runs as its vector loop where it is not the innermost,
by the statement's position in the definition (`tcpy.mapping.cpu.packing.channel_vectors`)."""
NO_VECTORS: Vectors = MappingProxyType({})
TRANSPOSED = "^T"  # `pack:A,W^T`: W's copy has its innermost dimension first (`^T2`: two)
ACROSS = "across/"  # `register_tile:across/6x16`: `RegisterBlock.across`
FRESH = "fresh/"  # `register_tile:fresh/8x32`: `RegisterBlock.fresh`
PHASED = "%"  # `pack:I%2`: I's copy holds its innermost dimension in 2 phases (`Pack.phased`)

T = TypeVar("T")


def innermost_first(dims: Sequence[T], turns: int = 1) -> list[T]:
    """The order of a transposed copy's dimensions (`Pack.transposed`): the tensor's
    `turns` innermost ones first, the others after them as they were (`W(n,k)` held as
    `(k,n)`, `W(t,h,e,d)` as `(d,t,h,e)`, and with two turns `W(n,h,e)` as `(h,e,n)`)."""
    return [*dims[len(dims) - turns :], *dims[: len(dims) - turns]]


@dataclass(frozen=True, slots=True)
class Parallel:
    """The worksharing loop of a nest (`#pragma omp for`)."""

    depth: int

    @property
    def name(self) -> str:
        return f"omp_parallel@{self.depth}"


@dataclass(frozen=True, slots=True)
class Collapse:
    """A parallel loop directly inside the worksharing loop: the two share out as one
    (`collapse(2)`), so that a nest whose outer loop has fewer iterations than there
    are threads still uses them all."""

    depth: int

    @property
    def name(self) -> str:
        return f"omp_collapse@{self.depth}"


@dataclass(frozen=True, slots=True)
class Simd:
    """A vector loop (`#pragma omp simd`)."""

    depth: int

    @property
    def name(self) -> str:
        return f"omp_simd@{self.depth}"


LoopMark = Parallel | Collapse | Simd


@dataclass(frozen=True, slots=True)
class RegisterBlock:
    """A block of outputs kept in registers across the reduction loops below
    (`tcpy.mapping.cpu.registers`): its sizes along the blocked members, in order.
    `across`: its vectors run across rows of the output, far apart in memory (a
    convolution's output channels), so the block starts at the reduction's identity
    and is added into the output once at the end, a row of the output at a time,
    instead of being loaded at the start. `fresh`: each output's whole reduction runs in
    one visit of the block, which starts at the identity and stores its outputs; their
    initialisation is left out of the schedule
    (`tcpy.mapping.cpu.registers.fresh_blocks`)."""

    sizes: tuple[int, ...]
    across: bool = False  # the vector loop runs across the output's rows: see the class
    fresh: bool = False  # started at the identity, no initialisation before: see the class

    @property
    def name(self) -> str:
        prefix = (FRESH if self.fresh else "") + (ACROSS if self.across else "")
        return f"register_tile:{prefix}{'x'.join(map(str, self.sizes))}"


@dataclass(frozen=True, slots=True)
class Jam:
    """A vector loop of distinct outputs, each reduced in a register over the `size`
    steps of the reduction loop just inside it (`tcpy.mapping.cpu.registers.jam`)."""

    size: int

    @property
    def name(self) -> str:
        return f"jam:{self.size}"


@dataclass(frozen=True, slots=True)
class Pack:
    """Tiles of these tensors copied into a thread's local buffers here (CPU);
    `transposed`, those copied with their innermost dimensions first, with how many
    (`innermost_first`); `phased`, those whose innermost dimension is held in phases,
    with how many: with 2, the elements at even positions of the tile's rows, then
    those at odd ones (a stride-2 convolution's vector loop then reads each phase
    unit-stride). `once`: the boxes are the same at every iteration of the loops
    around the nest below (a convolution's filters), so they are copied once, before
    the nest, by the threads together into one buffer they share, and read there by
    every thread (`tcpy.mapping.cpu.packing.pack_operands`)."""

    tensors: tuple[str, ...]
    transposed: tuple[tuple[str, int], ...] = ()
    phased: tuple[tuple[str, int], ...] = ()
    once: bool = False

    def turns(self, tensor: str) -> int:
        """How many innermost dimensions of `tensor`'s copy come first (0: none)."""
        return dict(self.transposed).get(tensor, 0)

    def phases(self, tensor: str) -> int:
        """In how many phases `tensor`'s copy holds its innermost dimension (1: as is)."""
        return dict(self.phased).get(tensor, 1)

    @property
    def name(self) -> str:
        def shown(t: str) -> str:
            turns, phases = self.turns(t), self.phases(t)
            if phases > 1:
                return f"{t}{PHASED}{phases}"
            return t if not turns else t + TRANSPOSED + (str(turns) if turns > 1 else "")

        kind = "pack_once" if self.once else "pack"
        return f"{kind}:{','.join(shown(t) for t in self.tensors)}"


@dataclass(frozen=True, slots=True)
class Shared:
    """Tiles of these tensors copied into the block's shared memory here (GPU), into a
    ring of `stages` buffers where the mark is a loop's body (`MappingOptions.copy_stages`)."""

    tensors: tuple[str, ...]
    stages: int = 1

    @property
    def name(self) -> str:
        ring = f"/{self.stages}" if self.stages > 1 else ""
        return f"shared{ring}:{','.join(self.tensors)}"


STORED = ">"
"""After a tensor's name in a `scratch:` mark: its box is stored to global memory when
the code below the mark has run (`scratch:P,A>`)."""


@dataclass(frozen=True, slots=True)
class Scratch:
    """These tensors live in shared memory here, one slice per row (GPU row kernels):
    temporaries, and outputs (`stored`) whose box is stored to global memory once
    the rows are done."""

    tensors: tuple[str, ...]
    stored: tuple[str, ...] = ()  # among `tensors`

    @property
    def name(self) -> str:
        return "scratch:" + ",".join(t + STORED * (t in self.stored) for t in self.tensors)


@dataclass(frozen=True, slots=True)
class ThreadRegisters:
    """A thread's point loops, with a register tile: the outputs the thread computes
    one after another (`outputs` at most) are kept in registers across the loops of
    their reduction, where the loops have that shape (`tcpy.codegen.thread_tile`);
    `steps` of the innermost reduction loop at a time, each operand read along it
    as one vector of that many values where adjacent (1: a step at a time)."""

    outputs: int
    steps: int = 1

    @property
    def name(self) -> str:
        steps = f"x{self.steps}" if self.steps > 1 else ""
        return f"thread_registers:{self.outputs}{steps}"


@dataclass(frozen=True, slots=True)
class MatrixTile:
    """The point loops of a contraction run on the tensor cores (`tcpy.mapping.gpu.matrix`):
    `kind` names the instruction's operand type ("f16", "bf16"), `tile` the block's
    rows, columns and reduction tile, `warps` the block's warps along the rows and
    the columns, and `tensors` the operands giving the rows and the columns, whose
    tiles are in shared memory."""

    kind: str
    tile: tuple[int, int, int]
    warps: tuple[int, int]
    tensors: tuple[str, str]

    @property
    def name(self) -> str:
        tile, warps = "x".join(map(str, self.tile)), "x".join(map(str, self.warps))
        return f"matrix/{self.kind}:{tile}:{warps}:{','.join(self.tensors)}"


@dataclass(frozen=True, slots=True)
class Private:
    """Where a thread's register tile is loaded and stored, above the reduction's
    tile loops it is held across."""

    @property
    def name(self) -> str:
        return "private"


@dataclass(frozen=True, slots=True)
class Lanes:
    """The point band of a reduction spread over the lanes of a warp."""

    @property
    def name(self) -> str:
        return "lane_reduction"


@dataclass(frozen=True, slots=True)
class Atomic:
    """The point band of a reduction split across blocks: each thread reduces its
    chunk into a register, then adds it to the element with an atomic."""

    @property
    def name(self) -> str:
        return "atomic_reduction"


@dataclass(frozen=True, slots=True)
class Rows:
    """The statements of a row kernel: one warp runs them in order over each row,
    meeting at `__syncwarp()` between them."""

    @property
    def name(self) -> str:
        return "warp_rows"


@dataclass(frozen=True, slots=True)
class LaneZero:
    """A row kernel's statement of the row alone (an initialisation, a row's value),
    run by lane 0. A mark rather than a filter on the lane: isl would otherwise split
    the row's statements by lane, and each lane's part would run in its own order,
    out of step with the warp's meetings (`tcpy.codegen.cuda`)."""

    @property
    def name(self) -> str:
        return "lane_zero"


Mark = (
    Parallel | Collapse | Simd | RegisterBlock | Jam | Pack | Shared | Scratch | ThreadRegisters
    | MatrixTile | Private | Lanes | Atomic | Rows | LaneZero
)  # fmt: skip
Copy = Pack | Shared | Scratch
"""The marks under which codegen lays out local copies of tensors' boxes."""


def parse(name: str) -> Mark:
    """The mark an isl mark's name spells (the inverse of `Mark.name`)."""
    kind, at, depth = name.partition("@")
    if at and depth.isdigit():
        match kind:
            case "omp_parallel":
                return Parallel(int(depth))
            case "omp_collapse":
                return Collapse(int(depth))
            case "omp_simd":
                return Simd(int(depth))
    kind, _, rest = name.partition(":")
    tensors = tuple(rest.split(",")) if rest else ()
    match kind:
        case "register_tile" if re.fullmatch(
            rf"({re.escape(FRESH)})?({re.escape(ACROSS)})?\d+(x\d+)*", rest
        ):
            settled = rest.removeprefix(FRESH)
            sizes = settled.removeprefix(ACROSS)
            blocked = tuple(int(s) for s in sizes.split("x"))
            return RegisterBlock(blocked, sizes != settled, settled != rest)
        case "jam" if rest.isdigit():
            return Jam(int(rest))
        case "thread_registers" if re.fullmatch(r"\d+(x\d+)?", rest):
            outputs, _, steps = rest.partition("x")
            return ThreadRegisters(int(outputs), int(steps or 1))
        case "pack" | "pack_once" if tensors:
            phased = [t.partition(PHASED) for t in tensors]
            split = [name.partition(TRANSPOSED) for name, _, _ in phased]
            plain = tuple(name for name, _, _ in split)
            transposed = tuple((name, int(turns or 1)) for name, mark, turns in split if mark)
            phases = tuple((name, int(n)) for name, mark, n in phased if mark)
            return Pack(plain, transposed, phases, once=kind == "pack_once")
        case "shared" if tensors:
            return Shared(tensors)
        case staged if staged.startswith("shared/") and staged[7:].isdigit() and tensors:
            return Shared(tensors, int(staged[7:]))
        case "scratch" if tensors:
            names = tuple(t.removesuffix(STORED) for t in tensors)
            return Scratch(
                names, tuple(t.removesuffix(STORED) for t in tensors if t.endswith(STORED))
            )
        case matrix if matrix.startswith("matrix/"):
            return _matrix_tile(matrix[7:], rest)
    for simple in (Private(), Lanes(), Atomic(), Rows(), LaneZero()):
        if name == simple.name:
            return simple
    raise InternalError(f"a schedule mark that is no tcpy mark: {name!r}")


def _matrix_tile(kind: str, rest: str) -> MatrixTile:
    """The `MatrixTile` of a name's kind and the rest after the colon."""
    parts = rest.split(":")
    t, w, names = (
        (parts[0].split("x"), parts[1].split("x"), parts[2].split(","))
        if len(parts) == 3
        else ([], [], [])
    )
    numbers = [*t, *w]
    if len(t) != 3 or len(w) != 2 or len(names) != 2 or not all(x.isdigit() for x in numbers):
        raise InternalError(f"a schedule mark that is no tcpy mark: matrix/{kind}:{rest!r}")
    tile, warps = tuple(map(int, t)), tuple(map(int, w))
    return MatrixTile(kind, (tile[0], tile[1], tile[2]), (warps[0], warps[1]), (names[0], names[1]))


def insert(node: isl.ScheduleNode, mark: Mark) -> isl.ScheduleNode:
    """Insert `mark` above `node`; returns the node below the mark."""
    return node.insert_mark(isl.Id(mark.name, context=node.get_ctx())).child(0)


def of(node: isl.ScheduleNode) -> Mark | None:
    """The mark a schedule-tree node is, or None for another node."""
    if node.get_type() != isl.schedule_node_type.mark:
        return None
    return parse(node.mark_get_id().get_name())


def of_ast(node: isl.AstNode) -> Mark | None:
    """The mark an isl AST node is, or None for another node."""
    if node.get_type() != isl.ast_node_type.mark:
        return None
    return parse(node.mark_get_id().get_name())


def loop_marks(marks: tuple[Mark, ...], depth: int) -> tuple[LoopMark, ...]:
    """The marks among `marks` that belong to the loop of schedule depth `depth`."""
    return tuple(m for m in marks if isinstance(m, Parallel | Collapse | Simd) and m.depth == depth)
