"""JSON schemas derived from Python signatures and docstrings, and argument validation.

`function_schema(fn)` reads type hints (int, float, str, bool, list[...], dict, Literal, Optional)
and a Google-style "Args:" docstring section. Validation is `jsonschema` against that schema;
errors are phrased for the model to read and correct. Valid arguments of a schema that uses only
the keywords derived here take a shortcut (a compiled check: ~7 µs a call here against ~45 µs for
jsonschema's walk): it may say "not sure" and defer to jsonschema, never accept what it rejects.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping

import jsonschema

_SCALARS: dict[type, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}


def type_schema(tp: object) -> dict[str, object]:
    origin = typing.get_origin(tp)
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if origin is typing.Literal:
        values = list(typing.get_args(tp))
        return {"enum": values}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return type_schema(args[0])
        return {"anyOf": [type_schema(a) for a in args]}
    if origin in (list, tuple) or tp in (list, tuple):
        args = typing.get_args(tp)
        item = type_schema(args[0]) if args else {}
        return {"type": "array", "items": item}
    if origin in (dict, Mapping) or tp is dict:
        return {"type": "object"}
    raise TypeError(f"cannot derive a JSON schema for type {tp!r}")


def _arg_docs(doc: str) -> dict[str, str]:
    docs: dict[str, str] = {}
    match = re.search(r"^\s*Args:\s*$(.*?)(^\s*\w+:\s*$|\Z)", doc, re.M | re.S)
    if not match:
        return docs
    for line in match.group(1).splitlines():
        m = re.match(r"^\s*(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", line)
        if m:
            docs[m.group(1)] = m.group(2).strip()
    return docs


_SCHEMAS: dict[Callable[..., object], tuple[str, dict[str, object]]] = {}


def function_schema(fn: Callable[..., object]) -> tuple[str, dict[str, object]]:
    """(description, JSON schema of the keyword arguments) of a function.

    Derived once per function (tools are often built per episode, and reading a signature and a
    docstring costs more than the call): the schema returned is shared, so treat it as read-only.
    """
    try:
        cached = _SCHEMAS.get(fn)
    except TypeError:  # an unhashable callable object
        return _derive(fn)
    if cached is None:
        cached = _derive(fn)
        if len(_SCHEMAS) >= _MAX_VALIDATORS:
            _SCHEMAS.clear()
        _SCHEMAS[fn] = cached
    return cached


def _derive(fn: Callable[..., object]) -> tuple[str, dict[str, object]]:
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].strip()
    hints = typing.get_type_hints(fn)
    arg_docs = _arg_docs(doc)
    properties: dict[str, object] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name not in hints:
            raise TypeError(f"tool argument {fn.__name__}({name}) needs a type hint")
        prop = type_schema(hints[name])
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            prop["default"] = param.default
        properties[name] = prop
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return description, schema


Check = Callable[[object], bool]

# What JSON (`json.loads`) gives for each JSON Schema type; bool is not a number here.
_JSON_TYPES: dict[str, Check] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}
_ANNOTATIONS = frozenset({"description", "default", "title", "examples"})
_SCALARS_JSON = (str, int, float, bool, type(None))


def _accepts(schema: object) -> Check | None:
    """A check that returns True only for instances `jsonschema` finds no error in, for the
    keywords `function_schema` writes (type, enum, properties, required, additionalProperties,
    items, anyOf); None for a schema using anything else. False means "not sure": the caller asks
    jsonschema, which also words the error. So the shortcut can skip work, never accept more."""
    if not isinstance(schema, dict) or not set(schema) <= _KEYWORDS:
        return None
    checks: list[Check] = []
    if "type" in schema:
        kind = _JSON_TYPES.get(schema["type"]) if isinstance(schema["type"], str) else None
        if kind is None:
            return None
        checks.append(kind)
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not all(type(x) in _SCALARS_JSON for x in values):
            return None
        checks.append(lambda v: any(type(v) is type(x) and v == x for x in values))
    for keyword, build in _BUILDERS.items():
        if keyword in schema:
            check = build(schema[keyword])
            if check is None:
                return None
            checks.append(check)
    if "additionalProperties" in schema:
        check = _additional(schema["additionalProperties"], schema.get("properties"))
        if check is None:
            return None
        checks.append(check)
    return lambda v: all(check(v) for check in checks)


def _properties(props: object) -> Check | None:
    if not isinstance(props, dict):
        return None
    subs = {name: _accepts(sub) for name, sub in props.items()}
    if any(check is None for check in subs.values()):
        return None
    return lambda v: type(v) is dict and all(subs[k](x) for k, x in v.items() if k in subs)


def _required(names: object) -> Check | None:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return lambda v: type(v) is dict and all(n in v for n in names)


def _additional(allowed: object, props: object) -> Check | None:
    if allowed is True:
        return lambda v: True
    if allowed is not False:
        return None
    known = frozenset(props) if isinstance(props, dict) else frozenset()
    return lambda v: type(v) is dict and known.issuperset(v)


def _items(sub: object) -> Check | None:
    check = _accepts(sub)
    return None if check is None else lambda v: type(v) is list and all(check(x) for x in v)


def _any_of(subs: object) -> Check | None:
    if not isinstance(subs, list) or not subs:
        return None
    checks = [_accepts(sub) for sub in subs]
    if any(check is None for check in checks):
        return None
    return lambda v: any(check(v) for check in checks)


_BUILDERS: dict[str, Callable[[object], Check | None]] = {
    "properties": _properties,
    "required": _required,
    "items": _items,
    "anyOf": _any_of,
}
_KEYWORDS = _ANNOTATIONS | {"type", "enum", "additionalProperties", *_BUILDERS}


@dataclasses.dataclass(frozen=True, slots=True)
class _Compiled:
    validator: jsonschema.protocols.Validator
    accepts: Check | None  # the shortcut for valid arguments, where the schema allows one


def _compile(schema: Mapping[str, object]) -> _Compiled:
    plain = dict(schema)
    cls = jsonschema.validators.validator_for(plain)
    cls.check_schema(plain)
    return _Compiled(cls(plain), _accepts(plain))


_VALIDATORS: dict[int, tuple[Mapping[str, object], _Compiled]] = {}
_COMPILED: dict[str, _Compiled] = {}
_MAX_VALIDATORS = 256


def _validator(schema: Mapping[str, object]) -> _Compiled:
    """The compiled validator of a tool's schema, checked and built once per distinct schema
    (`jsonschema.validate` would redo both every call). Looked up by the schema object first, then
    by its content: tools built per episode derive an equal schema in a new dict every time."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    key = json.dumps(schema, sort_keys=True, default=repr)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = _compile(schema)
        if len(_COMPILED) >= _MAX_VALIDATORS:
            _COMPILED.clear()
        _COMPILED[key] = compiled
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, compiled)
    return compiled


def validate_arguments(schema: Mapping[str, object], arguments: object) -> str | None:
    """None when `arguments` fits `schema`, else one readable sentence saying what is wrong."""
    compiled = _validator(schema)
    if compiled.accepts is not None and compiled.accepts(arguments):
        return None
    error = jsonschema.exceptions.best_match(compiled.validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"
