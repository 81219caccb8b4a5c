"""Source mutations for front-end robustness.

Starting from valid programs (the corpus and the parser's golden inputs), a few random
edits (delete a span, insert or substitute a TC token, duplicate a span, rename an
identifier) give text that is usually invalid in an interesting way: the front end must
answer it with a `TCError`, never another exception and never a hang.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOKENS = [
    "def",
    "(",
    ")",
    "{",
    "}",
    ",",
    "->",
    "=",
    "+=",
    "+=!",
    "*=!",
    "min=!",
    "max=",
    "max=!",
    "*=",
    "min=",
    "<=>",
    "where",
    "in",
    ":",
    "exists",
    "?",
    "&&",
    "||",
    "!",
    "<",
    "<=",
    "==",
    "!=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "min",
    "max",
    "float",
    "double",
    "int32",
    "int64",
    "bool",
    "float16",
    "uint8",
    "A",
    "B",
    "O",
    "i",
    "j",
    "k",
    "N",
    "M",
    "0",
    "1",
    "3",
    "-1",
    "2147483648",
    "99999999999",
    "1.5",
    ".5",
    "1e-3",
    "1e40",
    "exp",
    "fmax",
    "pow",
    "and",
    "nan",
    "inf",
    "INFINITY",
    "ceild",
    "tc_status",
    "#c\n",
    "\n",
    " ",
    "(((((",
    ")))))",
]
# Names a rename may introduce: builtins, keywords and names of the generated code.
RENAMES = ["exp", "pow", "min", "float", "and", "nan", "inf", "INFINITY", "ceild", "tc_status"]


def seed_sources() -> list[str]:
    """The valid programs mutations start from."""
    paths = sorted((ROOT / "tests" / "corpus").glob("*.tc"))
    paths += sorted((ROOT / "tests" / "golden" / "parse").glob("*.tc"))
    return [p.read_text() for p in paths]


AMPLIFIED = 0.02
"""The share of mutations that also repeat a span of the source many times (`amplify`)."""


def amplify(text: str, rng: random.Random) -> str:
    """`text` with a span repeated many times: to some tens of kilobytes (a large
    source the front end must still read), or past the source size limit of 1 MB
    (refused at once), the span being the whole source (its defs defined again), a
    def, or any few characters."""
    if not text:
        return text
    defs = [m.start() for m in re.finditer(r"\bdef\b", text)] + [len(text)]
    match rng.choice(("whole", "def", "span")):
        case "whole":
            a, b = 0, len(text)
        case "def" if len(defs) > 1:
            k = rng.randrange(len(defs) - 1)
            a, b = defs[k], defs[k + 1]
        case _:
            a = rng.randrange(len(text))
            b = rng.randint(a + 1, min(len(text), a + 200))
    size = rng.choice((rng.randint(10_000, 64_000), rng.randint(1_000_001, 4_000_000)))
    times = max(1, size // max(1, b - a))
    return text[:b] + text[a:b] * times + text[b:]


def mutate(text: str, rng: random.Random) -> str:
    """`text` after one to four random edits (and, once in a while, `amplify`)."""
    if rng.random() < AMPLIFIED:
        text = amplify(text, rng)
    for _ in range(rng.randint(1, 4)):
        if not text:
            break
        a = rng.randrange(len(text))
        b = rng.randint(a, min(len(text), a + 12))
        match rng.choice(("delete", "insert", "duplicate", "replace", "rename")):
            case "delete":
                text = text[:a] + text[b:]
            case "insert":
                text = text[:a] + rng.choice(TOKENS) + text[a:]
            case "duplicate":
                text = text[:b] + text[a:b] + text[b:]
            case "replace":
                text = text[:a] + rng.choice(TOKENS) + text[b:]
            case "rename":
                names = sorted(set(re.findall(r"[A-Za-z_]\w*", text)))
                if names:
                    old, new = rng.choice(names), rng.choice(names + RENAMES)
                    text = re.sub(rf"\b{old}\b", new, text, count=rng.randint(1, 3))
    return text


def token_soup(rng: random.Random) -> str:
    """Random tokens, some inside a def so that the statement grammar is reached."""
    soup = " ".join(rng.choice(TOKENS) for _ in range(rng.randint(0, 60)))
    return f"def f(float(N) A) -> (B) {{ {soup} }}" if rng.random() < 0.5 else soup
