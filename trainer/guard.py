"""Refusal to train on a serving box: training must never contend with an inference SLA."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SERVING_MARKER", "serving_refusal"]

# A serving box carries this file (any content). TUNEHARNESS_SERVING_MARKER names one more path
# to check; it adds to the default, it never replaces it.
SERVING_MARKER = Path("/etc/tuneharness/serving")


def serving_refusal(env: Mapping[str, str] | None = None) -> str | None:
    """Why this box must not train, or None when it may."""
    env = os.environ if env is None else env
    role = env.get("TUNEHARNESS_ROLE", "").strip().lower()
    if role == "serving":
        return (
            "refusing to train on a serving box (TUNEHARNESS_ROLE=serving): training must never "
            "contend with an inference SLA. Fix: run the job on a training host"
        )
    markers = [SERVING_MARKER]
    if env.get("TUNEHARNESS_SERVING_MARKER"):
        markers.append(Path(env["TUNEHARNESS_SERVING_MARKER"]))
    for marker in markers:
        if marker.exists():
            return (
                f"refusing to train on a serving box (marker file {marker} exists): training must "
                "never contend with an inference SLA. Fix: run the job on a training host"
            )
    return None
