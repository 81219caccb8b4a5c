"""Contractions on the tensor cores: the classifier of contractions, the mapping's
plan (which contractions, which tiles), and the warps' `ldmatrix`/`mma.sync` code run
by the emulator with its checks on (`conftest` sets `TCPY_EMU_CHECK`), each result
against the `reference` target; the sources compile with NVRTC for sm_80 and sm_90.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import tcpy
from tcpy.codegen import matrix_tile, shared_copy
from tcpy.errors import TCEmulationError, TCMappingError
from tcpy.mapping.gpu.device import DeviceProfile, named
from tcpy.mapping.gpu.matrix import point_indices
from tcpy.mapping.options import MappingOptions
from tcpy.parser import check_source
from tcpy.parser.contractions import classify
from tcpy.pipeline import LoweredCuda, lower_to_cuda
from tcpy.runtime import nvrtc

from differential import as_tuple

needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (the cuda extra)")

MM = "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! float(A(m,k)) * float(B(k,n)) }}"
CASES: dict[str, tuple[str, list[tuple[int, ...]]]] = {
    "matmul": (MM, [(100, 70), (70, 50)]),
    "A*B^T": (
        "def mm({t}(M,K) A, {t}(N,K) B) -> (C) {{ C(m,n) +=! float(A(m,k)) * float(B(n,k)) }}",
        [(64, 48), (40, 48)],
    ),
    "A^T*B": (
        "def mm({t}(K,M) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! float(A(k,m)) * float(B(k,n)) }}",
        [(33, 64), (33, 72)],
    ),
    "A^T*B^T": (
        "def mm({t}(K,M) A, {t}(N,K) B) -> (C) {{ C(m,n) +=! float(A(k,m)) * float(B(n,k)) }}",
        [(80, 96), (24, 80)],
    ),
    "batch": (
        "def bmm({t}(Z,M,K) A, {t}(Z,K,N) B) -> (C) "
        "{{ C(b,m,n) +=! float(A(b,m,k)) * float(B(b,k,n)) }}",
        [(3, 40, 24), (3, 24, 56)],
    ),
    "tensordot": (
        "def td({t}(N,C1,C2,W) I0, {t}(N,C2,C3,W) I1) -> (O) "
        "{{ O(n,c1,c3,w) +=! float(I0(n,c1,r,w)) * float(I1(n,r,c3,w)) }}",
        [(2, 40, 24, 3), (2, 24, 32, 3)],
    ),
    "convolution": (
        "def conv({t}(N,C,H,W) I, {t}(F,C,KH,KW) W1) -> (O) "
        "{{ O(n,f,h,w) +=! float(I(n,c,h+kh,w+kw)) * float(W1(f,c,kh,kw)) }}",
        [(2, 24, 10, 12), (20, 24, 3, 3)],
    ),
    "grouped convolution": (
        "def gconv({t}(N,G,C,H,W) I, {t}(G,F,C,KH,KW) W1) -> (O) "
        "{{ O(n,g,f,h,w) +=! float(I(n,g,c,h+kh,w+kw)) * float(W1(g,f,c,kh,kw)) }}",
        [(2, 2, 16, 6, 20), (2, 24, 16, 2, 3)],
    ),
    "convolution strided along its rows' outer index": (
        "def sconv({t}(N,C,H,W) I, {t}(F,C,KH,KW) W1) -> (O) "
        "{{ O(n,f,h,w) +=! float(I(n,c,2*h+kh,w+kw)) * float(W1(f,c,kh,kw)) where h in 0:4 }}",
        [(2, 24, 11, 15), (20, 24, 3, 3)],
    ),
    "transposed output": (
        "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(n,m) +=! float(A(m,k)) * float(B(k,n)) }}",
        [(64, 40), (40, 32)],
    ),
    "half output": (
        "def mm({t}(M,K) A, {t}(K,N) B) -> (C) {{ C(m,n) +=! A(m,k) * B(k,n) }}",
        [(48, 40), (40, 24)],
    ),
    "smaller than a tile": (MM, [(5, 3), (3, 7)]),
    "accumulating": (
        "def mm({t}(M,K) A, {t}(K,N) B, float(M,N) C0) -> (C) "
        "{{ C(m,n) = C0(m,n)\n C(m,n) += float(A(m,k)) * float(B(k,n)) }}",
        [(40, 56), (56, 24), (40, 24)],
    ),
}
TYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _inputs(shapes: list[tuple[int, ...]], dtype: type, rng: np.random.Generator) -> list:
    arrays: list[np.ndarray] = []
    for k, shape in enumerate(shapes):
        kind = dtype if k < 2 else np.float32
        arrays.append(rng.standard_normal(shape).astype(kind))
    return arrays


def _engines(source: str) -> tuple[tcpy.ExecutionEngine, tcpy.ExecutionEngine]:
    emu, reference = tcpy.ExecutionEngine("cuda-emu"), tcpy.ExecutionEngine("reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        emu.define(source)
        reference.define(source)
    return emu, reference


def _entry(source: str) -> str:
    found = re.search(r"def (\w+)", source)
    assert found is not None
    return found.group(1)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("case", CASES)
def test_contractions_on_tensor_cores_agree_with_the_reference(case: str, type_name: str) -> None:
    """Each shape of contraction runs on `mma.sync` (its source says so) and gives the
    reference's result to float32 accumulation's accuracy (a half output: to its
    rounding), under the emulator's race, bounds and barrier checks."""
    template, shapes = CASES[case]
    source = template.format(t=type_name)
    emu, reference = _engines(source)
    name = _entry(source)
    inputs = _inputs(shapes, TYPES[type_name], np.random.default_rng(7))
    compiled = emu.compile(name, *inputs)
    kind = "F16" if type_name == "float16" else "BF16"
    assert f"TC_MMA_{kind}(" in compiled.source
    got = np.asarray(getattr(emu, name)(*inputs), dtype=np.float64)
    want = np.asarray(getattr(reference, name)(*inputs), dtype=np.float64)
    scale = np.abs(want).max()
    tol = 1e-5 if got.dtype != np.float16 and "half" not in case else 1e-2
    assert np.abs(got - want).max() <= tol * scale


