"""The configuration reference names a field's type as the loader accepts it: null only where None is."""

from __future__ import annotations

from typing import Literal

from psrl.config.docs import type_name


def test_null_is_listed_only_for_fields_that_accept_none() -> None:
    assert type_name(bool | Literal["auto"]) == "bool \\| `auto`"
    assert type_name(int | None) == "int \\| null"
    assert type_name(Literal["a", None]) == "`a` \\| null"
