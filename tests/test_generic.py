"""Size-generic kernels: with `fix_parameters_before_scheduling=False` the `cpu` target
builds one kernel that reads the sizes at each call, and the engine runs it for every
shape of the same ranks and dtypes, from memory and from the disk cache."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np
import pytest

import tcpy
from tcpy.mapping.cpu.registers import ROWS, WIDE_ROWS
from tcpy.mapping.options import MappingOptions
from tcpy.runtime import cpu

from differential import CORPUS, defined, engines
from programs import CONV, MATMUL, renamed

GENERIC = MappingOptions.cpu().replace(fix_parameters_before_scheduling=False)

Inputs = Callable[[np.random.Generator, int], tuple[np.ndarray, ...]]


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


# Each program with inputs for a scale s = 1, 2, 3: every size changes between calls,
# and none is a multiple of the tiles or register blocks.
PROGRAMS: dict[str, tuple[str, Inputs]] = {
    "matmul": (
        renamed(MATMUL, "f"),
        lambda r, s: (_f32(r, 13 * s, 7 * s + 2), _f32(r, 7 * s + 2, 37 * s - 1)),
    ),
    "softmax": (  # the corpus's: two temporaries, reductions and a broadcast
        (CORPUS / "softmax.tc").read_text().replace("def softmax", "def f"),
        lambda r, s: (_f32(r, 5 * s, 301 * s),),
    ),
    "strided_conv": (
        "def f(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {"
        " O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * K(f,c,kh,kw) }",
        lambda r, s: (_f32(r, s, 2 * s + 1, 9 * s + 4, 7 * s + 6), _f32(r, 3, 2 * s + 1, s + 1, 2)),
    ),
    "gather": (
        "def f(float(E,D) T, int32(B,L) X) -> (O) { O(b, d) +=! T(X(b, l), d) }",
        lambda r, s: (_f32(r, 50 * s, 17 * s), r.integers(0, 50 * s, (3 * s, 5 + s), np.int32)),
    ),
}


def _outputs(value: object) -> tuple[np.ndarray, ...]:
    return value if isinstance(value, tuple) else (value,)  # type: ignore[return-value]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_one_generic_kernel_serves_every_shape(
    name: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, inputs = PROGRAMS[name]
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    engine, reference = engines("cpu", text, quiet=True)
    rng = np.random.default_rng(0)
    for scale in (2, 1, 3):
        args = inputs(rng, scale)
        got, want = _outputs(engine.f(*args, options=GENERIC)), _outputs(reference.f(*args))
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    assert engine.stats.compiles == 1
    compiled = engine.compile("f", *inputs(rng, 1), options=GENERIC)
    assert compiled.generic
    assert "tc_sizes[" in compiled.source

    # a new process finds it on disk for a shape it never saw
    fresh = defined("cpu", text, quiet=True)
    args = inputs(rng, 4)
    got = _outputs(fresh.f(*args, options=GENERIC))
    assert (fresh.stats.compiles, fresh.stats.disk_hits) == (0, 1)
    for g, w in zip(got, _outputs(reference.f(*args)), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_fixed_sizes_compile_per_shape(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))  # no kernel of an earlier run
    text, inputs = PROGRAMS["matmul"]
    engine = defined("cpu", text, quiet=True)
    rng = np.random.default_rng(1)
    fixed = MappingOptions.cpu()
    compiled = engine.compile("f", *inputs(rng, 1), options=fixed)
    assert not compiled.generic
    with pytest.raises(tcpy.TCInputError, match="compiled for other input shapes"):
        compiled(*inputs(rng, 2))
    engine.f(*inputs(rng, 2), options=fixed)
    assert engine.stats.compiles == 2


def test_a_kernel_that_fell_back_to_the_call_sizes_is_not_reused_for_others(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the parametric analysis cannot finish, the kernel is built for the call's
    sizes: it serves those shapes only, and is not kept on disk as a generic kernel."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    text, inputs = PROGRAMS["strided_conv"]
    monkeypatch.setenv("TCPY_ISL_SECONDS", "0.000001")
    engine = defined("cpu", text, quiet=True)
    rng = np.random.default_rng(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tcpy.TCWarning)
        for scale in (1, 2):
            args = inputs(rng, scale)
            compiled = engine.compile("f", *args, options=GENERIC)
            assert not compiled.generic
            assert compiled.options.fix_parameters_before_scheduling
            np.testing.assert_allclose(
                compiled(*args),
                defined("reference", text, quiet=True).f(*args),
                rtol=2e-5,
                atol=2e-5,
            )
    assert engine.stats.compiles == 2


def test_a_generic_register_block_has_a_constant_bounded_copy_for_full_blocks() -> None:
    """The block loops of a size-generic matmul are bounded by the sizes; a block that
    lies inside the domain runs a copy with constant bounds (unrolled, in registers),
    and only the blocks at the edges keep isl's bounds."""
    text, inputs = PROGRAMS["matmul"]
    engine = defined("cpu", text, quiet=True)
    source = engine.compile("f", *inputs(np.random.default_rng(3), 2), options=GENERIC).source
    block = source[source.index("float tc_reg") - 200 :]
    last = (WIDE_ROWS if cpu.vector_bytes() >= 64 else ROWS) - 1  # the block's last row
    assert re.search(rf"if \(.*s_M.* >= {last} && .*s_N.* >= \d+\) \{{", block)
    assert re.search(rf"for \(int64_t (c\d+) = 0; \1 <= {last}; \1\+\+\)", block)  # full
    assert re.search(rf"for \(int64_t (c\d+) = 0; \1 <= tc_min\({last}, ", block)  # edge


def test_a_generic_convolution_blocks_its_filters_and_leaves_its_window_whole() -> None:
    """With the sizes unknown, `kh` and `kw` (added to `h` and `w` in a subscript) are
    taken as a short window: not the vector loop, not tiled, and no copy is made
    inside them; the register block runs filters x image columns."""
    text = renamed(CONV, "f")
    engine, reference = engines("cpu", text, quiet=True)
    rng = np.random.default_rng(5)
    inputs = (_f32(rng, 2, 5, 12, 40), _f32(rng, 9, 5, 3, 3))
    kernel = engine.compile("f", *inputs, options=GENERIC)
    assert kernel.generic
    assert re.search(r"float tc_reg\[\d+\]\[\d+\];", kernel.source)  # rows x vector
    assert "tc_pack" not in kernel.source
    np.testing.assert_allclose(kernel(*inputs), reference.f(*inputs), rtol=1e-5, atol=1e-5)
