"""Kernels as users write them, beyond the suite (bench/README.md): PolyBench 4.2's
linear algebra at its LARGE sizes (the TC written here from the published
definitions), blocks of a BERT-base layer at sequence 384, and element-wise and
broadcast kernels on large matrices. `bench/cpu.py --users` times them against NumPy
and PyTorch, as it does the suite.

Each kernel's PyTorch peer is its `torch` function (given the module, the peer); the
NumPy peer computes the same in float32.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bench.suite import Kernel, f32

SEQ, WIDTH, HEADS, HEAD, HIDDEN = 384, 768, 12, 64, 3072  # BERT-base at sequence 384


def _scalar(r: np.random.Generator) -> np.float32:
    return np.float32(r.uniform(0.5, 1.5))


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(1e-5)) * g + b


USERS: tuple[Kernel, ...] = (
    Kernel(
        "gesummv",
        """def gesummv(float(N,N) A, float(N,N) B, float(N) x, float alpha, float beta)
               -> (y) {
            y(i) +=! alpha * A(i,j) * x(j) + beta * B(i,j) * x(j)
        }""",
        "gesummv",
        {"N": 1300},
        lambda r, s: (
            f32(r, s["N"], s["N"]),
            f32(r, s["N"], s["N"]),
            f32(r, s["N"]),
            _scalar(r),
            _scalar(r),
        ),
        lambda A, B, x, a, b: a * (A @ x) + b * (B @ x),
        lambda s: 4 * s["N"] ** 2,
        lambda s: 4 * (2 * s["N"] ** 2 + 2 * s["N"]),
        memory_bound=True,
        torch=lambda torch: lambda A, B, x, a, b: a * (A @ x) + b * (B @ x),
    ),
    Kernel(
        "atax",
        """def atax(float(M,N) A, float(N) x) -> (y) {
            t(i) +=! A(i,j) * x(j)
            y(j) +=! A(i,j) * t(i)
        }""",
        "atax",
        {"M": 1900, "N": 2100},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["N"])),
        lambda A, x: A.T @ (A @ x),
        lambda s: 4 * s["M"] * s["N"],
        lambda s: 4 * (s["M"] * s["N"] + 2 * s["N"]),
        memory_bound=True,
        torch=lambda torch: lambda A, x: A.T @ (A @ x),
    ),
    Kernel(
        "bicg",
        """def bicg(float(N,M) A, float(N) r, float(M) p) -> (s, q) {
            s(j) +=! r(i) * A(i,j)
            q(i) +=! A(i,j) * p(j)
        }""",
        "bicg",
        {"N": 2100, "M": 1900},
        lambda r, s: (f32(r, s["N"], s["M"]), f32(r, s["N"]), f32(r, s["M"])),
        lambda A, r, p: (r @ A, A @ p),
        lambda s: 4 * s["M"] * s["N"],
        lambda s: 4 * (s["M"] * s["N"] + 2 * s["M"] + 2 * s["N"]),
        memory_bound=True,
        torch=lambda torch: lambda A, r, p: (r @ A, A @ p),
    ),
    Kernel(
        "mvt",
        """def mvt(float(N,N) A, float(N) u, float(N) v) -> (p, q) {
            p(i) +=! A(i,j) * u(j)
            q(i) +=! A(j,i) * v(j)
        }""",
        "mvt",
        {"N": 2000},
        lambda r, s: (f32(r, s["N"], s["N"]), f32(r, s["N"]), f32(r, s["N"])),
        lambda A, u, v: (A @ u, v @ A),
        lambda s: 4 * s["N"] ** 2,
        lambda s: 4 * (s["N"] ** 2 + 4 * s["N"]),
        memory_bound=True,
        torch=lambda torch: lambda A, u, v: (A @ u, v @ A),
    ),
    Kernel(
        "gemm",
        """def gemm(float(NI,NK) A, float(NK,NJ) B, float(NI,NJ) C, float alpha, float beta)
               -> (D) {
            D(i,j) = beta * C(i,j)
            D(i,j) += alpha * A(i,k) * B(k,j)
        }""",
        "gemm",
        {"NI": 1000, "NJ": 1100, "NK": 1200},
        lambda r, s: (
            f32(r, s["NI"], s["NK"]),
            f32(r, s["NK"], s["NJ"]),
            f32(r, s["NI"], s["NJ"]),
            _scalar(r),
            _scalar(r),
        ),
        lambda A, B, C, a, b: b * C + a * (A @ B),
        lambda s: 2 * s["NI"] * s["NJ"] * s["NK"],
        lambda s: 4 * (s["NI"] * s["NK"] + s["NK"] * s["NJ"] + 2 * s["NI"] * s["NJ"]),
        torch=lambda torch: lambda A, B, C, a, b: torch.addmm(C, A, B, beta=b, alpha=a),
    ),
    Kernel(
        "2mm",
        """def mm2(float(NI,NK) A, float(NK,NJ) B, float(NJ,NL) C, float(NI,NL) D,
                   float alpha, float beta) -> (E) {
            T(i,j) +=! alpha * A(i,k) * B(k,j)
            E(i,l) = beta * D(i,l)
            E(i,l) += T(i,j) * C(j,l)
        }""",
        "mm2",
        {"NI": 800, "NJ": 900, "NK": 1100, "NL": 1200},
        lambda r, s: (
            f32(r, s["NI"], s["NK"]),
            f32(r, s["NK"], s["NJ"]),
            f32(r, s["NJ"], s["NL"]),
            f32(r, s["NI"], s["NL"]),
            _scalar(r),
            _scalar(r),
        ),
        lambda A, B, C, D, a, b: b * D + (a * (A @ B)) @ C,
        lambda s: 2 * s["NI"] * s["NJ"] * (s["NK"] + s["NL"]),
        lambda s: (
            4 * (s["NI"] * s["NK"] + s["NK"] * s["NJ"] + s["NJ"] * s["NL"] + 2 * s["NI"] * s["NL"])
        ),
        torch=lambda torch: lambda A, B, C, D, a, b: torch.addmm(D, a * (A @ B), C, beta=b),
    ),
    Kernel(
        "3mm",
        """def mm3(float(NI,NK) A, float(NK,NJ) B, float(NJ,NM) C, float(NM,NL) D) -> (G) {
            E(i,j) +=! A(i,k) * B(k,j)
            F(j,l) +=! C(j,m) * D(m,l)
            G(i,l) +=! E(i,j) * F(j,l)
        }""",
        "mm3",
        {"NI": 800, "NJ": 900, "NK": 1000, "NL": 1100, "NM": 1200},
        lambda r, s: (
            f32(r, s["NI"], s["NK"]),
            f32(r, s["NK"], s["NJ"]),
            f32(r, s["NJ"], s["NM"]),
            f32(r, s["NM"], s["NL"]),
        ),
        lambda A, B, C, D: (A @ B) @ (C @ D),
        lambda s: (
            2
            * (
                s["NI"] * s["NJ"] * s["NK"]
                + s["NJ"] * s["NL"] * s["NM"]
                + s["NI"] * s["NL"] * s["NJ"]
            )
        ),
        lambda s: (
            4
            * (
                s["NI"] * s["NK"]
                + s["NK"] * s["NJ"]
                + s["NJ"] * s["NM"]
                + s["NM"] * s["NL"]
                + s["NI"] * s["NL"]
            )
        ),
        torch=lambda torch: lambda A, B, C, D: (A @ B) @ (C @ D),
    ),
    Kernel(
        "mlp2",
        """def mlp2(float(B,D) X, float(H,D) W1, float(H) b1, float(D,H) W2, float(D) b2)
               -> (O) {
            Z(b,h) +=! X(b,d) * W1(h,d)
            R(b,h) = fmax(Z(b,h) + b1(h), 0)
            O(b,d) +=! R(b,h) * W2(d,h)
            O(b,d) = O(b,d) + b2(d)
        }""",
        "mlp2",
        {"B": SEQ, "D": WIDTH, "H": HIDDEN},
        lambda r, s: (
            f32(r, s["B"], s["D"]),
            f32(r, s["H"], s["D"]),
            f32(r, s["H"]),
            f32(r, s["D"], s["H"]),
            f32(r, s["D"]),
        ),
        lambda X, W1, b1, W2, b2: np.maximum(X @ W1.T + b1, 0) @ W2.T + b2,
        lambda s: 4 * s["B"] * s["D"] * s["H"],
        lambda s: 4 * (2 * s["B"] * s["D"] + 2 * s["D"] * s["H"]),
        torch=lambda torch: (
            lambda X, W1, b1, W2, b2: torch.nn.functional.linear(
                torch.relu(torch.nn.functional.linear(X, W1, b1)), W2, b2
            )
        ),
    ),
    Kernel(
        "qkv_projection",
        """def qkv(float(S,D) X, float(T,H,E,D) W) -> (O) {
            O(t,h,s,e) +=! X(s,d) * W(t,h,e,d)
        }""",
        "qkv",
        {"S": SEQ, "D": WIDTH, "T": 3, "H": HEADS, "E": HEAD},
        lambda r, s: (f32(r, s["S"], s["D"]), f32(r, s["T"], s["H"], s["E"], s["D"])),
        lambda X, W: np.einsum("sd,thed->thse", X, W, optimize=True),
        lambda s: 2 * s["S"] * s["D"] * s["T"] * s["H"] * s["E"],
        lambda s: 4 * (s["S"] * s["D"] + 2 * s["T"] * s["H"] * s["E"] * s["D"]),
        torch=lambda torch: (
            lambda X, W: (X @ W.flatten(0, 2).T).unflatten(1, W.shape[:3]).permute(1, 2, 0, 3)
        ),
    ),
    Kernel(
        "output_layernorm",
        """def out_ln(float(S,D) X, float(D,D) Wo, float(D) bo, float(S,D) R, float(D) g,
                      float(D) b) -> (O) {
            Y(s,n) +=! X(s,d) * Wo(n,d)
            Y(s,n) = Y(s,n) + bo(n) + R(s,n)
            mean(s) +=! Y(s,n) / D
            var(s) +=! (Y(s,n) - mean(s)) * (Y(s,n) - mean(s)) / D
            O(s,n) = (Y(s,n) - mean(s)) / sqrt(var(s) + 1e-5) * g(n) + b(n)
        }""",
        "out_ln",
        {"S": SEQ, "D": WIDTH},
        lambda r, s: (
            f32(r, s["S"], s["D"]),
            f32(r, s["D"], s["D"]),
            f32(r, s["D"]),
            f32(r, s["S"], s["D"]),
            f32(r, s["D"]),
            f32(r, s["D"]),
        ),
        lambda X, Wo, bo, R, g, b: _ln(X @ Wo.T + bo + R, g, b),
        lambda s: 2 * s["S"] * s["D"] ** 2 + 10 * s["S"] * s["D"],
        lambda s: 4 * (3 * s["S"] * s["D"] + s["D"] ** 2),
        torch=lambda torch: (
            lambda X, Wo, bo, R, g, b: torch.nn.functional.layer_norm(
                torch.nn.functional.linear(X, Wo, bo) + R, (X.shape[1],), g, b, 1e-5
            )
        ),
    ),
    Kernel(
        "difference",
        "def diff(float(M,N) A, float(M,N) B) -> (C) { C(i,j) = A(i,j) - B(i,j) }",
        "diff",
        {"M": 4096, "N": 4096},
        lambda r, s: (f32(r, s["M"], s["N"]), f32(r, s["M"], s["N"])),
        lambda A, B: A - B,
        lambda s: s["M"] * s["N"],
        lambda s: 12 * s["M"] * s["N"],
        memory_bound=True,
        torch=lambda torch: lambda A, B: A - B,
    ),
    Kernel(
        "broadcast",
        "def bcast(float(N) a) -> (C) { C(i,j) = a(j) where i in 0:4096 }",
        "bcast",
        {"N": 4096},
        lambda r, s: (f32(r, s["N"]),),
        lambda a: np.broadcast_to(a, (4096, a.shape[0])).copy(),
        lambda s: 0,
        lambda s: 4 * 4096 * s["N"],
        memory_bound=True,
        torch=lambda torch: lambda a: a.expand(4096, a.shape[0]).clone(),
    ),
)


def smoke_user(kernel: Kernel) -> Kernel:
    """`kernel` at the sizes of a smoke run (`bench.suite.smoke_tag`): each size at most
    48, which compiles and runs in well under a second."""
    return replace(kernel, sizes={k: min(v, 48) for k, v in kernel.sizes.items()})
