"""Built-in tools, written as a user's tool file would be: typed, with a docstring that becomes the tool's JSON
schema. Name one in a config as `rollout.tools: [posttrain.tasks.builtin_tools:calculate]`."""

from __future__ import annotations

import ast
import operator

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 10**30  # bounds every intermediate result: `9**9**9`-style blow-ups cannot be written (no `**`)

_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Refused(ValueError):
    pass


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise _Refused("division by zero")
        value = _BINARY[type(node.op)](left, right)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_evaluate(node.operand))
    else:
        raise _Refused(f"unsupported syntax {ast.dump(node)[:40]!r}: use integers, + - * / // % and parentheses")
    if abs(value) > MAX_MAGNITUDE:
        raise _Refused("a result is too large")
    return value


def _format(value: int | float) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(round(value, 6))
    return str(value)


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return its value.

    Args:
        expression: integers with + - * / // % and parentheses.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
    try:
        return _format(_evaluate(ast.parse(expression.strip(), mode="eval")))
    except SyntaxError:
        return "error: not an arithmetic expression"
    except _Refused as e:
        return f"error: {e}"
