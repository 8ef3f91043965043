"""Matplotlib figures -> the SDK's chart objects: each kind of plot, read back through the
SDK's own parser."""

from __future__ import annotations

from typing import Any

from e2b_code_interpreter.charts import _deserialize_chart
from matplotlib.figure import Figure

from agentenv.guest.interpreter.charts import figure_to_chart


def subplots(*grid: int) -> tuple[Figure, Any]:
    """A figure outside pyplot (no backend, nothing to close) and its axes."""
    fig = Figure()
    return fig, fig.subplots(*grid)


def sdk_chart(figure: Any) -> Any:
    data = figure_to_chart(figure)
    assert data is not None
    return _deserialize_chart(data)


def test_a_bar_chart_names_its_bars_by_their_ticks() -> None:
    fig, ax = subplots()
    ax.bar(["apples", "pears"], [3, 5], label="fruit")
    ax.set_ylabel("count [kg]")
    chart = sdk_chart(fig)
    assert chart.type == "bar"
    assert [(e.label, e.group, e.value) for e in chart.elements] == [
        ("apples", "fruit", 3.0),
        ("pears", "fruit", 5.0),
    ]
    assert chart.y_unit == "kg"


def test_horizontal_bars_swap_the_axes() -> None:
    fig, ax = subplots()
    ax.barh(["a", "b"], [1, 2])
    ax.set_xlabel("value")
    ax.set_ylabel("name")
    chart = sdk_chart(fig)
    assert [(e.label, e.value) for e in chart.elements] == [("a", 1.0), ("b", 2.0)]
    assert (chart.x_label, chart.y_label) == ("name", "value")


def test_a_pie_chart_gives_each_wedges_angle() -> None:
    fig, ax = subplots()
    ax.pie([1, 3], labels=["small", "big"])
    chart = sdk_chart(fig)
    assert chart.type == "pie"
    assert [(e.label, e.angle) for e in chart.elements] == [("small", 90.0), ("big", 270.0)]


def test_a_scatter_plot_gives_its_points() -> None:
    fig, ax = subplots()
    ax.scatter([1, 2], [3, 4], label="dots")
    chart = sdk_chart(fig)
    assert chart.type == "scatter"
    assert chart.elements[0].label == "dots"
    assert chart.elements[0].points == [(1.0, 3.0), (2.0, 4.0)]
    assert chart.x_scale.value == "linear"


def test_a_box_plot_gives_quartiles_whiskers_and_outliers() -> None:
    fig, ax = subplots()
    ax.boxplot([[1, 2, 3, 4, 5, 40]], patch_artist=True, tick_labels=["set"])
    chart = sdk_chart(fig)
    assert chart.type == "box_and_whisker"
    [box] = chart.elements
    assert box.label == "set"
    assert (box.min, box.median, box.max) == (1.0, 3.5, 5.0)
    assert box.first_quartile == 2.25 and box.third_quartile == 4.75
    assert box.outliers == [40.0]


def test_several_axes_make_a_superchart() -> None:
    fig, (left, right) = subplots(1, 2)
    left.plot([0, 1], [0, 1])
    right.bar(["x"], [1])
    fig.suptitle("both")
    chart = sdk_chart(fig)
    assert chart.type == "superchart" and chart.title == "both"
    assert [c.type for c in chart.elements] == ["line", "bar"]


def test_an_unknown_plot_and_a_blank_figure() -> None:
    fig, ax = subplots()
    ax.imshow([[0, 1], [1, 0]])
    assert sdk_chart(fig).type == "unknown"
    blank, _ = subplots()
    assert figure_to_chart(blank) is None


def test_dates_become_iso_strings() -> None:
    import datetime

    fig, ax = subplots()
    days = [datetime.date(2026, 1, 1), datetime.date(2026, 1, 2)]
    ax.plot(days, [1, 2])
    chart = sdk_chart(fig)
    assert chart.x_scale.value == "datetime"
    assert chart.elements[0].points[0][0].startswith("2026-01-01")
