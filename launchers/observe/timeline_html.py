"""The timeline as one self-contained HTML file: the same drawing as SVG, each mark's detail on hover.

Nothing is fetched: the SVG is inline (its text drawn as paths, no font needed), the script and
the style are inline, the details are a JSON object in the page. Hovering a mark (or a hang,
straggler or silence bar) shows the event's own words and fields; a click pins it; a link to
``file.html#ev3`` opens with mark ``ev3`` pinned. Below the picture, every event of the run in a
table (collapsed), for a search with the browser's find.
"""

from __future__ import annotations

import html
import io
import json
import re
import time
from typing import Any

from launchers.observe.timeline_draw import draw
from launchers.observe.timeline_model import Timeline
from launchers.observe.timeline_style import title

_STYLE = """
body { font-family: sans-serif; margin: 12px; color: #222; }
#fig svg { max-width: 100%; height: auto; }
#tip { position: absolute; display: none; max-width: 560px; background: #fffbe6; border: 2px solid #d4a017;
       padding: 6px 8px; font: 12px monospace; white-space: pre-wrap; box-shadow: 2px 2px 6px #999; z-index: 9; }
[data-ev] { cursor: pointer; }
table { border-collapse: collapse; font: 12px monospace; }
td, th { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; vertical-align: top; }
"""

_SCRIPT = """
const detail = JSON.parse(document.getElementById('detail').textContent);
const tip = document.getElementById('tip');
let pinned = null;
function show(id, el) {
  const box = el.getBoundingClientRect();
  tip.textContent = detail[id];
  tip.style.display = 'block';
  tip.style.left = (window.scrollX + Math.min(box.right + 8, window.innerWidth - 580)) + 'px';
  tip.style.top = (window.scrollY + box.top + 8) + 'px';
}
for (const id of Object.keys(detail)) {
  const el = document.getElementById(id);
  if (!el) continue;
  el.setAttribute('data-ev', id);
  el.addEventListener('mouseenter', () => show(id, el));
  el.addEventListener('mouseleave', () => { if (pinned !== id) { tip.style.display = 'none'; } });
  el.addEventListener('click', () => { pinned = pinned === id ? null : id; show(id, el); });
}
const wanted = location.hash.slice(1);
if (wanted && detail[wanted] && document.getElementById(wanted)) {
  pinned = wanted; show(wanted, document.getElementById(wanted));
}
"""


def render(t: Timeline, events: list[dict[str, Any]] | None = None) -> str:
    """The page for ``t``; ``events``: the run's events for the table below the picture."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "path"  # text as paths: no font to fetch
    drawing = draw(t)
    buffer = io.StringIO()
    drawing.figure.savefig(buffer, format="svg")
    from matplotlib import pyplot as plt

    plt.close(drawing.figure)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]  # the XML declaration and doctype do not belong inside HTML
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)  # matplotlib's RDF credits: no links
    detail = json.dumps(drawing.hover, ensure_ascii=False).replace("</", "<\\/")
    rows = "".join(_row(e) for e in events or [] if e.get("event") != "progress")
    name = html.escape(t.job)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>mlaunch timeline: {name}</title><style>{_STYLE}</style></head><body>\n"
        f"<h2>{html.escape(title(t))}</h2>\n"
        "<p>Hover a mark for its event (click pins it). Top: steps over time per node; middle: a lane per node "
        "with each fault where it hit; bottom: where the wall time went. Shaded: from the last step before a "
        "fault to the first step after it.</p>\n"
        f"<div id='fig'>{svg}</div><div id='tip'></div>\n"
        f"<details><summary>every event of the run ({len(events or [])}, progress samples left out)</summary>"
        f"<table><tr><th>time</th><th>event</th><th>node</th><th>detail</th></tr>{rows}</table></details>\n"
        f"<script type='application/json' id='detail'>{detail}</script>\n<script>{_SCRIPT}</script>\n"
        "</body></html>\n"
    )


def _row(e: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(e.get("time") or 0.0)))
    rest = {k: v for k, v in e.items() if k not in ("time", "event", "node", "job")}
    text = json.dumps(rest, ensure_ascii=False, default=str)
    return (
        f"<tr><td>{stamp}</td><td>{html.escape(str(e.get('event')))}</td>"
        f"<td>{html.escape(str(e.get('node', '')))}</td><td>{html.escape(text[:600])}</td></tr>"
    )
