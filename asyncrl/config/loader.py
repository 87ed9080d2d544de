"""YAML presets plus dotted overrides into a validated `RunConfig`: the one loading path.

Owns the conversion from untyped input (a file, YAML text, `key=value` strings) to the typed
dataclasses, and refuses, with one `ConfigError` line naming the file or dotted key, the value and
what is allowed:
- a file that is missing, a folder, not a regular file, larger than MAX_CONFIG_BYTES, binary, not
  UTF-8, or empty of settings (blank or only comments);
- YAML nested deeper than MAX_DEPTH, with anchors or aliases (an alias bomb costs memory before any
  check could run), merge keys, non-scalar keys, a key given twice, or a scalar over MAX_SCALAR;
- a key no dataclass declares ("did you mean" hint), a value of the wrong type, a float that is not
  finite, and a number outside the field's declared `bounds` (default: the int32/float32 range).
Ranges and relations specific to a field stay in the dataclasses' `__post_init__`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import stat
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

MAX_CONFIG_BYTES = 256 * 1024  # the largest shipped config is ~3 KiB
MAX_DEPTH = 8  # run > section > list is 3 levels; deeper input is a mistake or an attack
MAX_SCALAR = 4096  # characters in one value (also keeps int parsing far from CPython's limit)
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


def read_config_file(path: str | Path) -> str:
    """The text of a config file; anything but a small UTF-8 regular file is refused."""
    source = str(path)
    try:
        st = Path(path).stat()
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError("", "is a folder; expected a YAML file", source=source)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("", "is not a regular file; expected a YAML file", source=source)
        if st.st_size > MAX_CONFIG_BYTES:
            raise _too_large(st.st_size, source)
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError("", "not found", source=source) from None
    except NotADirectoryError:
        raise ConfigError("", "not found (a parent is a file)", source=source) from None
    except OSError as e:
        raise ConfigError("", f"cannot be read ({e.strerror or e})", source=source) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise _too_large(len(data), source)
    if b"\0" in data:
        at = data.index(b"\0")
        raise ConfigError(
            "", f"is binary (a NUL byte at offset {at}); expected YAML text", source=source
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(
            "", f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})", source=source
        ) from None


def _too_large(size: int, source: str) -> ConfigError:
    return ConfigError("", f"is {size} bytes; at most {MAX_CONFIG_BYTES} allowed", source=source)


def parse_yaml(text: str, source: str) -> dict[str, object]:
    """A mapping of sections from YAML text, under the limits above."""
    if len(text) > MAX_CONFIG_BYTES:
        raise _too_large(len(text.encode("utf-8", "replace")), source)
    loaded = _safe_yaml(text, source, key="")
    if loaded is _EMPTY:
        raise ConfigError(
            "",
            "holds no settings (it is empty or only comments); expected sections such as "
            "'learner:'",
            source=source,
        )
    if not isinstance(loaded, dict):
        raise ConfigError(
            "", f"must hold a mapping of sections, got a {_kind(loaded)}", source=source
        )
    return loaded


def parse_override(item: str) -> tuple[str, object]:
    """Split "learner.lr=3e-6" into its key and a YAML-typed value (plain text if not YAML)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(abbreviate(item), "an override must look like section.key=value")
    if not all(part.strip() for part in key.split(".")):
        raise ConfigError(abbreviate(key), "an override key is dotted names such as learner.lr")
    if not raw.strip():
        return key, ""
    try:
        value = _safe_yaml(raw, f"override {key}", key=key)
    except ConfigError as e:
        if e.message.startswith("is not valid YAML"):
            return key, raw
        raise
    return key, "" if value is _EMPTY else value


_EMPTY = object()  # a YAML document with no content (blank or only comments)


def _safe_yaml(text: str, source: str, key: str) -> object:
    loader = None
    try:
        loader = _StrictLoader(text, key)  # checks the characters first
        node = loader.get_single_node()
        if node is None:
            return _EMPTY
        _check_keys(node, [key] if key else [])
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(e.problem or e.context or "").split())
        raise ConfigError(key, f"is not valid YAML{where}: {problem}", source=source) from None
    except yaml.YAMLError as e:
        raise ConfigError(key, f"is not valid YAML: {e}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases and nesting deeper than MAX_DEPTH while composing,
    before anything is built (so an alias bomb or a deep document never costs memory or stack)."""

    def __init__(self, text: str, key: str) -> None:
        super().__init__(text)
        self._path: list[str] = [key] if key else []
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        part = index.value if isinstance(index, yaml.ScalarNode) else None
        part = f"[{index}]" if isinstance(index, int) else part
        if part is not None:
            self._path.append(str(part))
        try:
            return self._compose_checked(parent, index)
        finally:
            if part is not None:
                self._path.pop()

    def _compose_checked(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        where = _dotted(self._path) or "<root>"
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            name = getattr(event, "anchor", "")
            raise ConfigError(
                where,
                f"YAML anchor/alias '{abbreviate(name)}' (line "
                f"{event.start_mark.line + 1}); anchors and aliases are not allowed",
            )
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_SCALAR:
            raise ConfigError(
                where, f"a value of {len(event.value)} characters; at most {MAX_SCALAR}"
            )
        nests = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
        if nests and self._depth >= MAX_DEPTH:
            raise ConfigError(
                where,
                f"YAML nested deeper than {MAX_DEPTH} levels (line "
                f"{event.start_mark.line + 1}); configs are sections of keys",
            )
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests


def _check_keys(node: yaml.Node, path: list[str]) -> None:
    """Every mapping key is a plain scalar, not a merge key, and given once (YAML itself lets
    the last duplicate win silently)."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_keys(item, [*path, f"[{i}]"])
    if not isinstance(node, yaml.MappingNode):
        return
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(
                _dotted(path) or "<root>", f"a non-scalar key at line {line}; keys are plain names"
            )
        name = key_node.value
        here = _dotted([*path, name])
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise ConfigError(here, f"a merge key (line {line}); merge keys are not allowed")
        if name in seen:
            raise ConfigError(
                here,
                f"given twice (lines {seen[name]} and {line}); each key and "
                "section may appear once",
            )
        seen[name] = line
        _check_keys(value_node, [*path, name])


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


def _dotted(path: list[str]) -> str:
    return "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(path))


def _shown(value: object) -> str:
    return abbreviate(repr(value))


def _kind(value: object) -> str:
    return {dict: "mapping", list: "list", NoneType: "null"}.get(type(value), type(value).__name__)


def _article(name: str) -> str:
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


NoneType = type(None)