@pytest.mark.parametrize("warp_tile", [(16, 8), (16, 16), (32, 8), (64, 32), (32, 64)])
def test_every_warp_tile_is_right(warp_tile: tuple[int, int]) -> None:
    """Warp tiles of one column of instructions (the right operand's fragments by
    `ldmatrix.x2`) and of several (two at a time by `.x4`), one row or several, on a
    contraction none of them divides."""
    source = MM.format(t="bfloat16")
    emu, reference = _engines(source)
    a, b = _inputs([(70, 40), (40, 50)], ml_dtypes.bfloat16, np.random.default_rng(4))
    options = MappingOptions.cuda().replace(warp_tile=warp_tile)
    compiled = emu.compile("mm", a, b, options=options)
    registers = "tc_b[tc_n]" if warp_tile[1] == 8 else "&tc_b[0][0] + tc_n * 2"
    assert f"TC_LDMATRIX({2 if warp_tile[1] == 8 else 4}, true, {registers}" in compiled.source
    want = reference.mm(a, b)
    assert np.abs(compiled(a, b) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("one", ["M", "N", "K"])
@pytest.mark.parametrize("precision", ["bfloat16", "tf32x3"])
def test_a_size_of_one_fixed_before_scheduling_is_right(one: str, precision: str) -> None:
    """With the sizes fixed before scheduling, an index of one value has no member in
    the band (isl drops it): such a contraction runs on the CUDA cores where its row,
    column or reduction is missing, and is right either way."""
    type_name = "float" if precision == "tf32x3" else "bfloat16"
    source = MM.format(t=type_name)
    emu, reference = _engines(source)
    sizes = {"M": 20, "N": 24, "K": 40, one: 1}
    shapes = [(sizes["M"], sizes["K"]), (sizes["K"], sizes["N"])]
    dtype = np.float32 if type_name == "float" else ml_dtypes.bfloat16
    a, b = _inputs(shapes, dtype, np.random.default_rng(5))
    options = MappingOptions.cuda().replace(
        fix_parameters_before_scheduling=True,
        input_precision="tf32x3" if precision == "tf32x3" else "ieee",
    )
    want = reference.mm(a, b)
    got = emu.mm(a, b, options=options)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_the_profile_counts_the_instructions() -> None:
    """A 64x64x64 bfloat16 matmul: 64 * 64 * 64 / (16 * 8 * 16) = 128 instructions,
    whatever the tiles; its 2x2 blocks of 32x32 outputs (warp tiles of 16x16) copy
    both operands' 32x32 tiles at each of the two reduction tiles by 16-byte
    `cp.async`, 128 pieces a tile: 4 * 2 * 2 * 128 = 2,048, every element once."""
    emu, _ = _engines(MM.format(t="bfloat16"))
    a = np.ones((64, 64), ml_dtypes.bfloat16)
    (product,) = emu.compile("mm", a, a).profile(a, a)
    assert product["grid"] == (2, 2, 1)
    assert product["mmas"] == 128
    assert product["async_copies"] == 2048


@pytest.mark.parametrize("case", ["matmul", "A*B^T", "A^T*B", "A^T*B^T"])
@pytest.mark.parametrize("precision", ["bfloat16", "tf32"])
def test_the_operand_tiles_are_read_without_bank_conflicts(case: str, precision: str) -> None:
    """The skewed rows of the operands' tiles: no `ldmatrix` (bfloat16) and no warp's
    tf32 fragment loads meet a bank conflict, whichever dimension of each operand is
    innermost (the emulator's profile counts them; unskewed rows of 32 elements would
    put the eight rows an `ldmatrix` reads in the same banks)."""
    template, _ = CASES[case]
    source = template.format(t="bfloat16" if precision == "bfloat16" else "float")
    emu, _ = _engines(source)
    kind = ml_dtypes.bfloat16 if precision == "bfloat16" else np.float32
    a = np.ones((128, 128), kind)
    options = MappingOptions.cuda().replace(
        input_precision="ieee" if kind != np.float32 else "tf32"
    )
    product = emu.compile("mm", a, a, options=options).profile(a, a)[-1]
    assert product["mmas"] > 0
    assert product["bank_conflicts"] == 0


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (MM.format(t="float"), "float32 operands, input_precision ieee"),
        (
            "def mm(float16(M,K) A, float16(K,N) B) -> (C) "
            "{ C(m,n) +=! float(A(m,k)) * float(B(k,n)) where k in 0:5 }",
            "a reduction over part of the operands",
        ),
        (
            "def conv(float16(N,C,H) I, float16(F,C,KH) W1) -> (O) "
            "{ O(n,f,h) +=! float(I(n,c,2*h+kh)) * float(W1(f,c,kh)) where h in 0:3 }",
            "a strided window",
        ),
    ],
)
def test_what_the_tensor_cores_cannot_take_runs_on_cuda_cores(source: str, why: str) -> None:
    """Each of these runs without `mma.sync`, and right."""
    emu, reference = _engines(source)
    name = _entry(source)
    cdef = check_source(source)[name]
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal([9 for _ in t.shape]).astype(t.scalar.dtype) for t in cdef.inputs]
    compiled = emu.compile(name, *inputs)
    assert "tc_d[" not in compiled.source, why
    got = np.asarray(getattr(emu, name)(*inputs), np.float64)
    want = np.asarray(getattr(reference, name)(*inputs), np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _lowered(
    source: str, sizes: dict[str, int], options: MappingOptions, device: DeviceProfile | None = None
) -> LoweredCuda:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(source)[_entry(source)]
    return lower_to_cuda(cdef, sizes, options, check=True, device=device or named("h100"))


def test_tensor_cores_are_the_default_and_can_be_turned_off() -> None:
    source, sizes = MM.format(t="bfloat16"), {"M": 4096, "K": 4096, "N": 4096}
    on = _lowered(source, sizes, MappingOptions.cuda())
    assert on.mapping.kernels[-1].matrix and on.mapping.kernels[-1].block == (32, 4)
    assert on.mapping.kernels[-1].grid == (64, 32)  # 128x64 tiles: warp tiles of 64x32
    off = _lowered(source, sizes, MappingOptions.cuda().replace(use_tensor_cores=False))
    assert not off.mapping.kernels[-1].matrix and "tc_d[" not in off.source


def test_the_warp_tile_option_sets_the_block_tile() -> None:
    source, sizes = MM.format(t="float16"), {"M": 1024, "K": 256, "N": 1024}
    lowered = _lowered(source, sizes, MappingOptions.cuda().replace(warp_tile=(32, 64)))
    assert lowered.mapping.kernels[-1].grid == (8, 16)  # 64x128 tiles
    assert "float tc_d[2][8][4];" in lowered.source


def test_a_device_before_sm_80_uses_cuda_cores() -> None:
    source, sizes = MM.format(t="float16"), {"M": 256, "K": 256, "N": 256}
    turing = dataclasses.replace(named("l4"), arch="sm_75")
    lowered = _lowered(source, sizes, MappingOptions.cuda(), device=turing)
    assert not lowered.mapping.kernels[-1].matrix


def test_small_contractions_get_smaller_warp_tiles() -> None:
    """A 128^3 matmul gives the H100's 132 SMs 16 blocks of 32x32 (warp tiles of
    16x16, the smallest): the grid cannot fill it, and larger tiles would leave more
    SMs idle."""
    lowered = _lowered(
        MM.format(t="float16"), {"M": 128, "K": 128, "N": 128}, MappingOptions.cuda()
    )
    assert lowered.mapping.kernels[-1].grid == (4, 4)


@needs_nvrtc
@pytest.mark.parametrize("case", ["matmul", "A^T*B^T", "batch", "half output"])
def test_tensor_core_kernels_compile_with_nvrtc(case: str) -> None:
    template, _ = CASES[case]
    source = template.format(t="bfloat16")
    sizes = {"M": 512, "K": 512, "N": 512, "Z": 4}
    cdef = check_source(source)[_entry(source)]
    sizes = {s: sizes[s] for s in cdef.size_symbols}
    lowered = _lowered(source, sizes, MappingOptions.cuda())
    for arch in ("sm_80", "sm_90"):
        assert nvrtc.compile_cubin(lowered.source, arch)[:4] == b"\x7fELF"
    ptx = nvrtc.compile_ptx(lowered.source, "compute_80")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4" in ptx


def test_a_wrong_fragment_layout_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The operands' fragments loaded with `.trans` where it does not belong and
    without it where it does (rows where columns belong): the emulator's ISA layouts
    give a wrong product."""
    source = MM.format(t="float16")
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal((32, 32)).astype(np.float16) for _ in range(2))
    emu, reference = _engines(source)
    want = reference.mm(a, b)
    np.testing.assert_allclose(emu.mm(a, b), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matrix_tile, "_trans", lambda along: "true" if along else "false")
    broken, _ = _engines(source)
    assert np.abs(broken.mm(a, b) - want).max() > 1.0


def test_a_misaligned_ldmatrix_row_is_reported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Operand tiles whose rows are 12 bytes longer than whole 16-byte pieces: the rows
    `ldmatrix` reads no longer start on 16 bytes, which the emulator reports (lane 1
    gives the address of row 1, 38 elements in; the copies move pairs)."""
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path))
    layout = shared_copy.operand_layout

    def skewed_by_6(*args: object) -> tuple[tuple[int, ...], int] | None:
        found = layout(*args)  # type: ignore[arg-type]
        return None if found is None else (found[0], 6)

    monkeypatch.setattr(shared_copy, "operand_layout", skewed_by_6)
    emu, _ = _engines(MM.format(t="float16"))
    a = np.ones((32, 32), np.float16)
    pairs = MappingOptions.cuda().replace(vectorize=False)  # no 16-byte copies, which fail first
    with pytest.raises(
        TCEmulationError, match="misaligned 16-byte access to shared tc_shared0 at index 38"
    ):
        emu.compile("mm", a, a, options=pairs)(a, a)


