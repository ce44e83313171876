"""The HTML pages of a capacity search (capacity.json) and of an engine-setting sweep (sweep.json).

Why here: the pages read the capacity and sweep results and draw them in the run report's style
(`report/page.py`: the same CSS, inlined plotly.js, escaped figure JSON), so they open offline.
Both files come from other code and may be from an older or newer phaselens: every field past
the pinned ones is optional, a missing one becomes a note on the page instead of a figure, and
a wrongly typed one is read as missing rather than failing the page.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from phaselens.report.fig_capacity import (
    Interval,
    Knee,
    Point,
    SettingCurve,
    class_verdict_figure,
    goodput_figure,
    latency_figure,
    sweep_bars_figure,
    sweep_curves_figure,
    verdict_color,
)
from phaselens.report.figdata import slo_threshold
from phaselens.report.page import fig_json, fmt, render_page, template_env, write_page

STATUS_NOTE = {
    "running": "still probing (the page is rewritten after every probe); the probes so far",
    "interrupted": "stopped by Ctrl-C; the probes it finished",
    "budget": "the probe-second budget ran out before the bracket reached the precision",
}


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x)
    return v if v == v and abs(v) != float("inf") else None


def _ival(x: Any) -> Interval:
    if isinstance(x, Sequence) and not isinstance(x, str) and len(x) == 2:
        lo, hi = _num(x[0]), _num(x[1])
        if lo is not None and hi is not None:
            return (min(lo, hi), max(lo, hi))
    return None


def _map(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _list(x: Any) -> list[Mapping[str, Any]]:
    if isinstance(x, Sequence) and not isinstance(x, str):
        return [e for e in x if isinstance(e, Mapping)]
    return []


def _int_text(x: Any) -> str:
    v = _num(x)
    return "–" if v is None else f"{v:g}"


def _interval_text(iv: Interval, unit: str = "") -> str:
    return "–" if iv is None else f"[{fmt(iv[0])}, {fmt(iv[1])}]{unit}"


def _verdict(p: Mapping[str, Any]) -> str:
    v = p.get("verdict")
    return v.strip().lower() if isinstance(v, str) and v.strip() else "unknown"


def _stop_reason(p: Mapping[str, Any]) -> str:
    """Why a probe stopped early: capacity.json's `stopped_early` is the reason itself (or
    null); an older file had a flag and `stop_reason`."""
    for key in ("stopped_early", "stop_reason"):
        if isinstance(p.get(key), str) and p[key].strip():
            return str(p[key])
    return ""


def _run_point(p: Mapping[str, Any], rate: float, verdict: str, bistable: bool = False) -> Point:
    why = _stop_reason(p)
    label = f"{p.get('run', '')}" + (f" · stopped early: {why}" if p.get("stopped_early") else "")
    if bistable:
        label = f"{verdict} at a bistable load (its repeats disagree) · {label}"
    return Point(
        rate_rps=rate,
        verdict="bistable" if bistable else verdict,
        stopped_early=bool(p.get("stopped_early")),
        label=label,
        goodput_rps=_num(p.get("goodput_rps")),
        goodput_ci=_ival(p.get("goodput_ci_rps")),
        attainment=_num(p.get("attainment")),
        attainment_ci=_ival(p.get("attainment_ci")),
        ttft_p90_ms=_num(p.get("ttft_p90_ms")),
        ttft_ci=_ival(p.get("ttft_p90_ci_ms")),
        tpot_p90_ms=_num(p.get("tpot_p90_ms")),
        tpot_ci=_ival(p.get("tpot_p90_ci_ms")),
    )


def probe_points(
    probes: Sequence[Mapping[str, Any]], bistable: Sequence[float] = ()
) -> list[Point]:
    """Every measured run as a point: a probe, or each of its repeats when it lists them; a run
    at one of the `bistable` offered loads is drawn as bistable (its own verdict in the hover)."""
    out: list[Point] = []
    for p in probes:
        rate = _num(p.get("rate_rps"))
        if rate is None:
            continue
        reps = _list(p.get("repeats"))
        for r in reps or [p]:
            x = _num(r.get("rate_rps")) or rate
            bi = any(abs(x - b) <= 1e-9 * max(abs(b), 1.0) for b in bistable)
            out.append(_run_point(r, x, _verdict(r) if reps else _verdict(p), bi))
    return out


def _rel(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target.resolve(), page_dir.resolve())).as_posix()


def _href(run: Any, base: Path, page_dir: Path, page: str = "report.html") -> str | None:
    """Relative link from the page to a run's `page` (or to its directory when not written).
    `run` is taken under `base`; a path that is not there (capacity.json's `run` is the path the
    search wrote, relative to where it ran) is looked for as `base`'s child of that name, then
    as written."""
    if not isinstance(run, str) or not run:
        return None
    d = base / run
    if not d.exists():
        d = next((c for c in (base / Path(run).name, Path(run)) if c.exists()), d)
    return _rel(d / page if (d / page).is_file() else d, page_dir)


def _class_verdicts(p: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A probe's verdict per flow-control class (`probes[i].classes`), in the file's order."""
    return [(str(n), _verdict(_map(v))) for n, v in _map(p.get("classes")).items()]


