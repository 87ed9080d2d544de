"""The one error type of configuration, the "did you mean" hint, and declared field bounds.

Owns how a bad configuration is reported: every message is one line naming the dotted key (or the
file), the value found (abbreviated) and what is allowed. A field may declare bounds with
`field(metadata=bounds(...))`; the loader enforces them with the checks every number gets
(finite floats, ints within int32), so a section opts in without code of its own.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Where numbers end up: device arrays are int32/float32 (JAX without x64), so a config value
# beyond these would wrap or become inf there. A field may narrow them with `bounds`.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
# Longest wait any timeout or budget may ask for: 30 days (time.sleep and thread waits raise
# OverflowError far beyond this; nothing in a run legitimately waits longer).
MAX_SECONDS = 30 * 24 * 3600.0
_VALUE_CHARS = 80
BOUNDS_KEY = "asyncrl.config.bounds"


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range.

    `key` is the dotted path of the offending field ("learner.lr"); a section raises with its own
    field name and the loader prefixes the section path while the error travels up. A problem of
    the whole file (unreadable, not YAML) has an empty key and names the file as `source`.
    """

    def __init__(self, key: str, message: str, *, source: str = "") -> None:
        where = (
            f"config key '{abbreviate(key, 120)}'" if key else f"config file '{abbreviate(source)}'"
        )
        super().__init__(f"{where}: {' '.join(message.split())}")
        self.key = key
        self.message = message
        self.source = source

    def under(self, prefix: str) -> ConfigError:
        """The same error with its key placed under the section `prefix`."""
        return ConfigError(f"{prefix}.{self.key}" if prefix else self.key, self.message)


def abbreviate(value: object, limit: int = _VALUE_CHARS) -> str:
    """`repr`-like text of a value, cut to `limit` characters (a message stays one short line)."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else f"{text[: limit - 15]}...({len(text)} chars)"


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """A " (did you mean 'section.x'?)" hint for near-misses, or an empty string."""
    close = difflib.get_close_matches(word[:100], list(choices), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean '{prefix}.{close[0]}'?)" if prefix else f" (did you mean '{close[0]}'?)"


def require(condition: bool, key: str, value: object, allowed: str) -> None:
    """Raise a ConfigError for `key` unless `condition` holds; `allowed` says what is valid."""
    if not condition:
        raise ConfigError(key, f"got {abbreviate(repr(value))}; allowed: {allowed}")


@dataclass(frozen=True, slots=True)
class Bounds:
    """Inclusive range of a numeric field (or of each element of a tuple field)."""

    lo: float | None = None
    hi: float | None = None
    why: str = ""

    def describe(self, kind: str) -> str:
        lo = "-inf" if self.lo is None else _num(self.lo)
        hi = "inf" if self.hi is None else _num(self.hi)
        kind = "a finite number" if kind == "number" else f"an {kind}"
        return f"{kind} in [{lo}, {hi}]" + (f" ({self.why})" if self.why else "")


def bounds(lo: float | None = None, hi: float | None = None, why: str = "") -> dict[str, Bounds]:
    """Field metadata declaring a numeric field's range: `field(default=1.0, metadata=...)`."""
    return {BOUNDS_KEY: Bounds(lo, hi, why)}


def seconds(lo: float = 0.0) -> dict[str, Bounds]:
    """Metadata of a duration in seconds: at least `lo`, at most MAX_SECONDS."""
    return bounds(lo, MAX_SECONDS, "seconds, at most 30 days")


def declared_bounds(metadata: Mapping[str, object]) -> Bounds | None:
    found = metadata.get(BOUNDS_KEY)
    return found if isinstance(found, Bounds) else None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"
