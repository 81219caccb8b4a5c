"""The sm_80 instructions in the CUDA emulator (`emulator_async.h`), driven by
hand-written kernels, and their CUDA (`tcpy.codegen.instructions`) compiled by NVRTC.

What is tested:

* `cp.async` with commit groups and waits: a double-buffered copy of tiles through
  shared memory gives the right answer in the instrumented and the plain build; the
  check reports a missing wait, a wait that leaves the tile in flight and a copy into
  a stage other threads may still be reading (each with its fixed version);
* `ldmatrix` (.x1, .x2, .x4, with and without .trans): each lane's registers against a
  NumPy model of the PTX ISA's description (row addresses from lanes 8i..8i+7; lane L
  holds row L/4, columns 2(L%4) and 2(L%4)+1);
* `mma.sync` m16n8k16 (bfloat16, float16) and m16n8k8 (tf32): fragments placed in
  each lane's registers by a NumPy model of the ISA's fragment layouts, the result read
  back through the same layouts and compared with a float64 product; `cvt.rna.tf32`
  bit for bit; a warp that leaves lanes out is reported;
* the three together: a 16 x 8 product over K = 64 in bfloat16, its tiles copied by
  `cp.async` in two stages, read by `ldmatrix` and multiplied by `mma.sync`;
* NVRTC compiles every kernel of this file for sm_80 and sm_90 with the PTX macros.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from test_emulator import build_library, counted, dispatcher, emulated

from tcpy.codegen.cuda import ACCESS_MACROS
from tcpy.codegen.halves import CUDA_HALF_TYPES
from tcpy.codegen.instructions import CUDA_INSTRUCTIONS
from tcpy.errors import TCEmulationError
from tcpy.runtime import nvrtc

PARAMS = [
    "long long s_case",
    "long long s_defect",
    "long long s_N",
    "const unsigned *__restrict__ t_A",
    "const unsigned *__restrict__ t_B",
    "const float *__restrict__ t_C",
    "unsigned *__restrict__ t_O",
    "int *tc_status",
]
NAMES = ("A", "B", "C", "O")

SOURCE = r"""
#define TID (int)threadIdx.x

/* O[64k + t] = A[64k + (t + 1) % 64] for the n / 64 tiles of A, each copied into one of
   two stages by 16 threads' 16-byte cp.async while the tile before it is read.
   defect 1: no wait; 2: a wait that leaves the newest two groups in flight (the tile
   read among them); 3: no barrier after the reads, so the next tile's copy into the
   stage races them. */
__device__ void pipeline(long long defect, long long n, const unsigned *A, const unsigned *B,
                         const float *C, unsigned *O) {
  __shared__ __align__(16) unsigned stage[128];
  long long tiles = n / 64;
  if (TID < 16) TC_CP_ASYNC(stage, 4 * TID, A, 4 * TID, 16);
  TC_CP_COMMIT();
  for (long long k = 0; k < tiles; k++) {
    if (k + 1 < tiles && TID < 16)
      TC_CP_ASYNC(stage, (k + 1) % 2 * 64 + 4 * TID, A, (k + 1) * 64 + 4 * TID, 16);
    TC_CP_COMMIT();
    if (defect == 2) TC_CP_WAIT(2);
    else if (defect != 1) TC_CP_WAIT(1);
    __syncthreads();
    TC_ST(O, 64 * k + TID) = TC_SLD(stage, k % 2 * 64 + (TID + 1) % 64);
    if (defect != 3) __syncthreads();
  }
}

/* lane L's registers of ldmatrix .x4 (.trans with defect 1) over four 8x8 matrices of
   16-bit elements, A's 256 elements (128 words) copied into shared memory: matrix i's
   row j at the address of lane 8i + j, which points to row (7 - j) of matrix (3 - i)
   (the rows' order is the lanes', not the memory's). O[4L + i] = register i. */
