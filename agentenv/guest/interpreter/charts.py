"""Matplotlib figures -> the ``chart`` JSON of the SDKs (line, scatter, bar, pie,
box_and_whisker, superchart, unknown).

It runs inside the python kernel: kernel_startup sends this module's source, so it imports
only the stdlib at its top and matplotlib inside its functions.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

Chart = dict[str, Any]
# "Speed (m/s)" or "Speed [m/s]" -> the unit.
UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")
DIGITS = 8


def figure_to_chart(figure: Any) -> Chart | None:
    """The figure's chart, a superchart when it has several axes; None when it is blank."""
    axes = figure.get_axes()
    if not any(ax.has_data() for ax in axes):
        return None
    try:
        figure.draw_without_rendering()  # tick labels exist only once laid out
    except Exception:
        pass
    if len(axes) == 1:
        return axes_to_chart(axes[0])
    suptitle = getattr(figure, "_suptitle", None)
    return {
        "type": "superchart",
        "title": (suptitle.get_text() or None) if suptitle is not None else None,
        "elements": [axes_to_chart(ax) for ax in axes],
    }


def axes_to_chart(ax: Any) -> Chart:
    kind = chart_type(ax)
    if kind in ("line", "scatter"):
        return _point_chart(ax, kind)
    if kind == "bar":
        return _bar_chart(ax)
    if kind == "pie":
        return _pie_chart(ax)
    if kind == "box_and_whisker":
        return _box_chart(ax)
    return {"type": "unknown", "title": _title(ax), "elements": []}


def chart_type(ax: Any) -> str:
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    artists = [a for a in ax._children if not isinstance(a, Text)]
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    artists = [a for a in artists if not (isinstance(a, Line2D) and _is_rule(a))]
    if all(isinstance(a, PathCollection) for a in artists):
        return "scatter"
    if all(isinstance(a, Wedge) for a in artists):
        return "pie"
    if all(isinstance(a, Rectangle) for a in artists):
        return "bar"
    return "unknown"


def _is_rule(line: Any) -> bool:
    """A straight horizontal or vertical two-point line: a grid or reference line."""
    xs, ys = list(line.get_xdata()), list(line.get_ydata())
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def _title(ax: Any) -> str | None:
    return ax.get_title() or None


def _chart_2d(ax: Any, kind: str) -> Chart:
    x_label, y_label = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {
        "type": kind,
        "title": _title(ax),
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
        "elements": [],
    }


def _unit(label: str | None) -> str | None:
    match = UNIT.search(label or "")
    return (match.group(1) or match.group(2)) if match else None


def _swap_axes(chart: Chart) -> None:
    chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
    chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]


def _point_chart(ax: Any, kind: str) -> Chart:
    chart = _chart_2d(ax, kind)
    for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
        is_date = _is_date_axis(axis)
        ticks = list(axis.get_ticklocs())
        labels = [label.get_text() for label in axis.get_ticklabels()]
        chart[f"{name}_ticks"] = [_date_tick(t) if is_date else _number(t) for t in ticks]
        chart[f"{name}_tick_labels"] = labels
        chart[f"{name}_scale"] = _scale(axis, is_date, ticks, labels)
    if kind == "line":
        lines = [line for line in ax.get_lines() if not _is_rule(line)]
        for n, line in enumerate(lines):
            label = str(line.get_label())
            chart["elements"].append(
                {
                    "label": f"Line {n}" if label.startswith("_") else label,
                    "points": _points(line.get_xdata(), line.get_ydata()),
                }
            )
    else:
        for collection in ax.collections:
            offsets = collection.get_offsets()
            chart["elements"].append(
                {
                    "label": str(collection.get_label()),
                    "points": _points([p[0] for p in offsets], [p[1] for p in offsets]),
                }
            )
    return chart


def _is_date_axis(axis: Any) -> bool:
    import matplotlib.dates as mdates

    get = getattr(axis, "get_converter", None)
    converter = get() if get is not None else axis.converter
    date_types = tuple(
        t
        for t in (
            getattr(mdates, "DateConverter", None),
            getattr(mdates, "ConciseDateConverter", None),
            getattr(mdates, "_SwitchableDateConverter", None),
        )
        if t is not None
    )
    return isinstance(converter, date_types)


def _date_tick(tick: float) -> str:
    import matplotlib.dates as mdates

    return str(mdates.num2date(tick).isoformat())


