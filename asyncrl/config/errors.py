"""The one error type of configuration, and the "did you mean" hint.

Owns how a bad configuration is reported: every message names the dotted key, the value found and
what is allowed. It does not decide what is allowed; the dataclasses and the loader do.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range.

    `key` is the dotted path of the offending field ("learner.lr"); a section raises with its own
    field name and the loader prefixes the section path while the error travels up.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}")
        self.key = key
        self.message = message

    def under(self, prefix: str) -> ConfigError:
        """The same error with its key placed under the section `prefix`."""
        return ConfigError(f"{prefix}.{self.key}" if prefix else self.key, self.message)


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """A " (did you mean 'section.x'?)" hint for near-misses, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean '{prefix}.{close[0]}'?)" if prefix else f" (did you mean '{close[0]}'?)"


def require(condition: bool, key: str, value: object, allowed: str) -> None:
    """Raise a ConfigError for `key` unless `condition` holds; `allowed` says what is valid."""
    if not condition:
        raise ConfigError(key, f"got {value!r}; allowed: {allowed}")