def test_the_classifier_reads_roles_from_the_accesses() -> None:
    cdef = check_source(
        "def f(float(Z,M,K) A, float(Z,K,N) B) -> (C) { C(z,m,n) +=! A(z,m,k) * B(z,k,n) }"
    )["f"]
    c = classify(cdef.statements[0], cdef)
    assert c is not None
    assert (c.rows, c.columns, c.batch, c.reduction) == (("m",), ("n",), ("z",), ("k",))
    assert (c.left.tensor, c.right.tensor) == ("A", "B")
    assert point_indices(c) == ("m", "n", "k")


def test_a_convolution_is_an_implicit_matrix_product() -> None:
    """Rows from the input's indices (n, h, w), columns from the filters (f), the
    reduction over channels and window (c, kh, kw); the tensor cores run w, f and c in
    their point loops (w in the input's innermost dimension, c read alone by both),
    the others one at a time."""
    cdef = check_source(CASES["convolution"][0].format(t="float16"))["conv"]
    c = classify(cdef.statements[0], cdef)
    assert c is not None
    assert (c.rows, c.columns, c.batch, c.reduction) == (
        ("n", "h", "w"),
        ("f",),
        (),
        ("c", "kh", "kw"),
    )
    assert c.left.subscripts == (("n",), ("c",), ("h", "kh"), ("w", "kw"))
    assert point_indices(c) == ("w", "f", "c")
    strided = check_source(CASES["convolution"][0].format(t="float16").replace("w+kw", "2*w+kw"))
    c = classify(strided["conv"].statements[0], strided["conv"])
    assert c is not None and c.left.strides[3] == (2, 1)
    assert point_indices(c) is None  # the rows two apart: no `ldmatrix` reads them


