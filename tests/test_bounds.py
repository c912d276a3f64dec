"""Every duration has a documented range (no database)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgfence import bounds, registry, settings_table
from pgfence.errors import ConfigError
from pgfence.settings import Settings, from_mapping

SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "settings.md"


def valid(name: str, value: float) -> dict:
    """Settings changes that make ``name = value`` valid on its own (the
    heartbeat must stay shorter than the lease)."""
    changes = {name: value}
    if name == "heartbeat":
        changes["lease"] = bounds.RANGES["lease"][1]
    if name == "lease":
        changes["heartbeat"] = None
    return changes


@pytest.mark.parametrize("name", sorted(bounds.RANGES))
def test_each_duration_takes_its_range_and_nothing_outside(name):
    low, high = bounds.RANGES[name]
    assert getattr(Settings(**valid(name, low)), name) == low
    assert getattr(Settings(**valid(name, high)), name) == high
    for bad in (low / 2, high * 2, 1e13, 0.0, -1.0, float("inf"), float("nan")):
        if name == "heartbeat" and bad == high * 2:
            continue   # refused as longer than the lease, checked below
        with pytest.raises(ConfigError) as info:
            Settings(**valid(name, bad))
        message = str(info.value)
        assert message.startswith(f"invalid {name.replace('_', '-')}: must be a number of seconds from "
                                  f"{bounds.human(low)} to {bounds.human(high)}, got "), message
        assert "\n" not in message


def test_the_reviewed_values_are_refused_from_every_source():
    for text in ("1e13", "0.001", "1e13s", "10000d"):
        with pytest.raises(ConfigError, match=r"^invalid lease: must be a number of seconds from 0\.1s to 7d"):
            from_mapping({"lease": text}, "the command line")


def test_human_durations():
    assert [bounds.human(s) for s in (0.01, 0.1, 1.0, 90.0, 60.0, 3600.0, 86400.0, 7 * 86400.0, 1.5)] == \
        ["0.01s", "0.1s", "1s", "90s", "1m", "1h", "1d", "7d", "1.5s"]


def test_a_handlers_lease_and_timeout_are_bounded_too():
    with pytest.raises(ConfigError, match=r"^invalid lease of handler 'bounded_kind': must be a number of seconds "
                                          r"from 0\.1s to 7d, got 10000000000000\.0$"):
        registry.handler("bounded_kind", lease=1e13)
    with pytest.raises(ConfigError, match=r"^invalid timeout of handler 'bounded_kind': .* got 0\.001$"):
        registry.handler("bounded_kind", timeout=0.001)
    assert registry.find("bounded_kind") is None


def test_the_docs_settings_table_lists_every_range():
    # The table the settings page shows (docs/reference/settings.md renders
    # settings_table at build time, see test_settings).
    assert "<!-- generated: settings -->" in SETTINGS_PAGE.read_text()
    text = settings_table.render()
    for name in bounds.RANGES:
        row = next((line for line in text.splitlines() if re.match(rf"^\| [^|]*`{name}`", line)), None)
        assert row is not None, f"no settings row for {name}"
        assert bounds.describe(name) in row, f"the settings row of {name} lacks its range {bounds.describe(name)}: {row}"
