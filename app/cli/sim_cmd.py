"""`tuneharness sim ...`: the simulated marketplace of lying hosts.

`sim serve` shares one simulated marketplace over loopback HTTP (for the Celery path: workers
and CLI invocations are separate processes); point them at it with TUNEHARNESS_SIM_URL.
Other sim commands (e.g. `sim campaign`) register on this same `app`.
"""

from __future__ import annotations

import typer

# Every trace in providers/sim/traces (tests/unit/foundation checks the list stays whole).
TRACE_HELP = "trace file, or a shipped trace name: smoke, proof, marketplace, adversarial, recovery, hangs, consumer"

app = typer.Typer(help="The simulated marketplace of lying hosts.", no_args_is_help=True)


@app.command("serve")
def serve(
    trace: str = typer.Option("smoke", "--trace", help=TRACE_HELP),
    scale: float = typer.Option(1.0, "--scale", help="simulated seconds per wall second"),
    port: int = typer.Option(0, "--port", help="TCP port on 127.0.0.1 (0: pick a free one)"),
    root: str | None = typer.Option(
        None,
        "--root",
        help="directory for the sim hosts' sandboxes and sshd files (default: a temp dir, removed on exit)",
    ),
    url_file: str | None = typer.Option(None, "--url-file", help="also write the server's URL to this file"),
    train_step_s: float | None = typer.Option(
        None,
        "--train-step-s",
        help="simulated seconds a training step takes on a host at full speed "
        "(its tflops_factor slows it); default: the trainer's own pace",
    ),
    train_start_s: float | None = typer.Option(
        None,
        "--train-start-s",
        help="with --train-step-s: simulated seconds a trainer takes to start "
        "(imports, loading the model) before its first step",
    ),
) -> None:
    """Serve a simulated marketplace on 127.0.0.1; every running host answers over real SSH."""
    from app import bootstrap
    from app.errors import UserError

    if not 0 < scale < float("inf"):
        raise UserError(f"--scale must be a positive number, got {scale}. Fix: pass e.g. --scale 60")
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is out of range. Fix: pass 0 or a port from 1 to 65535")
    if train_step_s is not None and not (0 < train_step_s < float("inf")):
        raise UserError(f"--train-step-s must be a positive number of seconds, got {train_step_s}. Fix: e.g. 3")
    if train_start_s is not None and not (0 <= train_start_s < float("inf")):
        raise UserError(f"--train-start-s must be 0 or more seconds, got {train_start_s}. Fix: e.g. 30")

    def announce(url: str) -> None:
        typer.echo(f"sim market on {url} (trace {trace}, {scale:g}x); export TUNEHARNESS_SIM_URL={url}")

    try:
        bootstrap.sim_serve(
            trace,
            scale=scale,
            port=port,
            root=root,
            url_file=url_file,
            announce=announce,
            train_step_s=train_step_s,
            train_start_s=train_start_s,
        )
    except OSError as exc:
        raise UserError(f"cannot serve on 127.0.0.1:{port}: {exc.strerror}. Fix: pick another --port") from None
    except KeyboardInterrupt:
        typer.echo("sim market stopped", err=True)


@app.command("campaign")
def campaign(
    trace: str = typer.Option(..., "--trace", help=TRACE_HELP),
    policy: str = typer.Option("guarded", "--policy", help="guarded, naive or oracle"),
    jobs: int | None = typer.Option(None, "--jobs", help="number of jobs (default: the trace's workload)"),
    seed: int = typer.Option(0, "--seed", help="seed for the policy's jitter"),
    as_json: bool = typer.Option(False, "--json", help="print the receipt as one JSON object"),
    standby_hosts: int = typer.Option(0, "--standby-hosts", help="verified hosts kept waiting for recoveries"),
    driver: str = typer.Option(
        "virtual",
        "--driver",
        help="virtual: the campaign simulator, in virtual time (seconds); celery: the "
        "same trace through the real-time fleet (Redis, a Celery worker and beat, sim serve with real sshd "
        "hosts, the real trainer on the CPU), in scaled time (minutes)",
    ),
    scale: float = typer.Option(3.0, "--scale", help="with --driver celery: simulated seconds per wall second"),
    monitor_s: float | None = typer.Option(
        None, "--monitor-s", help="the supervisor's poll period in simulated seconds (default 30)"
    ),
) -> None:
    """Replay a whole campaign; the receipt comes from the simulator's billing and truth.

    --driver virtual (the default) replays it in virtual time through the campaign simulator;
    --driver celery runs it through the fleet production runs, in scaled time, and prints the same
    receipt, so both drivers can be compared (docs/simulation.md)."""
    import json

    from app import bootstrap
    from app.errors import UserError

    if policy not in ("guarded", "naive", "oracle"):
        raise UserError(f"--policy {policy!r} is not a policy. Fix: pass guarded, naive or oracle")
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}. Fix: pass a positive number")
    if standby_hosts < 0:
        raise UserError(f"--standby-hosts must be 0 or more, got {standby_hosts}. Fix: pass 0, 1, 2, ...")
    if monitor_s is not None and not 0 < monitor_s < float("inf"):
        raise UserError(f"--monitor-s must be a positive number of seconds, got {monitor_s}. Fix: e.g. 10")
    if driver not in ("virtual", "celery"):
        raise UserError(f"--driver {driver!r} is not a driver. Fix: pass virtual or celery")
    if driver == "celery":
        if policy != "guarded" or standby_hosts:
            raise UserError(
                "--driver celery runs what production runs: the guarded policy, with the job files' "
                "standby pools. Fix: drop --policy and --standby-hosts, or use --driver virtual"
            )
        receipt = bootstrap.sim_campaign_realtime(
            trace,
            jobs=jobs,
            scale=scale,
            monitor_s=monitor_s,
            progress=None if as_json else lambda m: typer.echo(m, err=True),
        )
    else:
        receipt = bootstrap.sim_campaign(
            trace, policy=policy, jobs=jobs, seed=seed, standby_hosts=standby_hosts, monitor_s=monitor_s
        )
    if as_json:
        typer.echo(json.dumps(receipt))
        return
    for key, value in receipt.items():
        if key == "recoveries":
            typer.echo(f"{key}: {len(value)}")
        else:
            typer.echo(f"{key}: {value}")
