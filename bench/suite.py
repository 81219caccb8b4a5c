# ruff: noqa: E741  (tensor names as in the TC)
"""The benchmark suite (bench/README.md): each kernel as TC, its NumPy peer, its inputs,
and the work it does (floating-point operations, and the fewest bytes it must move).

Shared by `bench/cpu.py` (against NumPy and PyTorch eager) and `bench/gpu.py` (against
PyTorch); `torch_peer` gives each kernel's PyTorch function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


@dataclass(frozen=True)
class Kernel:
    name: str
    tc: str
    entry: str
    sizes: dict[str, int]
    inputs: Callable[[np.random.Generator, dict[str, int]], tuple[np.ndarray, ...]]
    numpy: Callable[..., object]
    flops: Callable[[dict[str, int]], float]
    bytes: Callable[[dict[str, int]], float]
    memory_bound: bool = False
    torch: Callable[[Any], Callable[..., object]] | None = None  # the module -> the peer


def f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _layernorm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(1e-5)) * g + b


def _gelu(x: np.ndarray) -> np.ndarray:
    c = np.float32(0.7978845608)
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _conv(x: np.ndarray, w: np.ndarray, stride: int = 1) -> np.ndarray:
    kh, kw = w.shape[2:]
    windows = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("nchwij,fcij->nfhw", windows, w, optimize=True)


def _group_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    kh, kw = w.shape[3:]
    windows = sliding_window_view(x, (kh, kw), axis=(3, 4))
    return np.einsum("ngchwij,gfcij->ngfhw", windows, w, optimize=True)


def _window_outputs(s: dict[str, int], stride: int = 1) -> int:
    """The output positions of a convolution's window over `H` x `W`, per channel."""
    return ((s["H"] - s["KH"]) // stride + 1) * ((s["W"] - s["KW"]) // stride + 1)


def _maxpool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


SUITE: tuple[Kernel, ...] = (
    Kernel(
        "matmul",
        "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
        "matmul",
        {"M": 512, "K": 512, "N": 512},
        lambda r, s: (f32(r, s["M"], s["K"]), f32(r, s["K"], s["N"])),
        lambda A, B: A @ B,
        lambda s: 2 * s["M"] * s["N"] * s["K"],
        lambda s: 4 * (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]),
    ),
    Kernel(
        "matmul_transposed",
        "def mtt(float(K,M) A, float(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }",
        "mtt",
        {"M": 512, "K": 512, "N": 512},
        lambda r, s: (f32(r, s["K"], s["M"]), f32(r, s["N"], s["K"])),
        lambda A, B: A.T @ B.T,
        lambda s: 2 * s["M"] * s["N"] * s["K"],
        lambda s: 4 * (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]),
    ),
    Kernel(
        "batch_matmul",
        "def bmm(float(B,M,K) X, float(B,K,N) Y) -> (Z) { Z(b,m,n) +=! X(b,m,k) * Y(b,k,n) }",
        "bmm",
        {"B": 32, "M": 128, "K": 128, "N": 128},
        lambda r, s: (f32(r, s["B"], s["M"], s["K"]), f32(r, s["B"], s["K"], s["N"])),
        lambda X, Y: X @ Y,
        lambda s: 2 * s["B"] * s["M"] * s["N"] * s["K"],
        lambda s: 4 * s["B"] * (s["M"] * s["K"] + s["K"] * s["N"] + s["M"] * s["N"]),
    ),
    Kernel(
        "tensordot",
        "def td(float(N,C1,C2,H,W) I0, float(N,C2,C3,H,W) I1) -> (O) {"
        " O(n,c1,c3,h,w) +=! I0(n,c1,c2,h,w) * I1(n,c2,c3,h,w) }",
        "td",
        {"N": 8, "C1": 32, "C2": 32, "C3": 32, "H": 16, "W": 16},
        lambda r, s: (
            f32(r, s["N"], s["C1"], s["C2"], s["H"], s["W"]),
            f32(r, s["N"], s["C2"], s["C3"], s["H"], s["W"]),
        ),
        lambda A, B: np.einsum("nabhw,nbchw->nachw", A, B, optimize=True),
        lambda s: 2 * s["N"] * s["C1"] * s["C2"] * s["C3"] * s["H"] * s["W"],
        lambda s: 4 * s["N"] * s["H"] * s["W"] * (2 * s["C1"] * s["C2"] + s["C1"] * s["C3"]),
    ),
    Kernel(
        "bias_add_grad",
        "def bias_add_grad(float(B,N) G) -> (gb) { gb(n) +=! G(b,n) }",
        "bias_add_grad",
        {"B": 2048, "N": 1024},
        lambda r, s: (f32(r, s["B"], s["N"]),),
        lambda G: G.sum(axis=0),
        lambda s: s["B"] * s["N"],
        lambda s: 4 * (s["B"] * s["N"] + s["N"]),
        memory_bound=True,
    ),
    Kernel(
        "softmax",
        """def softmax(float(N, D) I) -> (O) {
            maxVal(n) max=! I(n, d)
            expDist(n, d) = exp(I(n, d) - maxVal(n))
            expSum(n) +=! expDist(n, d)
            O(n, d) = expDist(n, d) / expSum(n)
        }""",
        "softmax",
        {"N": 2048, "D": 1024},
        lambda r, s: (f32(r, s["N"], s["D"]),),
        _softmax,
        lambda s: 5 * s["N"] * s["D"],
        lambda s: 8 * s["N"] * s["D"],
        memory_bound=True,
    ),
    Kernel(
        "layernorm",
        """def layernorm(float(N, D) X, float(D) g, float(D) b) -> (O) {
            mean(n) +=! X(n, d) / D
            var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
            O(n, d) = (X(n, d) - mean(n)) / sqrt(var(n) + 1e-5) * g(d) + b(d)
        }""",
        "layernorm",
        {"N": 2048, "D": 1024},
        lambda r, s: (f32(r, s["N"], s["D"]), f32(r, s["D"]), f32(r, s["D"])),
        _layernorm,
        lambda s: 9 * s["N"] * s["D"],
        lambda s: 8 * s["N"] * s["D"],
        memory_bound=True,
    ),
    Kernel(
        "gelu",
        "def gelu(float(N, D) X) -> (O) {"
        " O(n, d) = 0.5 * X(n, d) * (1.0 + tanh(0.7978845608 * (X(n, d)"
        " + 0.044715 * X(n, d) * X(n, d) * X(n, d)))) }",
        "gelu",
        {"N": 2048, "D": 1024},
        lambda r, s: (f32(r, s["N"], s["D"]),),
        _gelu,
        lambda s: 10 * s["N"] * s["D"],
        lambda s: 8 * s["N"] * s["D"],
        memory_bound=True,
    ),
    Kernel(
        "mlp",
        """def mlp(float(B,K) I, float(N,K) W, float(N) bias) -> (O) {
            O(b, n) +=! I(b, k) * W(n, k)
            O(b, n) = O(b, n) + bias(n)
            O(b, n) = fmax(O(b, n), 0)
        }""",
        "mlp",
        {"B": 256, "K": 512, "N": 512},
        lambda r, s: (f32(r, s["B"], s["K"]), f32(r, s["N"], s["K"]), f32(r, s["N"])),
        lambda I, W, bias: np.maximum(I @ W.T + bias, 0),
        lambda s: 2 * s["B"] * s["N"] * s["K"] + 2 * s["B"] * s["N"],
        lambda s: 4 * (s["B"] * s["K"] + s["N"] * s["K"] + s["B"] * s["N"]),
    ),
    Kernel(
        "conv2d",
        "def conv2d(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {"
        " O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * K(f,c,kh,kw) }",
        "conv2d",
        {"N": 8, "C": 32, "H": 34, "W": 34, "F": 32, "KH": 3, "KW": 3},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
        ),
        _conv,
        lambda s: 2 * s["N"] * s["F"] * _window_outputs(s) * s["C"] * s["KH"] * s["KW"],
        lambda s: 4 * s["N"] * (s["C"] * s["H"] * s["W"] + s["F"] * _window_outputs(s)),
    ),
    Kernel(
        "conv2d_strided",
        "def sconv(float(N,C,H,W) I, float(F,C,KH,KW) K) -> (O) {"
        " O(n,f,h,w) +=! I(n,c,2*h+kh,2*w+kw) * K(f,c,kh,kw) }",
        "sconv",
        {"N": 8, "C": 32, "H": 65, "W": 65, "F": 32, "KH": 3, "KW": 3},
        lambda r, s: (
            f32(r, s["N"], s["C"], s["H"], s["W"]),
            f32(r, s["F"], s["C"], s["KH"], s["KW"]),
        ),
        lambda I, K: _conv(I, K, stride=2),
        lambda s: 2 * s["N"] * s["F"] * _window_outputs(s, 2) * s["C"] * s["KH"] * s["KW"],
        lambda s: 4 * s["N"] * (s["C"] * s["H"] * s["W"] + s["F"] * _window_outputs(s, 2)),
    ),
    Kernel(
        "group_conv",
        "def gconv(float(N,G,C,H,W) I, float(G,F,C,KH,KW) K) -> (O) {"
        " O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * K(g,f,c,kh,kw) }",
        "gconv",
        {"N": 8, "G": 4, "C": 8, "H": 34, "W": 34, "F": 8, "KH": 3, "KW": 3},
        lambda r, s: (
            f32(r, s["N"], s["G"], s["C"], s["H"], s["W"]),
            f32(r, s["G"], s["F"], s["C"], s["KH"], s["KW"]),
        ),
        _group_conv,
        lambda s: 2 * s["N"] * s["G"] * s["F"] * _window_outputs(s) * s["C"] * s["KH"] * s["KW"],
        lambda s: 4 * s["N"] * s["G"] * (s["C"] * s["H"] * s["W"] + s["F"] * _window_outputs(s)),
    ),
    Kernel(
        "maxpool",
        "def maxpool(float(N,C,H,W) I) -> (O) {"
        " O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2 }",
        "maxpool",
        {"N": 16, "C": 32, "H": 64, "W": 64},
        lambda r, s: (f32(r, s["N"], s["C"], s["H"], s["W"]),),
        _maxpool,
        lambda s: s["N"] * s["C"] * s["H"] * s["W"],
        lambda s: 4 * s["N"] * s["C"] * s["H"] * s["W"] * 5 / 4,
        memory_bound=True,
    ),
    Kernel(
        "two_table_lookup",
        """def lookup(float(E1,D) LUT1, int32(B,L1) I1, float(E2,D) LUT2, int32(B,L2) I2)
               -> (O1, O2) {
            O1(b, d) +=! LUT1(I1(b, l1), d)
            O2(b, d) +=! LUT2(I2(b, l2), d)
        }""",
        "lookup",
        {"E1": 10000, "E2": 10000, "D": 64, "B": 256, "L1": 50, "L2": 50},
        lambda r, s: (
            f32(r, s["E1"], s["D"]),
            r.integers(0, s["E1"], (s["B"], s["L1"]), dtype=np.int32),
            f32(r, s["E2"], s["D"]),
            r.integers(0, s["E2"], (s["B"], s["L2"]), dtype=np.int32),
        ),
        lambda L1, I1, L2, I2: (L1[I1].sum(axis=1), L2[I2].sum(axis=1)),
        lambda s: s["B"] * s["D"] * (s["L1"] + s["L2"]),
        lambda s: 4 * s["B"] * s["D"] * (s["L1"] + s["L2"] + 2),
        memory_bound=True,
    ),
)


