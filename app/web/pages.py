"""The pages as HTML strings, from the plain data of `app.web.data`.

Every value goes through `html.escape` on its way in (`_e`): job names, hosts' machine ids, ledger
reasons and train.log text are untrusted. The same renderers serve the live site (a stylesheet and
one script from /static/, links between pages) and the report (`report_html`: one file, the
stylesheet inline, no script, no external reference, pages linked by in-file anchors).

Live fields carry `data-live=FIELD data-job=ID`; the shipped script (static/live.js) polls
/api/live.json and rewrites their text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from importlib import resources
from typing import Any
from urllib.parse import quote

from app.web import svg
from app.web.data import CAUSES

__all__ = [
    "REPORT",
    "SITE",
    "Links",
    "fleet_page",
    "job_page",
    "money_page",
    "not_found_page",
    "reliability_page",
    "report_html",
    "static_text",
]


def static_text(name: str) -> str:
    """A file shipped in app/web/static (the stylesheet, the live script)."""
    return resources.files("app.web").joinpath("static", name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Links:
    """How pages point at each other: paths on the live site, anchors inside the report."""

    job: Callable[[str], str]
    page: Callable[[str], str]
    live: bool  # the site: stylesheet and script from /static/, external links clickable


SITE = Links(job=lambda j: "/jobs/" + quote(j, safe=""), page=lambda p: "/" if p == "fleet" else f"/{p}", live=True)
REPORT = Links(job=lambda j: "#job-" + quote(j, safe=""), page=lambda p: f"#{p}", live=False)


def _e(v: object) -> str:
    return escape("-" if v is None else str(v))


def _s(v: float | None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if v < 120:
        return f"{v:.0f}s"
    if v < 7200:
        return f"{v / 60:.1f}m"
    return f"{v / 3600:.1f}h"


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:.4f}"


def _table(cls: str, head: list[str], rows: list[list[str]]) -> str:
    """`rows` hold markup already escaped by the caller."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not rows:
        body = f'<tr><td colspan="{len(head)}" class="none">none</td></tr>'
    return f'<table class="{escape(cls)}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _live(field: str, job: str, text: str) -> str:
    return f'<span data-live="{escape(field)}" data-job="{escape(job)}">{text}</span>'


def _nav(links: Links, flower_url: str) -> str:
    items = [f'<a href="{escape(links.page(p))}">{escape(p.title())}</a>' for p in ("fleet", "money", "reliability")]
    if flower_url:
        if links.live:
            items.append(f'<a href="{escape(flower_url)}" rel="noopener">Flower</a>')
        else:
            items.append(f"<span>Flower: {escape(flower_url)}</span>")
    return '<nav class="top">' + " ".join(items) + "</nav>"


def _document(title: str, body: str, *, links: Links, flower_url: str) -> str:
    if links.live:
        head = '<link rel="stylesheet" href="/static/web.css"><script src="/static/live.js" defer></script>'
    else:
        head = f"<style>{static_text('web.css')}</style>"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title>{head}</head><body>{_nav(links, flower_url)}{body}"
        f"<footer>tuneharness, read-only. Rendered {escape(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}. "
        "Money is our estimate from the rates in force; the vendor's invoice is the final word.</footer>"
        "</body></html>"
    )


def _legend(names: tuple[str, ...] | list[str]) -> str:
    items = []
    for k, name in enumerate(names):
        colour = svg.PALETTE[k % len(svg.PALETTE)]
        swatch = f'<svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" fill="{colour}"/></svg>'
        items.append(f"<li>{swatch} {escape(name)}</li>")
    return '<ul class="legend">' + "".join(items) + "</ul>"