__device__ void ldmatrix4(long long trans, long long n, const unsigned *A, const unsigned *B,
                          const float *C, unsigned *O) {
  __shared__ __align__(16) unsigned short tile[256];
  for (int k = TID; k < 128; k += 32) {
    unsigned v = TC_LD(A, k);
    TC_SST(tile, 2 * k) = (unsigned short)(v & 0xffffu);
    TC_SST(tile, 2 * k + 1) = (unsigned short)(v >> 16);
  }
  __syncthreads();
  unsigned r[4];
  int i = TID / 8, j = TID % 8, row = (3 - i) * 64 + (7 - j) * 8;
  if (trans) TC_LDMATRIX(4, true, r, tile, row);
  else TC_LDMATRIX(4, false, r, tile, row);
  for (int q = 0; q < 4; q++) TC_ST(O, 4 * TID + q) = r[q];
}

/* ldmatrix .x1 and .x2 (n: 1 or 2; .trans with defect 1) on the first matrices, rows
   in memory order; only lanes 0..8n-1 give addresses (the others point nowhere). */
__device__ void ldmatrix12(long long trans, long long n, const unsigned *A, const unsigned *B,
                           const float *C, unsigned *O) {
  __shared__ __align__(16) unsigned short tile[128];
  for (int k = TID; k < 64; k += 32) {
    unsigned v = TC_LD(A, k);
    TC_SST(tile, 2 * k) = (unsigned short)(v & 0xffffu);
    TC_SST(tile, 2 * k + 1) = (unsigned short)(v >> 16);
  }
  __syncthreads();
  unsigned r[4] = {0, 0, 0, 0};
  int at = TID < 8 * n ? 8 * TID : 1 << 20;
  if (n == 1 && trans) TC_LDMATRIX(1, true, r, tile, at);
  if (n == 1 && !trans) TC_LDMATRIX(1, false, r, tile, at);
  if (n == 2 && trans) TC_LDMATRIX(2, true, r, tile, at);
  if (n == 2 && !trans) TC_LDMATRIX(2, false, r, tile, at);
  for (int q = 0; q < 2; q++) TC_ST(O, 4 * TID + q) = r[q];
}

/* one mma.sync: lane L's registers a[4], b[2], c[4] from A[4L..], B[2L..], C[4L..];
   kind n: 0 bfloat16, 1 float16, 2 tf32. O[4L + r] = the bits of d[r]. defect 1: lanes
   16..31 sit it out. */
__device__ void mma(long long defect, long long n, const unsigned *A, const unsigned *B,
                    const float *C, unsigned *O) {
  if (defect && TID >= 16) return;
  unsigned a[4], b[2];
  float c[4], d[4];
  for (int q = 0; q < 4; q++) a[q] = TC_LD(A, 4 * TID + q), c[q] = TC_LD(C, 4 * TID + q);
  for (int q = 0; q < 2; q++) b[q] = TC_LD(B, 2 * TID + q);
  if (n == 0) TC_MMA_BF16(d, a, b, c);
  if (n == 1) TC_MMA_F16(d, a, b, c);
  if (n == 2) TC_MMA_TF32(d, a, b, c);
  for (int q = 0; q < 4; q++) TC_ST(O, 4 * TID + q) = __float_as_uint(d[q]);
}

/* O[i] = the tf32 bits cvt.rna gives the float whose bits are A[i] */
__device__ void tf32(long long defect, long long n, const unsigned *A, const unsigned *B,
                     const float *C, unsigned *O) {
  for (long long i = TID; i < n; i += 32) TC_ST(O, i) = TC_TO_TF32(__uint_as_float(TC_LD(A, i)));
}

/* D (16 x 8, float32) = A (16 x n, bfloat16, row-major) x B (n x 8, bfloat16, stored
   n-major: row c of B^T is column c of B), K tiles of 16 copied by cp.async in two
   stages, each read by ldmatrix .x4 (A) and .x2 (B) and multiplied by mma.sync. */
