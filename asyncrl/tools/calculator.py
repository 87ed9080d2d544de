"""The `calculator` tool: exact arithmetic on integers and decimals, parsed safely (never `eval`).

Accepts + - * / // % ** and parentheses over numeric literals. Bounds keep a hostile expression
cheap: its length, the size of exponents and of intermediate integers. Division is exact
(fractions), and a non-integral result is printed as a decimal rounded to 10 places.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 200

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class CalculatorError(ValueError):
    pass


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > MAX_EXPONENT):
            raise CalculatorError(f"exponents must be integers of at most {MAX_EXPONENT}")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        result = _BINARY[type(node.op)](left, right)
        result = Fraction(result)
        if len(str(abs(result.numerator))) > MAX_DIGITS:
            raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
        return result
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text ("391", "2.5")."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}") from None
    value = _eval(tree)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10f}".rstrip("0").rstrip(".")


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: arithmetic over numbers with + - * / // % ** and parentheses, e.g. "17 * 23".
    """
    return evaluate(expression)
