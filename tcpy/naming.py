"""Every name tcpy writes into text that another tool parses: isl's notation, C and
CUDA. One table, so that no user name can ever collide with a keyword of those
languages or with a name tcpy generates.

A TC identifier (`[A-Za-z_][A-Za-z0-9_]*`) never appears as written. Each kind of
user name gets its prefix, and every prefix ends in `_`:

| prefix | what | example (TC name `and`) |
|---|---|---|
| `i_` | an index, as an isl set dimension | `i_and` |
| `s_` | a size symbol: an isl parameter and a C/CUDA constant or kernel parameter | `s_and` |
| `t_` | a tensor: an isl tuple name (arrays) and a C/CUDA pointer | `t_and` |
| `e_` | the extent of a tensor's dimension: `e_<tensor>_<dim>` | `e_and_0` |

The names tcpy generates itself contain no such prefix, so they are out of reach:
statements `S<k>` and `I<k>` (isl tuples), loop iterators `c<k>` (isl's AST), block
and thread parameters `b0..b2`, `t0..t2`, non-affine access dimensions `_o<k>`, and
every C/CUDA symbol of the generated code's own, which starts with `tc_` (`tc_status`,
`tc_acc`, `tc_kernel`, helpers). A prefixed name always has `_` as its second
character and none of these does (`tc_` has `c`).

`user_text` maps text back to the user's names for display (`tcpy compile --emit`,
messages).
"""

from __future__ import annotations

import re

INDEX = "i_"
SIZE = "s_"
TENSOR = "t_"
EXTENT = "e_"
RUNTIME = "tc_"  # the generated code's own symbols

BLOCK_PARAMS = tuple(f"b{k}" for k in range(12))  # blocks of the grid: x, y, then folded in z
THREAD_PARAMS = ("t0", "t1", "t2")


def index_name(name: str) -> str:
    return INDEX + name


def size_name(name: str) -> str:
    return SIZE + name


def tensor_name(name: str) -> str:
    return TENSOR + name


def extent_name(tensor: str, dim: int) -> str:
    return f"{EXTENT}{tensor}_{dim}"


_PREFIXED = re.compile(r"\b(?:i|s|t)_([A-Za-z_][A-Za-z0-9_]*)")


def user_text(text: str) -> str:
    """`text` (isl notation, a schedule tree, a message) with indices, sizes and
    tensors under the names the user wrote."""
    return _PREFIXED.sub(r"\1", text)
