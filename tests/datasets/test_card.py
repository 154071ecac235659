"""Data card statistics and their SVG rendering (pure functions)."""
from __future__ import annotations

from apps.datasets.card import histogram, message_stats, quantiles, reason_summary
from trajplatform.charts import histogram_svg


def test_histogram_bins_add_up_and_the_top_edge_is_included() -> None:
    h = histogram([0, 9.9, 10, 55, 100, None], lo=0, hi=100)
    counts = [c for _, _, c in h["bins"]]
    assert len(counts) == 10 and sum(counts) == 5 and h["missing"] == 1
    assert counts[0] == 2 and counts[1] == 1 and counts[5] == 1 and counts[9] == 1
    assert h["bins"][0][:2] == [0, 10] and h["bins"][-1][:2] == [90, 100]


def test_reward_histograms_use_the_unit_axis_or_the_data_range() -> None:
    assert histogram([0.2, 0.9])["bins"][-1][1] == 1.0
    wide = histogram([-2.0, 3.0])
    assert wide["bins"][0][0] == -2.0 and wide["bins"][-1][1] == 3.0 and sum(c for *_, c in wide["bins"]) == 2
    assert histogram([5.0, 5.0])["bins"] == [[5.0, 5.0, 2]]  # one value: one bin
    assert histogram([None, None]) == {"bins": [], "missing": 2}


def test_quantiles_are_nearest_rank() -> None:
    q = quantiles(list(range(1, 101)))
    assert (q["p0"], q["p10"], q["p50"], q["p90"], q["p99"], q["p100"]) == (1, 10, 50, 90, 99, 100)
    assert q["mean"] == 50.5
    assert quantiles([])["p50"] is None


def test_message_stats_count_assistant_turns_and_characters() -> None:
    messages = [{"role": "user", "content": "abcd" * 10},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"function": {"name": "run", "arguments": '{"x": 1}'}}]},
                {"role": "assistant", "content": "done"}]
    assert message_stats(messages) == (2, 14)  # (40 + 3 + 8 + 4) / 4 rounded up
    assert message_stats("not a list") == (0, 0)


def test_the_reason_summary_groups_by_limit_and_shows_the_measured_range() -> None:
    summary = reason_summary([
        "reward 0.2 < 0.5", "reward 0 < 0.5", "score 40 < 80; reward 0.3 < 0.5", "reward 0.1 < 0.7",
        "no automatic review (min_score 80)",
        "near duplicate of trajectory #7 (prompt cosine 0.991, actions cosine 0.950, threshold 0.92)",
        "near duplicate of trajectory #9 (prompt cosine 0.96, actions cosine 0.97, threshold 0.92)",
        "contaminated: prompt matches gsm8k item 12 (13-gram overlap 0.83 >= 0.5)",
    ])
    assert summary == {
        "reward < 0.5 (reward 0–0.3)": 3,
        "near duplicate of trajectory #… (prompt cosine 0.96–0.991, actions cosine 0.95–0.97, threshold 0.92)": 2,
        "contaminated: prompt matches gsm8k item … (13-gram overlap 0.83 >= 0.5)": 1,
        "no automatic review (min_score 80)": 1,
        "reward < 0.7 (reward 0.1)": 1,
        "score < 80 (score 40)": 1,
    }


def test_the_svg_escapes_its_title_and_has_one_bar_per_bin() -> None:
    svg = str(histogram_svg(histogram([1, 2, 3], lo=0, hi=10), title="<b>score</b>"))
    assert svg.startswith("<svg") and svg.count("<rect") == 10 and "&lt;b&gt;score&lt;/b&gt;" in svg
    assert "no values" in str(histogram_svg({"bins": [], "missing": 0}, title="t"))
