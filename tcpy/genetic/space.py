"""The search space of the tuner, derived from `MappingOptions` itself.

Every field of `MappingOptions` says in its metadata how it is searched (a `Tuning`:
its kind, the targets it applies to, its alleles); a field without one is not
searched and keeps the starting options' value. So an option added later is tuned
with no change here: give it a `Tuning`.

A genome is a list of integers, one gene per (field, position): the index of an
allele. The alleles of size fields come from the kernel's actual loop extents at the
tuning shapes: 0 (untiled: the loop stays whole), powers of two up to the extent, and
the ceil-divisors of each extent (tile sizes that split a loop into equal tiles), as
TC's tuner did. CUDA blocks stay within the device's limits (at most 1024 threads, at
least a warp of 32). Invalid combinations are repaired before they are evaluated.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tcpy.errors import TCMappingError
from tcpy.mapping.options import (
    MAX_REGISTER_BLOCK,
    MappingOptions,
    Tuning,
    TuningKind,
    block_elements,
)
from tcpy.parser.checked import CheckedDef

MAX_TILE_MEMBERS = 8  # tile vectors longer than any loop nest are never needed
AUTO = -1
"""The first allele of a size tuple (tile, grid, block) that stands for the empty tuple:
the target chooses (automatic tile sizes, a grid as large as the loops need)."""
MAX_THREADS = 1024
REGISTER_MEMBERS = 2  # register blocks are tuned over the rows and the vector loop
GPU_REGISTER_SIZE = 8  # the largest register tile per thread and loop on the GPU
WARP = 32


@dataclass(frozen=True, slots=True)
class Gene:
    """One position of the genome: field `name`, entry `position` of a tuple field (None
    for a scalar field), and the values it may take."""

    name: str
    position: int | None
    alleles: tuple[Any, ...]


@dataclass(frozen=True)
class Space:
    """The genes of one tuning problem and how genomes map to options."""

    target: str
    genes: tuple[Gene, ...]
    base: MappingOptions  # the value of every field that is not searched

    @property
    def bounds(self) -> list[int]:
        """The largest allele index of each gene (DEAP's mutation takes these)."""
        return [len(g.alleles) - 1 for g in self.genes]

    def size(self) -> int:
        n = 1
        for g in self.genes:
            n *= len(g.alleles)
        return n

    def random_genome(self, rng: random.Random) -> list[int]:
        return [rng.randrange(len(g.alleles)) for g in self.genes]

    def decode(self, genome: Sequence[int]) -> MappingOptions:
        """The options a genome stands for, repaired so that they validate."""
        scalars: dict[str, Any] = {}
        tuples: dict[str, list[Any]] = {}
        for gene, index in zip(self.genes, genome, strict=True):
            value = gene.alleles[index]
            if gene.position is None:
                scalars[gene.name] = value
            else:
                tuples.setdefault(gene.name, []).append(value)
        fields = {**scalars, **{name: _trim(name, v) for name, v in tuples.items()}}
        return repair(self.base, fields)

    def encode(self, options: MappingOptions) -> list[int]:
        """The genome closest to `options` (each gene takes the allele nearest to the
        field's value, so that starting options are in the first generation)."""
        genome = []
        for gene in self.genes:
            value = getattr(options, gene.name)
            if gene.position is not None:
                if value == () and AUTO in gene.alleles:
                    value = AUTO
                elif gene.position < len(value):
                    value = value[gene.position]
                else:
                    value = _absent(gene)
            genome.append(_nearest(gene.alleles, value))
        return genome


def _trim(name: str, values: list[Any]) -> tuple[Any, ...]:
    """A tuple field's value from its genes: empty when the first gene is AUTO (the
    target chooses), else with trailing absent entries dropped."""
    if values and values[0] == AUTO:
        return ()
    if name in ("map_to_blocks", "map_to_threads"):
        while values and values[-1] == 1 and len(values) > 1:
            values = values[:-1]
    return tuple(values)


def _absent(gene: Gene) -> Any:
    return 1 if gene.name in ("map_to_blocks", "map_to_threads") else 0


def _nearest(alleles: tuple[Any, ...], value: Any) -> int:
    if value in alleles:
        return alleles.index(value)
    if isinstance(value, int) and not isinstance(value, bool):
        numbers = [(abs(a - value), k) for k, a in enumerate(alleles) if isinstance(a, int)]
        if numbers:
            return min(numbers)[1]
    return 0


def repair(base: MappingOptions, fields: dict[str, Any]) -> MappingOptions:
    """`base` with `fields`, made valid first: a CUDA block of more than 1024 threads is
    halved along its largest dimension until it fits, one of fewer than a warp grows
    along x; a register block of more than MAX_REGISTER_BLOCK elements is halved the
    same way."""
    block = list(fields.get("map_to_threads", base.map_to_threads))
    if block:
        while _product(block) > MAX_THREADS:
            k = block.index(max(block))
            block[k] = max(1, block[k] // 2)
        while _product(block) < WARP:
            block[0] *= 2
        fields = {**fields, "map_to_threads": tuple(block)}
    registers = list(fields.get("register_tile", base.register_tile))
    if block_elements(registers) > MAX_REGISTER_BLOCK:
        while block_elements(registers) > MAX_REGISTER_BLOCK:
            registers[registers.index(max(registers))] //= 2
        fields = {**fields, "register_tile": tuple(registers)}
    try:
        return base.replace(**fields)
    except TCMappingError as e:  # a rule this repair does not know: a bug in the space
        raise TCMappingError(f"the tuner produced invalid options {fields}: {e}") from None


def _product(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


# --- building the space -----------------------------------------------------------------


def loop_extents(cdef: CheckedDef, sizes: Mapping[str, int]) -> list[int]:
    """The extent of every loop of the definition at `sizes` (one per statement index)."""
    extents = []
    for st in cdef.statements:
        for v in st.all_indices:
            r = st.range_of(v)
            extents.append(max(1, r.hi.evaluate(sizes) - r.lo.evaluate(sizes)))
    return extents


def loop_depth(cdef: CheckedDef) -> int:
    return max((len(st.all_indices) for st in cdef.statements), default=0)


def build_space(
    cdef: CheckedDef, sizes: Mapping[str, int], target: str, base: MappingOptions
) -> Space:
    """The genes of every field whose metadata applies to `target`."""
    extents = loop_extents(cdef, sizes)
    depth = min(loop_depth(cdef), MAX_TILE_MEMBERS)
    genes: list[Gene] = []
    for f in dataclasses.fields(MappingOptions):
        tuning: Tuning | None = f.metadata.get("tuning")
        if tuning is None or target not in tuning.targets:
            continue
        if tuning.kind is TuningKind.REGISTER and target != "cpu":
            # a thread's outputs on the GPU: at most 8 along each loop (64 registers)
            tuning = dataclasses.replace(
                tuning, values=tuple(v for v in tuning.values if v <= GPU_REGISTER_SIZE)
            )
        genes.extend(_genes(f.name, tuning, extents, depth))
    return Space(target, tuple(genes), base)


def _genes(name: str, tuning: Tuning, extents: list[int], depth: int) -> list[Gene]:
    match tuning.kind:
        case TuningKind.CHOICE:
            return [Gene(name, None, tuning.values)]
        case TuningKind.POWERS:
            top = int(tuning.values[0]) if tuning.values else 64
            return [Gene(name, None, tuple(_powers(top)))]
        case TuningKind.TILE:
            alleles = (0, *sorted(_sizes(extents)))
            return _sized(name, alleles, depth)
        case TuningKind.GRID:
            return _sized(name, tuple(sorted(_sizes(extents) | {1})), 3)
        case TuningKind.BLOCK:
            return _sized(name, tuple(_powers(MAX_THREADS)), 3)
        case TuningKind.PERMUTATION:
            return [Gene(name, None, tuple(_permutations(depth)))]
        case TuningKind.REGISTER:  # rows and the vector loop
            return _sized(name, (0, *tuning.values), REGISTER_MEMBERS)
    raise TCMappingError(f"unknown tuning kind {tuning.kind} of {name}")


def _sized(name: str, alleles: tuple[int, ...], n: int) -> list[Gene]:
    """The genes of a size tuple: the first may also be AUTO (the empty tuple)."""
    return [Gene(name, k, (AUTO, *alleles) if k == 0 else alleles) for k in range(n)]


def _powers(top: int) -> list[int]:
    out, p = [], 1
    while p <= top:
        out.append(p)
        p *= 2
    return out


def _sizes(extents: list[int]) -> set[int]:
    """Powers of two up to each extent, and the ceil-divisors of each extent."""
    out: set[int] = set()
    for e in set(extents):
        out.update(_powers(e))
        out.update(-(-e // d) for d in range(1, 9))
    return {s for s in out if s >= 1}


def _permutations(n: int) -> list[tuple[int, ...]]:
    """The empty interchange (the mapping chooses), and each single loop moved
    innermost (the choice that matters for locality), for n loops."""
    out: list[tuple[int, ...]] = [()]
    for k in range(n):
        out.append(tuple([j for j in range(n) if j != k] + [k]))
    return list(dict.fromkeys(out))
