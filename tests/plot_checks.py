"""What a plot that reads cleanly at its default size satisfies, checked on the drawn matplotlib figure.

:func:`figure_problems` draws the figure and returns one line per problem: no title (neither a figure title nor
one on every panel), two pieces of text whose boxes overlap (titles, axis labels, tick labels, annotations,
legend entries), text outside the figure, an annotation outside its axes, text struck through by a horizontal
or vertical reference line.
"""

from __future__ import annotations

import itertools
from typing import Any


def _visible_texts(fig: Any) -> list[tuple[str, Any]]:
    """(what, Text artist) for every visible, non-empty piece of text of the figure."""
    found: list[tuple[str, Any]] = []
    if fig._suptitle is not None:
        found.append(("figure title", fig._suptitle))
    for legend in fig.legends:
        found += [("legend", t) for t in (legend.get_title(), *legend.get_texts())]
    for n, ax in enumerate(fig.axes):
        found += [(f"axes {n} title", t) for t in (ax.title, ax._left_title, ax._right_title)]
        found += [(f"axes {n} label", ax.xaxis.label), (f"axes {n} label", ax.yaxis.label)]
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()  # matplotlib keeps ticks outside the view, and does not draw them
                if loc is not None and low - 1e-9 * abs(low) <= loc <= high + 1e-9 * abs(high):
                    found += [(f"axes {n} tick", t) for t in (tick.label1, tick.label2) if t.get_visible()]
        found += [(f"axes {n} annotation", t) for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            found += [(f"axes {n} legend", t) for t in (legend.get_title(), *legend.get_texts())]
    return [(what, t) for what, t in found if t.get_visible() and t.get_text().strip()]


def titles(fig: Any) -> list[str]:
    """The figure's title and its panels' titles, as drawn."""
    names = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    return [t for t in names + [ax.get_title() for ax in fig.axes] if t.strip()]


def figure_problems(fig: Any) -> list[str]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    problems = []
    if not (fig._suptitle is not None and fig._suptitle.get_text().strip()) and not all(
        ax.get_title().strip() for ax in fig.axes
    ):
        problems.append("no title: neither a figure title nor one on every panel")
    texts = [(what, t, t.get_window_extent(renderer)) for what, t in _visible_texts(fig)]
    for what, text, box in texts:
        if box.x0 < page.x0 - 1 or box.x1 > page.x1 + 1 or box.y0 < page.y0 - 1 or box.y1 > page.y1 + 1:
            problems.append(f"{what} {text.get_text()!r} leaves the figure")
    for (w1, t1, b1), (w2, t2, b2) in itertools.combinations(texts, 2):
        if b1.width and b2.width and b1.overlaps(b2):
            problems.append(f"{w1} {t1.get_text()!r} and {w2} {t2.get_text()!r} overlap")
    for ax in fig.axes:
        inside = ax.get_window_extent(renderer)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            if box.x0 < inside.x0 - 1 or box.x1 > inside.x1 + 1 or box.y0 < inside.y0 - 1 or box.y1 > inside.y1 + 1:
                problems.append(f"annotation {text.get_text()!r} leaves its axes")
            for line in ax.get_lines():
                xs, ys = line.get_xdata(), line.get_ydata()
                points = line.get_transform().transform(list(zip(xs, ys, strict=True))) if len(xs) else []
                level = len(points) == 2 and points[0][1] == points[1][1] and box.y0 < points[0][1] < box.y1
                if level and min(points[0][0], points[1][0]) < box.x1 and max(points[0][0], points[1][0]) > box.x0:
                    problems.append(f"annotation {text.get_text()!r} is struck through by a line")
    return problems
