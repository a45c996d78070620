"""The trainer and the supervisor read one exit-code table, though neither imports the other."""

from __future__ import annotations

from app.policy.supervision import TrainerExit
from trainer import exitcodes


def test_the_trainers_exit_codes_and_the_supervisors_agree() -> None:
    """Every EXIT_* of the trainer is the TrainerExit member of the same name, and nothing else."""
    trainer_side = {name.removeprefix("EXIT_"): getattr(exitcodes, name) for name in exitcodes.__all__}
    control_side = {member.name: int(member) for member in TrainerExit}
    assert trainer_side == control_side
