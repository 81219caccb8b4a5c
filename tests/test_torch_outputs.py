"""Host memory for `tcpy.torch`'s outputs kept from call to call
(`tcpy.torch.outputs`): a block is handed out again only once nothing holds it."""

from __future__ import annotations

import pytest

from tcpy.runtime.host_pool import MIN_BYTES

torch = pytest.importorskip("torch")
from tcpy.torch.outputs import TensorPool  # noqa: E402  (after PyTorch is known to be there)

BIG = (MIN_BYTES // 4,)


@pytest.mark.parametrize("hold", ["view", "numpy", "saved"])
def test_a_block_comes_back_when_nothing_holds_it(hold: str) -> None:
    """A view, a NumPy array, or a value an autograd graph saved keeps the block
    taken; once it goes, the next output of that shape takes the block again."""
    pool = TensorPool()
    a = pool.empty(BIG, torch.float32)
    where = a.data_ptr()
    holder = {
        "view": lambda t: t[10:],
        "numpy": lambda t: t.numpy(),
        "saved": lambda t: (t.requires_grad_() ** 2).grad_fn,  # saves t
    }[hold](a)
    del a
    b = pool.empty(BIG, torch.float32)
    assert b.data_ptr() != where  # still held: another block
    del b, holder
    assert pool.empty(BIG, torch.float32).data_ptr() == where


def test_outputs_are_new_tensors_of_their_shape_and_type() -> None:
    pool = TensorPool()
    for dtype in (torch.float64, torch.int32, torch.bfloat16, torch.float16):
        shape = (3, MIN_BYTES // 3)
        a = pool.empty(shape, dtype)
        assert a.dtype == dtype and a.shape == shape and a.is_contiguous()
        assert not a.requires_grad and a._base is None
        a.fill_(1)
        assert a.double().sum().item() == a.numel()
        del a
        b = pool.empty(shape, dtype)
        b.fill_(2)
        assert b.double().sum().item() == 2 * b.numel()


def test_idle_blocks_past_the_limit_are_freed() -> None:
    pool = TensorPool(idle_limit=3 * MIN_BYTES // 2)
    a, b = (pool.empty(BIG, torch.float32) for _ in range(2))
    assert pool.idle_bytes() == 0
    del a, b
    assert pool.idle_bytes() == 2 * MIN_BYTES  # freed when the pool next makes a block
    c = pool.empty((MIN_BYTES // 2,), torch.float32)  # another shape: a new block
    assert pool.idle_bytes() == MIN_BYTES  # one idle block was freed
    del c
    pool.clear()
    assert pool.idle_bytes() == 0


def test_a_block_first_made_in_inference_mode_serves_training_after() -> None:
    """The block's own tensor is an ordinary one even when the first output of its
    shape is asked for under `torch.inference_mode()`: a later output takes part in
    autograd."""
    pool = TensorPool()
    with torch.inference_mode():
        first = pool.empty(BIG, torch.float32)
    del first
    later = pool.empty(BIG, torch.float32).fill_(1)
    assert not later.is_inference()
    weight = torch.ones(BIG, requires_grad=True)
    (later * weight).sum().backward()
    assert torch.equal(weight.grad, later)
