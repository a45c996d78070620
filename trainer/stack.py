"""Importing the training stack (torch, bitsandbytes, transformers, peft) at the least cost.

Start-up is what every slice pays, so it is measured (docs/trainer.md, "Start-up"). Two costs are
avoidable and are avoided here:

- bitsandbytes wraps a few fallback kernels with `torch.compile` when it is imported. No kernel is
  compiled then (torch compiles on the first call), but building the wrapper imports TorchDynamo
  and Inductor, about a second of a start-up on a busy machine. `import_stack` imports
  bitsandbytes with a deferred `torch.compile` in place: the wrapper calls the real
  `torch.compile` on its first call, so a kernel that is ever used is compiled exactly as before
  (bitsandbytes' own fallback to the eager function on a compile error included). On the CPU the
  NF4 path uses the native library and never reaches these kernels.
- Interpreter teardown after the work is done (module garbage collection, about a second with
  torch loaded): `trainer.__main__` ends the process with `os._exit` once everything it wrote is
  flushed and fsynced.

Nothing here runs a torch operation: a fork server (trainer.slices) imports the stack and forks
children that compute, and a parent that never ran a parallel region leaves no OpenMP pool behind.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["deferred_compile", "import_stack"]


def deferred_compile(real: Callable[..., Any]) -> Callable[..., Any]:
    """A stand-in for `torch.compile` that calls `real` with the same arguments on first use."""

    def compile_later(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # used as @torch.compile(dynamic=False)
            return lambda fn: compile_later(fn, **kwargs)
        compiled: Any = None

        @functools.wraps(model)
        def call(*args: Any, **kw: Any) -> Any:
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **kwargs)
            return compiled(*args, **kw)

        return call

    return compile_later


def _import_bitsandbytes() -> None:
    if "bitsandbytes" in sys.modules or importlib.util.find_spec("bitsandbytes") is None:
        return
    import torch

    real = torch.compile
    torch.compile = deferred_compile(real)
    try:
        import bitsandbytes  # noqa: F401
    finally:
        torch.compile = real


def import_stack() -> None:
    """Import what loading and training need, bitsandbytes first (peft imports it whenever it is
    installed, so it is imported first even for `quantization: none`)."""
    _import_bitsandbytes()
    import peft  # noqa: F401
    import transformers  # noqa: F401
    from peft import LoraConfig, get_peft_model  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
