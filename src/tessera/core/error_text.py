"""One formatter for refusals written by validation libraries (pydantic, under FastAPI and Typer):
their rule in tessera's words ("must be at least 1"), never theirs ("Input should be greater than
or equal to 1"), so the API and the CLI read alike (``field: rule (got 'value')``). Pure: works on
the error records and message strings, without importing the libraries."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["plain", "rule_of"]


def _n(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def rule_of(err: Mapping[str, Any]) -> str:
    """A pydantic error record's rule, as tessera words it."""
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    simple = {
        "missing": "is required",
        "extra_forbidden": "is not a field tessera knows (check its spelling)",
        "string_type": "must be text",
        "int_type": "must be a whole number", "int_parsing": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_type": "must be a number", "float_parsing": "must be a number",
        "decimal_parsing": "must be a number", "decimal_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_type": "must be true or false", "bool_parsing": "must be true or false",
        "list_type": "must be a list", "dict_type": "must be an object",
        "model_type": "must be an object", "model_attributes_type": "must be an object",
        "none_required": "must be null",
    }
    if kind in simple:
        return simple[kind]
    bounds = {"greater_than_equal": ("ge", "must be at least {}"),
              "greater_than": ("gt", "must be greater than {}"),
              "less_than_equal": ("le", "must be at most {}"),
              "less_than": ("lt", "must be less than {}")}
    if kind in bounds and bounds[kind][0] in ctx:
        key, text = bounds[kind]
        return text.format(_n(ctx[key]))
    if kind == "string_too_short":
        least = int(ctx.get("min_length", 1))
        return "must not be empty" if least <= 1 else f"must be at least {least} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected', '')}".rstrip()
    if kind == "json_invalid":
        return f"must be valid JSON ({ctx.get('error', 'it could not be parsed')})"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    return plain(str(err.get("msg") or "is invalid"))


_PHRASES = [
    (re.compile(r"Input should be greater than or equal to (\S+?)(?=$|[ ,;)])"), r"must be at least \1"),
    (re.compile(r"Input should be greater than (\S+?)(?=$|[ ,;)])"), r"must be greater than \1"),
    (re.compile(r"Input should be less than or equal to (\S+?)(?=$|[ ,;)])"), r"must be at most \1"),
    (re.compile(r"Input should be less than (\S+?)(?=$|[ ,;)])"), r"must be less than \1"),
    (re.compile(r"Input should be a valid number(, unable to parse string as a number)?"), "must be a number"),
    (re.compile(r"Input should be a valid integer(, [a-z ]+)?"), "must be a whole number"),
    (re.compile(r"Input should be a valid boolean(, [a-z ]+)?"), "must be true or false"),
    (re.compile(r"Input should be a valid string"), "must be text"),
    (re.compile(r"String should have at least 1 character"), "must not be empty"),
    (re.compile(r"String should have at least (\d+) characters"), r"must be at least \1 characters"),
    (re.compile(r"String should have at most (\d+) characters?"), r"must be at most \1 characters"),
    (re.compile(r"Extra inputs are not permitted"), "is not a field tessera knows (check its spelling)"),
    (re.compile(r"Field required"), "is required"),
    (re.compile(r"Input should be (.+)"), r"must be \1"),
    (re.compile(r"Value error, "), ""),
]


def plain(text: str) -> str:
    """A message with any validation library's phrase replaced by tessera's wording."""
    for pattern, repl in _PHRASES:
        text = pattern.sub(repl, text)
    return text
