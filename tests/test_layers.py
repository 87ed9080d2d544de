"""The package's layering (DESIGN.md, "Layers"): a module imports only from its own layer or below.

Read from the source with `ast`, so a lazy import inside a function counts as much as a top-level
one. `asyncrl.testing` is test support: no product module imports it.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "asyncrl"
# Lowest first. A package may import from packages in its own row or in rows above it.
LAYERS = (
    ("types", "records", "config", "tracing", "metrics", "storage"),
    ("model", "tokenize", "run_layout"),
    ("sampling",),
    ("serving",),  # the remote engine client, and the replica process serving an engine
    ("tools",),
    ("rewards",),
    ("envs",),
    ("agents",),
    ("rollout",),
    ("sync",),
    ("learner",),
    ("checkpoint", "gates"),
    ("wiring",),
    ("stages", "compare"),
    ("cloud",),
    ("pipeline",),
    ("cli",),
)
RANK = {name: i for i, row in enumerate(LAYERS) for name in row}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def violations(source: str, owner: str) -> list[str]:
    """The imports in `source` (a module of package `owner`) that break the layering."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        else:
            continue
        for module in modules:
            if not module.startswith("asyncrl."):
                continue
            target = _package(module)
            if target == "testing":
                found.append(f"{module} (test support)")
            elif target not in RANK:
                found.append(f"{module} (a package missing from LAYERS)")
            elif RANK[target] > RANK[owner]:
                found.append(f"{module} (layer {RANK[target]} above {owner}'s {RANK[owner]})")
    return found


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        owner = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if owner not in ("__init__", "testing"):
            yield path, owner


def test_every_package_is_placed_in_a_layer():
    assert {owner for _, owner in _modules()} <= set(RANK)


@pytest.mark.parametrize(("path", "owner"), list(_modules()), ids=lambda v: str(v)[-40:])
def test_no_module_imports_from_a_layer_above_its_own(path, owner):
    assert violations(path.read_text(), owner) == []


@pytest.mark.parametrize(
    ("source", "owner"),
    [
        ("from asyncrl.checkpoint.manager import Checkpointer", "learner"),
        ("def f():\n    from asyncrl.stages.train import train", "rollout"),
        ("import asyncrl.cloud.jobset", "stages"),
        ("from asyncrl.testing.configs import micro_config", "cloud"),
        ("from asyncrl.nowhere import x", "types"),
    ],
)
def test_a_deliberate_back_import_is_caught(source, owner):
    assert len(violations(source, owner)) == 1
