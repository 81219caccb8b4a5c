"""tcpy defs as PyTorch operators, with gradients.

    import tcpy.torch
    ops = tcpy.torch.define(SOURCE)     # options=..., backward="auto" | TC source | None,
                                        # save="auto" | "all" | "none" | names
    y = ops.layernorm(x, gamma, beta)   # a registered PyTorch operator

Every def of the source becomes a `torch.library` operator (`ops.<def>` is its
`torch.ops` overload), so that `torch.compile` sees one opaque node per call and
`torch.library.opcheck` can test it. Each has a fake implementation from
tcpy's range inference (output shapes from the inputs', symbolic sizes included), runs
on CPU tensors with the `cpu` target and on CUDA tensors with the `cuda` target, and has
an autograd formula from the def's backward: derived (`tcpy.gradient`), given as TC, or
none. The backward is a registered operator too. PyTorch is an optional dependency:
this module imports it, nothing else of tcpy does.
"""

from __future__ import annotations

from tcpy.torch.ops import Ops, define

__all__ = ["Ops", "define"]