__device__ void product(long long defect, long long n, const unsigned *A, const unsigned *B,
                        const float *C, unsigned *O) {
  __shared__ __align__(16) unsigned short a_tile[2 * 256];
  __shared__ __align__(16) unsigned short b_tile[2 * 128];
  const unsigned short *Ah = (const unsigned short *)A, *Bh = (const unsigned short *)B;
  long long tiles = n / 16;
  float d[4] = {0, 0, 0, 0};
  for (long long k = 0; k <= tiles; k++) {
    if (k < tiles) {  /* tile k: A's 16 rows of 16 (32 pieces of 8), B^T's 8 rows of 16 */
      int s = k % 2, r = TID / 2, h = TID % 2;
      TC_CP_ASYNC(a_tile, s * 256 + r * 16 + 8 * h, Ah, r * n + 16 * k + 8 * h, 16);
      if (TID < 16) TC_CP_ASYNC(b_tile, s * 128 + r * 16 + 8 * h, Bh, r * n + 16 * k + 8 * h, 16);
    }
    TC_CP_COMMIT();
    if (k == 0) continue;
    TC_CP_WAIT(1);
    __syncthreads();
    int s = (k - 1) % 2, l = TID;
    unsigned a[4], b[2];
    /* A's quadrants in the fragment's order: rows 0-7 cols 0-7, rows 8-15 cols 0-7,
       rows 0-7 cols 8-15, rows 8-15 cols 8-15; lane l gives row l % 16, half l / 16 */
    TC_LDMATRIX(4, false, a, a_tile, s * 256 + (l % 16) * 16 + 8 * (l / 16));
    /* B^T's 8 rows: reduction 0-7 (lanes 0-7), then 8-15 (lanes 8-15) */
    TC_LDMATRIX(2, false, b, b_tile, s * 128 + (l % 8) * 16 + 8 * (l / 8 % 2));
    TC_MMA_BF16(d, a, b, d);
    __syncthreads();
  }
  for (int q = 0; q < 4; q++) TC_ST(O, 4 * TID + q) = __float_as_uint(d[q]);
}
"""
CASES = ["pipeline", "ldmatrix4", "ldmatrix12", "mma", "tf32", "product"]
SOURCE += dispatcher(PARAMS, CASES, "s_defect, s_N, t_A, t_B, t_C, t_O")


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("sm80"), SOURCE, PARAMS, 3)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("sm80-plain")
    return build_library(directory, SOURCE, PARAMS, 3, instrumented=False)


def run(
    library: Path, case: str, threads: int, sizes: tuple[int, int], arrays: list[np.ndarray],
    out: int, *, check: bool = True, instrumented: bool = True,
) -> np.ndarray:  # fmt: skip
    """`case` on one block of `threads`, with (defect, n) and A, B, C: O's words."""
    o = np.zeros(out, np.uint32)
    kernels = emulated(
        library, 1, threads, case, names=NAMES, check=check, instrumented=instrumented
    )
    kernels([CASES.index(case), *sizes], [*arrays, o])
    return o


def _none(n: int = 1) -> np.ndarray:
    return np.zeros(n, np.uint32)


# --- cp.async ------------------------------------------------------------------------


def _pipelined(a: np.ndarray) -> np.ndarray:
    return np.roll(a.reshape(-1, 64), -1, axis=1).ravel()


@pytest.mark.parametrize("instrumented", [True, False], ids=["checked", "plain"])
def test_a_two_stage_pipeline_of_async_copies_is_right(
    checked: Path, plain: Path, instrumented: bool
) -> None:
    a = np.arange(1, 4 * 64 + 1, dtype=np.uint32)
    library = checked if instrumented else plain
    o = run(library, "pipeline", 64, (0, a.size), [a, _none(), _none().view(np.float32)], a.size,
            instrumented=instrumented)  # fmt: skip
    np.testing.assert_array_equal(o, _pipelined(a))


