"""Host memory for the outputs of `tcpy.torch`'s calls on CPU tensors, kept for the
next call.

The host pool of `tcpy.runtime.host_pool` keeps NumPy blocks, each handed out through
a Python owner that gives it back when it ends; a PyTorch tensor over one costs a
NumPy array, the owner, and the owner's end, some 8 us an output of a layer's
forward and backward. This pool keeps a tensor per block (its base, of the outputs'
shape and type) and hands out `base.detach()`, a new tensor over the same memory
(0.4 us). A block is idle again when PyTorch's count of its storage's holders is back
to what it was when the pool made it (every tensor, view, NumPy array or saved value
over it is one; `torch.compile`'s CUDA graph trees read the same count to reuse their
outputs' memory). No code runs when an output ends: `empty` looks for an idle block of
its shape and type, and every `TRIM_EVERY` calls, and whenever it makes a block, the
pool frees idle blocks past `IDLE_BYTES`.

A detached tensor shares its base's version counter (PyTorch's count of in-place
writes, which a saved value checks): the tensors of one block are never alive
together, so a later one only starts its count where the earlier one left it.
"""

from __future__ import annotations

import threading

import torch

from tcpy.runtime.host_pool import IDLE_BYTES

TRIM_EVERY = 256

_Block = tuple[torch.Tensor, int, int]


def _holders(storage: int) -> int:
    """How many hold the storage at `storage` (a `_cdata`; its Python object, which
    PyTorch keeps once made, is one)."""
    count: int = torch._C._storage_Use_Count(storage)
    return count


class TensorPool:
    """Blocks of host memory by the shape and type of their tensors, handed out as new
    tensors while nothing else holds them (`empty`)."""

    def __init__(self, idle_limit: int = IDLE_BYTES) -> None:
        self.idle_limit = idle_limit
        # by shape and type: each block's base tensor, its storage's `_cdata`, and the
        # storage's holders while the block is idle
        self.blocks: dict[tuple[tuple[int, ...], torch.dtype], list[_Block]]
        self.blocks = {}
        self.lock = threading.Lock()
        self._calls = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous tensor of `shape` and `dtype` over a pooled
        block (whether an output is worth a block, `MIN_BYTES` or more, is its
        caller's to say: `tcpy.torch.ops._maker` decides once per signature)."""
        with self.lock:
            self._calls += 1
            blocks = self.blocks.setdefault((shape, dtype), [])
            for base, storage, idle in blocks:
                if _holders(storage) <= idle:
                    if self._calls % TRIM_EVERY == 0:
                        self._trim()
                    return base.detach()
            with torch.inference_mode(False):  # a block made in inference mode serves all
                base = torch.empty(shape, dtype=dtype)
            storage = base.untyped_storage()._cdata
            blocks.append((base, storage, _holders(storage)))
            self._trim()
            return base.detach()

    def idle_bytes(self) -> int:
        with self.lock:
            return sum(_nbytes(b[0]) for b in self._idle())

    def clear(self) -> None:
        """Forget every block (those in use live on with their tensors)."""
        with self.lock:
            self.blocks.clear()

    def _idle(self) -> list[_Block]:
        return [b for blocks in self.blocks.values() for b in blocks if _holders(b[1]) <= b[2]]

    def _trim(self) -> None:
        """Free idle blocks, the largest first, until at most `idle_limit` bytes idle
        (the lock held)."""
        idle = sorted(self._idle(), key=lambda b: _nbytes(b[0]))
        over = sum(_nbytes(b[0]) for b in idle) - self.idle_limit
        while over > 0 and idle:
            base, storage, _ = idle.pop()
            key = (tuple(base.shape), base.dtype)
            self.blocks[key] = [b for b in self.blocks[key] if b[1] != storage]
            over -= _nbytes(base)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


POOL = TensorPool()
