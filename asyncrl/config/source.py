"""Config input as plain data: a file or YAML text read under limits, before any typing.

Owns what the loader refuses before it looks at a single key, each with one `ConfigError` line
naming the file or the dotted key:
- a file that is missing, a folder, not a regular file (a FIFO would block, /dev/zero never ends),
  larger than MAX_CONFIG_BYTES, binary, not UTF-8, or without settings (blank or only comments);
- YAML nested deeper than MAX_DEPTH, with anchors or aliases (an alias bomb costs memory before any
  check could run), merge keys, non-scalar keys, a key or section given twice (YAML itself lets the
  last one win silently), or one value longer than MAX_SCALAR characters.
It does not know the config's sections: `loader.py` turns the data into dataclasses.
"""

from __future__ import annotations

import stat
import typing
from pathlib import Path

import yaml

from asyncrl.config.errors import ConfigError, abbreviate

MAX_CONFIG_BYTES = 256 * 1024  # the largest shipped config is ~3 KiB
MAX_DEPTH = 8  # run > section > list is 3 levels; deeper input is a mistake or an attack
MAX_SCALAR = 4096  # characters in one value (also keeps int parsing far from CPython's limit)


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


def parse_value(raw: str, key: str) -> object:
    """One override's value as YAML under the same limits; text that is not YAML stays text."""
    try:
        value = _safe_yaml(raw, f"override {key}", key=key)
    except ConfigError as e:
        if e.message.startswith("is not valid YAML"):
            return raw
        raise
    return "" if value is _EMPTY else value


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
    except ConfigError:
        raise
    except (
        ValueError,
        OverflowError,
    ) as e:  # a scalar that resolves but does not build: 2024-13-45
        raise ConfigError(key, f"is not valid YAML: {e}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases and nesting deeper than MAX_DEPTH while composing,
    before anything is built (so an alias bomb or a deep document never costs memory or stack)."""

    # No config value is a date: "2024-12-01" stays text (a run id), never a datetime.date.
    yaml_implicit_resolvers: typing.ClassVar = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

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


def _dotted(path: list[str]) -> str:
    return "".join(p if p.startswith("[") or i == 0 else f".{p}" for i, p in enumerate(path))


def _kind(value: object) -> str:
    return {dict: "mapping", list: "list", type(None): "null"}.get(
        type(value), type(value).__name__
    )