@pytest.mark.parametrize(
    ("defect", "fragments"),
    [
        (1, ("race", "stage", "while a cp.async by", "is in flight")),
        (2, ("race", "stage", "while a cp.async by", "is in flight")),
        (3, ("race", "stage", "cp.async")),
    ],
    ids=["no-wait", "wait-leaves-it-in-flight", "no-barrier-before-the-next-copy"],
)
def test_the_check_reports_async_copy_defects(
    checked: Path, defect: int, fragments: tuple[str, ...]
) -> None:
    a = np.arange(1, 4 * 64 + 1, dtype=np.uint32)
    with pytest.raises(TCEmulationError) as caught:
        run(
            checked,
            "pipeline",
            64,
            (defect, a.size),
            [a, _none(), _none().view(np.float32)],
            a.size,
        )
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_unchecked_a_read_before_the_wait_sees_the_old_contents(checked: Path) -> None:
    """Without the check, the missing wait gives what real asynchrony gives: tile 0's
    reads find shared memory as it was (zero on the emulator's first block)."""
    a = np.arange(1, 4 * 64 + 1, dtype=np.uint32)
    o = run(checked, "pipeline", 64, (1, a.size), [a, _none(), _none().view(np.float32)], a.size,
            check=False)  # fmt: skip
    assert not np.array_equal(o, _pipelined(a))


def test_the_profile_counts_async_copies_and_groups(checked: Path) -> None:
    a = np.arange(1, 4 * 64 + 1, dtype=np.uint32)
    o = np.zeros(a.size, np.uint32)
    kernels = emulated(checked, 1, 64, "pipeline", names=NAMES)
    profile = counted(
        kernels.profile(
            [CASES.index("pipeline"), 0, a.size], [a, _none(), _none().view(np.float32), o]
        )[0]
    )
    assert profile["async_copies"] == 16 * 4  # 16 threads, 4 tiles
    assert profile["async_groups"] == 64 * 5  # every thread commits 5 groups
    assert profile["global_load_bytes"] == a.nbytes


# --- ldmatrix ------------------------------------------------------------------------


