"""The `calculator` tool: exact arithmetic on integers and decimals, parsed safely (never `eval`).

Accepts + - * / // % ** and parentheses over numeric literals. Bounds keep a hostile expression
cheap: its length, the size of exponents and of intermediate integers. Arithmetic is exact: ints
while it stays integral, fractions from the first division or decimal literal on; a non-integral
result is printed as a decimal rounded to 10 places.
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


_TOO_BIG = 10**MAX_DIGITS  # a numerator at least this large has more than MAX_DIGITS digits

Number = int | Fraction  # ints while the arithmetic stays integral (cheap), exact fractions after


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value)) if type(node.value) is float else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _binary(node.op, _eval(node.left), _eval(node.right))
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Pow):
        if right.denominator != 1 or abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponents must be integers of at most {MAX_EXPONENT}")
        if right < 0:  # int ** negative int would be a float
            if left == 0:
                raise CalculatorError("division by zero")
            left = Fraction(left)
    elif isinstance(op, ast.Div | ast.FloorDiv | ast.Mod):
        if right == 0:
            raise CalculatorError("division by zero")
        if isinstance(op, ast.Div):  # int / int would be a float
            left = Fraction(left)
    result = _BINARY[type(op)](left, right)
    if abs(result.numerator) >= _TOO_BIG:
        raise CalculatorError(f"result has more than {MAX_DIGITS} digits")
    return result.numerator if result.denominator == 1 else result


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression as text ("391", "2.5")."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r}") from None
    value = _eval(tree.body)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.10f}".rstrip("0").rstrip(".")


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: arithmetic over numbers with + - * / // % ** and parentheses, e.g. "17 * 23".
    """
    return evaluate(expression)
