"""`tuneharness market offers|instances`, and the operator's `tuneharness stop|destroy`.

`market` only reads. `stop` and `destroy` change what bills, so each writes a ledger event with
time, rate and reason `operator` (a failed attempt too). `destroy` asks first; with no terminal
to ask on and no `--yes`, it destroys nothing and exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from app.ledger import Ledger
    from app.market import Instance, Market, MarketError, Offer
    from app.policy.pricing import PriceEstimate

app = typer.Typer(help="Search a marketplace's offers and list your instances there.", no_args_is_help=True)


class ProviderName(StrEnum):
    vast = "vast"
    runpod = "runpod"
    sim = "sim"


ProviderOpt = Annotated[ProviderName, typer.Option("--provider", "-p", help="The marketplace.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON list on stdout.")]


def register(cli: typer.Typer) -> None:
    """Add the top-level operator commands `stop` and `destroy`."""
    cli.command("stop")(stop)
    cli.command("destroy")(destroy)


def _fail(exc: MarketError) -> NoReturn:
    """A refused key or a used-up quota is the operator's to fix (exit 2); other vendor errors exit 1."""
    from app.errors import UserError
    from app.market import AuthFailed, QuotaExhausted

    if isinstance(exc, AuthFailed | QuotaExhausted):
        raise UserError(str(exc)) from None
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(1) from None


@contextmanager
def _vendor_errors() -> Iterator[None]:
    from app.market import MarketError

    try:
        yield
    except MarketError as exc:
        _fail(exc)


def _market(provider: ProviderName) -> Market:
    from app import bootstrap

    return bootstrap.market(provider.value)


# -- market offers ----------------------------------------------------------------------------


def _offer_row(offer: Offer, estimate: PriceEstimate) -> dict[str, Any]:
    return {
        "provider": offer.provider,
        "offer_id": offer.offer_id,
        "machine_id": offer.machine_id,
        "gpu_name": offer.gpu_name,
        "num_gpus": offer.num_gpus,
        "gpu_ram_gb": offer.gpu_ram_gb,
        "dph_total": offer.dph_total,
        "storage_per_gb_month": offer.storage_per_gb_month,
        "inet_down_per_gb": offer.inet_down_per_gb,
        "inet_down_mbps": offer.inet_down_mbps,
        "reliability": offer.reliability,
        "cuda_max": offer.cuda_max,
        "expected_cost_usd": round(estimate.expected_cost_usd, 6),
        "price_unknown": list(estimate.price_unknown),
    }


def _price(value: float | None, fmt: str) -> str:
    return "?" if value is None else format(value, fmt)


