"""Size limits of the stage and loop code (issue 15): small functions, a short train stage.

Read from the source with `ast`; a function's length runs from its `def` (or first decorator) to its
last line, docstring and comments included.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "asyncrl"
MAX_FUNCTION_LINES = 60
MAX_TRAIN_STAGE_LINES = 200  # exclusive: the train stage stays under this
SHAPED = [*sorted((PACKAGE / "stages").glob("*.py")), PACKAGE / "learner" / "loop.py"]


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lines = node.end_lineno - first + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_the_shaped_modules_are_found():
    names = {p.name for p in SHAPED}
    assert {"train.py", "quality_gate.py", "loop.py"} <= names


def test_no_function_in_the_stages_or_the_loop_is_over_the_limit():
    too_long = {
        str(p.relative_to(PACKAGE)): found
        for p in SHAPED
        if (found := long_functions(p.read_text(), MAX_FUNCTION_LINES))
    }
    assert too_long == {}


def test_the_train_stage_is_short():
    lines = len((PACKAGE / "stages" / "train.py").read_text().splitlines())
    assert lines < MAX_TRAIN_STAGE_LINES


def test_the_length_check_counts_decorators_docstrings_and_nested_functions():
    def body(indent: int) -> str:
        return "\n".join(f"{' ' * indent}x{i} = {i}" for i in range(58))

    f = f'@decorator\ndef f():\n    """doc"""\n{body(4)}\n'
    g = f"def g():\n    def h():\n{body(8)}\n"
    assert long_functions(f + g, 60) == [("f", 61)]
    assert sorted(long_functions(f + g, 58)) == [("f", 61), ("g", 60), ("h", 59)]
