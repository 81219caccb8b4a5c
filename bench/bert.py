"""A BERT-base encoder layer written in TC, as a user writes it, against PyTorch: each
block as a def of its own and the whole layer as one def, at the sizes of the fusion
papers' BERT measurements (sequence 384, 12 heads of 64, hidden 768, feed-forward 3072).

    python bench/bert.py [--batches 1,4] [--types float32,bfloat16] [--only layer,attention]
                         [--device cpu|cuda] [--reps 6] [--tag NAME] [--out bench/results]
                         [--smoke]

The layer is post-LN BERT: QKV projection with bias (one `[3, heads, seq, 64]` tensor
per batch row), attention (scores, scale, additive mask, softmax, times V), output
projection with bias, residual and LayerNorm, feed-forward with bias and GELU (erf),
second projection with bias, residual and LayerNorm. Its PyTorch peer is written with
`torch.nn.functional` (`linear`, `softmax`, `layer_norm`, `gelu`); the attention block
is also timed against `scaled_dot_product_attention`. Every def is checked against
PyTorch eager in float32 on the same inputs (the largest error relative to the largest
magnitude of the output), then tcpy's full call (outputs and temporaries allocated),
PyTorch eager and `torch.compile` are timed in alternating blocks (`bench.cpu`), on
the CPU; with `--device cuda`, by CUDA events (`bench.gpu`). bfloat16 runs the defs
retyped (their reductions accumulate in float32) against PyTorch's bfloat16 ops. Each
row records the minimum bytes a call must move (its inputs and outputs) and the rate
that makes. On the CPU it also profiles the attention def on `cuda-emu` at a sequence
of 20 (2 heads of 8): its launches and global bytes against its least bytes; and the
layer def at the smoke sizes with its kernels apart and as one kernel (`one_kernel`):
the launches, the grid barriers passed, and that the outputs agree. On the GPU the
layer is also timed as one kernel (`tcpy_one_kernel`), and the attention online over
tiles of 32 keys (`tcpy_online`). JSON goes
to bench/results/bert-<date>[-tag].json; `--smoke` runs tiny sizes once (CI's check
that the benchmark runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tcpy
from bench.cpu import SMOKE_BLOCKS, Blocks, _cpu_name, alternating_blocks
from bench.suite import smoke_tag
from tcpy.parser.parse import retyped
from tcpy.types import ScalarType

RESULTS = Path(__file__).resolve().parent / "results"
BERT = {"S": 384, "D": 768, "H": 12, "E": 64, "F": 3072}
SMOKE = {"S": 20, "D": 16, "H": 2, "E": 8, "F": 32}
EPS = 1e-12  # BERT's LayerNorm epsilon

QKV = """
def qkv(float(B,S,D) X, float(T,H,E,D) Wqkv, float(T,H,E) bqkv) -> (QKV) {
    QKV(t,b,h,s,e) +=! X(b,s,d) * Wqkv(t,h,e,d)
    QKV(t,b,h,s,e) = QKV(t,b,h,s,e) + bqkv(t,h,e)
}
"""
ATTENTION = """
def attention(float(T,B,H,S,E) QKV, float(B,S) M) -> (A) {
    Sc(b,h,i,j) +=! QKV(0,b,h,i,e) * QKV(1,b,h,j,e)
    Sc(b,h,i,j) = Sc(b,h,i,j) * SCALE + M(b,j)
    mx(b,h,i) max=! Sc(b,h,i,j)
    P(b,h,i,j) = exp(Sc(b,h,i,j) - mx(b,h,i))
    sm(b,h,i) +=! P(b,h,i,j)
    A(b,h,i,e) +=! P(b,h,i,j) * QKV(2,b,h,j,e)
    A(b,h,i,e) = A(b,h,i,e) / sm(b,h,i)
}
"""
ONLINE_TILE = 32  # a tile's keys, values, scores and probabilities, and the block's
# queries and output, in 41 KB of shared memory at 32 rows a block (heads of 64)
OUTPUT = """
def output(float(B,H,S,E) A, float(D,H,E) Wo, float(D) bo, float(B,S,D) X,
           float(D) g1, float(D) be1) -> (L1) {
    Y1(b,s,n) +=! A(b,h,s,e) * Wo(n,h,e)
    Y1(b,s,n) = Y1(b,s,n) + bo(n) + X(b,s,n)
    m1(b,s) +=! Y1(b,s,n) / D
    v1(b,s) +=! (Y1(b,s,n) - m1(b,s)) * (Y1(b,s,n) - m1(b,s)) / D
    L1(b,s,n) = (Y1(b,s,n) - m1(b,s)) / sqrt(v1(b,s) + EPS) * g1(n) + be1(n)
}
"""
FFN1 = """
def ffn1(float(B,S,D) L1, float(F,D) W1, float(F) b1) -> (G) {
    F1(b,s,f) +=! L1(b,s,d) * W1(f,d)
    G(b,s,f) = 0.5 * (F1(b,s,f) + b1(f)) * (1 + erf((F1(b,s,f) + b1(f)) * 0.70710678))
}
"""
FFN2 = """
def ffn2(float(B,S,F) G, float(D,F) W2, float(D) b2, float(B,S,D) L1,
         float(D) g2, float(D) be2) -> (Y) {
    Y2(b,s,n) +=! G(b,s,f) * W2(n,f)
    Y2(b,s,n) = Y2(b,s,n) + b2(n) + L1(b,s,n)
    m2(b,s) +=! Y2(b,s,n) / D
    v2(b,s) +=! (Y2(b,s,n) - m2(b,s)) * (Y2(b,s,n) - m2(b,s)) / D
    Y(b,s,n) = (Y2(b,s,n) - m2(b,s)) / sqrt(v2(b,s) + EPS) * g2(n) + be2(n)
}
"""


def _body(def_: str) -> str:
    return def_[def_.index("{") + 1 : def_.rindex("}")]


LAYER = (
    """
