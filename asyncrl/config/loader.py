"""YAML presets plus dotted overrides into a validated `RunConfig`.

Owns the conversion from untyped data (YAML, `key=value` strings) to the typed dataclasses: each
value is checked against its field's declared type, an unknown key is an error with a "did you mean"
hint, and any error carries the full dotted key. Validation of ranges stays in the dataclasses.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from asyncrl.config.errors import ConfigError, did_you_mean
from asyncrl.config.presets import MODEL_PRESETS
from asyncrl.config.run import RunConfig

# `model.preset: custom` starts from the ModelConfig defaults: every shape key is given explicitly.
CUSTOM_PRESET = "custom"


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML preset (or start from defaults), apply `key=value` overrides, validate."""
    text = Path(path).read_text() if path is not None else ""
    return load_config_text(text, overrides, source=str(path) if path is not None else "<defaults>")


def load_config_text(
    text: str, overrides: Sequence[str] = (), source: str = "<config text>"
) -> RunConfig:
    """The same from YAML text (how a pipeline passes its config: one string parameter)."""
    try:
        loaded = yaml.safe_load(text) if text else None
    except yaml.YAMLError as e:
        raise ConfigError("<file>", f"{source} is not valid YAML: {e}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(
            "<file>", f"{source} must hold a mapping of sections, got a {_kind(loaded)}"
        )
    data: dict[str, object] = loaded or {}
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return from_dict(RunConfig, data)


def parse_override(item: str) -> tuple[str, object]:
    """Split "learner.lr=3e-6" into its key and a YAML-typed value."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(item, "an override must look like section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def from_dict(cls: type, data: object, prefix: str = "") -> typing.Any:
    """Build dataclass `cls` from a mapping, checking keys and types; errors name dotted keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(prefix or "<root>", f"expected a mapping of keys, got a {_kind(data)}")
    data = dict(data)
    if cls.__name__ == "ModelConfig" and "preset" in data:
        data = _expand_preset(data, prefix)
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in hints:
            raise ConfigError(
                dotted,
                f"unknown key{did_you_mean(str(key), names, prefix)}; "
                f"allowed keys: {', '.join(names)}",
            )
        kwargs[key] = _convert(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        # Section validators name their own field; cross-section validators already name full keys.
        raise (e if "." in e.key or not prefix else e.under(prefix)) from None


def to_yaml(config: RunConfig) -> str:
    """The resolved config as YAML that `load_config` reads back to an equal config."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)


def _expand_preset(data: dict[str, object], prefix: str) -> dict[str, object]:
    name = data["preset"]
    if name == CUSTOM_PRESET:
        return data
    if name not in MODEL_PRESETS:
        raise ConfigError(
            f"{prefix}.preset" if prefix else "preset",
            f"unknown preset {name!r}{did_you_mean(str(name), MODEL_PRESETS)}; "
            f"allowed: {', '.join([*MODEL_PRESETS, CUSTOM_PRESET])}",
        )
    return {**MODEL_PRESETS[str(name)], **data}


@functools.cache
def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _convert(tp: typing.Any, value: object, key: str) -> object:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, key)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            hint = did_you_mean(str(value), [str(a) for a in allowed])
            raise ConfigError(key, f"got {value!r}{hint}; allowed: {', '.join(map(str, allowed))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, key)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(tp)
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise ConfigError(key, f"got {value!r}; expected a list")
        return tuple(_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value))
    return _scalar(tp, value, key)


def _scalar(tp: type, value: object, key: str) -> object:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        # PyYAML reads "3e-6" (no dot) as a string; accept any numeric spelling.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - a field type this loader does not know is a programming error
        raise TypeError(f"unsupported config field type {tp!r} at {key}")
    raise ConfigError(key, f"got {value!r} ({_kind(value)}); expected {_article(tp.__name__)}")


def _set_dotted(data: dict[str, object], key: str, value: object) -> None:
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
        node = child
    node[parts[-1]] = value


def _kind(value: object) -> str:
    return {dict: "mapping", list: "list", NoneType: "null"}.get(type(value), type(value).__name__)


def _article(name: str) -> str:
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


NoneType = type(None)