@pytest.mark.parametrize(
    ("source", "contraction"),
    [
        ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) max=! A(m,k) * B(k,n) }", False),
        ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) + B(k,n) }", False),
        ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * 2.0 }", False),
        ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) * A(m,k) }", False),
        ("def f(float(N,H) I, float(KH) W) -> (O) { O(n,h) +=! I(n,h+kh) * W(kh) }", True),
        ("def f(float(M,K) A, float(K) B) -> (C) { C(m) +=! A(m,k) * B(k) }", True),
        (
            "def f(double(M,K) A, double(K,N) B) -> (C) "
            "{ C(m,n) +=! float(A(m,k)) * float(B(k,n)) }",
            False,
        ),
    ],
    ids=["max", "sum", "three factors", "a square", "window", "vector", "narrowing cast"],
)
def test_what_is_no_matrix_product_has_no_point_indices(source: str, contraction: bool) -> None:
    """No classification, or (a window against a vector, a matrix-vector product) a
    contraction without columns, so no point indices for the tensor cores."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cdef = check_source(source)["f"]
    c = classify(cdef.statements[0], cdef)
    assert (c is not None) == contraction
    if c is not None:
        assert c.columns == ()
        assert point_indices(c) is None


def test_the_options_check_their_new_fields() -> None:
    assert MappingOptions(input_precision="tf32x3").input_precision == "tf32x3"
    with pytest.raises(TCMappingError, match="input_precision"):
        MappingOptions(input_precision="fp32")
    with pytest.raises(TCMappingError, match="warp_tile"):
        MappingOptions(warp_tile=(24, 8))
    with pytest.raises(TCMappingError, match="warp_tile"):
        MappingOptions(warp_tile=(128, 64))
    o = MappingOptions(warp_tile=(32, 16), use_tensor_cores=False)
    assert MappingOptions.from_json(o.to_json()) == o


@pytest.mark.parametrize("case", ["matmul", "A*B^T", "A^T*B^T", "batch"])
def test_float32_contractions_on_tf32_tensor_cores(case: str) -> None:
    """`input_precision` "tf32" and "tf32x3" put a float32 contraction on `mma.sync`
    m16n8k8: tf32's error against float64 is that of 10-bit mantissas (under 2^-9 of
    the largest output here, above 2^-16), tf32x3's within twice the CUDA cores'
    ("ieee") error, under the emulator's checks."""
    template, shapes = CASES[case]
    source = template.format(t="float")
    emu, _ = _engines(source)
    name = _entry(source)
    a, b = _inputs(shapes, np.float32, np.random.default_rng(11))
    exact = _float64_product(source, name, a, b)
    errors = {}
    for precision in ("ieee", "tf32", "tf32x3"):
        options = MappingOptions.cuda().replace(input_precision=precision)
        compiled = emu.compile(name, a, b, options=options)
        assert ("TC_MMA_TF32(tc_d" in compiled.source) == (precision != "ieee")
        errors[precision] = np.abs(compiled(a, b) - exact).max() / np.abs(exact).max()
    assert 2**-16 < errors["tf32"] < 2**-9
    assert errors["tf32x3"] <= 2 * errors["ieee"]


