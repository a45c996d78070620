"""GPU models: one canonical name per model, whatever the vendor's spelling, and what each computes.

Vendors spell the same card many ways: Vast says `RTX 4090`, RunPod `NVIDIA GeForce RTX 4090`,
`torch.cuda.get_device_name()` says `NVIDIA GeForce RTX 4090`; an A100 is `A100 SXM4`,
`A100-SXM4-80GB`, `NVIDIA A100-SXM4-80GB`, `A100 PCIE`, `NVIDIA A100 80GB PCIe`. `canonical_gpu`
maps all of them to one key so the preflight can check that the host is what the offer said.

`DATASHEET_PEAK_TFLOPS_BF16` is each card's dense bf16 peak as its vendor documents it; no card
reaches it on the preflight's timed 4096x4096 bf16 matmul (FP32 accumulate, as torch does it).
Measured on the card where we could: `MEASURED_PREFLIGHT_TFLOPS_BF16`, from `bench/gpu.py` (an H200
reached 72% of its datasheet's dense peak, so the datasheet alone judged every healthy H200
`throttled`, 709 < 0.85 x 989.5). A card of a measured processor family takes that family's
measured fraction of its own datasheet peak (the H100s: same processor as the H200).
`EXPECTED_TFLOPS_BF16` is that table (other cards at their datasheet peak): the judgement's
default when nothing better is known. The provisioning policy judges against what the model
measured on our own machines instead (`app.policy.speeds`: healthy consumer cards reach 65-80% of
their datasheet), with this module's measured figures as seeds and the datasheet as a floor.

`hardware_key` names a host by the hardware the preflight read (the GPU's UUID, else the host's
/etc/machine-id), for a vendor that names no machine.
"""

from __future__ import annotations

import re

__all__ = [
    "ACHIEVED_FRACTION",
    "DATASHEET_PEAK_TFLOPS_BF16",
    "EXPECTED_TFLOPS_BF16",
    "FAMILY_ACHIEVED_FRACTION",
    "MEASURED_PREFLIGHT_TFLOPS_BF16",
    "canonical_gpu",
    "expected_tflops_bf16",
    "hardware_key",
    "same_gpu",
]

ACHIEVED_FRACTION = 1.0

# Dense bf16 tensor TFLOP/s with FP32 accumulate, from the vendor's own documents:
DATASHEET_PEAK_TFLOPS_BF16: dict[str, float] = {
    # NVIDIA Ampere GA102 GPU architecture whitepaper, Appendix A (GeForce RTX 3090: "Peak BF16
    # Tensor TFLOPS with FP32 Accumulate" 71 dense / 142 sparse; RTX 3080: 59.5 / 119).
    "RTX 3090": 71.0,
    "RTX 3080": 59.5,
    # NVIDIA Ada Lovelace architecture whitepaper v1.1, Appendix A, table 2 (GeForce RTX 4090:
    # "Peak BF16 Tensor TFLOPS with FP32 Accumulate" 165.2 dense / 330.4 sparse).
    "RTX 4090": 165.2,
    # NVIDIA RTX A6000 datasheet: "Peak BF16 Tensor TFLOPS with FP32 Accumulate" 154.8 / 309.7.
    "RTX A6000": 154.8,
    # NVIDIA RTX 6000 Ada Generation datasheet: 364.2 dense (728.5 with sparsity).
    "RTX 6000 Ada": 364.2,
    # NVIDIA A40 datasheet: 149.7 dense (299.4 sparse).
    "A40": 149.7,
    # NVIDIA A10 datasheet: 125 dense (250 sparse).
    "A10": 125.0,
    # NVIDIA L4 datasheet: 121 dense (242 with sparsity).
    "L4": 121.0,
    # NVIDIA L40S datasheet: 362.05 dense (733 with sparsity).
    "L40S": 362.0,
    # NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 dense (624 sparse), PCIe and SXM.
    "A100 PCIE": 312.0,
    "A100 SXM4": 312.0,
    # NVIDIA H100 Tensor Core GPU datasheet: BF16 1,979 (SXM) and 1,513 (PCIe) "with sparsity";
    # dense is half.
    "H100 SXM": 989.5,
    "H100 PCIE": 756.5,
    # NVIDIA H200 Tensor Core GPU datasheet: BF16 1,979 with sparsity (SXM); dense is half.
    "H200": 989.5,
}

