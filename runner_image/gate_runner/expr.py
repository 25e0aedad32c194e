"""The assertion expression language (spec §6.1): a whitelisted Python AST, never eval/exec.

An expression is parsed once with :func:`compile_expression`, which refuses every construct
outside the grammar with its position, and evaluated any number of times against a mapping of
bindings. Evaluation walks the tree by hand, so nothing in an expression can reach Python's
object model: there are no calls, no attribute lookups on objects, and no names but the
bindings of the place the expression appears in.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_EXPRESSION_CHARS = 2000

# Both spellings are accepted: the vendor's own examples write `True` in tool conditions.
CONSTANT_NAMES: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}

_COMPARE_OPS = (
    ast.Eq,
    ast.NotEq,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.In,
    ast.NotIn,
    ast.Is,
    ast.IsNot,
)


class ExpressionError(Exception):
    """An expression is not in the language; ``position`` is the 1-based column."""

    def __init__(self, message: str, *, expression: str, position: int | None = None) -> None:
        where = f" at column {position}" if position is not None else ""
        super().__init__(f"{message}{where} in `{expression}`")
        self.reason = message
        self.expression = expression
        self.position = position


class EvaluationError(Exception):
    """A valid expression failed at run time (missing key, type mismatch, ...).

    ``names`` are the bindings the failing part of the expression reads (`params` for
    `params.to.email` on a null `to`, both sides' for a comparison of mismatched types), so
    that a caller can tell whether the failure came from one tool call's own values or from
    elsewhere (a typo against `context`); empty when that is not known.
    """

    def __init__(self, message: str, *, names: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.names = names


@dataclass(frozen=True)
class Expression:
    """A parsed, validated expression and the root names it uses."""

    source: str
    tree: ast.expr
    names: frozenset[str] = field(default_factory=frozenset)

    def evaluate(self, bindings: Mapping[str, Any]) -> Any:
        try:
            return _eval(self.tree, bindings)
        except (TypeError, ValueError, RecursionError) as exc:
            # e.g. a list used as a dict key: the assertion fails, the runner does not.
            raise EvaluationError(f"{type(exc).__name__}: {exc}") from None

    def holds(self, bindings: Mapping[str, Any]) -> bool:
        return bool(self.evaluate(bindings))


def compile_expression(source: str, allowed_names: Sequence[str]) -> Expression:
    """Parse ``source`` and refuse anything outside the grammar or the allowed root names."""
    if not isinstance(source, str) or not source.strip():
        raise ExpressionError("an expression must be a non-empty string", expression=str(source))
    if len(source) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(
            f"expression is {len(source)} characters; the limit is {MAX_EXPRESSION_CHARS}",
            expression=source[:80] + "...",
        )
    try:
        # Newlines inside a YAML block scalar are layout, not syntax.
        tree = ast.parse(" ".join(source.strip().splitlines()), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"syntax error: {exc.msg}", expression=source, position=exc.offset
        ) from None
    names: set[str] = set()
    _validate(tree.body, source, frozenset(allowed_names), names)
    return Expression(source=source, tree=tree.body, names=frozenset(names))


def _refuse(node: ast.AST, what: str, source: str) -> ExpressionError:
    col = getattr(node, "col_offset", None)
    return ExpressionError(
        f"{what} not allowed", expression=source, position=None if col is None else col + 1
    )


def _validate(node: ast.AST, source: str, allowed: frozenset[str], names: set[str]) -> None:
    match node:
        case ast.BoolOp(values=values):
            for value in values:
                _validate(value, source, allowed, names)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            _validate(operand, source, allowed, names)
        case ast.UnaryOp(op=ast.USub() | ast.UAdd(), operand=ast.Constant(value=v)) if isinstance(
            v, int | float
        ) and not isinstance(v, bool):
            pass
        case ast.UnaryOp():
            raise _refuse(node, "arithmetic", source)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            for op in ops:
                if not isinstance(op, _COMPARE_OPS):
                    raise _refuse(node, f"operator {type(op).__name__}", source)
            for part in (left, *comparators):
                _validate(part, source, allowed, names)
        case ast.Attribute(value=value, attr=attr):
            if attr.startswith("_"):
                raise _refuse(node, f"attribute {attr!r} (names starting with _)", source)
            _validate(value, source, allowed, names)
        case ast.Subscript(value=value, slice=index):
            if isinstance(index, ast.Slice):
                raise _refuse(node, "slicing", source)
            _validate(value, source, allowed, names)
            _validate(index, source, allowed, names)
        case ast.Name(id=name):
            if name.startswith("_"):
                raise _refuse(node, f"name {name!r} (names starting with _)", source)
            if name in CONSTANT_NAMES:
                return
            if name not in allowed:
                known = ", ".join(sorted(allowed)) or "none"
                raise _refuse(node, f"unknown name {name!r} (known here: {known});", source)
            names.add(name)
        case ast.Constant(value=value):
            if not isinstance(value, str | int | float | bool) and value is not None:
                raise _refuse(node, f"constant of type {type(value).__name__}", source)
        case ast.List(elts=elts) | ast.Tuple(elts=elts) | ast.Set(elts=elts):
            for elt in elts:
                _validate(elt, source, allowed, names)
        case ast.Dict(keys=keys, values=values):
            for key in keys:
                if key is None:
                    raise _refuse(node, "dict unpacking", source)
                _validate(key, source, allowed, names)
            for value in values:
                _validate(value, source, allowed, names)
        case ast.Call():
            raise _refuse(node, "function and method calls", source)
        case ast.BinOp():
            raise _refuse(node, "arithmetic", source)
        case ast.Lambda():
            raise _refuse(node, "lambda", source)
        case ast.ListComp() | ast.SetComp() | ast.DictComp() | ast.GeneratorExp():
            raise _refuse(node, "comprehensions", source)
        case _:
            raise _refuse(node, type(node).__name__, source)


def describe(value: Any) -> str:
    """Render a value the way a person reading a failure reason wants to see it."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    match node:
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            if name in CONSTANT_NAMES:
                return CONSTANT_NAMES[name]
            if name not in env:
                raise EvaluationError(f"{name!r} is not bound here", names=frozenset({name}))
            return env[name]
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not _eval(operand, env)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -_eval(operand, env)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return _eval(operand, env)
        case ast.BoolOp(op=ast.And(), values=values):
            result: Any = True
            for value in values:
                result = _eval(value, env)
                if not result:
                    return result
            return result
        case ast.BoolOp(op=ast.Or(), values=values):
            result = False
            for value in values:
                result = _eval(value, env)
                if result:
                    return result
            return result
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            current, left_node = _eval(left, env), left
            for op, right_node in zip(ops, comparators, strict=True):
                right = _eval(right_node, env)
                try:
                    if not _compare(op, current, right):
                        return False
                except EvaluationError as exc:
                    raise _from(exc, left_node, right_node) from None
                current, left_node = right, right_node
            return True
        case ast.Attribute(value=value, attr=attr):
            base = _eval(value, env)
            try:
                return _lookup(base, attr, f".{attr}")
            except EvaluationError as exc:
                raise _from(exc, value) from None
        case ast.Subscript(value=value, slice=index):
            key = _eval(index, env)
            base = _eval(value, env)
            try:
                return _lookup(base, key, f"[{describe(key)}]")
            except EvaluationError as exc:
                raise _from(exc, value, index) from None
        case ast.List(elts=elts):
            return [_eval(e, env) for e in elts]
        case ast.Tuple(elts=elts):
            return tuple(_eval(e, env) for e in elts)
        case ast.Set(elts=elts):
            return {_hashable(_eval(e, env), e) for e in elts}
        case ast.Dict(keys=keys, values=values):
            return {
                _hashable(_eval(k, env), k): _eval(v, env)
                for k, v in zip(keys, values, strict=True)
                if k is not None
            }
    raise EvaluationError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover


def _roots(node: ast.AST) -> frozenset[str]:
    """The bindings a part of an expression reads: `params` for `params.to.email`."""
    return frozenset(
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in CONSTANT_NAMES
    )


def _from(exc: EvaluationError, *nodes: ast.AST) -> EvaluationError:
    """``exc``, saying which bindings the operands it failed on were read from."""
    exc.names = exc.names.union(*(_roots(n) for n in nodes))
    return exc


def _hashable(value: Any, node: ast.AST) -> Any:
    try:
        hash(value)
    except TypeError:
        raise EvaluationError(
            f"{describe(value)} cannot be a set member or dict key", names=_roots(node)
        ) from None
    return value


def _lookup(container: Any, key: Any, label: str) -> Any:
    if isinstance(container, Mapping):
        if key in container:
            return container[key]
        raise EvaluationError(f"no key {label.lstrip('.[').rstrip(']')} in {describe(container)}")
    if isinstance(container, list | tuple | str):
        if isinstance(key, int) and not isinstance(key, bool):
            try:
                return container[key]
            except IndexError:
                raise EvaluationError(
                    f"index {key} out of range for length {len(container)}"
                ) from None
        raise EvaluationError(f"cannot look up {label} on a {type(container).__name__}")
    raise EvaluationError(f"cannot look up {label} on {describe(container)}")


def _same_kind(value: Any) -> Any:
    """Numbers as numbers and sequences as sequences, whatever their Python type.

    A Decimal from a builder's context equals the literal 42.5, and 0.1 equals Decimal("0.1")
    (a float is taken at its shortest repr); a tuple equals the list with the same items.
    """
    if isinstance(value, float) and not isinstance(value, bool):
        try:
            return Decimal(repr(value))
        except InvalidOperation:  # nan and inf stay floats
            return value
    if isinstance(value, tuple | list):
        return [_same_kind(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _same_kind(v) for k, v in value.items()}
    return value


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    if isinstance(
        op, ast.Eq | ast.NotEq | ast.Lt | ast.LtE | ast.Gt | ast.GtE | ast.Is | ast.IsNot
    ):
        left, right = _same_kind(left), _same_kind(right)
    try:
        match op:
            case ast.Eq():
                return bool(left == right)
            case ast.NotEq():
                return bool(left != right)
            case ast.Lt():
                return bool(left < right)
            case ast.LtE():
                return bool(left <= right)
            case ast.Gt():
                return bool(left > right)
            case ast.GtE():
                return bool(left >= right)
            # Spec §6.1: `"x" in error` with a null error is false rather than an error.
            case ast.In():
                return False if right is None else bool(left in right)
            case ast.NotIn():
                return True if right is None else bool(left not in right)
            case ast.Is():
                return left is right if left is None or right is None else bool(left == right)
            case ast.IsNot():
                return left is not right if left is None or right is None else bool(left != right)
    except TypeError as exc:
        raise EvaluationError(
            f"cannot compare {describe(left)} with {describe(right)}: {exc}"
        ) from None
    raise EvaluationError(f"unsupported operator {type(op).__name__}")  # pragma: no cover


def accessor_values(expr: Expression, bindings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The values of each accessor (``output.total``, ``status``...) an expression reads.

    Used to say *what was seen* when an assertion fails, without re-running user code.
    """
    seen: list[tuple[str, str]] = []
    labels: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Name | ast.Attribute | ast.Subscript) and not (
            isinstance(node, ast.Name) and node.id in CONSTANT_NAMES
        ):
            label = ast.unparse(node)
            if label not in labels:
                labels.add(label)
                try:
                    seen.append((label, describe(_eval(node, bindings))))
                except EvaluationError as exc:
                    seen.append((label, f"<{exc}>"))
                except (TypeError, ValueError, RecursionError) as exc:
                    seen.append((label, f"<{type(exc).__name__}: {exc}>"))
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr.tree)
    return seen
