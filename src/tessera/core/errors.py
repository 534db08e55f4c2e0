"""Errors raised by the core. Every refusal names the field and the rule it broke."""

from __future__ import annotations


class TesseraError(Exception):
    """Base of every error tessera raises on purpose."""


class InvalidRequest(TesseraError, ValueError):
    """A request, a project or a cluster description broke a rule.

    ``field`` is the dotted name a user wrote (``gpu_portion``, ``projects.team-a.limit``);
    ``rule`` says what the value must be, in words a user can act on.
    """

    def __init__(self, field: str, rule: str, value: object = None) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        shown = "" if value is None else f" (got {value!r})"
        super().__init__(f"{field}: {rule}{shown}")

    def __reduce__(self) -> tuple[type[InvalidRequest], tuple[str, str, object]]:
        return (type(self), (self.field, self.rule, self.value))