def torch_peer(torch, kernel: Kernel) -> Callable[..., object]:  # type: ignore[no-untyped-def]
    """The kernel's PyTorch function, on tensors of any device: the library's own
    operator where it has one (softmax, layer_norm, conv2d, ...), else the same array
    operations as the NumPy peer; a kernel's own `torch` where it has one."""
    if kernel.torch is not None:
        return kernel.torch(torch)
    overrides = {
        "matmul": lambda A, B: A @ B,
        "matmul_transposed": lambda A, B: A.T @ B.T,
        "batch_matmul": lambda X, Y: X @ Y,
        "tensordot": lambda A, B: torch.einsum("nabhw,nbchw->nachw", A, B),
        "bias_add_grad": lambda G: G.sum(0),
        "softmax": lambda x: torch.softmax(x, 1),
        "layernorm": lambda x, g, b: torch.nn.functional.layer_norm(x, x.shape[1:], g, b, 1e-5),
        "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "mlp": lambda I, W, b: torch.relu(I @ W.T + b),
        "conv2d": lambda I, K: torch.nn.functional.conv2d(I, K),
        "conv2d_strided": lambda I, K: torch.nn.functional.conv2d(I, K, stride=2),
        "group_conv": lambda I, K: torch.nn.functional.conv2d(
            I.flatten(1, 2), K.flatten(0, 1), groups=I.shape[1]
        ).unflatten(1, (K.shape[0], K.shape[1])),
        "maxpool": lambda I: torch.nn.functional.max_pool2d(I, 2),
        "two_table_lookup": lambda L1, I1, L2, I2: (L1[I1.long()].sum(1), L2[I2.long()].sum(1)),
    }
    name = (
        "matmul" if kernel.name.startswith("matmul_") and kernel.name[7:].isdigit() else kernel.name
    )
    return overrides[name]


