"""The one formatter of validation libraries' refusals (tessera.core.error_text): pydantic's
records and phrases in tessera's words."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tessera.core.error_text import plain, rule_of


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    workers: int = Field(1, ge=1, le=1024)
    name: str = Field("x", min_length=1, max_length=63)
    share: float = Field(0.5, gt=0, lt=1)


@pytest.mark.parametrize(("data", "rule"), [
    ({"workers": 0}, "must be at least 1"),
    ({"workers": 99999999999}, "must be at most 1024"),
    ({"workers": "abc"}, "must be a whole number"),
    ({"name": ""}, "must not be empty"),
    ({"name": "x" * 64}, "must be at most 63 characters"),
    ({"share": 0}, "must be greater than 0"),
    ({"share": 1}, "must be less than 1"),
    ({"share": "half"}, "must be a number"),
    ({"bogus": 1}, "is not a field tessera knows (check its spelling)"),
])
def test_records_read_as_rules(data: dict[str, object], rule: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Body.model_validate(data)
    [err] = caught.value.errors()
    assert rule_of(err) == rule
    assert "Input should" not in rule_of(err) and "String should" not in rule_of(err)


@pytest.mark.parametrize(("text", "want"), [
    ("Input should be a valid number, unable to parse string as a number", "must be a number"),
    ("Input should be a valid integer, unable to parse string as an integer", "must be a whole number"),
    ("Input should be greater than or equal to 0 (got -1.0)", "must be at least 0 (got -1.0)"),
    ("String should have at least 1 character", "must not be empty"),
    ("no change here", "no change here"),
])
def test_phrases(text: str, want: str) -> None:
    assert plain(text) == want