def fleet_section(data: dict[str, Any], *, links: Links) -> str:
    """Jobs, hosts, the beat sweeps' liveness and the interruptions line."""
    jobs = []
    for j in data["jobs"]:
        jid = str(j["job_id"])
        phase = j["phase"] if not j.get("paused_by") else f"paused ({j['paused_by']})"
        step = f"{j['step']}/{j['max_steps']}" if j["max_steps"] else str(j["step"])
        jobs.append(
            [
                f'<a href="{escape(links.job(jid))}">{_e(jid)}</a>',
                _e(j["name"]),
                _live("phase", jid, _e(phase)),
                _live("step", jid, _e(step)),
                _live("loss", jid, "-" if j["loss"] is None else _e(f"{j['loss']:.4g}")),
                _live("eta_s", jid, _e(_s(j["eta_s"]))),
                _e(j["host"]),
                _live("spent_usd", jid, _e(_usd(j["spent_usd"]))),
                _live("usd_per_hour", jid, _e(f"{j['usd_per_hour']:.3f}")),
                _e(_s(j["heartbeat_age_s"])),
            ]
        )
    hosts = []
    for h in data["hosts"]:
        state = h["state"] if not h.get("held") else f"{h['state']} ({'standby' if h['held']['standby'] else 'held'})"
        p = h["delivery_probability"]
        hosts.append(
            [
                _e(h["instance"]),
                _e(h["machine_id"]),
                _e(h["job"]),
                _e(state),
                _e(h["usd_per_hour"]),
                "-" if p is None else _e(f"{p:.2f}"),
                _e(h["failures"]),
                '<span class="bad">yes</span>' if h["quarantined"] else "no",
            ]
        )
    beats = []
    for b in data.get("liveness", []):
        word = "never ran" if b["age_s"] is None else ("overdue" if b["overdue"] else "ok")
        cls = "bad" if b["overdue"] else "ok"
        beats.append([_e(b["task"]), _e(_s(b["interval_s"])), _e(_s(b["age_s"])), f'<span class="{cls}">{word}</span>'])
    i = data["interruptions"]
    return (
        '<section id="fleet"><h1>Fleet</h1><h2>Jobs</h2>'
        + _table("jobs", ["job", "name", "phase", "step", "loss", "ETA", "host", "spent", "$/h", "heartbeat"], jobs)
        + "<h2>Hosts</h2>"
        + _table(
            "hosts",
            ["instance", "machine", "job", "state", "$/h", "delivery p", "failures", "quarantined"],
            hosts,
        )
        + "<h2>Beat sweeps</h2>"
        + _table("liveness", ["task", "every", "last success", "state"], beats)
        + f'<p class="summary">Interruptions ({_e(i["window_days"])} days): {_e(i["count"])}, resumed '
        f"{_e(i['resumed'])}, recovery median {_e(_s(i['recovery_median_s']))}, p90 {_e(_s(i['recovery_p90_s']))}."
        "</p></section>"
    )


def money_section(data: dict[str, Any]) -> str:
    """Spend by cause over time against the caps, dead-host lifetimes, what the guardrails saved."""
    r = data["receipt"]
    series = data["series"]
    usd_caps = [(f"{c['name']} ({c['period']})", float(c["cap"])) for c in data["caps"] if c["unit"] == "usd"]
    chart = svg.stacked_area(
        "spend",
        series["hours"],
        series["layers"],
        caps=usd_caps,
        title="spend over time by cause, against each budget cap",
        x_label="hours since the first rental",
    )
    caps = [
        [_e(c["name"]), _e(c["period"]), _e(c["unit"]), _e(f"{c['cap']:g}"), _e(f"{c['spent']:.4f}")]
        for c in data["caps"]
    ]
    lifetimes = svg.histogram(
        "dead-lifetimes",
        [s / 60.0 for s in data["dead_lifetimes_s"]],
        title="how long dead hosts lived before they were dropped",
        x_label="minutes",
    )
    stops = [
        [_e(k), _e(v["count"]), _e(f"{v['usd_per_hour']:.3f}"), _e(_usd(v["saved_usd"]))]
        for k, v in data["stops"].items()
    ]
    ends = {k: sum(v[-1:]) for k, v in series["layers"].items()}
    return (
        '<section id="money"><h1>Money</h1>'
        f'<p class="summary">Spent {_e(_usd(r["total_usd"]))}: GPU {_e(_usd(r["gpu_usd"]))}, storage '
        f"{_e(_usd(r['storage_usd']))}, traffic {_e(_usd(r['traffic_usd']))}. Dead hosts {_e(r['dead_hosts'])} cost "
        f"{_e(_usd(r['dead_host_cost_usd']))}. Still billing {_e(_usd(r['billing_per_hour_now']))}/h.</p>"
        f"<h2>Spend over time, by cause</h2>{chart}"
        + _legend([f"{c} {_usd(ends.get(c, 0.0))}" for c in CAUSES])
        + "<h2>Budget caps</h2>"
        + _table("caps", ["budget", "period", "unit", "cap", "spent"], caps)
        + f"<h2>Dead-host lifetimes</h2>{lifetimes}"
        + "<h2>What the guardrails saved</h2>"
        + _table("stops", ["stop and reason", "hosts", "$/h stopped", "saved until kill-time"], stops)
        + "</section>"
    )


def reliability_section(data: dict[str, Any]) -> str:
    """Interruptions, resumed, recovery median and p90 over 7 and 30 days, recovery times plotted."""
    windows = [
        [_e(f"{w['days']} days"), _e(w["interruptions"]), _e(w["resumed"]), _e(_s(w["median_s"])), _e(_s(w["p90_s"]))]
        for w in data["windows"]
    ]
    recs = data["recoveries"]
    first = min((r["at"] for r in recs), default=0.0)
    plot = svg.scatter(
        "recoveries",
        [((r["at"] - first) / 3600.0, r["recovery_s"]) for r in recs],
        title="recovery time of each interruption (seconds)",
        x_label="hours since the first recovery shown",
    )
    rows = [
        [
            _e(time.strftime("%Y-%m-%d %H:%M", time.gmtime(r["at"]))),
            _e(r["job"]),
            _e(r["cause"]),
            _e(r["lost_machine"]),
            _e(r["machine"]),
            _e(_s(r["recovery_s"])),
        ]
        for r in recs
    ]
    causes = [[_e(k), _e(v)] for k, v in data["loss_causes"].items()]
    return (
        '<section id="reliability"><h1>Reliability</h1>'
        + _table("windows", ["window", "interruptions", "resumed", "recovery median", "recovery p90"], windows)
        + f"<h2>Recovery times</h2>{plot}<h2>Recoveries</h2>"
        + _table("recoveries", ["at (UTC)", "job", "cause", "lost machine", "new machine", "took"], rows)
        + "<h2>Why hosts were lost</h2>"
        + _table("causes", ["cause", "hosts"], causes)
        + "</section>"
    )