def matmul_sweep(sizes: tuple[int, ...] = (256, 512, 1024, 2048)) -> tuple[Kernel, ...]:
    """The suite's matmul at n x n x n for each n."""
    (matmul,) = [k for k in SUITE if k.name == "matmul"]
    return tuple(
        Kernel(f"matmul_{n}", matmul.tc, matmul.entry, {"M": n, "K": n, "N": n},
               matmul.inputs, matmul.numpy, matmul.flops, matmul.bytes)
        for n in sizes
    )  # fmt: skip


CONV_SHAPES: tuple[tuple[str, int, dict[str, int]], ...] = (
    # name, stride, sizes: a ResNet's 3x3 layers at batch 1 (inputs without padding, so
    # that the outputs are the layers' 56, 28, 14 and 7), its strided ones, and a 1x1
    ("conv3x3_56_64", 1, {"N": 1, "C": 64, "H": 58, "W": 58, "F": 64, "KH": 3, "KW": 3}),
    ("conv3x3_28_128", 1, {"N": 1, "C": 128, "H": 30, "W": 30, "F": 128, "KH": 3, "KW": 3}),
    ("conv3x3_14_256", 1, {"N": 1, "C": 256, "H": 16, "W": 16, "F": 256, "KH": 3, "KW": 3}),
    ("conv3x3_7_512", 1, {"N": 1, "C": 512, "H": 9, "W": 9, "F": 512, "KH": 3, "KW": 3}),
    ("conv3x3s2_28_128", 2, {"N": 1, "C": 64, "H": 57, "W": 57, "F": 128, "KH": 3, "KW": 3}),
    ("conv3x3s2_14_256", 2, {"N": 1, "C": 128, "H": 29, "W": 29, "F": 256, "KH": 3, "KW": 3}),
    ("conv1x1_28_64", 1, {"N": 1, "C": 256, "H": 28, "W": 28, "F": 64, "KH": 1, "KW": 1}),
)
SMOKE_CONV = {"N": 1, "C": 8, "H": 11, "W": 11, "F": 8}  # each shape's sizes under --smoke


