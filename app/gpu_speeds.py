"""The durable record of what each GPU model measured on our own machines' passing preflights.

One row per (GPU model, provider, machine): the machine's last `KEPT_PER_MACHINE` measurements of
the preflight's bf16 TFLOP/s. `app.policy.speeds` (pure) turns them into the expectation a new host
of that model is judged against; this module only loads and stores. The production driver loads
the reported model's samples into the `PreflightResult` it feeds the policy, and stores the sample
a passing preflight's `Record` carries.
"""

from __future__ import annotations

import json
import math

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.policy.speeds import SpeedSample

__all__ = ["KEPT_PER_MACHINE", "GpuSpeed", "GpuSpeedStore"]

KEPT_PER_MACHINE = 5


class GpuSpeed(SQLModel, table=True):
    __tablename__ = "gpu_speed"

    gpu_model: str = Field(primary_key=True)  # canonical (app.policy.speeds.speed_model)
    provider: str = Field(primary_key=True)
    machine_id: str = Field(primary_key=True)
    tflops_json: str = "[]"  # the machine's last measurements, oldest first
    measured_at: float = 0.0


_T = GpuSpeed.__table__  # type: ignore[attr-defined]


class GpuSpeedStore:
    """Passing preflights' measurements in the project's database (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def samples(self, gpu_model: str) -> list[SpeedSample]:
        """Every kept measurement of the model, one machine under `provider:machine_id`."""
        with read_connection(self._engine) as conn:
            rows = conn.execute(select(_T).where(_T.c.gpu_model == gpu_model)).all()
        return [
            SpeedSample(f"{r.provider}:{r.machine_id}", float(v))
            for r in rows
            for v in json.loads(r.tflops_json or "[]")
        ]

    def add(self, gpu_model: str, *, provider: str, machine_id: str, tflops_bf16: float, now: float) -> None:
        """Keep one passing preflight's measurement (the machine's oldest beyond KEPT_PER_MACHINE drops)."""
        if not math.isfinite(tflops_bf16) or tflops_bf16 <= 0:
            return
        where = (_T.c.gpu_model == gpu_model, _T.c.provider == provider, _T.c.machine_id == machine_id)
        with write_transaction(self._engine, lock=f"tuneharness.gpu_speed.{gpu_model}") as conn:
            row = conn.execute(select(_T).where(*where)).first()
            kept = [*(json.loads(row.tflops_json or "[]") if row is not None else []), tflops_bf16]
            values = {"tflops_json": json.dumps(kept[-KEPT_PER_MACHINE:]), "measured_at": now}
            if row is None:
                conn.execute(
                    _T.insert().values(gpu_model=gpu_model, provider=provider, machine_id=machine_id, **values)
                )
            else:
                conn.execute(_T.update().where(*where).values(**values))
