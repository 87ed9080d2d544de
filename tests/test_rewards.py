"""Rewards: `normalize`'s fast path for plain decimals against the Fraction-parsing reference."""

import random
import re
from fractions import Fraction

from asyncrl.rewards import exact_match, format_ok, normalize
from asyncrl.types import Task

_NUMBER = re.compile(r"^[-+]?\d+(\.\d+)?$")


def reference_normalize(text: str) -> str | Fraction:
    """The definition: every number parsed by `Fraction` from its text."""
    t = text.strip().rstrip(".").replace(",", "")
    if _NUMBER.match(t):
        return Fraction(t)
    return t.casefold()


def _outcome(fn, text):
    try:
        value = fn(text)
    except Exception as e:  # the digit limit of int(): both must fail alike
        return ("raised", type(e), str(e))
    return ("value", type(value), value)


# Unicode digits (`\d` reads them, so does Fraction), look-alikes that are not digits, every
# whitespace `strip()` removes, and the characters a number's syntax is made of.
DIGITS = "0123456789"
HOSTILE = "٣５𝟓०²½" + " \t\n\r\x0b\x0c\u00a0\u2003\u3000" + "+-.,_eE/xİßΣ"


def _random_text(rng: random.Random) -> str:
    if rng.random() < 0.6:  # shaped like a number, with hostile decoration
        parts = [rng.choice(["", "", "+", "-", "--", " -"])]
        parts.append("".join(rng.choices(DIGITS, k=rng.choice([1, 2, 5, 30]))))
        if rng.random() < 0.5:
            parts.append("." + "".join(rng.choices(DIGITS, k=rng.choice([0, 1, 3, 20]))))
        if rng.random() < 0.3:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(HOSTILE))
        tail = rng.choice(["", "", ".", "..", ",", "\n", ".\n", "\n.", " ", "%"])
        return "".join(parts) + tail
    return "".join(rng.choices(DIGITS + HOSTILE + "ab", k=rng.randrange(0, 12)))


EDGES = [
    "", " ", ".", "-", "+", "0", "-0", "+0", "00", "-00.000", "1.", ".5", "1.5.", "1..5",
    "1,000", "1,000.50", ",,1,,", "1_000", "1e3", "1/2", "١٢٣", "１２", "٣.٥", "5\n", "5\n.",
    " 5 \n", "5\n\n", "\u30005\u3000", "-٣", "4164", "391.0", "+391.000",
    "9" * 4300, "9" * 4301, "-" + "9" * 4301, "1." + "9" * 4301, "9" * 4300 + "." + "9" * 4300,
]  # fmt: skip


def test_normalize_equals_the_fraction_reference_on_hostile_and_random_text():
    rng = random.Random(0)
    texts = EDGES + [_random_text(rng) for _ in range(20_000)]
    numeric = 0
    for text in texts:
        expected = _outcome(reference_normalize, text)
        assert _outcome(normalize, text) == expected, repr(text)
        numeric += expected[1] is Fraction
    assert numeric > 5_000  # the fast path was exercised, not only the text path


def test_numbers_compare_by_value_and_text_by_casefold():
    task = Task(id="t", family="calculator", prompt="?", answer="391", environment="tool")
    assert exact_match(task, "391.0") == exact_match(task, "+391.") == 1.0
    assert exact_match(task, "391.5") == exact_match(task, "3910") == 0.0
    words = Task(id="w", family="w", prompt="?", answer="Straße", environment="tool")
    assert exact_match(words, " STRASSE ") == 1.0
    assert format_ok(task, "1,000") == 1.0 and format_ok(task, "about 3") == 0.0
