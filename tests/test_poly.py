"""The polyhedral core: domains, accesses and dependences compared with isl's
`is_equal`; what each fusion strategy does on softmax and on an MLP layer; the
schedule transforms and the verifier."""

from __future__ import annotations

import warnings

import islpy as isl
import pytest

from tcpy.errors import InternalError, TCCompileError
from tcpy.mapping.options import Fusion, MappingOptions
from tcpy.parser import check_source
from tcpy.pipeline import lower_to_c
from tcpy.poly import isl_helpers
from tcpy.poly.dependences import compute_dependences, respects
from tcpy.poly.schedule import bands, isl_schedule, original_order
from tcpy.poly.scop import Kind, build_scop
from tcpy.poly.transforms import permute_band, tile_band, verify

from programs import GATHER, MATMUL, SOFTMAX

MLP = """def mlp(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}"""


def _scop(source: str, sizes: dict[str, int] | None = None):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (cdef,) = check_source(source).values()
    return build_scop(cdef, sizes)


def test_matmul_domains_and_accesses() -> None:
    scop = _scop(MATMUL)
    ctx = scop.ctx
    assert [(s.name, s.kind) for s in scop.statements] == [("I0", Kind.INIT), ("S0", Kind.COMPUTE)]
    expected = isl.UnionSet(
        "[s_M, s_K, s_N] -> { I0[m, n] : 0 <= m < s_M and 0 <= n < s_N;"
        " S0[m, n, k] : 0 <= m < s_M and 0 <= n < s_N and 0 <= k < s_K }",
        context=ctx,
    ).intersect_params(scop.context)
    assert scop.domain.is_equal(expected)
    reads = isl.UnionMap(
        "[s_M, s_K, s_N] -> { S0[m, n, k] -> t_A[m, k]; S0[m, n, k] -> t_B[k, n];"
        " S0[m, n, k] -> t_C[m, n] }",
        context=ctx,
    ).intersect_domain(scop.domain)
    assert scop.reads.is_equal(reads)
    writes = isl.UnionMap(
        "[s_M, s_K, s_N] -> { I0[m, n] -> t_C[m, n]; S0[m, n, k] -> t_C[m, n] }", context=ctx
    ).intersect_domain(scop.domain)
    assert scop.writes.is_equal(writes)


def test_gather_access_covers_the_whole_dimension() -> None:
    scop = _scop(GATHER)
    expected = isl.UnionMap(
        "[s_E, s_D, s_B] -> { S0[b, d] -> t_T[o, d] : 0 <= o < s_E; S0[b, d] -> t_I[b] }",
        context=scop.ctx,
    ).intersect_domain(scop.domain)
    assert scop.reads.is_equal(expected)


def test_fixed_sizes_fix_the_parameters() -> None:
    scop = _scop(MATMUL, {"M": 4, "K": 5, "N": 6})
    point = isl.Set("[s_M, s_K, s_N] -> { : s_M = 4 and s_K = 5 and s_N = 6 }", context=scop.ctx)
    assert scop.context.is_equal(point)


def test_matmul_dependences() -> None:
    scop = _scop(MATMUL)
    deps = compute_dependences(scop)
    ctx = scop.ctx
    init_to_first = isl.UnionMap(
        "[s_M, s_K, s_N] -> { I0[m, n] -> S0[m, n, 0] :"
        " 0 <= m < s_M and 0 <= n < s_N and s_K > 0 }",
        context=ctx,
    )
    assert init_to_first.is_subset(deps.raw)
    along_k = isl.UnionMap(
        "[s_M, s_K, s_N] -> { S0[m, n, k] -> S0[m, n, k + 1] : 0 <= m < s_M and 0 <= n < s_N"
        " and 0 <= k < s_K - 1 }",
        context=ctx,
    )
    assert along_k.is_subset(deps.raw)
    # no dependence between different output elements: m and n stay parallel
    crossing = deps.all.subtract(
        isl.UnionMap(
            "[s_M, s_K, s_N] -> { S0[m, n, k] -> S0[m, n, k2]; I0[m, n] -> S0[m, n, k2] }",
            context=ctx,
        )
    )
    assert crossing.is_empty()


