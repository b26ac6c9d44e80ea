"""The installed torch: its major version and what it offers. Imported only after
common.reexec_under_remat_conditions()."""
import re

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint

TORCH_MAJOR = int(re.match(r"\d+", torch.__version__).group())


def _compile_budget_available():
    if not hasattr(torch, "compile"):
        return False
    try:
        import torch._functorch.config as functorch_config
    except ImportError:
        return False
    return hasattr(functorch_config, "activation_memory_budget")


# What this torch offers, by feature (a backport or a removal shows up here, not as a crash).
FEATURES = {
    "sdpa": hasattr(F, "scaled_dot_product_attention"),
    "sac": hasattr(torch_checkpoint, "create_selective_checkpoint_contexts"),
    "compile_memory_budget": _compile_budget_available(),
}