def conv_sweep(smoke: bool = False) -> tuple[Kernel, ...]:
    """The suite's convolutions (`conv2d`, `conv2d_strided`) at each shape of
    `CONV_SHAPES`, against PyTorch's `conv2d` at its stride; at a few channels of
    11 x 11 with `smoke`."""
    by_stride = {1: "conv2d", 2: "conv2d_strided"}
    kernels = []
    for name, stride, sizes in CONV_SHAPES:
        (base,) = [k for k in SUITE if k.name == by_stride[stride]]
        shape = {**sizes, **SMOKE_CONV} if smoke else sizes

        def peer(torch: Any, stride: int = stride) -> Callable[..., object]:
            return lambda I, K: torch.nn.functional.conv2d(I, K, stride=stride)

        kernels.append(replace(base, name=name, sizes=shape, torch=peer))
    return tuple(kernels)


# The suite at sizes the emulator profiles in seconds (`bench/emu_profile.py`), the same
# for the GPU emulator's baseline and the GPU mapping's progress against it. Each keeps
# the shape's character (rows of a reduction longer than a warp, more than one tile per
# dimension, a stride's gap) at a few hundred kilobytes of traffic.
REDUCED_SIZES: dict[str, dict[str, int]] = {
    "matmul": {"M": 128, "K": 128, "N": 128},
    "matmul_transposed": {"M": 128, "K": 128, "N": 128},
    "batch_matmul": {"B": 4, "M": 64, "K": 64, "N": 64},
    "tensordot": {"N": 2, "C1": 16, "C2": 16, "C3": 16, "H": 8, "W": 8},
    "bias_add_grad": {"B": 256, "N": 256},
    "softmax": {"N": 128, "D": 256},
    "layernorm": {"N": 128, "D": 256},
    "gelu": {"N": 128, "D": 256},
    "mlp": {"B": 64, "K": 128, "N": 128},
    "conv2d": {"N": 2, "C": 8, "H": 18, "W": 18, "F": 8, "KH": 3, "KW": 3},
    "conv2d_strided": {"N": 2, "C": 8, "H": 33, "W": 33, "F": 8, "KH": 3, "KW": 3},
    "group_conv": {"N": 2, "G": 2, "C": 4, "H": 18, "W": 18, "F": 4, "KH": 3, "KW": 3},
    "maxpool": {"N": 2, "C": 8, "H": 32, "W": 32},
    "two_table_lookup": {"E1": 1000, "E2": 1000, "D": 64, "B": 64, "L1": 16, "L2": 16},
}


