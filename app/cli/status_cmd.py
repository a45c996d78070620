"""`tuneharness status [--watch] [--json]`: running jobs, their hosts, and how recoveries went.

Reads only (the job table, the supervisor's last look at each job, rentals, reputation and the
ledger); works with nothing running. Times are on the provisioning clock (the simulator's scaled
clock when TUNEHARNESS_SIM_URL is set and reachable, else the wall clock).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

__all__ = ["collect", "register", "status"]

WINDOW_S = 30 * 24 * 3600.0


def register(cli: typer.Typer) -> None:
    """Add `status` as a top-level command."""
    cli.command("status")(status)


def _clock_now() -> float:
    import os
    import time

    if os.environ.get("TUNEHARNESS_SIM_URL"):
        try:
            from app import bootstrap

            clock = bootstrap.sim_clock()
            if clock is not None:
                return float(clock.now())
        except Exception:  # the sim server is down: status still answers, on the wall clock
            pass
    return time.time()


def collect(*, now: float | None = None) -> dict[str, Any]:
    """Everything `status` shows, as plain data."""
    from datetime import UTC, datetime, timedelta

    from app import bootstrap
    from app.ledger import Ledger
    from app.policy.codec import load_job
    from app.policy.supervision import recovery_summary
    from app.rentals import Rentals
    from app.services.provisioning import ProvisioningStateRow
    from app.services.supervisor import SupervisionRow, Watch
    from app.services.transfer import TransferRow

    now = _clock_now() if now is None else now
    engine = bootstrap.engine()
    rentals = Rentals(engine)
    with engine.connect() as conn:
        states = ProvisioningStateRow.__table__  # type: ignore[attr-defined]
        prov = {r.job_id: load_job(json.loads(r.state_json)) for r in conn.execute(states.select())}
        watches = {r.job_id: Watch.from_json(r.state_json) for r in conn.execute(SupervisionRow.__table__.select())}  # type: ignore[attr-defined]
        moves = {(r.job_id, r.instance_id): r for r in conn.execute(TransferRow.__table__.select())}  # type: ignore[attr-defined]
    all_rentals = rentals.all()
    jobs_out: list[dict[str, Any]] = []
    for rec in bootstrap.jobs().list():
        w = watches.get(rec.job_id) or Watch()
        st = prov.get(rec.job_id)
        att = st.attempt if st is not None else None
        mine = [r for r in all_rentals if r.job == rec.job_id]
        spent = sum(rentals.spent_usd(r, now=now) for r in mine)
        per_hour = sum(r.rate_usd_per_hour or 0.0 for r in mine if r.state == "active")
        move = moves.get((rec.job_id, att.instance_id)) if att is not None else None
        transfer = (
            None
            if move is None
            else {
                "state": move.state,
                "bytes_done": int(move.bytes_done),
                "bytes_total": int(move.bytes_total),
                "bytes_moved": int(move.bytes_moved),
                "rate_bytes_per_s": move.rate_bytes_per_s,
                "current": move.current,
                "error": move.error,
            }
        )
        eta = None
        if w.max_steps and w.steps_per_s and rec.phase == "training":
            eta = max(0.0, (w.max_steps - w.step) / w.steps_per_s)
        jobs_out.append(
            {
                "job_id": rec.job_id,
                "name": rec.name,
                "phase": rec.phase,
                "step": w.step,
                "max_steps": w.max_steps,
                "loss": w.loss,
                "eta_s": eta,
                "host": att.machine_id if att is not None else None,
                "instance": att.instance_id if att is not None else None,
                "provider": att.provider if att is not None else None,
                "spent_usd": round(spent, 6),
                "usd_per_hour": round(per_hour, 6),
                "heartbeat_age_s": None if w.last_heartbeat_at is None else max(0.0, now - w.last_heartbeat_at),
                "pulled_step": w.pulled_step,
                "recoveries": w.recoveries,
                "paused_by": w.paused if rec.phase == "paused" else None,  # StopReason: who stopped its host
                "transfer": transfer,  # the job's files moving onto its current host (app.services.transfer)
                # [batch_size, grad_accum] in force after out-of-memory deaths (None: the job's own)
                "micro_batch": w.micro_batch,
                "oom_halvings": w.oom_halvings,
                "detail": rec.detail,
            }
        )
    reps = {(h.record.provider, h.record.machine_id): h.to_dict(now=now) for h in bootstrap.reputation().hosts()}
    from app.services.pool import Pool

    held = {(h.provider, h.instance_id): h for h in Pool(engine).held()}
    hosts_out = []
    for r in all_rentals:
        if r.state not in ("active", "stopped", "intent"):
            continue
        rep = reps.get((r.provider, r.machine_id or ""), {})
        h = held.get((r.provider, r.instance_id or ""))
        hosts_out.append(
            {
                "instance": r.instance_id,
                "provider": r.provider,
                "machine_id": r.machine_id,
                "job": r.job,
                "state": r.state,
                "usd_per_hour": r.rate_usd_per_hour,
                "held": None
                if h is None
                else {"standby": h.standby, "hold_until": h.hold_until, "released_by": h.released_by},
                "delivery_probability": rep.get("delivery_probability"),
                "failures": len(rep.get("failures", []) or []),  # type: ignore[arg-type]
                "quarantined": rep.get("quarantined", False),
            }
        )
    since = datetime.now(UTC) - timedelta(seconds=WINDOW_S)
    ledger = Ledger(engine)
    lost = ledger.rows(kind="host_lost", since=since)
    recs = ledger.rows(kind="recovery", since=since)
    summary = recovery_summary([float(r.payload.get("recovery_s", 0.0)) for r in recs])
    interruptions = {
        "window_days": 30,
        "count": len(lost),
        "resumed": summary["resumed"],
        "recovery_median_s": summary["median_s"],
        "recovery_p90_s": summary["p90_s"],
        "recoveries": [
            {
                "job": r.job,
                **{
                    k: r.payload.get(k)
                    for k in ("cause", "lost_machine", "machine_id", "recovery_s", "resume_step", "lost_step")
                },
            }
            for r in recs
        ],
    }
    return {"now": now, "jobs": jobs_out, "hosts": hosts_out, "interruptions": interruptions}


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}s" if v < 120 else f"{v / 60:.1f}m"


def _render(data: dict[str, Any]) -> None:
    from rich.console import Console

    Console().print(_renderable(data))


def _renderable(data: dict[str, Any]) -> Any:
    """The status screen as one rich renderable (printed once, or redrawn in place by --watch)."""
    from rich.console import Group
    from rich.table import Table

    parts: list[Any] = []
    jobs = Table(title="jobs")
    for col in ("job", "phase", "step", "loss", "ETA", "host", "spent $", "$/h", "heartbeat"):
        jobs.add_column(col)
    for j in data["jobs"]:
        step = f"{j['step']}/{j['max_steps']}" if j["max_steps"] else str(j["step"])
        loss = "-" if j["loss"] is None else f"{j['loss']:.4g}"
        jobs.add_row(
            j["job_id"],
            f"paused ({j['paused_by']})" if j.get("paused_by") else j["phase"],
            step,
            loss,
            _fmt_s(j["eta_s"]),
            j["host"] or "-",
            f"{j['spent_usd']:.4f}",
            f"{j['usd_per_hour']:.3f}",
            _fmt_s(j["heartbeat_age_s"]),
        )
    parts.append(jobs)
    for j in data["jobs"]:
        if j.get("micro_batch"):
            b, a = j["micro_batch"]
            parts.append(
                f"{j['job_id']}: micro-batch {b} x {a} accumulation after {j['oom_halvings']} out-of-memory halving(s)"
            )
        t = j.get("transfer")
        if t is not None and t["state"] != "done":
            rate = f" at {t['rate_bytes_per_s'] / 1e6:.1f} MB/s" if t["rate_bytes_per_s"] else ""
            what = f" ({t['current']})" if t["current"] else ""
            why = f": {t['error']}" if t["error"] else ""
            parts.append(
                f"{j['job_id']}: transfer {t['state']} {t['bytes_done'] / 1e6:.1f}/{t['bytes_total'] / 1e6:.1f} MB"
                f"{rate}{what}{why}"
            )
    hosts = Table(title="hosts")
    for col in ("instance", "machine", "job", "state", "$/h", "delivery p", "failures", "quarantined"):
        hosts.add_column(col)
    for h in data["hosts"]:
        state = h["state"] if not h.get("held") else f"{h['state']} ({'standby' if h['held']['standby'] else 'held'})"
        hosts.add_row(
            str(h["instance"]),
            str(h["machine_id"]),
            h["job"],
            state,
            str(h["usd_per_hour"]),
            str(h["delivery_probability"]),
            str(h["failures"]),
            "yes" if h["quarantined"] else "no",
        )
    parts.append(hosts)
    i = data["interruptions"]
    parts.append(
        f"interruptions (30 days): {i['count']}, resumed {i['resumed']}, recovery median "
        f"{_fmt_s(i['recovery_median_s'])}, p90 {_fmt_s(i['recovery_p90_s'])}"
    )
    return Group(*parts)


def status(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    interval_s: Annotated[float, typer.Option("--interval", help="seconds between refreshes with --watch")] = 5.0,
) -> None:
    """Jobs (step, loss, ETA, host, spend, heartbeat), hosts with reputation, and recoveries.

    --watch redraws the screen in place until Ctrl-C; with --json it prints one object per line
    per refresh. Exit codes: 0 ok (Ctrl-C included); 2 a bad option.
    """
    import math

    if not (math.isfinite(interval_s) and interval_s > 0):
        from app.errors import UserError

        raise UserError(f"--interval {interval_s:g} is not a positive number of seconds. Fix: e.g. --interval 5")
    import time

    if not watch:
        data = collect()
        if as_json:
            typer.echo(json.dumps(data, indent=2))
        else:
            _render(data)
        return
    if as_json:  # one JSON object per refresh, one per line: a stream another program reads
        try:
            while True:
                typer.echo(json.dumps(collect()))
                time.sleep(max(0.5, interval_s))
        except KeyboardInterrupt:
            return
    from rich.console import Console
    from rich.live import Live

    console = Console()
    try:
        if not console.is_terminal:  # a pipe or a file: each refresh printed after the last
            while True:
                console.print(_renderable(collect()))
                time.sleep(max(0.5, interval_s))
        with Live(_renderable(collect()), console=console, auto_refresh=False, screen=False) as live:
            while True:
                time.sleep(max(0.5, interval_s))
                live.update(_renderable(collect()), refresh=True)
    except KeyboardInterrupt:
        return
