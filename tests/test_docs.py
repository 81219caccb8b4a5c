"""The guide's examples run, and print what the guide says they print.

Each ```python block of `docs/guide.md` runs in a fresh directory and cache. A block
that does not begin with an import continues the namespace of the block before it (the
guide's sections build on a preamble). When a ```text block follows, the printed
output must match it, up to what changes from run to run: times, cache keys, and the
tuner's timings."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"

_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)

# what varies from run to run, masked on both sides before comparing
_VARYING = [
    (re.compile(r"\d+(\.\d+)? ms"), "<time>"),
    (re.compile(r"\d+\.\d+x"), "<ratio>"),
    (re.compile(r"key [0-9a-f]{12}"), "key <key>"),
    (re.compile(r"\b\d+ (trials|candidates)"), r"<n> \1"),  # the search follows the times
    (re.compile(r"(tcpy(::|\.)\w+?)_[0-9a-f]{12}\b"), r"\1_<digest>"),  # a hash of the source
]


def _examples() -> list[tuple[int, str, str | None, bool]]:
    """(line, code, expected output or None, continues the previous block)."""
    text = GUIDE.read_text()
    blocks = [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), m.end())
              for m in _BLOCK.finditer(text)]  # fmt: skip
    examples = []
    for k, (line, lang, body, end) in enumerate(blocks):
        if lang != "python":
            continue
        expected = None
        if k + 1 < len(blocks) and blocks[k + 1][1] == "text":
            between = text[end : text.index("```text", end)]
            after = blocks[k + 1][2]
            # output that follows at once, or after a sentence that introduces it, and is
            # the program's own (not a shell session)
            if (not between.strip() or between.strip().endswith(":")) and not after.startswith("$"):
                expected = after
        examples.append((line, body, expected, not body.startswith("import")))
    return examples


def _masked(text: str) -> str:
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return text.strip()


def test_the_guide_has_examples() -> None:
    examples = _examples()
    assert len(examples) >= 10
    assert sum(expected is not None for _, _, expected, _ in examples) >= 8


def test_the_guides_examples_print_what_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")  # section 4 passes PyTorch tensors
    monkeypatch.setenv("TCPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for line, code, expected, continues in _examples():
        if not continues:
            namespace = {"__name__": f"guide_line_{line}"}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            exec(compile(code, f"{GUIDE.name}:{line}", "exec"), namespace)
        if expected is None:
            continue
        if "\n...\n" in expected:  # the guide shows a part of the output
            head, _, tail = expected.partition("\n...\n")
            got = _masked(printed.getvalue())
            assert got.startswith(_masked(head)), f"the example at line {line}"
            assert got.endswith(_masked(tail)), f"the example at line {line}"
        else:
            assert _masked(printed.getvalue()) == _masked(expected), f"the example at line {line}"
