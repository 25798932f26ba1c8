"""The ``calculator`` tool: arithmetic on a whitelisted Python-expression AST, never ``eval``.

The expression is parsed with :func:`ast.parse` (mode ``"eval"``) and walked node by node;
anything not listed below is refused before it is evaluated. Every intermediate value is
bounded, so hostile input (``9**9**9**9``, ``factorial(10**6)``, ``[1]*10**9``) fails at once
instead of using time or memory.

Allowed: int/float literals; ``+ - * / // % **`` (``^`` is read as ``**``, as on a calculator);
unary ``+``/``-``; parentheses; the constants ``pi``, ``e``, ``tau``; the functions
``sqrt abs round floor ceil log log10 log2 exp sin cos tan asin acos atan factorial min max``
(positional arguments only; angles in radians; ``log(x)`` is natural, ``log(x, b)`` base b).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from app.chat.tools.base import ToolError

MAX_EXPRESSION_CHARS = 500
"""Longest expression accepted (characters)."""
MAX_NODES = 300
"""Most AST nodes accepted (every number, operator and call counts)."""
MAX_MAGNITUDE = 1e308
"""Largest absolute value of any intermediate result (about the largest float64)."""
MAX_FACTORIAL = 170
"""Largest n for factorial(n): 170! ~ 7.3e306 is the last one below MAX_MAGNITUDE."""
RESULT_SIGNIFICANT_DIGITS = 12
"""Float results are rounded to this many significant digits (hides 0.1+0.2 noise)."""

Number = int | float

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: None,  # handled by _power (bounded)
}
_CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _check(value: Number) -> Number:
    """Refuse values that are not finite or too large; returns ``value``."""
    if isinstance(value, float):
        if math.isnan(value):
            raise ToolError("the result is not a number (NaN)")
        if math.isinf(value) or abs(value) > MAX_MAGNITUDE:
            raise ToolError("the result is too large")
    elif abs(value) > MAX_MAGNITUDE:  # int: compared exactly, cheap while bounded
        raise ToolError("the result is too large")
    return value


def _power(base: Number, exp: Number) -> Number:
    """``base ** exp`` with the size checked from logarithms before computing."""
    if base == 0 and exp < 0:
        raise ToolError("division by zero (0 raised to a negative power)")
    if base != 0 and abs(base) != 1:
        # log10 of the result's size, from the operands: refuses 9**9**9**9 and 0.5**-5000
        # without computing them.
        if exp * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
            raise ToolError("the result is too large")
    if isinstance(base, int) and isinstance(exp, int) and exp < 0:
        return _check(float(base) ** exp)
    try:
        result = base**exp
    except OverflowError:
        raise ToolError("the result is too large") from None
    if isinstance(result, complex):
        raise ToolError("the result is a complex number (negative base, fractional power)")
    return _check(result)


def _as_int(name: str, x: Number) -> int:
    if isinstance(x, float):
        if not x.is_integer():
            raise ToolError(f"{name} needs a whole number, got {x:g}")
        x = int(x)
    return x


def _factorial(x: Number) -> int:
    n = _as_int("factorial", x)
    if n < 0:
        raise ToolError("factorial needs a non-negative number")
    if n > MAX_FACTORIAL:
        raise ToolError(f"factorial is limited to n <= {MAX_FACTORIAL}")
    return math.factorial(n)


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise ToolError("sqrt of a negative number")
    if isinstance(x, int):
        r = math.isqrt(x)
        if r * r == x:
            return r
    return math.sqrt(x)


def _log(x: Number, base: Number | None = None) -> float:
    if x <= 0:
        raise ToolError("log needs a positive number")
    if base is None:
        return math.log(x)
    if base <= 0 or base == 1:
        raise ToolError("log base must be positive and not 1")
    return math.log(x, base)


def _positive_log(fn, name):
    def inner(x: Number) -> float:
        if x <= 0:
            raise ToolError(f"{name} needs a positive number")
        return fn(x)

    return inner


def _domain(fn, name, lo, hi):
    def inner(x: Number) -> float:
        if not lo <= x <= hi:
            raise ToolError(f"{name} needs a value between {lo:g} and {hi:g}")
        return fn(x)

    return inner


def _exp(x: Number) -> float:
    if x > math.log(MAX_MAGNITUDE):
        raise ToolError("the result is too large")
    return math.exp(x)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    nd = _as_int("round", ndigits)
    if not -308 <= nd <= 308:
        raise ToolError("round's digits must be between -308 and 308")
    return round(x, nd)


# name -> (function, min args, max args)
_FUNCTIONS: dict[str, tuple[Any, int, int]] = {
    "sqrt": (_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_round, 1, 2),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "log": (_log, 1, 2),
    "ln": (_log, 1, 1),
    "log10": (_positive_log(math.log10, "log10"), 1, 1),
    "log2": (_positive_log(math.log2, "log2"), 1, 1),
    "exp": (_exp, 1, 1),
    "sin": (math.sin, 1, 1),
    "cos": (math.cos, 1, 1),
    "tan": (math.tan, 1, 1),
    "asin": (_domain(math.asin, "asin", -1, 1), 1, 1),
    "acos": (_domain(math.acos, "acos", -1, 1), 1, 1),
    "atan": (math.atan, 1, 1),
    "factorial": (_factorial, 1, 1),
    "min": (lambda *xs: min(xs), 1, 20),
    "max": (lambda *xs: max(xs), 1, 20),
}


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ToolError(f"only numbers are allowed, not {type(v).__name__} {v!r:.30}")
        return _check(v)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _eval(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left = _eval(node.left)
        right = _eval(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        try:
            result = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("the result is too large") from None
        return _check(result)
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise ToolError(f"unknown name '{node.id:.40}' (constants: pi, e, tau)")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise ToolError(
                f"calling a {type(node.func).__name__} is not allowed "
                f"(functions: {', '.join(_FUNCTIONS)})"
            )
        if node.func.id not in _FUNCTIONS:
            raise ToolError(
                f"function '{node.func.id:.40}' is not allowed (allowed: {', '.join(_FUNCTIONS)})"
            )
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ToolError(f"{node.func.id} takes plain positional arguments only")
        fn, lo, hi = _FUNCTIONS[node.func.id]
        if not lo <= len(node.args) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise ToolError(f"{node.func.id} takes {want} argument(s), got {len(node.args)}")
        args = [_eval(a) for a in node.args]
        try:
            result = fn(*args)
        except (ValueError, ZeroDivisionError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
        except OverflowError:
            raise ToolError("the result is too large") from None
        return _check(result)
    if isinstance(node, ast.BinOp):
        raise ToolError(f"operator {type(node.op).__name__} is not allowed")
    raise ToolError(f"{type(node).__name__} is not allowed in an arithmetic expression")


def _tidy(value: Number) -> Number:
    """Round floats to RESULT_SIGNIFICANT_DIGITS and return an int when the value is whole."""
    if isinstance(value, float):
        value = float(f"{value:.{RESULT_SIGNIFICANT_DIGITS}g}")
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        if value == 0:
            return 0
    return value


def evaluate(expression: str) -> Number:
    """Evaluate an arithmetic ``expression`` (see the module docstring for what is allowed).

    Returns an ``int`` when the result is whole (below 2**53 for float arithmetic), else a
    ``float`` rounded to 12 significant digits. Raises :class:`ToolError` for anything not
    allowed, division by zero, a result beyond 1e308, or an expression over 500 characters /
    300 nodes.
    """
    if not isinstance(expression, str):
        raise ToolError("the expression must be text")
    text = expression.strip()
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = text.replace("^", "**").replace("\u00d7", "*").replace("\u00f7", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"not a valid arithmetic expression: {expression!r:.80}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"the expression has more than {MAX_NODES} parts")
    return _tidy(_eval(tree))


def calculator(expression: str) -> Number:
    """Tool entry point: see :func:`evaluate`."""
    return evaluate(expression)


PARAMETERS = {
    "type": "object",
    "properties": {
        "expression": {
            "type": "string",
            "description": 'An arithmetic expression, e.g. "(17 * 23) + sqrt(16)". '
            "Operators + - * / // % ** and parentheses; functions sqrt, abs, round, floor, "
            "ceil, log, log10, exp, sin, cos, tan, factorial; constants pi and e.",
        }
    },
    "required": ["expression"],
}
DESCRIPTION = (
    "Evaluate an arithmetic expression exactly and return the number. Use it for any "
    "calculation instead of doing arithmetic in your head."
)
