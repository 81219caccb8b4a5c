"""MappingOptions: validation with clear errors, JSON round-trip, presets, and the
options that change generated code doing what they say."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tcpy
from tcpy.errors import TCMappingError
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c
from tcpy.poly.schedule import bands, member_variables

from programs import MATMUL

PRESETS = ["naive", "pointwise", "mlp", "conv", "cpu"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_round_trip_through_json(name: str) -> None:
    options = MappingOptions.preset(name)
    assert MappingOptions.from_json(options.to_json()) == options


@given(
    st.builds(
        MappingOptions,
        outer_schedule_fusion=st.sampled_from(list(Fusion)),
        tile=st.lists(st.integers(0, 512), max_size=6).map(tuple),
        unroll=st.integers(1, 64),
        map_to_threads=st.lists(st.integers(1, 8), max_size=3).map(tuple),
        map_to_blocks=st.lists(st.integers(1, 1 << 16), max_size=3).map(tuple),
        use_shared_memory=st.booleans(),
        max_shared_memory=st.integers(0, 1 << 20),
        threads=st.integers(0, 64),
    )
)
def test_json_round_trip(options: MappingOptions) -> None:
    assert MappingOptions.from_json(options.to_json()) == options
    assert MappingOptions.from_dict(options.to_dict()) == options


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"tile": (32, -1)}, "tile sizes must be 0"),
        ({"unroll": 0}, "unroll must be 1 to 1024"),
        ({"unroll": 65535}, "unroll must be 1 to 1024"),
        ({"map_to_threads": (64, 32)}, "2048 threads a block; at most 1024"),
        ({"map_to_threads": (1, 1, 1, 1)}, "map_to_threads takes 1 to 3"),
        ({"map_to_blocks": (0,)}, "map_to_blocks takes 1 to 3 positive sizes"),
        ({"interchange": (0, 0)}, "interchange must be a permutation"),
        ({"threads": -1}, "threads must not be negative"),
        ({"tile": [32]}, "tile must be a tuple of integers"),
        ({"parallel": 1}, "parallel must be true or false"),
        ({"outer_schedule_fusion": "Max"}, "outer_schedule_fusion must be a Fusion"),
    ],
)
def test_validation(changes: dict, fragment: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(TCMappingError, match=fragment):
        MappingOptions(**changes)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"tiles": [1]}', "unknown mapping option"),
        ('{"outer_schedule_fusion": "Everything"}', "must be one of Max"),
        ('{"tile": 3}', "must be a list of integers"),
        ("[1, 2]", "must be a JSON object"),
        ("{oops", "not valid JSON"),
    ],
)
def test_json_errors(text: str, fragment: str) -> None:
    with pytest.raises(TCMappingError, match=fragment):
        MappingOptions.from_json(text)


def test_unknown_preset() -> None:
    with pytest.raises(TCMappingError, match="unknown preset 'fast'"):
        MappingOptions.preset("fast")


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        MappingOptions().unroll = 2  # type: ignore[misc]


def _innermost_variable(lowered) -> str:  # type: ignore[no-untyped-def]
    """The index of the matmul statement that its innermost loop walks."""
    inner = [b for b in bands(lowered.schedule) if "S0" in member_variables(b, 0)][-1]
    position = member_variables(inner, inner.band_n_member() - 1)["S0"]
    return lowered.scop.statement("S0").dims[position]


@pytest.mark.parametrize(
    ("interchange", "innermost"),
    [((), "n"), ((0, 1, 2), "k"), ((2, 0, 1), "n"), ((1, 2, 0), "m")],
)
def test_interchange_orders_the_point_loops(interchange: tuple[int, ...], innermost: str) -> None:
    (cdef,) = check_source(MATMUL).values()
    options = MappingOptions.cpu().replace(tile=(8, 8, 8), interchange=interchange)
    lowered = lower_to_c(cdef, {"M": 32, "K": 32, "N": 32}, options, check=True)
    assert _innermost_variable(lowered) == innermost
    engine = tcpy.ExecutionEngine("cpu")
    engine.define(MATMUL)
    A = np.random.default_rng(0).random((32, 32), dtype=np.float32)
    np.testing.assert_allclose(engine.mm(A, A, options=options), A @ A, rtol=1e-5)


def test_the_threads_option_does_not_change_the_code() -> None:
    """The thread count is chosen at each call (`tests/test_threads.py`), so kernels that
    differ only in it are one source and one build."""
    (cdef,) = check_source(MATMUL).values()
    sizes = {"M": 64, "K": 64, "N": 64}
    cpu = MappingOptions.cpu()
    sources = {lower_to_c(cdef, sizes, cpu.replace(threads=t)).source for t in (0, 3)}
    assert len(sources) == 1
    assert "#pragma omp parallel num_threads(tc_threads)" in sources.pop()


@pytest.mark.parametrize("name", ["tile_imperfectly_nested", "match_library_calls"])
def test_a_removed_field_is_ignored_with_a_warning(name: str) -> None:
    """Old options files, stored tuning records and fuzz replays may name fields that
    nothing read and that are gone: they load, with a warning naming the field."""
    old = {**MappingOptions(unroll=4).to_dict(), name: True}
    with pytest.warns(tcpy.TCWarning, match=f"{name}' no longer exists"):
        assert MappingOptions.from_dict(old) == MappingOptions(unroll=4)
    with pytest.warns(tcpy.TCWarning, match=name):
        assert MappingOptions().layered({name: False, "unroll": 2}).unroll == 2
    with pytest.raises(TCMappingError, match="unknown mapping option"):
        MappingOptions.from_dict({"tile_imperfect": True})


def test_intra_tile_fusion_is_tuned_only_where_it_is_read() -> None:
    """The GPU mapping picks a tile's point loops itself: the gene is the CPU's."""
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(MappingOptions)}["intra_tile_schedule_fusion"]
    assert field.metadata["tuning"].targets == ("cpu",)
