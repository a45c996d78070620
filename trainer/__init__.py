"""The agent that runs on the rented host.

It reads a job directory, trains a LoRA/QLoRA adapter in capped slices with atomic checkpoints,
keeps `status.json` as a heartbeat and writes a fixed-format `train.log`. It knows nothing of
the control plane: the only interface is the files described in docs/trainer.md, and the
control plane runs it as a program (`python -m trainer ...`), never imports it.
"""

__all__: list[str] = []