def _float64_product(source: str, name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The contraction of `source` on the reference target in float64."""
    reference = tcpy.ExecutionEngine("reference")
    reference.define(source.replace("float(", "double("))
    return np.asarray(getattr(reference, name)(a.astype(np.float64), b.astype(np.float64)))


@needs_nvrtc
def test_tf32_kernels_compile_with_nvrtc() -> None:
    source = MM.format(t="float")
    for precision in ("tf32", "tf32x3"):
        options = MappingOptions.cuda().replace(input_precision=precision)
        lowered = _lowered(source, {"M": 256, "K": 256, "N": 256}, options)
        for arch in ("sm_80", "sm_90"):
            assert nvrtc.compile_cubin(lowered.source, arch)[:4] == b"\x7fELF"
        ptx = nvrtc.compile_ptx(lowered.source, "compute_80")
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
        assert "cvt.rna.tf32.f32" in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bfloat16", "float16", "tf32", "tf32x3"])
@pytest.mark.parametrize("case", ["matmul", "A^T*B^T", "batch", "smaller than a tile"])
def test_tensor_cores_on_the_gpu(case: str, precision: str) -> None:
    """The same contractions on the device's tensor cores against the reference: the
    instructions' real fragment layouts, rounding and accumulation."""
    template, shapes = CASES[case]
    half = precision in TYPES
    source = template.format(t=precision if half else "float")
    engine, reference = tcpy.ExecutionEngine("cuda"), tcpy.ExecutionEngine("reference")
    engine.define(source)
    reference.define(source)
    name = _entry(source)
    inputs = _inputs(shapes, TYPES[precision] if half else np.float32, np.random.default_rng(2))
    options = MappingOptions.cuda().replace(input_precision="ieee" if half else precision)
    compiled = engine.compile(name, *inputs, options=options)
    assert "(tc_d[" in compiled.source
    got = np.asarray(compiled(*inputs), np.float64)
    want = np.asarray(getattr(reference, name)(*inputs), np.float64)
    tol = 2**-9 if precision == "tf32" else 1e-5
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


MLP = """def mlp({t}(B,K) I, {t}(N,K) W, float(N) bias) -> (O) {{
    O(b, n) +=! float(I(b, k)) * float(W(n, k))
    O(b, n) = O(b, n) + bias(n)
    O(b, n) = fmax(O(b, n), 0)
}}"""
EPILOGUES = {
    "bias and relu": (MLP, 1),
    "bias and relu into a half output": (
        """def mlp({t}(B,K) I, {t}(N,K) W, float(N) bias) -> ({t}(B,N) O) {{
    O(b, n) +=! I(b, k) * W(n, k)
    O(b, n) = {t}(O(b, n) + bias(n))
    O(b, n) = fmax(O(b, n), 0)
}}""",
        1,
    ),
    "a neighbour's value": (
        MLP.replace("0)\n}}", "0)\n    P(b, n) = O(b, n) + O(b, 0)\n}}").replace(
            "-> (O)", "-> (O, P)"
        ),
        2,
    ),
    "one statement": (MLP.replace("    O(b, n) = O(b, n) + bias(n)\n", ""), 1),
    # writes a tensor the product reads: other blocks may still read its tiles
    "an operand overwritten": (
        """def mlp({t}(B,K) I, {t}(K,K) W, float(K) bias) -> (O, T) {{
    T(b, k) = I(b, k)
    O(b, n) +=! float(T(b, k)) * float(W(n, k))
    T(b, n) = {t}(O(b, n) + bias(n))
}}""",
        3,
    ),
}


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("case", EPILOGUES)
def test_pointwise_statements_after_a_contraction_run_as_its_epilogue(
    case: str, type_name: str
) -> None:
    """Statements that only replace each output of a contraction by a value of it
    (a bias, an activation) are applied to the accumulators as they are stored, in
    the tensor-core kernel, which also leaves out the initialisation's kernel (its
    accumulators start at zero and it stores every output): one launch instead of
    four; one that reads another output (`O(b, 0)`, into another tensor) keeps its own
    kernel, as does one writing a tensor the product reads. The output is rounded
    between the statements as the tensor rounds it (a half output). Under
    `TCPY_POISON` (`conftest`), an output left unwritten would be NaN."""
    template, launches = EPILOGUES[case]
    source = template.format(t=type_name)
    emu, reference = _engines(source)
    rng = np.random.default_rng(8)
    square = "(K,K) W" in source
    shapes = [(40, 24), (24, 24), (24,)] if square else [(40, 24), (56, 24), (56,)]
    inputs = _inputs(shapes, TYPES[type_name], rng)
    compiled = emu.compile("mlp", *inputs)
    assert "(tc_d[" in compiled.source
    assert len(compiled.profile(*inputs)) == launches
    tol = 1e-5 if "half" not in case else 2**-7
    for g, w in zip(as_tuple(compiled(*inputs)), as_tuple(reference.mlp(*inputs)), strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert np.abs(g64 - w64).max() <= tol * np.abs(w64).max()


@pytest.mark.parametrize("k", [12, 20, 36])
def test_a_float32_reduction_ending_inside_a_tile_reads_zeros_past_it(k: int) -> None:
    """A reduction of a multiple of 4 values, not of the tile's: the operand rows are
    copied by `float4`, and the vector past the reduction's end must be zeros whole
    (not only its first element), which the emulator's check of shared memory read
    before any thread wrote it sees; the results agree with the reference."""
    source = MM.format(t="float")
    emu, reference = _engines(source)
    a, b = _inputs([(20, k), (k, 24)], np.float32, np.random.default_rng(k))
    options = MappingOptions.cuda().replace(input_precision="tf32x3", copy_stages=1)
    compiled = emu.compile("mm", a, b, options=options)
    assert "TC_MMA_TF32(tc_d" in compiled.source and "TC_LDV(float4" in compiled.source
    want = reference.mm(a, b)
    assert np.abs(compiled(a, b) - want).max() <= 1e-5 * np.abs(want).max()