def _targets_text(targets: Any) -> str:
    parts = []
    for t in _list(targets):
        thr = _num(t.get("threshold_ms"))
        if isinstance(t.get("metric"), str) and thr is not None:
            parts.append(f"{t['metric']} {t.get('stat', '')} ≤ {fmt(thr)} ms")
    return ", ".join(parts) or "–"


def _per_class(res: Mapping[str, Any], probes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """capacity.json `per_class`: per class its capacity (the highest load at which its own SLO
    holds), that load's scale, the first load it missed, its SLO (from the probes' targets) and
    how many probe runs passed."""
    out = []
    for name, v in _map(res.get("per_class")).items():
        v = _map(v)
        cap = _num(v.get("capacity_rps"))
        judged = [_map(_map(p.get("classes")).get(name)) for p in probes]
        judged = [j for j in judged if j]
        out.append(
            {
                "cls": str(name),
                "rps": "0 (missed at every load probed)" if cap == 0 else fmt(cap),
                "scale": fmt(_num(v.get("load_scale")), "×"),
                "edge": fmt(_num(v.get("upper_edge_rps"))),
                "slo": _targets_text(judged[0].get("targets")) if judged else "–",
                "passed": f"{sum(_verdict(j) == 'pass' for j in judged)}/{len(judged)}",
            }
        )
    return out


def _class_figure(res: Mapping[str, Any], probes: Sequence[Mapping[str, Any]]) -> str | None:
    """The per-class verdict strip (fig_capacity.class_verdict_figure), None without classes."""
    marks = [
        (name, rate, verdict, f"{verdict} · {p.get('run', '')}")
        for p in probes
        if (rate := _num(p.get("rate_rps"))) is not None
        for name, verdict in _class_verdicts(p)
    ]
    caps = {
        str(n): _num(_map(v).get("capacity_rps")) for n, v in _map(res.get("per_class")).items()
    }
    if not marks and not caps:
        return None
    return fig_json(class_verdict_figure(marks, caps))


def _probe_rows(probes: Sequence[Mapping[str, Any]], base: Path, page_dir: Path) -> list[Any]:
    rows = []
    for i, p in enumerate(probes, 1):
        reps = p.get("repeats")
        runs = [r.get("run") for r in _list(reps)] or [p.get("run")]
        why = _stop_reason(p)
        rows.append(
            {
                "i": i,
                "scale": fmt(_num(p.get("load_scale")), "×"),
                "rate": fmt(_num(p.get("rate_rps"))),
                "verdict": _verdict(p),
                "color": verdict_color(_verdict(p)),
                "repeats": len(_list(reps))
                if _list(reps)
                else fmt(reps if isinstance(reps, int) else None),
                "goodput": fmt(_num(p.get("goodput_rps"))),
                "goodput_ci": _interval_text(_ival(p.get("goodput_ci_rps"))),
                "ttft": fmt(_num(p.get("ttft_p90_ms"))),
                "tpot": fmt(_num(p.get("tpot_p90_ms"))),
                "stopped": (f"yes: {why}" if why else "yes") if p.get("stopped_early") else "",
                "classes": [(n, v, verdict_color(v)) for n, v in _class_verdicts(p)],
                "links": [
                    (Path(r).name, _href(r, base, page_dir)) for r in runs if isinstance(r, str)
                ],
            }
        )
    return rows


Curve = tuple[list[float], list[float | None], list[float | None], list[float | None]]


def _predicted_curve(pred: Sequence[Mapping[str, Any]]) -> Curve:
    """The simulator's points sorted by offered load: x, then goodput, TTFT p90, TPOT p90."""
    pts = [(r, p) for p in pred if (r := _num(p.get("rate_rps"))) is not None]
    pts.sort(key=lambda rp: rp[0])
    ys = [[_num(p.get(k)) for _, p in pts] for k in ("goodput_rps", "ttft_p90_ms", "tpot_p90_ms")]
    return [r for r, _ in pts], ys[0], ys[1], ys[2]


def _binding_text(b: Mapping[str, Any]) -> str:
    if not b:
        return "–"
    thr = _num(b.get("threshold_ms"))
    model = b.get("model")
    who = "all requests" if not model or model == "*" else str(model)
    parts = [who, f"{b.get('metric', '?')} {b.get('stat', '')}"]
    text = " · ".join(parts) + (f" ≤ {fmt(thr)} ms" if thr is not None else "")
    obs, rate = _num(b.get("observed_ms")), _num(b.get("rate_rps"))
    if obs is not None:
        text += f": {fmt(obs)} ms"
        iv = b.get("interval_ms")
        if isinstance(iv, Sequence) and not isinstance(iv, str) and len(iv) == 2:
            text += f" [{fmt(_num(iv[0]))}, {fmt(_num(iv[1]))}]"
        if rate is not None:
            text += f" at {fmt(rate)} req/s"
    return text


def _stability_text(st: Mapping[str, Any], stable: Any) -> str:
    """The 1.1× probe: its verdict and whether it tipped over (docs/capacity.md, "Stability")."""
    if not st:
        return "not measured"
    rate = fmt(_num(st.get("rate_rps")), " req/s")
    tips = st.get("tips_over") is True or stable is False
    word = "tips over: at a cliff, keep headroom" if tips else "does not tip over"
    return f"1.1× ({rate}) {st.get('verdict', '?')}, {word}"


def _per_model(x: Any) -> list[dict[str, str]]:
    items = (
        list(x.items())
        if isinstance(x, Mapping)
        else [(str(e.get("model", "?")), e) for e in _list(x)]
    )
    out = []
    for name, v in items:
        v = _map(v)
        out.append(
            {
                "model": str(name),
                "rps": fmt(_num(v.get("capacity_rps"))),
                "interval": _interval_text(_ival(v.get("interval"))),
                "tok": fmt(
                    _num(v.get("output_tokens_per_s"))
                    if _num(v.get("output_tokens_per_s")) is not None
                    else _num(v.get("capacity_output_tokens_per_s"))
                ),
            }
        )
    return out


def capacity_context(res: Mapping[str, Any], out: Path, base: Path | None = None) -> dict[str, Any]:
    """Everything the capacity template shows; `base` is where probe `run` paths start."""
    base = out.parent if base is None else base
    probes = _list(res.get("probes"))
    bistable = [r for b in _list(res.get("bistable")) if (r := _num(b.get("rate_rps"))) is not None]
    pts = probe_points(probes, bistable)
    knee = Knee(_num(res.get("capacity_rps")), _ival(res.get("interval")))
    pred = _predicted_curve(_list(res.get("predicted")))
    # a URL without --deploy: the queue fitted to the saturation probe predicted, not the simulator
    pred_name = "fitted queue (predicted)" if res.get("saturation") else "simulator (predicted)"
    slo = _map(res.get("slo"))
    notes = [f"search: {n}" for n in res.get("notes", ()) if isinstance(n, str)]
    gone = _map(res.get("unreachable"))
    if isinstance(gone.get("message"), str):
        notes.insert(0, str(gone["message"]))
    status = res.get("status")
    if isinstance(status, str) and status in STATUS_NOTE:
        notes.insert(0, f"search {status}: {STATUS_NOTE[status]}")
    if not pred[0]:
        notes.append(
            "capacity.json has no predicted curve: no prediction is drawn (no deployment"
            " and no saturation probe, calibration failed, or an older phaselens wrote the file)."
        )
    ser = _map(res.get("serial"))
    if ser and ser.get("holds") is False:
        neff = [x for t in _list(ser.get("targets")) if (x := _num(_map(t).get("n_eff")))]
        notes.append(
            "serial check: at the capacity the requests' latencies are serially correlated"
            f" (effective sample size {fmt(min(neff)) if neff else '?'}): for that many values"
            " the SLO is not held with confidence; longer probes or more repeats settle it."
        )
    if not slo_threshold(slo, "ttft_ms") and not slo_threshold(slo, "tpot_ms"):
        notes.append("capacity.json has no TTFT/TPOT SLO thresholds: no SLO lines drawn.")
    figures = []
    if pts:
        figures = [
            ("goodput", fig_json(goodput_figure(pts, (pred[0], pred[1]), knee, pred_name))),
            (
                "latency",
                fig_json(
                    latency_figure(
                        pts,
                        (pred[0], pred[2], pred[3]),
                        knee,
                        {k: slo_threshold(slo, k) for k in ("ttft_ms", "tpot_ms")},
                        pred_name,
                    )
                ),
            ),
        ]
    else:
        notes.append("capacity.json lists no probe with an offered load: nothing to draw.")
    class_fig = _class_figure(res, probes)
    if class_fig is not None:
        figures.append(("classes", class_fig))
    cap = knee.capacity_rps
    iv = knee.interval
    return {
        "title": str(
            res.get("spec")
            or _map(res.get("settings")).get("spec")
            or res.get("name")
            or out.parent.name
        ),
        "capacity": fmt(cap, " req/s") if cap is not None else "none found",
        "interval": _interval_text(iv, " req/s"),
        "pm": fmt((iv[1] - iv[0]) / 2, " req/s") if iv is not None else "–",
        "tokens": fmt(_num(res.get("capacity_output_tokens_per_s")), " tok/s"),
        "binding": _binding_text(_map(res.get("binding"))),
        "predicted_knee": fmt(_num(res.get("predicted_knee_rps")), " req/s"),
        "predicted_by": "fitted queue" if res.get("saturation") else "calibrated simulator",
        "probe_seconds": fmt(_num(res.get("probe_seconds")), " s"),
        "bistable": bool(res.get("bistable")),
        "stability": _stability_text(_map(res.get("stability")), res.get("stable")),
        "status": str(res.get("status") or ""),
        "target": str(res.get("target") or ""),
        "slo": [
            (k, ", ".join(f"{s} ≤ {fmt(_num(v))} ms" for s, v in _map(d).items()))
            for k, d in slo.items()
        ],
        "per_model": _per_model(res.get("per_model")),
        "per_class": _per_class(res, probes),
        "probe_figures": bool(pts),
        "class_figure": class_fig is not None,
        "probe_classes": any(_class_verdicts(p) for p in probes),
        "probes": _probe_rows(probes, base, out.parent),
        "figures": figures,
        "notes": notes,
        "verdicts": [(v, verdict_color(v)) for v in ("pass", "fail", "uncertain", "bistable")],
    }


def capacity_page(result_json: Mapping[str, Any], out: Path, base: Path | None = None) -> Path:
    """Write the capacity search's page; probe links are relative to `out`'s folder."""
    ctx = capacity_context(result_json, out, base)
    return write_page(render_page(template_env().get_template("capacity.html.j2"), ctx), out)


# --- sweeps -----------------------------------------------------------------------------------


def _setting_label(s: Mapping[str, Any]) -> str:
    if isinstance(s.get("label"), str):
        return str(s["label"])
    vals = _map(s.get("setting") or s.get("set"))
    return ", ".join(f"{k}={v}" for k, v in vals.items()) or "?"


def _value(x: Any, *keys: str) -> float | None:
    if isinstance(x, Mapping):
        for k in keys:
            if _num(x.get(k)) is not None:
                return _num(x.get(k))
        return None
    return _num(x)


def setting_curve(s: Mapping[str, Any]) -> SettingCurve:
    """One setting's measured value, interval and prediction, wherever the file puts them."""
    cap = _map(s.get("capacity"))
    meas = s.get("measured")
    value = _value(meas, "value", "capacity_rps", "goodput_rps")
    if value is None:  # sweep.json's own `value`, then what older files carried
        value = _num(s.get("value"))
    if value is None:
        value = _num(cap.get("capacity_rps")) if cap else _num(s.get("goodput_rps"))
    iv = (
        _ival(_map(meas).get("interval"))
        or _ival(s.get("interval"))
        or _ival(cap.get("interval"))
        or _ival(s.get("goodput_ci_rps"))
    )
    return SettingCurve(
        label=_setting_label(s),
        points=tuple(probe_points(_list(cap.get("probes")))),
        value=value,
        interval=iv,
        predicted=_value(s.get("predicted"), "value", "capacity_rps", "goodput_rps"),
        pareto=bool(s.get("pareto")),
    )


def _setting_link(s: Mapping[str, Any], base: Path, page_dir: Path) -> str | None:
    """The setting's capacity page (beside its capacity.json), else its first run's report,
    else its directory."""
    cj = _map(s.get("capacity")).get("capacity_json")
    if isinstance(cj, str) and cj:
        return _href(str(Path(cj).parent), base, page_dir, "capacity.html")
    runs = [r.get("run") for r in _list(s.get("repeats")) if isinstance(r.get("run"), str)]
    if runs:
        return _href(runs[0], base, page_dir)
    return _href(s.get("dir"), base, page_dir, "capacity.html")


def sweep_context(sw: Mapping[str, Any], out: Path, base: Path | None = None) -> dict[str, Any]:
    base = out.parent if base is None else base
    settings = _list(sw.get("settings"))
    curves = [setting_curve(s) for s in settings]
    mode = sw.get("mode")
    if mode not in ("capacity", "rate"):
        mode = "capacity" if any(_map(s.get("capacity")) for s in settings) else "rate"
    what = "capacity (req/s)" if mode == "capacity" else "goodput at the fixed rate (req/s)"

    def rank_key(i: int) -> tuple[float, float]:
        r = _num(settings[i].get("rank"))
        v = curves[i].value
        return (r if r is not None else 1e18, -(v if v is not None else -1e18))

    rows: list[dict[str, Any]] = []
    for i in sorted(range(len(settings)), key=rank_key):
        s, c = settings[i], curves[i]
        err = _num(s.get("error_pct"))
        if err is None and c.value and c.predicted is not None:
            err = 100.0 * (c.predicted - c.value) / c.value
        msg = s.get("error") if isinstance(s.get("error"), str) else None
        rows.append(
            {
                "rank": _int_text(s.get("rank"))
                if _num(s.get("rank")) is not None
                else str(len(rows) + 1)
                if c.value is not None
                else "–",
                "label": c.label,
                "value": fmt(c.value),
                "interval": _interval_text(c.interval),
                "predicted": fmt(c.predicted),
                "error": "–" if err is None else f"{err:+.1f}%",
                "gpus": _int_text(s.get("gpus")),
                "pareto": c.pareto,
                "status": msg or str(s.get("status") or "ok"),
                "failed": msg is not None,
                "link": _setting_link(s, base, out.parent),
            }
        )
    notes, figures = [], []
    if mode == "capacity" and any(c.points for c in curves):
        figures.append(("curves", fig_json(sweep_curves_figure(curves))))
    elif mode == "capacity":
        notes.append("no setting lists its capacity probes: no goodput-vs-load curves.")
    if any(c.value is not None for c in curves):
        figures.append(
            ("bars", fig_json(sweep_bars_figure([c for c in curves if c.value is not None], what)))
        )
    else:
        notes.append("no setting has a measured value.")
    if not any(c.predicted is not None for c in curves):
        notes.append("sweep.json has no simulator predictions: the predicted column is empty.")
    return {
        "title": str(sw.get("spec") or sw.get("name") or out.parent.name),
        "engine": str(sw.get("engine") or ""),
        "mode": mode,
        "what": what,
        "rate": fmt(_num(sw.get("rate_rps")), " req/s"),
        "rows": rows,
        "figures": figures,
        "notes": notes,
        "n_pareto": sum(1 for c in curves if c.pareto),
    }


def sweep_page(sweep_json: Mapping[str, Any], out: Path, base: Path | None = None) -> Path:
    """Write the sweep's page: one curve (or bar) per setting, ranking, Pareto front."""
    ctx = sweep_context(sweep_json, out, base)
    return write_page(render_page(template_env().get_template("sweep.html.j2"), ctx), out)
