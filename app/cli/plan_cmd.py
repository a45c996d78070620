"""`tuneharness plan`: what a workload would cost on a hyperscaler, on the marketplace as a naive
renter, and guarded; each a median with a p10-p90 band and where the figure comes from
(`app.services.plan`, docs/simulation.md)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from app.services.plan import DEFAULT_SEEDS


def register(cli: typer.Typer) -> None:
    cli.command("plan")(plan)


def plan(
    gpu: Annotated[str, typer.Option("--gpu", help="GPU model, e.g. H100, A100, L4, A10G, RTX 3090, RTX 4090.")],
    train_hours: Annotated[
        float, typer.Option("--train-hours", help="Hours of training per job on a healthy card of that model.")
    ],
    model_gb: Annotated[float, typer.Option("--model-gb", help="Base model size, pulled by every host.")] = 15.0,
    data_gb: Annotated[float, typer.Option("--data-gb", help="Training data size, pulled by every host.")] = 1.0,
    jobs: Annotated[int, typer.Option("--jobs", help="Number of jobs in the campaign.")] = 1,
    seeds: Annotated[
        int, typer.Option("--seeds", help="Seeded replays of the campaign simulator behind each band.")
    ] = DEFAULT_SEEDS,
    dud_rate: Annotated[
        float | None,
        typer.Option(
            "--dud-rate",
            help="Share of rentals that never deliver a working GPU (default: what our reputation data "
            "observed, else the field reports' 0.62).",
        ),
    ] = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="Observe the dud rate on this provider's machines only.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as one JSON object.")] = False,
) -> None:
    """What a workload would cost: hyperscaler on-demand, marketplace naive, marketplace guarded.

    The hyperscaler figure multiplies GPU-hours by a dated, sourced price table; the marketplace
    figures replay the campaign simulator over --seeds seeds at the marketplace's dud rate. Each
    figure comes with one sentence that says where it comes from."""
    from app import bootstrap
    from app.services.plan import (
        choose_dud_rate,
        load_price_table,
        make_plan,
        observed_dud_rate,
        validate_workload,
    )

    replay = bootstrap.plan_replay()
    prices = load_price_table()
    workload = validate_workload(
        gpu=gpu,
        train_hours=train_hours,
        model_gb=model_gb,
        data_gb=data_gb,
        jobs=jobs,
        seeds=seeds,
        dud_rate=dud_rate,
        known_gpus=[*replay.gpu_price_ranges(), *(r.gpu for r in prices)],
    )
    observed = None if dud_rate is not None else observed_dud_rate(bootstrap.reputation().records(provider).values())
    result = make_plan(
        workload,
        dud_rate=choose_dud_rate(override=dud_rate, observed=observed),
        seeds=seeds,
        replay=replay,
        prices=prices,
    )
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    w = workload
    typer.echo(
        f"{w.jobs} job(s) x {w.train_hours:g} h on {w.gpu}, model {w.model_gb:g} GB, data {w.data_gb:g} GB; "
        f"{result.dud_rate.describe()}; {result.seeds} seeds"
    )
    typer.echo(f"{'':<12} {'median $':>10} {'p10 $':>10} {'p90 $':>10}")
    for name, b in (("hyperscaler", result.hyperscaler), ("naive", result.naive), ("guarded", result.guarded)):
        if b.median_usd is None:
            missing = "no sourced price" if name == "hyperscaler" else "no simulated offers"
            typer.echo(f"{name:<12} {missing:>32}")
        else:
            typer.echo(f"{name:<12} {b.median_usd:>10.2f} {b.p10_usd:>10.2f} {b.p90_usd:>10.2f}")
    for name, b in (("hyperscaler", result.hyperscaler), ("naive", result.naive), ("guarded", result.guarded)):
        typer.echo(f"{name}: {b.provenance}")
    for policy, n in result.unfinished_runs.items():
        if n:
            typer.echo(
                f"note: in {n} of {result.seeds} {policy} replays some job did not finish; its cost is what it billed"
            )
