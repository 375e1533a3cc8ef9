"""fusedopt for PyTorch: ``fusedopt.torch.Optimizer``, a ``torch.optim.Optimizer`` that runs
any rule (a preset name, a rule's text or a ``fusedopt.Rule``) as one fused kernel over
every parameter that has a gradient: CPU tensors on the host kernel, CUDA tensors on the GPU
kernel, on torch's current stream.

- Param groups keep torch's keys (``lr``, ``betas``, ``weight_decay``, ...) so LR schedulers
  and user code work unchanged; a changed value reaches the kernel at the next step without
  a recompile.
- ``state_dict()`` / ``load_state_dict()`` use torch's layout and state names
  (``exp_avg``, ``exp_avg_sq``, ``step``, ...): a ``torch.optim.AdamW`` checkpoint loads into
  ``rule="adamw"`` and back. ``from_torch(optimizer)`` converts a live torch optimizer.
- AMP: ``_step_supports_amp_scaling``: a GradScaler hands over ``grad_scale`` and
  ``found_inf``; the unscale and the skip happen in the fused kernel, with no host
  synchronisation on CUDA.

The package's files, one job each: optimizer.py (the class, the step), options.py, hypers.py,
engines.py (planning and pointer following), state.py and state_table.py (``opt.state``),
state_dict.py, distributed.py (sharded params).
"""

from ..errors import UsageError  # noqa: F401  (fusedopt.torch.UsageError, as before)
from .hypers import TORCH_PRESETS
from .optimizer import Optimizer, from_torch

__all__ = ["Optimizer", "from_torch", "TORCH_PRESETS"]
