"""The benchmark's soak section, its pure logic: the criterion for a bounded
queue, the search for the sustained rate, and the windows of a run.  The
section itself runs against the embedded server in ``bench/run.sh --only
soak``; nothing here needs a database."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import soak


def samples(depths: list[int], every: float = 10.0, rate: float = 1000.0) -> list[dict]:
    """Samples every ``every`` s at ``rate`` offered, with these queue depths."""
    out = []
    for i, depth in enumerate(depths):
        enqueued = int(rate * every * i)
        out.append({"t": every * i, "enqueued": enqueued, "live": depth, "done": enqueued - depth,
                    "live_max": depth, "hot_bytes": 2**20 * (i + 1), "history_bytes": None, "dead": 10 * i,
                    "live_tuples": depth, "autovacuums": i // 3})
    return out


def test_a_flat_queue_is_bounded():
    v = soak.verdict(samples([0, 300, 250, 320, 280, 310, 290]), 1000, 995.0)
    assert v["bounded"] and v["checks"] == {"offered": True, "depth": True, "trend": True}
    assert v["depth_end"] == 290 and v["depth_limit"] == 5000


def test_a_queue_that_grows_is_not_bounded_though_still_short():
    # 1,500 jobs at the end (1.5 s of the rate) growing 50 jobs a second over
    # the second half: 5% of the rate, over the 2% allowed.
    v = soak.verdict(samples([0, 0, 0, 0, 500, 1000, 1500]), 1000, 1000.0)
    assert not v["bounded"]
    assert v["checks"] == {"offered": True, "depth": True, "trend": False}
    assert v["slope_per_s"] == pytest.approx(50.0)


def test_a_small_queue_passes_the_trend_whatever_its_slope():
    # Start-up makes a slope over a short run; under a second of work queued
    # at the end is bounded.
    v = soak.verdict(samples([0, 0, 400, 900]), 1000, 1000.0)
    assert v["bounded"] and v["slope_per_s"] > soak.SLOPE_SHARE * 1000


def test_a_deep_queue_at_the_end_is_not_bounded():
    v = soak.verdict(samples([0, 6000, 5500, 5200, 5100, 5050, 5001]), 1000, 1000.0)
    assert not v["bounded"] and v["checks"]["depth"] is False and v["checks"]["trend"] is True


def test_a_rate_the_producer_could_not_offer_is_not_bounded():
    v = soak.verdict(samples([0, 0, 0, 0]), 1000, 960.0)
    assert not v["bounded"] and v["checks"] == {"offered": False, "depth": True, "trend": True}


def test_the_search_starts_at_the_goal_goes_up_then_halves():
    assert soak.next_rate(10_000, 0, None) == pytest.approx(8_000)
    assert soak.next_rate(10_000, 8_000, None) == pytest.approx(10_000)
    assert soak.next_rate(10_000, 0, 8_000) == pytest.approx(4_000)
    assert soak.next_rate(10_000, 4_000, 8_000) == pytest.approx(6_000)


@pytest.mark.parametrize("rate, rounded", [(0.4, 1), (57.4, 57), (149, 150), (9_333, 9_300), (23_456, 23_000),
                                           (125_100, 130_000)])
def test_rates_keep_two_significant_figures(rate, rounded):
    assert soak.round_rate(rate) == rounded


def test_windows_give_rates_sizes_and_autovacuums_per_window():
    w = soak.windows(samples([0, 100, 50], rate=2000.0))
    assert [x["t_end_s"] for x in w] == [10.0, 20.0]
    assert [x["offered_per_s"] for x in w] == [2000.0, 2000.0]
    assert [x["done_per_s"] for x in w] == [1990.0, 2005.0]
    assert [(x["depth"], x["hot_mib"], x["history_mib"], x["dead_tuples"]) for x in w] == [
        (100, 2.0, None, 10), (50, 3.0, None, 20)]
    assert [x["autovacuums"] for x in w] == [0, 0]
    assert [x["machine_busy"] for x in w] == [None, None]


def test_machine_busy_is_the_busy_share_between_two_samples():
    assert soak.busy_share({"busy": (10.0, 100.0)}, {"busy": (25.0, 120.0)}) == 0.75
    assert soak.busy_share({"busy": (10.0, 100.0)}, {"busy": (10.0, 100.0)}) is None


def test_retention_uses_the_statements_the_checkout_has():
    import soak_history

    both = soak_history.retention_steps({"history_partition_remove": "R"}, "job_history_20261204")
    assert both == [("detach", "R", {"name": "job_history_20261204", "drop": False}),
                    ("drop", "R", {"name": "job_history_20261204", "drop": True})]
    each = soak_history.retention_steps({"history_partition_detach": "D", "history_partition_drop": "X"}, "p")
    assert each == [("detach", "D", {"name": "p"}), ("drop", "X", {"name": "p"})]
    with pytest.raises(RuntimeError, match="no statement that removes a history partition"):
        soak_history.retention_steps({}, "p")