def _top_level_nests(schedule: isl.Schedule) -> int:
    node = schedule.get_root().child(0)
    if node.get_type() in (isl.schedule_node_type.sequence, isl.schedule_node_type.set):
        return node.n_children()
    return 1


@pytest.mark.parametrize(
    ("source", "fusion", "nests"),
    [
        # Min: every statement (and initialisation) in its own loop nest.
        (SOFTMAX, Fusion.MIN, 6),
        # Preserve3Coincident: one nest over the rows n, each statement keeping its own
        # inner loop over d, so the row loop stays parallel.
        (SOFTMAX, Fusion.PRESERVE3_COINCIDENT, 1),
        # Max: one nest over n as well.
        (SOFTMAX, Fusion.MAX, 1),
        (MLP, Fusion.MIN, 4),
        # An MLP layer: product, bias and ReLU share the (b, n) loops.
        (MLP, Fusion.PRESERVE3_COINCIDENT, 1),
        (MLP, Fusion.MAX, 1),
    ],
)
def test_fusion_strategies(source: str, fusion: Fusion, nests: int) -> None:
    scop = _scop(source)
    deps = compute_dependences(scop)
    schedule = isl_schedule(scop, deps, fusion)
    verify(schedule, deps.all, scop.domain)
    assert _top_level_nests(schedule) == nests
    if nests == 1:
        outer = bands(schedule)[0]
        assert outer.band_member_get_coincident(0)  # the fused row loop is parallel


def test_tile_band_strip_mines() -> None:
    scop = _scop(MATMUL, {"M": 64, "K": 64, "N": 64})
    deps = compute_dependences(scop)
    schedule = isl_schedule(scop, deps, Fusion.MIN)
    band = next(b for b in bands(schedule) if b.band_n_member() == 3)
    tiled = tile_band(band, (8, 0, 4))
    tile = tiled.band_get_partial_schedule_union_map()
    expected = isl.UnionMap(
        "[s_M, s_K, s_N] -> { S0[m, n, k] -> [m - (m mod 8), n, k - (k mod 4)] }", context=scop.ctx
    ).intersect_domain(scop.statement("S0").domain)
    assert tile.intersect_domain(scop.domain).is_equal(expected)
    point = tiled.child(0).band_get_partial_schedule_union_map().intersect_domain(scop.domain)
    assert point.is_equal(
        isl.UnionMap(
            "[s_M, s_K, s_N] -> { S0[m, n, k] -> [m mod 8, 0, k mod 4] }", context=scop.ctx
        ).intersect_domain(scop.statement("S0").domain)
    )
    verify(tiled.get_schedule(), deps.all, scop.domain)


def test_permute_band_and_verify() -> None:
    scop = _scop(MATMUL)
    deps = compute_dependences(scop)
    schedule = isl_schedule(scop, deps, Fusion.MIN)
    band = next(b for b in bands(schedule) if b.band_n_member() == 3)
    permuted = permute_band(band, [2, 0, 1])
    assert not permuted.band_member_get_coincident(0)  # k moved out, flags travel with it
    verify(permuted.get_schedule(), deps.all, scop.domain)


def test_verify_rejects_a_reversed_order() -> None:
    scop = _scop(SOFTMAX)
    deps = compute_dependences(scop)
    valid = original_order(scop, deps)
    assert respects(valid, deps.all)
    # the statements in reverse source order break every flow dependence
    reversed_map = isl.UnionMap.empty(scop.order.get_space())
    n = len(scop.statements)
    for pos, s in enumerate(scop.statements):
        m = isl.Map(f"{{ {s.name}[{', '.join(s.dims)}] -> [{n - pos}] }}", context=scop.ctx)
        reversed_map = reversed_map.union(isl.UnionMap.from_map(m))
    bad = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(reversed_map)
    )
    with pytest.raises(InternalError, match="violates dependences"):
        verify(bad, deps.all, scop.domain)


def test_isl_budget_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isl_helpers, "MAX_OPERATIONS", 50)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (cdef,) = check_source(SOFTMAX).values()
    with pytest.raises(TCCompileError, match="failed in isl"):
        lower_to_c(cdef, {"N": 8, "D": 8}, MappingOptions())
