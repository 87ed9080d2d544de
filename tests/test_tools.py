"""Tools: schemas from signatures, validated calls, parallel turns, deadlines, output caps."""

import ast
import asyncio
import contextlib
import json
import operator
import random
from fractions import Fraction
from typing import Literal

import pytest

from asyncrl.tools import deadlines
from asyncrl.tools.base import ToolStatus
from asyncrl.tools.calculator import CalculatorError, evaluate
from asyncrl.tools.deadlines import within
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool, tool
from asyncrl.tools.lookup import LookupTool
from asyncrl.types import ToolCall


def call(name, **args):
    return ToolCall(name=name, arguments_json=json.dumps(args))


def run(coro):
    return asyncio.run(coro)


def search(query: str, limit: int = 3, mode: Literal["fast", "exact"] = "fast") -> list[str]:
    """Search the index.

    Args:
        query: what to look for.
        limit: how many hits to return.
        mode: speed or precision.
    """
    return [f"{query}-{i}" for i in range(limit)]


def test_schema_is_derived_from_hints_and_docstring():
    t = FunctionTool(search)
    assert t.description == "Search the index."
    props = t.schema["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"]["type"] == "integer" and props["limit"]["default"] == 3
    assert props["mode"]["enum"] == ["fast", "exact"]
    assert t.schema["required"] == ["query"]
    assert t.schema["additionalProperties"] is False


def test_untyped_argument_is_refused():
    def bad(x):
        return x

    with pytest.raises(TypeError, match="needs a type hint"):
        FunctionTool(bad)


@pytest.fixture
def executor():
    @tool
    async def sleepy(seconds: float) -> str:
        """Sleep."""
        await asyncio.sleep(seconds)
        return "woke"

    @tool
    def crash(message: str) -> str:
        """Raise."""
        raise RuntimeError(message)

    @tool
    def shout(n: int) -> str:
        """Print a lot."""
        return "x" * n

    tools = [FunctionTool(search), sleepy, crash, shout, LookupTool({"Apple": "12"})]
    return ToolExecutor(tools, timeout_s=0.5, output_chars=100)


@pytest.mark.parametrize(
    ("the_call", "status", "fragment"),
    [
        (call("search", query="cats", limit=2), ToolStatus.OK, '["cats-0", "cats-1"]'),
        (call("lookup", key=" apple "), ToolStatus.OK, "12"),
        (call("lookup", key="pear"), ToolStatus.OK, "no value stored under 'pear'"),
        (call("nope"), ToolStatus.UNKNOWN_TOOL, "available: crash, lookup, search"),
        (call("search", limit=2), ToolStatus.INVALID_ARGUMENTS, "'query' is a required property"),
        (call("search", query="a", limit="2"), ToolStatus.INVALID_ARGUMENTS, "limit: '2' is not"),
        (
            call("search", query="a", extra=1),
            ToolStatus.INVALID_ARGUMENTS,
            "'extra' was unexpected",
        ),
        (call("search", query="a", mode="slow"), ToolStatus.INVALID_ARGUMENTS, "is not one of"),
        (ToolCall(name="search", arguments_json="{oops"), ToolStatus.INVALID_ARGUMENTS, "not JSON"),
        (call("crash", message="boom"), ToolStatus.ERROR, "RuntimeError: boom"),
        (call("sleepy", seconds=30), ToolStatus.TIMEOUT, "no result within 0.5 s"),
        (call("shout", n=1000), ToolStatus.OUTPUT_TRUNCATED, "…[truncated]"),
    ],
)
def test_every_outcome_is_a_status_never_an_exception(executor, the_call, status, fragment):
    result = run(executor.call(the_call))
    assert result.status == status
    assert fragment in result.observation()


def test_calls_of_one_turn_run_concurrently():
    """Each call waits until all three have started: run one after another, they would time out."""
    started = []

    @tool
    async def rendezvous(i: int) -> str:
        """Meet."""
        started.append(i)
        while len(started) < 3:
            await asyncio.sleep(0.001)
        return str(i)

    ex = ToolExecutor([rendezvous], timeout_s=5, output_chars=100)
    results = run(ex.call_all([call("rendezvous", i=i) for i in range(3)]))
    assert [r.output for r in results] == ["0", "1", "2"]


def test_timeout_really_cancels_the_tool():
    cancelled = []

    @tool
    async def hang() -> str:
        """Hang."""
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return ""

    ex = ToolExecutor([hang], timeout_s=0.05, output_chars=100)
    assert run(ex.call(call("hang"))).status == ToolStatus.TIMEOUT
    assert cancelled == [True]


