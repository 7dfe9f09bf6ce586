# Structured data of the charts matplotlib figures draw (prepended to the Python driver).
#
# E2B's interpreter gives a shown figure a `chart` result beside its PNG: the chart's kind and
# the data it plots, for clients that redraw it interactively. Its format is E2B's (the
# `chart` field of their SDKs' results); what is read is matplotlib's public artist API, and
# the statistics box plots are drawn from, which their artists no longer hold, are kept by
# `_koder_keep_box_stats` when pyplot's backend is ours.


def _koder_chart(fig):
    """The chart `fig` draws as a dict in E2B's `chart` format, or None for a figure with no
    axes. Call it after the figure was drawn (its tick labels are filled in by drawing)."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible() and not hasattr(ax, "_colorbar")]
    if not axes:
        return None
    if len(axes) == 1:
        return _koder_axes_chart(axes[0])
    charts = [c for c in (_koder_axes_chart(ax) for ax in axes) if c["type"] != "unknown"]
    title = None
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text():
        title = suptitle.get_text()
    if len(charts) == 1 and title is None:
        return charts[0]
    return {"type": "superchart" if charts else "unknown", "title": title, "elements": charts}


def _koder_axes_chart(ax):
    from matplotlib.container import BarContainer
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Wedge

    title = ax.get_title() or None
    # Box plots whose artists an `ax.clear()` removed are gone from the chart as well.
    boxes = [s for s, median in getattr(ax, "_koder_box_stats", ()) if median in ax.lines]
    if boxes:
        return _koder_planar(ax, "box_and_whisker", title,
                             [_koder_box(i, s) for i, s in enumerate(boxes)])
    wedges = [p for p in ax.patches if isinstance(p, Wedge) and p.get_visible()]
    if wedges:
        return {"type": "pie", "title": title, "elements": [
            {"label": _koder_label(w), "angle": _koder_round(abs(w.theta2 - w.theta1)),
             "radius": _koder_number(w.r)} for w in wedges]}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars:
        return _koder_planar(ax, "bar", title, [e for c in bars for e in _koder_bars(ax, c)])
    lines = [line for line in ax.get_lines() if line.get_visible()]
    dots = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_visible()]
    if lines:
        return _koder_point_chart(ax, "line", title, [
            (_koder_label(line), line.get_xydata()) for line in lines])
    if dots:
        return _koder_point_chart(ax, "scatter", title, [
            (_koder_label(c), c.get_offsets()) for c in dots])
    return {"type": "unknown", "title": title, "elements": []}


def _koder_label(artist):
    # matplotlib names unlabelled artists `_child0`, `_container1`: no label of the user's.
    label = artist.get_label()
    return "" if label is None or str(label).startswith("_") else str(label)


def _koder_number(v):
    # JSON has no NaN or infinity: a gap in the data is null.
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _koder_round(v):
    # A pie's angles come from its fractions in single precision (323.99999141693115 for
    # 90 %): the digits that precision does not hold are dropped.
    f = _koder_number(v)
    return None if f is None else round(f, 4)


def _koder_unit(label):
    import re

    m = re.search(r"[(\[]([^()\[\]]+)[)\]]\s*$", label or "")
    return m.group(1).strip() if m else None


def _koder_planar(ax, kind, title, elements):
    x_label, y_label = ax.get_xlabel() or None, ax.get_ylabel() or None
    return {"type": kind, "title": title, "x_label": x_label, "y_label": y_label,
            "x_unit": _koder_unit(x_label), "y_unit": _koder_unit(y_label),
            "elements": elements}


def _koder_converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if get is not None else getattr(axis, "converter", None)


def _koder_axis_kind(axis):
    """The axis's scale as E2B names it: matplotlib's own, or for a linear one that holds
    dates or categories, `datetime` or `categorical`."""
    scale = axis.get_scale()
    if scale != "linear":
        return scale
    module = type(_koder_converter(axis)).__module__
    if module == "matplotlib.dates":
        return "datetime"
    if module == "matplotlib.category":
        return "categorical"
    return "linear"


def _koder_axis_values(axis, kind, values):
    """Values in the axis's data coordinates as the user gave them: dates as ISO strings,
    categories by name, numbers as floats."""
    if kind == "datetime":
        from matplotlib.dates import num2date

        def shown(v):
            f = _koder_number(v)
            return None if f is None else num2date(f).isoformat()
        return [shown(v) for v in values]
    if kind == "categorical":
        try:
            names = {i: str(name) for name, i in axis.units._mapping.items()}
        except AttributeError:
            names = {}
        return [names.get(int(round(v)), _koder_number(v)) if _koder_number(v) is not None
                else None for v in values]
    return [_koder_number(v) for v in values]


def _koder_ticks(ax, which):
    axis = ax.xaxis if which == "x" else ax.yaxis
    kind = _koder_axis_kind(axis)
    ticks = ax.get_xticks() if which == "x" else ax.get_yticks()
    labels = ax.get_xticklabels() if which == "x" else ax.get_yticklabels()
    return {which + "_ticks": _koder_axis_values(axis, kind, ticks),
            which + "_tick_labels": [t.get_text() for t in labels],
            which + "_scale": kind}


def _koder_point_chart(ax, kind, title, series):
    x_kind, y_kind = _koder_axis_kind(ax.xaxis), _koder_axis_kind(ax.yaxis)
    elements = []
    for label, xy in series:
        xs = _koder_axis_values(ax.xaxis, x_kind, [p[0] for p in xy])
        ys = _koder_axis_values(ax.yaxis, y_kind, [p[1] for p in xy])
        elements.append({"label": label, "points": [list(p) for p in zip(xs, ys)]})
    chart = _koder_planar(ax, kind, title, elements)
    chart.update(_koder_ticks(ax, "x"))
    chart.update(_koder_ticks(ax, "y"))
    return chart


def _koder_bars(ax, container):
    horizontal = getattr(container, "orientation", "vertical") == "horizontal"
    axis = ax.yaxis if horizontal else ax.xaxis
    kind = _koder_axis_kind(axis)
    group = _koder_label(container)
    out = []
    for rect in container.patches:
        if horizontal:
            at, value = rect.get_y() + rect.get_height() / 2, rect.get_width()
        else:
            at, value = rect.get_x() + rect.get_width() / 2, rect.get_height()
        name = _koder_axis_values(axis, kind, [at])[0]
        out.append({"label": name if isinstance(name, str) else _koder_tick_text(ax, axis, at),
                    "group": group, "value": _koder_number(value)})
    return out


def _koder_tick_text(ax, axis, at):
    """The label of the tick at `at`, or the number itself where there is none."""
    for tick, label in zip(axis.get_ticklocs(), axis.get_ticklabels()):
        if abs(tick - at) < 1e-9 and label.get_text():
            return label.get_text()
    return "%g" % at


def _koder_box(i, stats):
    return {"label": str(stats.get("label", i + 1)),
            "min": _koder_number(stats.get("whislo")),
            "first_quartile": _koder_number(stats.get("q1")),
            "median": _koder_number(stats.get("med")),
            "third_quartile": _koder_number(stats.get("q3")),
            "max": _koder_number(stats.get("whishi")),
            "outliers": [_koder_number(v) for v in stats.get("fliers", [])]}


def _koder_keep_box_stats(Axes):
    """Makes every box plot keep the statistics it is drawn from on its axes (the artists
    hold only the shapes): `boxplot` computes them and hands them to `bxp`."""
    drawn = Axes.bxp
    if getattr(drawn, "_koder", False):
        return

    def bxp(self, bxpstats, *args, **kwargs):
        artists = drawn(self, bxpstats, *args, **kwargs)
        try:
            kept = getattr(self, "_koder_box_stats", None) or []
            drawn_stats = zip(bxpstats, artists["medians"])
            self._koder_box_stats = kept + [(dict(s), m) for s, m in drawn_stats]
        except Exception:
            pass
        return artists

    bxp._koder = True
    bxp.__wrapped__ = drawn
    bxp.__doc__ = drawn.__doc__
    Axes.bxp = bxp
