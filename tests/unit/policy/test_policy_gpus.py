"""GPU names in every vendor's spelling map to one model, with an expected bf16 throughput."""

from __future__ import annotations

import pytest

from app.policy.gpus import canonical_gpu, expected_tflops_bf16, same_gpu


@pytest.mark.parametrize(
    ("spelling", "model"),
    [
        ("RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("A100 PCIE", "A100 PCIE"),
        ("NVIDIA A100 80GB PCIe", "A100 PCIE"),
        ("A100 SXM4", "A100 SXM4"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4"),
        ("H100 SXM", "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIE"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ],
)
def test_vendor_spellings_map_to_one_model(spelling: str, model: str) -> None:
    """Vast, RunPod and torch spellings of a card all name the same model."""
    assert canonical_gpu(spelling) == model


def test_same_gpu_tells_a_3080_from_a_3090() -> None:
    """A host that reports a smaller card than its offer is not the same GPU."""
    assert same_gpu("RTX 3090", "NVIDIA GeForce RTX 3090")
    assert not same_gpu("RTX 3090", "NVIDIA GeForce RTX 3080")


def test_bare_a100_matches_either_form() -> None:
    """A vendor that says only `A100` matches both the PCIe and the SXM4 card."""
    assert same_gpu("A100", "NVIDIA A100-SXM4-80GB")
    assert same_gpu("A100", "A100 PCIE")
    assert not same_gpu("A100 PCIE", "H100 PCIE")


def test_expected_tflops_known_and_unknown() -> None:
    """Known models have an expected figure; an unknown model has none."""
    assert expected_tflops_bf16("NVIDIA GeForce RTX 4090") == pytest.approx(165.2)
    assert expected_tflops_bf16("Tesla V100-SXM2-16GB") is None


def test_hopper_cards_are_expected_at_what_the_preflight_measured_not_their_datasheet() -> None:
    """The H200 was measured (709.2 against 989.5 on its datasheet); the H100s share its processor
    and take the same fraction of their own datasheet peaks. Cards never measured keep theirs."""
    from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16, MEASURED_PREFLIGHT_TFLOPS_BF16

    assert expected_tflops_bf16("NVIDIA H200") == MEASURED_PREFLIGHT_TFLOPS_BF16["H200"] == pytest.approx(709.2)
    assert expected_tflops_bf16("NVIDIA H100 80GB HBM3") == pytest.approx(709.2)
    fraction = 709.2 / 989.5
    assert expected_tflops_bf16("NVIDIA H100 PCIe") == pytest.approx(DATASHEET_PEAK_TFLOPS_BF16["H100 PCIE"] * fraction,
                                                                    abs=0.05)
    assert expected_tflops_bf16("NVIDIA A100-SXM4-80GB") == DATASHEET_PEAK_TFLOPS_BF16["A100 SXM4"]