@app.command("offers")
def offers(
    provider: ProviderOpt,
    gpu: Annotated[str | None, typer.Option(help='Only this GPU, e.g. "RTX 4090".')] = None,
    min_gpu_ram_gb: Annotated[float | None, typer.Option(min=0, help="At least this much VRAM per GPU.")] = None,
    download_gb: Annotated[float, typer.Option(min=0, help="GB the job downloads (priced as traffic).")] = 0.0,
    disk_gb: Annotated[float, typer.Option(min=0, help="GB of disk (priced as storage).")] = 0.0,
    hours: Annotated[float, typer.Option(min=0, help="Hours of rental to price.")] = 1.0,
    num_gpus: Annotated[int, typer.Option(min=1, help="GPUs per instance.")] = 1,
    limit: Annotated[int, typer.Option(min=1, help="Ask the marketplace for at most this many.")] = 64,
    as_json: JsonOpt = False,
) -> None:
    """Rentable offers, cheapest expected cost first: GPU time + storage + traffic.

    expected_cost_usd = dph_total*hours + storage_per_gb_month*disk_gb*hours/720
    + inet_down_per_gb*download_gb. An unknown price counts as 0 and is flagged.
    """
    from app.market import OfferQuery
    from app.numbers import MAX_HOURS, MAX_USD, finite
    from app.policy.pricing import expected_cost

    for name, value in (("--min-gpu-ram-gb", min_gpu_ram_gb), ("--download-gb", download_gb), ("--disk-gb", disk_gb)):
        if value is not None:
            finite(value, name, minimum=0, maximum=MAX_USD)
    finite(hours, "--hours", minimum=0, maximum=MAX_HOURS)

    market = _market(provider)
    query = OfferQuery(
        gpu_names=(gpu,) if gpu else (),
        min_gpu_ram_gb=min_gpu_ram_gb,
        num_gpus=num_gpus,
        disk_gb=disk_gb,
        limit=limit,
    )
    with _vendor_errors():
        found = market.search_offers(query)
    priced = [
        (
            o,
            expected_cost(
                dph_total=o.dph_total,
                storage_per_gb_month=o.storage_per_gb_month,
                inet_down_per_gb=o.inet_down_per_gb,
                hours=hours,
                disk_gb=disk_gb,
                download_gb=download_gb,
            ),
        )
        for o in found
    ]
    priced.sort(key=lambda pair: (pair[1].expected_cost_usd, pair[0].dph_total, pair[0].offer_id))
    if as_json:
        typer.echo(json.dumps([_offer_row(o, e) for o, e in priced], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{provider.value} offers ({len(priced)}) for {hours:g} h, {disk_gb:g} GB disk, "
        f"{download_gb:g} GB download"
    )
    for col in (
        "offer",
        "machine",
        "gpu",
        "n",
        "VRAM GB",
        "$/h",
        "$/GB-mo",
        "$/GB down",
        "Mb/s",
        "reliability",
        "expected $",
    ):
        table.add_column(col, overflow="fold", justify="right" if col not in ("offer", "machine", "gpu") else "left")
    flagged = False
    for o, e in priced:
        mark = "*" if e.price_unknown else ""
        flagged = flagged or bool(mark)
        table.add_row(
            o.offer_id,
            o.machine_id or "-",
            o.gpu_name,
            str(o.num_gpus),
            f"{o.gpu_ram_gb:g}",
            f"{o.dph_total:.4f}",
            _price(o.storage_per_gb_month, ".3f"),
            _price(o.inet_down_per_gb, ".4f"),
            _price(o.inet_down_mbps, ".0f"),
            _price(o.reliability, ".3f"),
            f"{e.expected_cost_usd:.4f}{mark}",
        )
    console = Console()
    console.print(table)
    if flagged:
        console.print("* a price the marketplace does not publish (shown as ?) counted as 0")


# -- market instances -------------------------------------------------------------------------


def _instance_row(i: Instance) -> dict[str, Any]:
    return {
        "provider": i.provider,
        "instance_id": i.instance_id,
        "machine_id": i.machine_id,
        "label": i.label,
        "state": i.state,
        "status_line": i.status_line,
        "dph_total": i.dph_total,
        "gpu_util": i.gpu_util,
        "ssh": None if i.ssh is None else f"{i.ssh.user}@{i.ssh.host}:{i.ssh.port}",
        "started_at": i.started_at,
    }


@app.command("instances")
def instances(
    provider: ProviderOpt,
    label_prefix: Annotated[str, typer.Option(help="Only labels starting with this.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Your instances at the marketplace: id, machine, label, state, status line, $/h."""
    market = _market(provider)
    with _vendor_errors():
        found = market.list_instances(label_prefix)
    rows = [_instance_row(i) for i in found]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{provider.value} instances ({len(rows)})")
    for col in ("instance", "machine", "label", "state", "status line", "$/h", "ssh"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["instance_id"],
            r["machine_id"] or "-",
            r["label"] or "-",
            r["state"],
            r["status_line"] or "",
            "" if r["dph_total"] is None else f"{r['dph_total']:.4f}",
            r["ssh"] or "",
        )
    Console().print(table)


# -- stop / destroy (top level) ---------------------------------------------------------------


def _record(ledger: Ledger, kind: str, provider: str, before: Instance, **payload: Any) -> int:
    from app.ledger import Event

    row = ledger.append(
        Event(
            kind=kind,
            provider=provider,
            instance=before.instance_id,
            machine=before.machine_id,
            rate_usd_per_hour=before.dph_total,
            reason="operator",
            payload={"label": before.label, "state_before": before.state, **payload},
        )
    )
    return row.seq


def _look_up(market: Market, instance: str) -> Instance:
    with _vendor_errors():
        return market.status(instance)


def stop(
    provider: ProviderOpt,
    instance: Annotated[str, typer.Option("--instance", "-i", help="The instance id.", show_default=False)],
) -> None:
    """Stop an instance: GPU billing ends, its storage keeps billing until destroy. Ledger: operator."""
    from app import bootstrap
    from app.errors import UserError
    from app.market import MarketError

    ledger = bootstrap.ledger()  # first: nothing is changed unless it can be written down
    market = _market(provider)
    before = _look_up(market, instance)
    if before.state == "gone":
        raise UserError(
            f"{provider.value} has no instance {instance}: it is gone, nothing to stop. "
            f"Fix: check the id with `tuneharness market instances --provider {provider.value}`"
        )
    try:
        market.stop(instance)
    except MarketError as exc:
        _record(ledger, "instance_stop_failed", provider.value, before, error=str(exc))
        _fail(exc)
    seq = _record(ledger, "instance_stopped", provider.value, before)
    _sync_stopped(provider.value, instance)
    typer.echo(
        f"stopped {provider.value} instance {instance} (ledger seq {seq}); its storage bills until you destroy it"
    )


def _parse_age_s(text: str) -> float:
    from app.errors import UserError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise UserError(f"--older-than {text!r} is not an age. Fix: use e.g. 90m, 1h or 2d") from None


def _sync_registry(provider: str, instance: str) -> None:
    """The operator destroyed it: close its rental and settle its reservations."""
    import time

    from app import bootstrap
    from app.rentals import Rentals

    rentals = Rentals(bootstrap.engine())
    r = rentals.by_instance(provider, instance)
    if r is None or r.state in ("destroyed", "lost"):
        return
    now = time.time()
    if rentals.transition(
        r.id,
        to="destroyed",
        from_states=("active", "stopped", "intent"),
        kind="rental_closed",
        reason="operator destroyed it",
        now=now,
    ):
        rentals.settle(r.id, now=now, reason="instance destroyed by the operator")


def _sync_stopped(provider: str, instance: str) -> None:
    import time

    from app import bootstrap
    from app.policy.supervision import StopReason
    from app.rentals import Rentals

    rentals = Rentals(bootstrap.engine())
    r = rentals.by_instance(provider, instance)
    if r is not None:
        rentals.transition(
            r.id,
            to="stopped",
            from_states=("active",),
            kind="rental_stopped",
            reason="operator stopped it",
            now=time.time(),
            evidence={"stopped_by": StopReason.OPERATOR.value},  # the job's supervisor pauses it
        )


def destroy(
    provider: ProviderOpt,
    instance: Annotated[
        str | None, typer.Option("--instance", "-i", help="The instance id.", show_default=False)
    ] = None,
    stopped: Annotated[
        bool, typer.Option("--stopped", help="Every stopped instance we rented (bulk clean-up).")
    ] = False,
    older_than: Annotated[
        str, typer.Option("--older-than", help="With --stopped: stopped at least this long (e.g. 1h).")
    ] = "0s",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask (needed without a terminal).")] = False,
) -> None:
    """Destroy an instance and everything on its disk: the operator's command. Ledger: operator."""
    from app.errors import UserError

    if stopped == (instance is not None):
        raise UserError("name one instance with --instance ID, or clean up in bulk with --stopped [--older-than 1h]")
    if stopped:
        _destroy_stopped(provider, _parse_age_s(older_than), older_than, yes)
        return
    assert instance is not None
    _destroy_one(provider, instance, yes)


def _destroy_stopped(provider: ProviderName, min_age_s: float, older_than: str, yes: bool) -> None:
    import time

    from app import bootstrap
    from app.errors import UserError
    from app.rentals import Rentals

    now = time.time()
    rentals = Rentals(bootstrap.engine())
    doomed = [
        r
        for r in rentals.all(states=("stopped",))
        if r.provider == provider.value and r.instance_id and now - (r.stopped_at or now) >= min_age_s
    ]
    if not doomed:
        typer.echo(f"no stopped {provider.value} instances older than {older_than}")
        return
    monthly = sum((r.storage_per_gb_month or 0.0) * r.disk_gb for r in doomed)
    typer.echo(
        f"will destroy {len(doomed)} stopped {provider.value} instance(s); their storage bills "
        f"${monthly:.2f}/month (${monthly / 720:.4f}/h) until destroyed:"
    )
    for r in doomed:
        age_h = (now - (r.stopped_at or now)) / 3600
        typer.echo(
            f"  {r.instance_id}  job {r.job}  stopped {age_h:.1f}h ago  {r.disk_gb:.0f} GB  "
            f"${(r.storage_per_gb_month or 0.0) * r.disk_gb:.2f}/month"
        )
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(
                "refusing to destroy without confirmation: no terminal to ask, nothing was "
                "destroyed. Fix: add --yes if you mean it"
            )
        typer.confirm("Destroy all of these? Everything on their disks is lost", abort=True)
    for r in doomed:
        assert r.instance_id is not None
        _destroy_one(provider, r.instance_id, True)


def _destroy_one(provider: ProviderName, instance: str, yes: bool) -> None:
    from app import bootstrap
    from app.errors import UserError
    from app.market import MarketError

    if not yes and not sys.stdin.isatty():
        raise UserError(
            f"refusing to destroy {provider.value} instance {instance}: no terminal to ask "
            "for confirmation, and nothing was destroyed. Fix: add --yes if you mean it"
        )
    ledger = bootstrap.ledger()
    market = _market(provider)
    before = _look_up(market, instance)
    if not yes:
        rate = "?" if before.dph_total is None else f"${before.dph_total:.4f}/h"
        typer.confirm(
            f"Destroy {provider.value} instance {instance} (label {before.label or '-'}, {before.state}, {rate})? "
            "Everything on its disk is lost",
            abort=True,
        )
    try:
        market.destroy(instance)
    except MarketError as exc:
        _record(ledger, "instance_destroy_failed", provider.value, before, error=str(exc))
        _fail(exc)
    seq = _record(ledger, "instance_destroyed", provider.value, before, already_gone=before.state == "gone")
    _sync_registry(provider.value, instance)
    note = " (it was already gone)" if before.state == "gone" else ""
    typer.echo(f"destroyed {provider.value} instance {instance}{note} (ledger seq {seq})")
