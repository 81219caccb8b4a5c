"""Golden files: compare with the stored text, or rewrite it under --accept.

A mismatch writes the actual text beside the golden as `<name>.actual` so that the
difference can be inspected (and accepted with `pytest --accept`)."""

from __future__ import annotations

from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def check_golden(relative: str, actual: str, accept: bool) -> None:
    path = GOLDEN / relative
    actual = actual.rstrip("\n") + "\n"
    if accept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    scratch = path.with_name(path.name + ".actual")
    if not path.exists():
        scratch.write_text(actual)
        raise AssertionError(f"no golden file {path}; run pytest --accept to create it")
    if path.read_text() != actual:
        scratch.write_text(actual)
        raise AssertionError(f"{path} differs from the output (see {scratch.name})")
    scratch.unlink(missing_ok=True)