# The preflight's own figure on a healthy card (`python -m trainer preflight`, 4096, the TFLOP/s it
# prints), run by `bench/gpu.py`:
MEASURED_PREFLIGHT_TFLOPS_BF16: dict[str, float] = {
    # One NVIDIA H200 (143,771 MiB, driver 580.159.04, torch 2.11.0+cu130, power limit 700 W, max SM
    # clock 1,980 MHz), 2026-12-04: 705.9, 709.2 and 713.6 in three preflights (718.4 at 8192).
    # The median.
    "H200": 709.2,
}

# Models of one processor reach one fraction of their datasheet peak on the same matmul. The H100
# SXM is the H200's processor at the same clock and power limit (the H200 differs in memory, which
# does not bound a 4096 matmul: 1,365 FLOP per byte, above the ~295 where an H100 turns
# memory-bound); the H100 PCIe is the same processor power-limited, so its datasheet peak is
# already lower. Inferred from the H200's measurement, not measured on those cards.
_HOPPER = ("H100 SXM", "H100 PCIE", "H200")
FAMILY_ACHIEVED_FRACTION: dict[str, float] = {
    name: MEASURED_PREFLIGHT_TFLOPS_BF16["H200"] / DATASHEET_PEAK_TFLOPS_BF16["H200"] for name in _HOPPER
}

EXPECTED_TFLOPS_BF16: dict[str, float] = {
    name: MEASURED_PREFLIGHT_TFLOPS_BF16.get(
        name, round(peak * FAMILY_ACHIEVED_FRACTION.get(name, ACHIEVED_FRACTION), 1)
    )
    for name, peak in DATASHEET_PEAK_TFLOPS_BF16.items()
}

_NOISE = re.compile(r"\b(nvidia|geforce|tesla|\d+\s?gb|hbm\d?e?|gddr\d\w*)\b")


def canonical_gpu(name: str) -> str:
    """The one key for a GPU model in any vendor's spelling (`NVIDIA A100-SXM4-80GB` -> `A100 SXM4`).

    A name this table does not know comes back normalised (upper case, single spaces) so two
    spellings of an unknown card still compare equal when they differ only in noise words.
    """
    raw = name.strip().lower().replace("_", " ").replace("-", " ")
    hbm = "hbm" in raw
    parts = _NOISE.sub(" ", raw).split()
    if parts and parts[-1] == "generation":
        parts = parts[:-1]  # `RTX 6000 Ada Generation`
    head = parts[0] if parts else ""
    if head == "h100":
        # `NVIDIA H100 80GB HBM3` is the SXM part; `H100 PCIe` and `H100 NVL` say so.
        if "pcie" in parts:
            return "H100 PCIE"
        if "nvl" in parts:
            return "H100 NVL"
        if "sxm" in parts or "sxm5" in parts or hbm or len(parts) == 1:
            return "H100 SXM"
    if head == "a100":
        if "pcie" in parts:
            return "A100 PCIE"
        if "sxm4" in parts or "sxm" in parts:
            return "A100 SXM4"
        return "A100"
    if head == "h200":
        return "H200"
    out = " ".join(parts)
    for known in DATASHEET_PEAK_TFLOPS_BF16:
        if out == known.lower():
            return known
    return out.upper()


def same_gpu(offered: str, reported: str) -> bool:
    """Whether the name a host reports is the model its offer advertised.

    A bare `A100` (a vendor that does not say PCIe or SXM) matches either A100 form.
    """
    a, b = canonical_gpu(offered), canonical_gpu(reported)
    if a == b:
        return True
    if "A100" in (a, b):
        return a.startswith("A100") and b.startswith("A100")
    return False


def expected_tflops_bf16(gpu_name: str) -> float | None:
    """What a healthy card of this model reaches on the preflight matmul; None if not in the table."""
    key = canonical_gpu(gpu_name)
    if key in EXPECTED_TFLOPS_BF16:
        return EXPECTED_TFLOPS_BF16[key]
    if key == "A100":
        return EXPECTED_TFLOPS_BF16["A100 SXM4"]
    return None


def hardware_key(*, gpu_uuid: str | None, host_machine_id: str | None) -> str | None:
    """The key a host's record is kept under when the vendor names no machine: the GPU's UUID
    (`gpu:GPU-8f3c...`), else the host's /etc/machine-id (`host:...`); None if neither was read."""
    uuid = (gpu_uuid or "").strip()
    if uuid:
        return f"gpu:{uuid}"
    host = (host_machine_id or "").strip()
    return f"host:{host}" if host else None
