"""The scaffolding every phaselens HTML page shares: templates, CSS, plotly.js, figure JSON.

Why one module: the run report, the comparison and the what-if page must look alike, open with
no network (CSS and plotly.js inlined) and escape every value the same way (Jinja2 autoescaping
on, figure JSON made safe for a <script> element), so they build on these functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import numpy as np

if TYPE_CHECKING:
    import plotly.graph_objects as go


@lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("phaselens.report", "templates"),
        autoescape=True,  # every template variable is HTML-escaped unless marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The plotly.js bundle shipped with the plotly package (inlined: no CDN, no network)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def page_css() -> str:
    return (resources.files("phaselens.report") / "templates" / "base.css").read_text("utf-8")


def fig_json(fig: go.Figure) -> str:
    """Figure JSON safe to inline in a <script> element (`<`, `>` and `/` are escaped)."""
    import plotly.io as pio  # here: the what-if commands import this module before any figure

    s = str(pio.to_json(fig, validate=False, engine="json"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(template: jinja2.Template, ctx: Mapping[str, Any]) -> str:
    """A page from its template and context, with the shared CSS and plotly.js inlined."""
    return template.render(**ctx, css=page_css(), plotlyjs=plotly_js())


def write_page(text: str, path: Path | str) -> Path:
    """Write a rendered page, creating its folder; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


# --- formatting -------------------------------------------------------------------------------


def fmt(x: Any, unit: str = "", nd: int | None = None) -> str:
    """Human number: '–' for missing, thousands separators, few significant digits."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}{unit}"
    if isinstance(x, float):
        if nd is None:
            a = abs(x)
            nd = 0 if a >= 100 else 1 if a >= 10 else 2 if a >= 0.1 else 3
        return f"{x:,.{nd}f}{unit}"
    return f"{x}{unit}"


def ms(x: Any) -> str:
    return fmt(x, " ms")


def get(d: Any, *path: str) -> Any:
    """A nested value of the analysis dict, None where any step is missing."""
    for k in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(k)
    return d