def layer(float(B,S,D) X, float(T,H,E,D) Wqkv, float(T,H,E) bqkv, float(B,S) M,
          float(D,H,E) Wo, float(D) bo, float(D) g1, float(D) be1,
          float(F,D) W1, float(F) b1, float(D,F) W2, float(D) b2, float(D) g2, float(D) be2)
          -> (Y) {"""
    + "".join(_body(d) for d in (QKV, ATTENTION, OUTPUT, FFN1, FFN2))
    + "}\n"
)


@dataclass(frozen=True)
class Block:
    name: str
    tc: str
    inputs: tuple[str, ...]  # names in `Weights.tensors`
    peer: Callable[..., Any]  # PyTorch's, given the module and the sizes
    output: str


def _peers(torch: Any, s: dict[str, int]) -> dict[str, Callable[..., Any]]:
    """PyTorch's blocks (post-LN BERT), on tensors shaped as the defs' inputs."""
    f = torch.nn.functional
    scale = s["E"] ** -0.5

    def qkv(x: Any, w: Any, b: Any) -> Any:
        t, h, e, d = w.shape
        y = f.linear(x, w.reshape(t * h * e, d), b.reshape(-1))
        return y.unflatten(2, (t, h, e)).permute(2, 0, 3, 1, 4)  # [3, B, H, S, E]

    def attention(q: Any, m: Any) -> Any:
        scores = q[0] @ q[1].transpose(-1, -2) * scale + m[:, None, None, :]
        return torch.softmax(scores, -1) @ q[2]

    def sdpa(q: Any, m: Any) -> Any:
        mask = m[:, None, None, :].to(q.dtype)
        return f.scaled_dot_product_attention(q[0], q[1], q[2], attn_mask=mask, scale=scale)

    def output(a: Any, w: Any, b: Any, x: Any, g: Any, be: Any) -> Any:
        merged = a.transpose(1, 2).flatten(2)  # [B, S, H*E]
        y = f.linear(merged, w.flatten(1), b) + x
        return f.layer_norm(y, (y.shape[-1],), g, be, EPS)

    def ffn1(x: Any, w: Any, b: Any) -> Any:
        return f.gelu(f.linear(x, w, b))

    def ffn2(x: Any, w: Any, b: Any, r: Any, g: Any, be: Any) -> Any:
        y = f.linear(x, w, b) + r
        return f.layer_norm(y, (y.shape[-1],), g, be, EPS)

    def layer(x, wqkv, bqkv, m, wo, bo, g1, be1, w1, b1, w2, b2, g2, be2):  # type: ignore[no-untyped-def]
        a = attention(qkv(x, wqkv, bqkv), m)
        l1 = output(a, wo, bo, x, g1, be1)
        return ffn2(ffn1(l1, w1, b1), w2, b2, l1, g2, be2)

    return {
        "qkv": qkv, "attention": attention, "sdpa": sdpa, "output": output,
        "ffn1": ffn1, "ffn2": ffn2, "layer": layer,
    }  # fmt: skip


def _tc(def_: str, s: dict[str, int]) -> str:
    """A def with the constants of the sizes filled in (TC has no named constants)."""
    return def_.replace("SCALE", repr(s["E"] ** -0.5)).replace("EPS", repr(EPS))


BLOCKS = (
    Block("qkv", QKV, ("X", "Wqkv", "bqkv"), lambda p: p["qkv"], "QKV"),
    Block("attention", ATTENTION, ("QKV", "M"), lambda p: p["attention"], "A"),
    Block("output", OUTPUT, ("A", "Wo", "bo", "X", "g1", "be1"), lambda p: p["output"], "L1"),
    Block("ffn1", FFN1, ("L1", "W1", "b1"), lambda p: p["ffn1"], "G"),
    Block("ffn2", FFN2, ("G", "W2", "b2", "L1", "g2", "be2"), lambda p: p["ffn2"], "Y"),
    Block(
        "layer",
        LAYER,
        ("X", "Wqkv", "bqkv", "M", "Wo", "bo", "g1", "be1", "W1", "b1", "W2", "b2", "g2", "be2"),
        lambda p: p["layer"],
        "Y",
    ),
)


def tensors(torch: Any, s: dict[str, int], batch: int, seed: int = 0) -> dict[str, Any]:
    """The layer's weights and input (float32, on the CPU) and the activations between
    its blocks, from PyTorch's blocks: every block's inputs."""
    g = torch.Generator().manual_seed(seed)
    d, h, e, f = s["D"], s["H"], s["E"], s["F"]

    def randn(*shape: int, scale: float = 1.0) -> Any:
        return torch.randn(*shape, generator=g) * scale

    t: dict[str, Any] = {
        "X": randn(batch, s["S"], d),
        "Wqkv": randn(3, h, e, d, scale=d**-0.5),
        "bqkv": randn(3, h, e, scale=0.1),
        "M": (torch.rand(batch, s["S"], generator=g) < 0.1).float() * -1e4,  # padding
        "Wo": randn(d, h, e, scale=d**-0.5),
        "bo": randn(d, scale=0.1),
        "g1": 1 + randn(d, scale=0.1),
        "be1": randn(d, scale=0.1),
        "W1": randn(f, d, scale=d**-0.5),
        "b1": randn(f, scale=0.1),
        "W2": randn(d, f, scale=f**-0.5),
        "b2": randn(d, scale=0.1),
        "g2": 1 + randn(d, scale=0.1),
        "be2": randn(d, scale=0.1),
    }
    p = _peers(torch, s)
    with torch.no_grad():
        t["QKV"] = p["qkv"](t["X"], t["Wqkv"], t["bqkv"]).contiguous()
        t["A"] = p["attention"](t["QKV"], t["M"]).contiguous()
        t["L1"] = p["output"](t["A"], t["Wo"], t["bo"], t["X"], t["g1"], t["be1"])
        t["G"] = p["ffn1"](t["L1"], t["W1"], t["b1"]).contiguous()
    return t


def _arrays(inputs: list[Any], ty: ScalarType) -> list[np.ndarray]:
    """NumPy arrays of the CPU tensors `inputs`, in type `ty`."""
    return [np.ascontiguousarray(x.numpy()).astype(ty.dtype) for x in inputs]


def measure(  # type: ignore[no-untyped-def]
    torch, block: Block, s: dict[str, int], batch: int, ty: ScalarType, device: str, timing
) -> dict[str, Any]:
    """One block at one batch and type: its error against PyTorch eager in float32,
    then tcpy's full call, PyTorch eager, torch.compile (and SDPA for the attention),
    timed by `timing` (contenders -> milliseconds)."""
    t = tensors(torch, s, batch)
    peers = _peers(torch, s)
    inputs = [t[n] for n in block.inputs]
    source = _tc(block.tc, s)
    source = source if ty is ScalarType.FLOAT32 else retyped(source, ty)
    engine = tcpy.ExecutionEngine(device)
    engine.define(source)
    entry = getattr(engine, block.name)
    torch_type = getattr(torch, ty.value)
    peer_inputs = [x.to(device=device, dtype=torch_type) for x in inputs]
    ours = _arrays(inputs, ty) if device == "cpu" else peer_inputs  # tcpy's inputs
    with torch.no_grad():
        want = peers[block.name](*[x.to(device) for x in inputs]).double().cpu()
        got = torch.as_tensor(np.asarray(_host(entry(*ours)), dtype=np.float64))
    error = float((got - want).abs().max() / want.abs().max())
    eager = peers[block.name]
    compiled = torch.compile(eager)
    contenders: dict[str, Callable[[], object]] = {
        "tcpy": lambda: entry(*ours),
        "eager": lambda: eager(*peer_inputs),
        "compile": lambda: compiled(*peer_inputs),
    }
    if block.name == "attention":
        contenders["sdpa"] = lambda: peers["sdpa"](*peer_inputs)
    errors: dict[str, float] = {}
    if device == "cuda" and block.name == "attention":  # online over tiles of keys
        options = engine.default_options(block.name, *ours)
        online = engine.compile(block.name, *ours, options=options.replace(online_tile=ONLINE_TILE))
        contenders["tcpy_online"] = lambda: online(*ours)
        with torch.no_grad():
            online_got = np.asarray(_host(online(*ours)), dtype=np.float64)
        errors["online"] = float(
            (torch.as_tensor(online_got) - want).abs().max() / want.abs().max()
        )
    if device == "cuda" and block.name == "layer":  # its kernels as one, launched once
        options = engine.default_options(block.name, *ours).replace(one_kernel=True)
        one = engine.compile(block.name, *ours, options=options)
        contenders["tcpy_one_kernel"] = lambda: one(*ours)
    with torch.no_grad():
        for fn in contenders.values():
            fn()
        ms = timing(contenders)
    least = sum(x.numel() for x in inputs) + math.prod(want.shape)
    least_bytes = least * ty.dtype.itemsize
    return {
        "block": block.name,
        "batch": batch,
        "type": ty.value,
        "device": device,
        "max_error_of_largest": error,
        **{f"{name}_max_error_of_largest": v for name, v in errors.items()},
        **{f"{name}_ms": round(v, 4) for name, v in ms.items()},
        **{
            f"{name}_over_tcpy": round(v / ms["tcpy"], 3)
            for name, v in ms.items()
            if name != "tcpy"
        },
        "least_bytes": least_bytes,
        "tcpy_gbps_of_least": round(least_bytes / ms["tcpy"] / 1e6, 2),
    }


def attention_on_emulator() -> dict[str, Any]:
    """The attention def at a size where one block's rows cover the sequence (20, 2
    heads of 8) on `cuda-emu`: its launches and the global bytes they load and store,
    against the bytes of its inputs and outputs (the GPU's row fusion target: 1.3x);
    and the same online over tiles of keys (`online_tile`)."""
    s = {"S": 20, "H": 2, "E": 8}
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((3, 1, s["H"], s["S"], s["E"]), dtype=np.float32)
    mask = np.zeros((1, s["S"]), np.float32)
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define(_tc(ATTENTION, {**BERT, **s}))
    compiled = engine.compile("attention", qkv, mask)
    launches = compiled.profile(qkv, mask)
    moved = sum(x["global_load_bytes"] + x["global_store_bytes"] for x in launches)
    least = qkv.nbytes + mask.nbytes + math.prod((1, s["H"], s["S"], s["E"])) * 4
    # the same online over tiles of 8 keys (three tiles a row)
    options = engine.default_options("attention", qkv, mask).replace(online_tile=8)
    online = engine.compile("attention", qkv, mask, options=options).profile(qkv, mask)
    online_moved = sum(x["global_load_bytes"] + x["global_store_bytes"] for x in online)
    return {"sizes": s, "launches": len(launches), "global_bytes": moved,
            "least_bytes": least, "moved_x": round(moved / least, 2),
            "online_tile": 8, "online_launches": len(online),
            "online_moved_x": round(online_moved / least, 2)}  # fmt: skip


def layer_on_emulator() -> dict[str, Any]:
    """The whole layer as one def at the smoke sizes on `cuda-emu`, its kernels apart
    and as one kernel (`one_kernel`): the launches, the grid barriers each block passed,
    and whether the outputs agree."""
    import torch

    s = {**BERT, **SMOKE}
    t = tensors(torch, s, batch=1)
    block = BLOCKS[-1]
    inputs = [np.ascontiguousarray(t[n].numpy()) for n in block.inputs]
    engine = tcpy.ExecutionEngine("cuda-emu")
    engine.define(_tc(LAYER, s))
    found: dict[str, Any] = {"sizes": SMOKE}
    outputs = []
    for one in (False, True):
        options = engine.default_options("layer", *inputs).replace(one_kernel=one)
        compiled = engine.compile("layer", *inputs, options=options)
        outputs.append(compiled(*inputs))
        launches = compiled.profile(*inputs)
        key = "one_kernel" if one else "apart"
        found[f"{key}_launches"] = len(launches)
        found[f"{key}_grid_barriers"] = sum(x["grid_barriers"] for x in launches)
    found["same_outputs"] = bool(np.allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6))
    return found


def _host(result: object) -> object:
    """A result on the host: a CUDA tensor copied back, an array as it is."""
    cpu = getattr(result, "cpu", None)
    return cpu().float().numpy() if cpu is not None else result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batches", default="1,4")
    p.add_argument("--types", default="float32,bfloat16")
    p.add_argument("--only", default="", help="comma-separated blocks (layer, attention, ...)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--tag", default="")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, timed once: does it run?")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing measured", file=sys.stderr)
        return 1
    s = SMOKE if args.smoke else BERT
    only = set(filter(None, args.only.split(",")))
    blocks = [b for b in BLOCKS if not only or b.name in only]
    timing = _timing(torch, args.device, SMOKE_BLOCKS if args.smoke else Blocks(least=args.reps))
    rows = []
    for ty in (ScalarType.from_name(n) for n in args.types.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            for block in blocks:
                row = measure(torch, block, s, batch, ty, args.device, timing)
                rows.append(row)
                print(_line(row), flush=True)
    emulated = attention_on_emulator() if args.device == "cpu" else None
    layer = layer_on_emulator() if args.device == "cpu" and (not only or "layer" in only) else None
    if emulated:
        print(f"attention on cuda-emu {emulated['sizes']}: {emulated['launches']} launches, "
              f"{emulated['moved_x']}x its least bytes; online over tiles of "
              f"{emulated['online_tile']}: {emulated['online_launches']} launches, "
              f"{emulated['online_moved_x']}x")  # fmt: skip
    if layer:
        print(f"layer on cuda-emu {layer['sizes']}: {layer['apart_launches']} launches apart, "
              f"{layer['one_kernel_launches']} as one kernel "
              f"({layer['one_kernel_grid_barriers']} grid barriers passed), "
              f"same outputs: {layer['same_outputs']}")  # fmt: skip
    record = {
        "date": datetime.date.today().isoformat(),
        "smoke": args.smoke,
        "attention_on_emulator": emulated,
        "layer_on_emulator": layer,
        "sizes": s,
        "device": args.device,
        "cpu": _cpu_name(),
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "threads": os.cpu_count(),
        "torch": torch.__version__,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tag = smoke_tag(args.tag, args.smoke)
    path = args.out / f"bert-{record['date']}{'-' + tag if tag else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written {path}")
    return 0


def _timing(torch: Any, device: str, blocks: Blocks) -> Callable[..., dict[str, float]]:
    """Contenders -> their median milliseconds: alternating blocks of wall time on the
    CPU; on the GPU, CUDA events around each run (`bench.gpu`)."""
    if device == "cpu":
        return lambda contenders: alternating_blocks(contenders, blocks)
    from bench.gpu import _time

    reps = max(blocks.least, 1)
    return lambda contenders: {n: _time(torch, fn, reps * 5) for n, fn in contenders.items()}


def _line(row: dict[str, Any]) -> str:
    ratios = {k.removesuffix("_over_tcpy"): v for k, v in row.items() if k.endswith("_over_tcpy")}
    peers = "  ".join(f"{k}/tcpy {v:5.2f}" for k, v in ratios.items())
    return (
        f"{row['block']:>9} batch {row['batch']} {row['type']:>8}  tcpy {row['tcpy_ms']:8.3f} ms"
        f"  {peers}  error {row['max_error_of_largest']:.1e}"
    )


if __name__ == "__main__":
    sys.exit(main())
