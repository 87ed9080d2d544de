"""Frozen dataclass records to JSON and back, checked against their declared types.

Owns the one codec of the run folder's result files (and of other small JSON records): `encode`
turns a record into plain JSON data; `decode(cls, data)` rebuilds it, checking every field against
its type hint (bool, int, float — finite —, str, None, Enums, tuples, `dict[str, X]`, nested
records) and raising `RecordError` that names the dotted field, the value and what was expected.
It knows nothing of files; `run_layout.py` owns where records live and how they are written.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping

T = typing.TypeVar("T")


class RecordError(ValueError):
    """Data that does not describe a record of the expected type."""


def encode(record: object) -> object:
    """Plain JSON data (dicts, lists, numbers, strings) of a record or value."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: encode(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, enum.Enum):
        return record.value
    if isinstance(record, tuple | list):
        return [encode(v) for v in record]
    if isinstance(record, Mapping):
        return {str(k): encode(v) for k, v in record.items()}
    return record


def decode(cls: type[T], data: object, where: str = "") -> T:
    """The record `cls` described by `data`; every field checked (see the module docstring)."""
    return typing.cast(T, _value(cls, data, where or cls.__name__))


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _fail(where: str, value: object, expected: str) -> typing.NoReturn:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise RecordError(f"{where}: got {shown}; expected {expected}")


def _record(cls: type, data: object, where: str) -> object:
    if not isinstance(data, Mapping):
        _fail(where, data, "an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        _fail(f"{where}.{unknown[0]}", data[unknown[0]], f"one of the fields {', '.join(fields)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                _fail(f"{where}.{name}", None, "a value (the field is missing)")
            continue
        kwargs[name] = _value(_hints(cls)[name], data[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecordError(f"{where}: {e}") from None


def _value(tp: object, data: object, where: str) -> object:
    if dataclasses.is_dataclass(tp):
        return _record(typing.cast(type, tp), data, where)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {tp!r} at {where}")
        return _value(inner[0], data, where)
    if origin is typing.Literal:
        if data not in args:
            _fail(where, data, f"one of {', '.join(map(repr, args))}")
        return data
    if origin is tuple:
        return _tuple(args, data, where)
    if origin is dict:
        if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
            _fail(where, data, "an object with string keys")
        return {k: _value(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(data)
        except ValueError:
            _fail(where, data, f"one of {', '.join(repr(m.value) for m in tp)}")
    return _scalar(tp, data, where)


def _tuple(args: tuple, data: object, where: str) -> tuple:
    if not isinstance(data, list | tuple):
        _fail(where, data, "a list")
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
    if len(data) != len(args):
        _fail(where, data, f"a list of {len(args)} items")
    return tuple(
        _value(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data, strict=True))
    )


def _scalar(tp: object, data: object, where: str) -> object:
    if tp is bool:
        if isinstance(data, bool):
            return data
        _fail(where, data, "true or false")
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        _fail(where, data, "an integer")
    if tp is float:
        if isinstance(data, int | float) and not isinstance(data, bool) and math.isfinite(data):
            return float(data)
        _fail(where, data, "a finite number")
    if tp is str:
        if isinstance(data, str):
            return data
        _fail(where, data, "a string")
    if tp is type(None):
        if data is None:
            return None
        _fail(where, data, "null")
    raise TypeError(f"unsupported record field type {tp!r} at {where}")
