"""YAML presets plus dotted overrides into a validated `RunConfig`: the one loading path.

Owns the conversion from plain data (read by `source.py`, which refuses malformed files and YAML)
plus `key=value` overrides to the typed dataclasses. It refuses, with one `ConfigError` line naming
the dotted key, the value and what is allowed: a key no dataclass declares ("did you mean" hint), a
value of the wrong type, a float that is not finite, a number outside its field's declared `bounds`
(default: the int32/float32 range of device arrays), and text with control characters. A field
that names a preset (`selects_preset`) has the preset's values filled in under the keys beside it.
Ranges and relations specific to a field stay in the dataclasses' `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from asyncrl.config.errors import (
    FLOAT32_MAX,
    INT32_MAX,
    INT32_MIN,
    Bounds,
    ConfigError,
    abbreviate,
    declared_bounds,
    did_you_mean,
)
from asyncrl.config.presets import PRESETS_KEY
from asyncrl.config.run import RunConfig
from asyncrl.config.source import MAX_SCALAR, parse_value, parse_yaml, read_config_file

_INT32 = Bounds(INT32_MIN, INT32_MAX, "the int32 range of device arrays")
_FLOAT32 = Bounds(-FLOAT32_MAX, FLOAT32_MAX, "the float32 range of device arrays")


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML preset (or start from defaults), apply `key=value` overrides, validate."""
    data = {} if path is None else parse_yaml(read_config_file(path), source=str(path))
    return _build(data, overrides)


def load_config_text(
    text: str, overrides: Sequence[str] = (), source: str = "<config text>"
) -> RunConfig:
    """The same from YAML text (how a pipeline passes its config: one string parameter)."""
    return _build(parse_yaml(text, source), overrides)


def _build(data: dict[str, object], overrides: Sequence[str]) -> RunConfig:
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return from_dict(RunConfig, data)


def parse_override(item: str) -> tuple[str, object]:
    """Split "learner.lr=3e-6" into its key and a YAML-typed value (plain text if not YAML)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(abbreviate(item), "an override must look like section.key=value")
    if not all(part.strip() for part in key.split(".")):
        raise ConfigError(abbreviate(key), "an override key is dotted names such as learner.lr")
    return key, parse_value(raw, key) if raw.strip() else ""


def from_dict(cls: type, data: object, prefix: str = "") -> typing.Any:
    """Build dataclass `cls` from a mapping, checking keys, types and bounds; errors name keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix or "<root>", f"expected a mapping of keys, got a {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    data = _expand_presets(cls, dict(data), prefix)
    hints = _hints(cls)
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            raise ConfigError(
                abbreviate(dotted),
                f"unknown key{did_you_mean(str(key), fields, prefix)}; "
                f"allowed keys: {', '.join(fields)}",
            )
        kwargs[key] = _convert(hints[key], value, dotted, declared_bounds(fields[key].metadata))
    try:
        return cls(**kwargs)
    except ConfigError as e:
        # Section validators name their own field; cross-section validators already name full keys.
        raise (e if "." in e.key or not prefix else e.under(prefix)) from None


def to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML that `load_config` reads back to an equal config."""
    return yaml.dump(config.to_dict(), Dumper=_PlainDumper, sort_keys=False)


class _PlainDumper(yaml.SafeDumper):
    """Never writes anchors/aliases (the loader refuses them), even for repeated values."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _expand_presets(cls: type, data: dict[str, object], prefix: str) -> dict[str, object]:
    """Fill the defaults of a preset named by a field declared with `selects_preset`."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(PRESETS_KEY)
        if spec is None or f.name not in data:
            continue
        table, custom = spec
        key = f"{prefix}.{f.name}" if prefix else f.name
        name = _convert(_hints(cls)[f.name], data[f.name], key, None)
        if name == custom:
            continue
        if name not in table:
            raise ConfigError(
                key,
                f"unknown preset {abbreviate(repr(name))}{did_you_mean(str(name), table)}; "
                f"allowed: {', '.join([*table, custom])}",
            )
        data = {**table[str(name)], **data}
    return data


@functools.cache
def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _convert(tp: typing.Any, value: object, key: str, bounds: Bounds | None) -> object:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, key)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if isinstance(value, list | dict) or value not in allowed:
            hint = did_you_mean(str(value), [str(a) for a in allowed])
            raise ConfigError(
                key, f"got {_shown(value)}{hint}; allowed: {', '.join(map(str, allowed))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key, bounds)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(tp)
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ConfigError(key, f"got {_shown(value)}; expected a list")
        return tuple(_convert(inner, v, f"{key}[{i}]", bounds) for i, v in enumerate(value))
    return _scalar(tp, value, key, bounds)


def _scalar(tp: type, value: object, key: str, bounds: Bounds | None) -> object:
    if tp is bool and isinstance(value, bool):
        return value
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return _in_bounds(value, value, key, bounds or _INT32, "integer")
    if tp is float:
        number = _as_float(value)
        if number is not None:
            return _in_bounds(number, value, key, bounds or _FLOAT32, "number")
    if tp is str and isinstance(value, str):
        if len(value) > MAX_SCALAR or not value.isprintable():
            raise ConfigError(
                key,
                f"got {_shown(value)}; allowed: text of at most {MAX_SCALAR} printable "
                "characters (no newlines or control characters)",
            )
        return value
    if tp not in (bool, int, float, str):  # pragma: no cover - a programming error
        raise TypeError(f"unsupported config field type {tp!r} at {key}")
    raise ConfigError(
        key, f"got {_shown(value)} ({_kind(value)}); expected {_article(tp.__name__)}"
    )


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    # PyYAML reads "3e-6" (no dot) as a string; accept any numeric spelling.
    try:
        return float(value)
    except ValueError:
        return None
    except OverflowError:  # an int beyond float range
        return math.inf


def _in_bounds(value: float, given: object, key: str, bounds: Bounds, kind: str) -> float:
    ok = math.isfinite(value)
    ok = ok and (bounds.lo is None or value >= bounds.lo)
    ok = ok and (bounds.hi is None or value <= bounds.hi)
    if not ok:
        raise ConfigError(key, f"got {_shown(given)}; allowed: {bounds.describe(kind)}")
    return value


def _set_dotted(data: dict[str, object], key: str, value: object) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:  # absent, or an empty section (`learner:` with nothing under it)
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
        node = child
    node[parts[-1]] = value


def _shown(value: object) -> str:
    return abbreviate(repr(value))


def _kind(value: object) -> str:
    return {dict: "mapping", list: "list", NoneType: "null"}.get(type(value), type(value).__name__)


def _article(name: str) -> str:
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


NoneType = type(None)
