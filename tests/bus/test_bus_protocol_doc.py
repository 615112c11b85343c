"""docs/protocol.md is the spec: its catalogue must match bus/messages.py, every field documented."""

from __future__ import annotations

import pytest

from bus import spec
from bus.schema import CATALOGUE, Channel, message


def test_protocol_doc_catalogue_is_current() -> None:
    assert spec.main(["--check"]) == 0, "run `python -m bus.spec` and commit docs/protocol.md"


@pytest.mark.parametrize("kind", list(CATALOGUE))
def test_every_field_of_every_kind_is_documented(kind: str) -> None:
    cls = CATALOGUE[kind]
    assert set(spec.field_docs(cls)) == set(cls.__struct_fields__)
    assert spec.summary(cls)


def test_commands_travel_on_the_control_channel() -> None:
    control = {kind for kind, cls in CATALOGUE.items() if cls.CHANNEL is Channel.CONTROL}
    assert {k for k in CATALOGUE if k.startswith("ctl.")} <= control
    assert {"gen.abort", "coord.sync", "coord.migrate"} <= control
    assert "gen.tokens" not in control


def test_kind_names_are_validated() -> None:
    for bad in ("Gen.request", "gen", "gen..x", "gen.re quest", "gen.request-x"):
        with pytest.raises(ValueError, match="dotted lower-case"):
            message(bad)
    with pytest.raises(ValueError, match="already registered"):
        message("gen.request")(type("Again", (), {}))  # type: ignore[type-var]
