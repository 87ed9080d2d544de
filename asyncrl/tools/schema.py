"""JSON schemas derived from Python signatures and docstrings, and argument validation.

`function_schema(fn)` reads type hints (int, float, str, bool, list[...], dict, Literal, Optional)
and a Google-style "Args:" docstring section. Validation is `jsonschema` against that schema;
errors are phrased for the model to read and correct.
"""

from __future__ import annotations

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


_VALIDATORS: dict[int, tuple[Mapping[str, object], jsonschema.protocols.Validator]] = {}
_COMPILED: dict[str, jsonschema.protocols.Validator] = {}
_MAX_VALIDATORS = 256


def _validator(schema: Mapping[str, object]) -> jsonschema.protocols.Validator:
    """The compiled validator of a tool's schema, checked and built once per distinct schema
    (`jsonschema.validate` would redo both every call). Looked up by the schema object first, then
    by its content: tools built per episode derive an equal schema in a new dict every time."""
    cached = _VALIDATORS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    key = json.dumps(schema, sort_keys=True, default=repr)
    validator = _COMPILED.get(key)
    if validator is None:
        cls = jsonschema.validators.validator_for(dict(schema))
        cls.check_schema(dict(schema))
        validator = cls(dict(schema))
        if len(_COMPILED) >= _MAX_VALIDATORS:
            _COMPILED.clear()
        _COMPILED[key] = validator
    if len(_VALIDATORS) >= _MAX_VALIDATORS:
        _VALIDATORS.clear()
    _VALIDATORS[id(schema)] = (schema, validator)
    return validator


def validate_arguments(schema: Mapping[str, object], arguments: object) -> str | None:
    """None when `arguments` fits `schema`, else one readable sentence saying what is wrong."""
    error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"