def _scale(axis: Any, is_date: bool, ticks: list[Any], labels: list[str]) -> str:
    if is_date:
        return "datetime"
    scale = str(axis.get_scale())
    if scale != "linear":
        return scale
    # Ticks 0..n-1 labelled with something else than their numbers: categories.
    pairs = enumerate(zip(ticks, labels, strict=False))
    if ticks and all(t == i and str(i) != label for i, (t, label) in pairs):
        return "categorical"
    return "linear"


def _points(xs: Any, ys: Any) -> list[list[Any]]:
    return [[_value(x), _value(y)] for x, y in zip(xs, ys, strict=False)]


def _value(value: Any) -> Any:
    """A JSON-friendly point coordinate: dates as ISO strings, numbers as floats."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if type(value).__name__ == "datetime64":
        return str(value.astype("datetime64[s]"))
    if isinstance(value, str):
        return value
    try:
        return _number(value)
    except (TypeError, ValueError):
        return str(value)


def _number(value: Any) -> float | None:
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        return None
    return float(f"{number:.{DIGITS}g}")


def _label_at(position: float, ticks: list[float], labels: list[str]) -> str:
    """The label of the tick nearest a position (a bar's or box's centre)."""
    if not ticks:
        return str(_number(position))
    nearest = min(range(len(ticks)), key=lambda i: abs(ticks[i] - position))
    return labels[nearest] if nearest < len(labels) and labels[nearest] else str(ticks[nearest])


def _bar_chart(ax: Any) -> Chart:
    chart = _chart_2d(ax, "bar")
    horizontal = False
    for n, container in enumerate(ax.containers):
        group = str(container.get_label())
        group = f"Group {n}" if group.startswith("_") else group
        horizontal = getattr(container, "orientation", "vertical") == "horizontal"
        axis = ax.yaxis if horizontal else ax.xaxis
        ticks = list(axis.get_ticklocs())
        labels = [label.get_text() for label in axis.get_ticklabels()]
        for rect in container:
            if horizontal:
                centre, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
            else:
                centre, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
            chart["elements"].append(
                {"label": _label_at(centre, ticks, labels), "group": group, "value": _number(value)}
            )
    if horizontal:
        _swap_axes(chart)
    return chart


def _pie_chart(ax: Any) -> Chart:
    return {
        "type": "pie",
        "title": _title(ax),
        "elements": [
            {
                "label": str(wedge.get_label()),
                "angle": _number(abs(wedge.theta2 - wedge.theta1)),
                "radius": _number(wedge.r),
            }
            for wedge in ax.patches
        ],
    }


def _box_chart(ax: Any) -> Chart:
    """Boxes from their patches; medians, whiskers and outliers from the lines around them."""
    chart = _chart_2d(ax, "box_and_whisker")
    lines = [
        (list(map(float, line.get_xdata())), list(map(float, line.get_ydata())))
        for line in ax.get_lines()
    ]
    flat_y = sum(1 for xs, ys in lines if len(ys) == 2 and ys[0] == ys[1])
    flat_x = sum(1 for xs, ys in lines if len(xs) == 2 and xs[0] == xs[1])
    # Upright boxes have their caps and medians level (more level lines than upright ones).
    horizontal = flat_x > flat_y
    if horizontal:
        lines = [(ys, xs) for xs, ys in lines]
        _swap_axes(chart)
    axis = ax.yaxis if horizontal else ax.xaxis
    ticks = list(axis.get_ticklocs())
    labels = [label.get_text() for label in axis.get_ticklabels()]
    for patch in ax.patches:
        vertices = patch.get_path().vertices
        across, along = vertices[:, 0], vertices[:, 1]
        if horizontal:
            across, along = along, across
        left, right = float(min(across)), float(max(across))
        low, high = float(min(along)), float(max(along))
        box: dict[str, Any] = {
            "label": _label_at((left + right) / 2, ticks, labels),
            "min": low,
            "first_quartile": _number(low),
            "median": None,
            "third_quartile": _number(high),
            "max": high,
            "outliers": [],
        }
        for xs, ys in lines:
            if not all(left - 1e-9 <= x <= right + 1e-9 for x in xs):
                continue
            if len(ys) == 2 and ys[0] == ys[1] and low <= ys[0] <= high:
                box["median"] = _number(ys[0])
            elif len(ys) == 2 and xs[0] == xs[1]:
                if max(ys) <= low + 1e-9:
                    box["min"] = min(ys)
                elif min(ys) >= high - 1e-9:
                    box["max"] = max(ys)
            elif len(ys) != 2 or (ys[0] != ys[1] and xs[0] != xs[1]):
                box["outliers"] += [_number(y) for y in ys]
        box["min"], box["max"] = _number(box["min"]), _number(box["max"])
        chart["elements"].append(box)
    return chart