def ldmatrix_model(matrices: np.ndarray, trans: bool) -> np.ndarray:
    """Each lane's registers (32 x count, uint32) of ldmatrix over `matrices` (count x 8
    x 8, uint16), by the PTX ISA: lane L holds of matrix i row L // 4, elements
    2 (L % 4) and 2 (L % 4) + 1, the first in the low half; with .trans, the matrix is
    transposed first."""
    m = matrices.transpose(0, 2, 1) if trans else matrices
    lane = np.arange(32)
    lo = m[:, lane // 4, 2 * (lane % 4)].astype(np.uint32)
    hi = m[:, lane // 4, 2 * (lane % 4) + 1].astype(np.uint32)
    return (lo | hi << 16).T


@pytest.mark.parametrize("trans", [False, True], ids=["rows", "trans"])
def test_ldmatrix_x4_gives_each_lane_the_isa_fragment(checked: Path, trans: bool) -> None:
    elements = np.random.default_rng(1).integers(0, 1 << 16, 256, dtype=np.uint16)
    words = elements.view(np.uint32)
    o = run(
        checked, "ldmatrix4", 32, (int(trans), 0), [words, _none(), _none().view(np.float32)], 128
    )
    # lane 8i + j gave row 7 - j of matrix 3 - i: matrix i is memory's 3 - i, rows reversed
    memory = elements.reshape(4, 8, 8)
    matrices = memory[::-1, ::-1]
    np.testing.assert_array_equal(o.reshape(32, 4), ldmatrix_model(matrices, trans))


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("trans", [False, True], ids=["rows", "trans"])
def test_ldmatrix_x1_x2_read_the_first_lanes_addresses(
    checked: Path, count: int, trans: bool
) -> None:
    elements = np.random.default_rng(2).integers(0, 1 << 16, 128, dtype=np.uint16)
    o = run(checked, "ldmatrix12", 32, (int(trans), count),
            [elements.view(np.uint32), _none(), _none().view(np.float32)], 128)  # fmt: skip
    want = ldmatrix_model(elements.reshape(2, 8, 8)[:count], trans)
    np.testing.assert_array_equal(o.reshape(32, 4)[:, :count], want)


# --- mma.sync ------------------------------------------------------------------------


def _lanes() -> tuple[np.ndarray, np.ndarray]:
    lane = np.arange(32)
    return lane // 4, lane % 4  # groupID, threadID_in_group


def accumulator_positions() -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols), 32 x 4, of C and D's elements in each lane's registers (the ISA:
    row groupID for c0, c1 and groupID + 8 for c2, c3; column 2 threadID + (i & 1))."""
    g, t = _lanes()
    i = np.arange(4)
    rows = g[:, None] + 8 * (i[None, :] >= 2)
    cols = 2 * t[:, None] + (i[None, :] & 1)
    return rows, cols


def half_fragments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The m16n8k16 registers of A (16 x 16) and B (16 x 8) of 16-bit element bits, by
    the ISA: A's a_i at row groupID (i in 0-1, 4-5) or groupID + 8, column 2 threadID +
    (i & 1) (+ 8 for i >= 4); B's b_i at row 2 threadID + (i & 1) (+ 8 for i >= 2), column
    groupID; two elements to a register, the lower index in the low half."""
    g, t = _lanes()
    i = np.arange(8)
    a_rows = g[:, None] + 8 * np.isin(i, [2, 3, 6, 7])[None, :]
    a_cols = 2 * t[:, None] + (i[None, :] & 1) + 8 * (i[None, :] >= 4)
    a_elems = a[a_rows, a_cols].astype(np.uint32)  # 32 x 8
    j = np.arange(4)
    b_rows = 2 * t[:, None] + (j[None, :] & 1) + 8 * (j[None, :] >= 2)
    b_elems = b[b_rows, g[:, None]].astype(np.uint32)  # 32 x 4
    pack = lambda e: e[:, 0::2] | e[:, 1::2] << 16  # noqa: E731
    return pack(a_elems), pack(b_elems)


def tf32_fragments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The m16n8k8 registers of A (16 x 8) and B (8 x 8) of tf32 bits, by the ISA: a_i
    at row groupID (i = 0, 2) or groupID + 8, column threadID (+ 4 for i >= 2); b_i at
    row threadID (+ 4 for i = 1), column groupID."""
    g, t = _lanes()
    i = np.arange(4)
    a_rows = g[:, None] + 8 * (i[None, :] % 2)
    a_cols = t[:, None] + 4 * (i[None, :] >= 2)
    b_rows = t[:, None] + 4 * np.arange(2)[None, :]
    return a[a_rows, a_cols], b[b_rows, g[:, None]]


def tf32_rna(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 of finite floats: the nearest value with 10 explicit bits,
    ties away from zero; the float32 bits with the 13 low bits zero."""
    x = np.asarray(x, np.float32)
    mantissa, exponent = np.frexp(x.astype(np.float64))
    rounded = np.copysign(np.floor(np.abs(mantissa) * 2**11 + 0.5) / 2**11, mantissa)
    return np.ldexp(rounded, exponent).astype(np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", ["bfloat16", "float16", "tf32"])
def test_mma_with_the_isa_fragment_layouts(checked: Path, kind: str) -> None:
    rng = np.random.default_rng(3)
    k = 8 if kind == "tf32" else 16
    c = rng.standard_normal((16, 8)).astype(np.float32)
    if kind == "tf32":
        a = rng.standard_normal((16, k)).astype(np.float32).view(np.uint32) & 0xFFFFE000
        b = rng.standard_normal((k, 8)).astype(np.float32).view(np.uint32) & 0xFFFFE000
        a_regs, b_regs = tf32_fragments(a, b)
        a_val, b_val = a.view(np.float32), b.view(np.float32)
    else:
        dtype = ml_dtypes.bfloat16 if kind == "bfloat16" else np.float16
        a_val = rng.standard_normal((16, k)).astype(dtype)
        b_val = rng.standard_normal((k, 8)).astype(dtype)
        a_regs, b_regs = half_fragments(a_val.view(np.uint16), b_val.view(np.uint16))
    rows, cols = accumulator_positions()
    c_regs = c[rows, cols]
    o = run(checked, "mma", 32, (0, ["bfloat16", "float16", "tf32"].index(kind)),
            [a_regs.astype(np.uint32).ravel(), b_regs.astype(np.uint32).ravel(), c_regs.ravel()],
            128)  # fmt: skip
    d = np.zeros((16, 8), np.float32)
    d[rows, cols] = o.view(np.float32).reshape(32, 4)
    want = a_val.astype(np.float64) @ b_val.astype(np.float64) + c
    np.testing.assert_allclose(d, want, rtol=2**-23, atol=2**-23 * np.abs(want).max())


def test_a_wrong_fragment_layout_gives_a_wrong_product(checked: Path) -> None:
    """A's registers 1 and 2 swapped (rows 8-15 taken for columns 8-15): what a layout
    mistake in generated code would do, and what the comparison catches."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16)
    a_regs, b_regs = half_fragments(a.view(np.uint16), b.view(np.uint16))
    a_regs = a_regs[:, [0, 2, 1, 3]]
    o = run(checked, "mma", 32, (0, 0),
            [a_regs.astype(np.uint32).ravel(), b_regs.astype(np.uint32).ravel(),
             np.zeros(128, np.float32)], 128)  # fmt: skip
    rows, cols = accumulator_positions()
    d = np.zeros((16, 8), np.float32)
    d[rows, cols] = o.view(np.float32).reshape(32, 4)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.allclose(d, want, rtol=1e-2, atol=1e-2)


def test_tf32_conversion_rounds_to_nearest_ties_away(checked: Path) -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1000).astype(np.float32)
    ties = (x.view(np.uint32) & 0xFFFFE000 | 0x1000).view(np.float32)  # exactly halfway
    x = np.concatenate([x, ties, np.float32([0.0, -0.0, 1.0, 3.4e38])])
    o = run(
        checked,
        "tf32",
        32,
        (0, x.size),
        [x.view(np.uint32), _none(), _none().view(np.float32)],
        x.size,
    )
    np.testing.assert_array_equal(o, tf32_rna(x))
    halfway = o[1000:2000].view(np.float32)
    assert np.all(np.abs(halfway) > np.abs(ties[:1000]))  # away from zero


def test_a_warp_with_lanes_missing_is_reported(checked: Path) -> None:
    with pytest.raises(TCEmulationError, match=r"mma\.sync by .* names lane 16 .* exited"):
        run(checked, "mma", 32, (1, 0), [_none(128), _none(64), _none(128).view(np.float32)], 128)


# --- all three -----------------------------------------------------------------------


@pytest.mark.parametrize("instrumented", [True, False], ids=["checked", "plain"])
def test_a_pipelined_tensor_core_product(checked: Path, plain: Path, instrumented: bool) -> None:
    rng = np.random.default_rng(5)
    n = 64
    a = rng.standard_normal((16, n)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((n, 8)).astype(ml_dtypes.bfloat16)
    bt = np.ascontiguousarray(b.T)
    library = checked if instrumented else plain
    o = run(library, "product", 32, (0, n),
            [a.view(np.uint16).view(np.uint32).ravel(), bt.view(np.uint16).view(np.uint32).ravel(),
             _none().view(np.float32)], 128, instrumented=instrumented)  # fmt: skip
    rows, cols = accumulator_positions()
    d = np.zeros((16, 8), np.float32)
    d[rows, cols] = o.view(np.float32).reshape(32, 4)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# --- NVRTC ---------------------------------------------------------------------------


@pytest.mark.skipif(not nvrtc.available(), reason="needs NVRTC (the cuda extra)")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_instructions_compile_with_nvrtc(arch: str) -> None:
    source = CUDA_HALF_TYPES + CUDA_INSTRUCTIONS + ACCESS_MACROS + SOURCE
    assert nvrtc.compile_cubin(source, arch)[:4] == b"\x7fELF"


# --- on a GPU: the device agrees with the emulator lane for lane ----------------------


def on_device(
    case: str, threads: int, sizes: tuple[int, int], arrays: list[np.ndarray], out: int
) -> np.ndarray:
    """`case` run by the GPU (the CUDA source with the PTX macros, built by NVRTC for
    the device): O's words."""
    from tcpy.runtime import cuda

    drv = cuda.driver()
    source = CUDA_HALF_TYPES + CUDA_INSTRUCTIONS + ACCESS_MACROS + SOURCE
    (function,) = drv.load(nvrtc.compile_cubin(source, drv.arch()), ["tc_kernel_0"])
    o = np.zeros(out, np.uint32)
    buffers = [*arrays, o, np.zeros(1, np.int32)]
    pointers = [drv.alloc(b.nbytes) for b in buffers]
    try:
        for p, b in zip(pointers, buffers, strict=True):
            drv.to_device(p, np.ascontiguousarray(b), 0)
        args = drv.arguments(["i64"] * 3 + ["ptr"] * len(buffers))
        for k, value in enumerate([CASES.index(case), *sizes, *pointers]):
            args.set(k, value)
        drv.launch(function, (1, 1, 1), (threads, 1, 1), args, 0)
        drv.to_host(o, pointers[-2], 0)
    finally:
        for p in pointers:
            drv.free(p)
    return o


@pytest.mark.gpu
def test_the_gpu_agrees_with_the_emulator(checked: Path) -> None:
    """ldmatrix's registers and the tf32 conversion bit for bit, the pipelined copies
    exactly, mma.sync's products within float32 accumulation's error (the tensor
    cores' order and rounding of the sum are not the emulator's)."""
    rng = np.random.default_rng(7)
    nothing = [_none(), _none().view(np.float32)]
    words = rng.integers(0, 1 << 32, 128, dtype=np.uint32)
    runs = [("ldmatrix4", 32, (t, 0), [words, *nothing], 128) for t in (0, 1)]
    runs += [
        ("ldmatrix12", 32, (t, n), [words[:64], *nothing], 128) for t in (0, 1) for n in (1, 2)
    ]
    x = rng.standard_normal(1000).astype(np.float32)
    runs.append(("tf32", 32, (0, x.size), [x.view(np.uint32), *nothing], x.size))
    a = np.arange(1, 4 * 64 + 1, dtype=np.uint32)
    runs.append(("pipeline", 64, (0, a.size), [a, *nothing], a.size))
    for case, threads, sizes, arrays, out in runs:
        want = run(checked, case, threads, sizes, arrays, out)
        np.testing.assert_array_equal(
            on_device(case, threads, sizes, arrays, out), want, err_msg=case
        )
    for kind in range(3):
        regs = [rng.integers(0, 1 << 32, 128, dtype=np.uint32) & 0x3FFF3FFF,  # finite halves
                rng.integers(0, 1 << 32, 64, dtype=np.uint32) & 0x3FFF3FFF,
                rng.standard_normal(128).astype(np.float32)]  # fmt: skip
        if kind == 2:  # tf32 bits: ordinary floats
            regs[:2] = [
                rng.standard_normal(n).astype(np.float32).view(np.uint32) for n in (128, 64)
            ]
        want = run(checked, "mma", 32, (0, kind), regs, 128).view(np.float32)
        got = on_device("mma", 32, (0, kind), regs, 128).view(np.float32)
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=str(kind)
        )
