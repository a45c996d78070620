"""GPU names the main tests leave unspelled: the H100 NVL, an H100 variant nobody names, a bare A100."""

from __future__ import annotations

from app.policy.gpus import EXPECTED_TFLOPS_BF16, canonical_gpu, expected_tflops_bf16, same_gpu


def test_an_h100_nvl_is_its_own_model() -> None:
    """`NVIDIA H100 NVL` is the NVL part, not the SXM one."""
    assert canonical_gpu("NVIDIA H100 NVL") == "H100 NVL"
    assert not same_gpu("H100 SXM", "NVIDIA H100 NVL")


def test_an_h100_spelling_without_a_form_factor_word_stays_unknown() -> None:
    """An H100 name that says neither PCIe, NVL nor SXM (and more than `H100`) is not guessed into a model."""
    assert canonical_gpu("H100 mystery") == "H100 MYSTERY"
    assert expected_tflops_bf16("H100 mystery") is None


def test_a_bare_a100_is_expected_at_the_sxm4_figure() -> None:
    """A vendor that says only `A100` gets the SXM4 expectation (both forms share the datasheet peak)."""
    assert expected_tflops_bf16("A100") == EXPECTED_TFLOPS_BF16["A100 SXM4"]
