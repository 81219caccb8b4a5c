"""Random valid `MappingOptions`, over every field.

Valid means accepted by `MappingOptions`' own validation (`unroll` stays below gcc's
limit for `#pragma GCC unroll`, 65535). A field this module does not know raises, so
that a new option is noticed here instead of silently never being fuzzed.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from tcpy import Fusion, MappingOptions, TCMappingError
from tcpy.mapping.options import WARP_TILES

# Options the targets refuse today (none); sampling them would only test the refusal.
REFUSED: dict[str, object] = {}


def _fusion(rng: random.Random) -> Fusion:
    return rng.choice(list(Fusion))


def _tile(rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.2:
        return rng.choice(((), (0,)))
    sizes = (0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 64)
    return tuple(rng.choice(sizes) for _ in range(rng.randint(1, 5)))


def _unroll(rng: random.Random) -> int:
    return rng.choice((1, 1, 2, 3, 4, 8, 16, 64))


def _interchange(rng: random.Random) -> tuple[int, ...]:
    n = rng.choice((0, 0, 1, 2, 3, 4))
    perm = list(range(n))
    rng.shuffle(perm)
    return tuple(perm)


def _register_tile(rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.4:
        return rng.choice(((), (), (0,)))
    sizes = (0, 1, 2, 3, 4, 5, 8, 16, 32)
    return tuple(rng.choice(sizes) for _ in range(rng.randint(1, 3)))


def _grid(rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.3:
        return ()
    return tuple(rng.choice((1, 2, 3, 7, 16, 64, 256)) for _ in range(rng.randint(1, 3)))


def _block(rng: random.Random) -> tuple[int, ...]:
    if rng.random() < 0.2:
        return ()
    while True:
        dims = tuple(rng.choice((1, 2, 3, 4, 8, 16, 32, 64)) for _ in range(rng.randint(1, 3)))
        total = 1
        for d in dims:
            total *= d
        if total <= 1024:
            return dims


def _flag(rng: random.Random) -> bool:
    return rng.random() < 0.5


SAMPLERS: dict[str, Callable[[random.Random], Any]] = {
    "outer_schedule_fusion": _fusion,
    "intra_tile_schedule_fusion": _fusion,
    "allow_skewing": _flag,
    "positive_orthant": _flag,
    "fix_parameters_before_scheduling": _flag,
    "tile": _tile,
    "unroll": _unroll,
    "interchange": _interchange,
    "register_tile": _register_tile,
    "pack_operands": lambda rng: rng.choice((None, True, False)),
    "map_to_blocks": _grid,
    "map_to_threads": _block,
    "max_shared_memory": lambda rng: rng.choice((0, 0, 1024, 49152)),
    "copy_stages": lambda rng: rng.choice((1, 2, 2, 3, 4)),
    "use_tensor_cores": lambda rng: rng.random() < 0.8,
    "warp_tile": lambda rng: rng.choice(WARP_TILES),
    # tf32 rounds the operands to 10 bits, beyond the fuzzer's tolerance; tf32x3 keeps
    # float32's accuracy, so it is drawn
    "input_precision": lambda rng: rng.choice(("ieee", "ieee", "tf32x3")),
    "use_readonly_cache": _flag,
    "one_kernel": _flag,
    "use_shared_memory": _flag,
    "use_private_memory": _flag,
    "unroll_copy_shared": _flag,
    "reduce_across_threads": _flag,
    "split_reductions": _flag,
    "shared_depth": lambda rng: rng.randint(0, 3),
    "private_depth": lambda rng: rng.randint(0, 3),
    "parallel": _flag,
    "vectorize": _flag,
    "fuse_rows": lambda rng: rng.random() < 0.8,  # mostly on: the rewrite is what is tested
    "fuse_epilogues": lambda rng: rng.random() < 0.8,  # mostly on, as fuse_rows
    # small tiles, so that the fuzzer's short rows run several
    "online_tile": lambda rng: rng.choice((0, 0, 1, 2, 3, 8, 64)),
    "threads": lambda rng: rng.randint(0, 4),
}


def sample_options(rng: random.Random) -> MappingOptions:
    """A random `MappingOptions` that validates (drawn again until it does)."""
    names = [f.name for f in dataclasses.fields(MappingOptions)]
    unknown = [n for n in names if n not in SAMPLERS and n not in REFUSED]
    if unknown:
        raise NotImplementedError(f"the fuzzer does not know how to sample {unknown}")
    while True:
        values = {n: REFUSED[n] if n in REFUSED else SAMPLERS[n](rng) for n in names}
        try:
            return MappingOptions(**values)
        except TCMappingError:
            continue
