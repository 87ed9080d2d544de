"""The valid-arguments shortcut of tool schemas never accepts what `jsonschema` rejects."""

from __future__ import annotations

import itertools
from typing import Literal

import jsonschema

from asyncrl.tools.schema import _accepts, function_schema, validate_arguments


def _tool(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    mode: Literal["a", "b", 3],
    tags: list[str],
    extra: dict,
    maybe: int | None = None,
    either: int | str = 0,
) -> str:
    """A tool with one argument of every kind `function_schema` derives.

    Args:
        name: a name.
    """
    return name


SCHEMAS = [
    function_schema(_tool)[1],
    {"type": "object", "properties": {"x": {"type": "integer"}}},  # extra keys allowed
    {"type": "object", "properties": {"p": {"type": "object", "properties": {"q": {}},
                                            "additionalProperties": False}}},
    {"type": "array", "items": {"anyOf": [{"type": "null"}, {"type": "number"}]}},
    {"enum": [1, "1", None, True]},
]  # fmt: skip

VALUES = [None, True, False, 0, 1, 1.0, 2.5, -3, "", "a", "b", 3, [], ["x"], [1, None], {},
          {"q": 1}, {"q": 1, "r": 2}, {"x": 1}, {"x": True}, {"x": 1.0}, {"p": {"q": [1]}},
          {"p": {"q": 1, "z": 0}}]  # fmt: skip


def _tool_arguments():
    base = dict(name="n", count=1, ratio=0.5, flag=True, mode="a", tags=["t"], extra={})
    yield base
    for key, values in {
        "name": [1, None],
        "count": [True, 1.0, 1.5, "1"],
        "ratio": [1, True, "x"],
        "flag": [0, "true"],
        "mode": ["c", 3, 3.0, "3"],
        "tags": [["a", 1], "a", []],
        "extra": [[], {"k": [1]}],
        "maybe": [None, 1, "1"],
        "either": [1, "s", 1.5, None],
        "unknown": [1],
    }.items():
        for value in values:
            yield {**base, key: value}
    yield {k: v for k, v in base.items() if k != "count"}


def test_shortcut_accepts_only_what_jsonschema_accepts():
    cases = [(s, v) for s, v in itertools.product(SCHEMAS, VALUES)]
    cases += [(SCHEMAS[0], arguments) for arguments in _tool_arguments()]
    accepted = 0
    for schema, value in cases:
        accepts = _accepts(schema)
        assert accepts is not None, schema  # every schema here is within the shortcut's keywords
        valid = jsonschema.Draft202012Validator(schema).is_valid(value)
        if accepts(value):
            accepted += 1
            assert valid, (schema, value)
        assert (validate_arguments(schema, value) is None) == valid, (schema, value)
    assert accepted >= 20  # the shortcut is taken, not merely safe


def test_schemas_outside_the_shortcut_go_to_jsonschema():
    for schema in (
        {"type": ["string", "null"]},
        {"type": "string", "minLength": 2},
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"enum": [[1]]},
    ):
        assert _accepts(schema) is None
    assert validate_arguments({"type": "string", "minLength": 2}, "a") is not None
    assert validate_arguments({"type": "string", "minLength": 2}, "ab") is None