# The suite at sizes that fill a Hopper GPU (`bench/gpu.py`): each launch runs well past
# its launch overhead, and the memory-bound kernels move several times the L2 (50-60 MB).
# matmul is the 4096-cubed SGEMM of the GPU issue's target.
GPU_SIZES: dict[str, dict[str, int]] = {
    "matmul": {"M": 4096, "K": 4096, "N": 4096},
    "matmul_transposed": {"M": 4096, "K": 4096, "N": 4096},
    "batch_matmul": {"B": 64, "M": 512, "K": 512, "N": 512},
    "tensordot": {"N": 16, "C1": 64, "C2": 64, "C3": 64, "H": 32, "W": 32},
    "bias_add_grad": {"B": 32768, "N": 1024},
    "softmax": {"N": 32768, "D": 1024},
    "layernorm": {"N": 32768, "D": 1024},
    "gelu": {"N": 32768, "D": 1024},
    "mlp": {"B": 2048, "K": 2048, "N": 2048},
    "conv2d": {"N": 32, "C": 64, "H": 66, "W": 66, "F": 64, "KH": 3, "KW": 3},
    "conv2d_strided": {"N": 32, "C": 64, "H": 129, "W": 129, "F": 64, "KH": 3, "KW": 3},
    "group_conv": {"N": 32, "G": 8, "C": 16, "H": 66, "W": 66, "F": 16, "KH": 3, "KW": 3},
    "maxpool": {"N": 64, "C": 64, "H": 128, "W": 128},
    "two_table_lookup": {"E1": 100000, "E2": 100000, "D": 64, "B": 4096, "L1": 50, "L2": 50},
}


def at_gpu_size(kernel: Kernel) -> Kernel:
    """`kernel` at its GPU sizes (`GPU_SIZES`)."""
    return replace(kernel, sizes=GPU_SIZES[kernel.name])


def reduced(kernel: Kernel) -> Kernel:
    """`kernel` at its reduced sizes (`REDUCED_SIZES`)."""
    return replace(kernel, sizes=REDUCED_SIZES[kernel.name])


# --- smoke runs -----------------------------------------------------------------------------
# Every script's `--smoke` runs its kernels once at small sizes, so that CI can see that
# each benchmark still runs (tests/test_bench.py); its results say "smoke": true, and
# its files are tagged `smoke`, never taking a real result's name.


def smoke_sized(kernel: Kernel) -> Kernel:
    """`kernel` at the sizes of a smoke run: its reduced sizes (`REDUCED_SIZES`), which
    compile and run in well under a second on a CPU and keep the shape's character."""
    return reduced(kernel)


def smoke_tag(tag: str, smoke: bool) -> str:
    """A result file's `tag`, with `smoke` added under `--smoke`."""
    return "-".join(filter(None, (tag, "smoke" if smoke else "")))