def test_shared_limit_bounds_concurrent_calls():
    running, peak = [0], [0]

    @tool
    async def busy() -> str:
        """Work."""
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1
        return "ok"

    async def go():
        limit = {"busy": asyncio.Semaphore(2)}
        executors = [
            ToolExecutor([busy], timeout_s=5, output_chars=9, limits=limit) for _ in range(3)
        ]
        await asyncio.gather(*[e.call_all([call("busy")] * 3) for e in executors])

    run(go())
    assert peak[0] == 2


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 * 23", "391"),
        ("(2 + 3) ** 3", "125"),
        ("7 / 2", "3.5"),
        ("-4 // 3", "-2"),
        ("1.5 * 4", "6"),
        ("10 % 4", "2"),
    ],
)
def test_calculator_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd')",
        "2 ** 100000",
        "x + 1",
        "(1).__class__",
        "1 / 0",
        "9" * 300,
        "[1, 2]",
    ],
)
def test_calculator_refuses_anything_but_bounded_arithmetic(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def _random_expression(rng, depth=0):
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(["0", "1", "2", "3", "7", "12", "0.5", "2.25", "10"])
    op = rng.choice(["+", "-", "*", "/", "//", "%", "**"])
    right = rng.choice(["-2", "-1", "0", "1", "2", "3"]) if op == "**" else None
    left = _random_expression(rng, depth + 1)
    return f"({left} {op} {right or _random_expression(rng, depth + 1)})"


_REFERENCE_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _reference_value(expression):
    """Every value a Fraction, at every step (the calculator's arithmetic, written plainly)."""

    def value(node):
        if isinstance(node, ast.Constant):
            return Fraction(str(node.value))
        if isinstance(node, ast.UnaryOp):
            return -value(node.operand)
        return Fraction(_REFERENCE_OPS[type(node.op)](value(node.left), value(node.right)))

    v = value(ast.parse(expression, mode="eval").body)
    return str(v.numerator) if v.denominator == 1 else f"{float(v):.10f}".rstrip("0")


def test_calculator_agrees_with_exact_fractions_on_random_expressions():
    rng = random.Random(0)
    checked = 0
    for _ in range(2000):
        expression = _random_expression(rng)
        try:
            expected = _reference_value(expression)
        except ZeroDivisionError:
            with pytest.raises(CalculatorError, match="division by zero"):
                evaluate(expression)
            continue
        assert evaluate(expression) == expected.rstrip("."), expression
        checked += 1
    assert checked > 1000


# -- hard deadlines (tools/deadlines.within) run in the caller's task ---------------------------


async def _swallow_then_return():
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        return "late"


def test_within_returns_the_result_and_leaves_no_cancellation_behind():
    async def go():
        value = await within(asyncio.sleep(0, "v"), 5, label="t")
        return value, asyncio.current_task().cancelling()

    assert run(go()) == ("v", 0)


def test_within_times_out_even_when_the_coroutine_swallows_the_cancellation_and_returns():
    async def go():
        with pytest.raises(TimeoutError, match=r"t: no result within 0\.05 s"):
            await within(_swallow_then_return(), 0.05, label="t")
        return asyncio.current_task().cancelling()

    assert run(go()) == 0  # its own cancellation taken back


def test_an_inner_deadline_does_not_start_the_outer_calls_grace():
    """The inner call's cancellation passes through the outer driver first; the outer coroutine
    goes on after the inner TimeoutError for longer than the outer grace and is not dropped."""
    grace = 0.1

    async def outer():
        with contextlib.suppress(TimeoutError):
            await within(asyncio.sleep(3600), 0.02, label="inner", grace_s=grace)
        await asyncio.sleep(3 * grace)
        return "finished"

    async def go():
        return await within(outer(), 5, label="outer-test", grace_s=grace)

    before = deadlines.DROPPED["outer-test"]
    assert run(go()) == "finished"
    assert deadlines.DROPPED["outer-test"] == before


def test_the_callers_own_timeout_still_works_around_within():
    async def go():
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await within(asyncio.sleep(3600), 5, label="t")
        return asyncio.current_task().cancelling()

    assert run(go()) == 0


def test_cancelling_the_caller_cancels_the_call_and_raises_cancelled():
    cancelled = []

    async def inner():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def go():
        job = asyncio.create_task(within(inner(), 60, label="t"))
        await asyncio.sleep(0.01)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(go())
    assert cancelled == [True]