def job_section(data: dict[str, Any], *, links: Links) -> str:
    """A job's header (live phase), gate decision, loss curve, timeline, hosts and money."""
    job = data["job"]
    jid = str(job["job_id"])
    gate = data.get("gate")
    if gate is None:
        gate_html = "<p>Gate: not evaluated.</p>"
    else:
        why = ", ".join(map(str, gate["reasons"])) or "no refusal reasons"
        cls = "ok" if gate["decision"] == "promote" else "bad"
        gate_html = f'<p>Gate: <span class="{cls}">{_e(gate["decision"])}</span> ({_e(why)}).</p>'
    loss = svg.line_plot("loss", data.get("loss", []), title="training loss by step (pulled train.log)", x_label="step")
    events = sorted(
        [*(("phase", p) for p in data["phases"]), *(("failure", f) for f in data["failures"])]
        + [("recovery", r) for r in data["recoveries"]],
        key=lambda x: x[1]["seq"],
    )
    timeline = []
    for what, ev in events:
        if what == "recovery":
            detail = (
                f"from {ev.get('lost_machine')} in {_s(ev.get('recovery_s'))}, resumed at step {ev.get('resume_step')}"
            )
        elif what == "failure":
            cause = f"[{ev['cause']}]" if ev.get("cause") else ""
            detail = f"{ev.get('reason') or ''} {cause} {ev.get('evidence') or ''}"
        else:
            detail = ev.get("reason") or ""
        timeline.append(
            [
                _e(str(ev["at"])[:19].replace("T", " ")),
                _e(ev["kind"]),
                _e(ev["run"]),
                _e(ev["machine"]),
                _e(detail.strip()),
            ]
        )
    hosts = [
        [
            _e(h["instance"]),
            _e(h["machine"]),
            _e(h["provider"]),
            _e(h["state"]),
            _e(h["usd_per_hour"]),
            "yes" if h["held_work"] else "no",
            _e(h["slices"]),
        ]
        for h in data["hosts"]
    ]
    money = [[_e(k), _e(_usd(v))] for k, v in data["money_by_cause_usd"].items()]
    return (
        f'<section class="job" id="job-{escape(quote(jid, safe=""))}"><h1>Job {_e(jid)}: {_e(job["name"])}</h1>'
        f"<p>Phase: {_live('phase', jid, _e(job['phase']))}. {_e(job.get('detail', ''))}</p>{gate_html}"
        f"<h2>Loss</h2>{loss}<h2>Timeline</h2>"
        + _table("timeline", ["at (UTC)", "event", "run", "machine", "detail"], timeline)
        + "<h2>Hosts</h2>"
        + _table("job-hosts", ["instance", "machine", "provider", "state", "$/h", "held work", "slices"], hosts)
        + f"<h2>Money by cause (total {_e(_usd(data['total_usd']))})</h2>"
        + _table("job-money", ["cause", "$"], money)
        + "</section>"
    )


def fleet_page(data: dict[str, Any]) -> str:
    return _document("tuneharness: fleet", fleet_section(data, links=SITE), links=SITE, flower_url=data["flower_url"])


def money_page(data: dict[str, Any], *, flower_url: str) -> str:
    return _document("tuneharness: money", money_section(data), links=SITE, flower_url=flower_url)


def reliability_page(data: dict[str, Any], *, flower_url: str) -> str:
    return _document("tuneharness: reliability", reliability_section(data), links=SITE, flower_url=flower_url)


def job_page(data: dict[str, Any], *, flower_url: str) -> str:
    title = f"tuneharness: job {data['job']['job_id']}"
    return _document(title, job_section(data, links=SITE), links=SITE, flower_url=flower_url)


def not_found_page(what: str, *, flower_url: str) -> str:
    return _document(
        "tuneharness: not found", f"<h1>Not found</h1><p>{_e(what)}</p>", links=SITE, flower_url=flower_url
    )


def report_html(
    fleet: dict[str, Any], money: dict[str, Any], reliability: dict[str, Any], jobs: list[dict[str, Any]]
) -> str:
    """Every page in one self-contained file: inline stylesheet and SVG, no script, no external link."""
    body = (
        fleet_section(fleet, links=REPORT)
        + money_section(money)
        + reliability_section(reliability)
        + "".join(job_section(j, links=REPORT) for j in jobs)
    )
    return _document("tuneharness report", body, links=REPORT, flower_url=fleet["flower_url"])
