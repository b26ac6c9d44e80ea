"""Strategies: one row of the comparison each (a way to run the step, on one system); PyTorch 2.x's
strategies (--pytorch-strategies) and torch.compile's forward."""
import os
import re

import torch

from .common import fail, log


# The compiled forward's outer function, compiled from source once per compiled strategy. Dynamo
# keeps compiled code on the Python code object of the frame it compiles, and its guards do not
# include functorch's config: two torch.compile wrappers of one function would both run whichever
# budget compiled first. A code object of its own (its own file name) keeps each budget's graph.
COMPILED_SOURCE = "def compiled_forward_loss(tokens):\n    return forward_loss(tokens)\n"


def compiled_forward(model, targets, sdpa, budget, label):
    import torch._functorch.config as functorch_config

    def forward_loss(tokens):
        x = model.embed(tokens)
        for block in model.blocks:
            x = block.mlp_half(block.attention_half(x, sdpa))
        return model.loss(x, targets)

    namespace = {"forward_loss": forward_loss}
    exec(compile(COMPILED_SOURCE, f"<{label}>", "exec"), namespace)  # noqa: S102 - our own constant source
    compiled = torch.compile(namespace["compiled_forward_loss"], backend="inductor", fullgraph=True, dynamic=False)

    def run(tokens):
        # The partitioner reads the budget when the first call compiles; every call sets it so a
        # recompilation (which the measured rounds refuse) could not pick up another one.
        with functorch_config.patch(activation_memory_budget=budget):
            return compiled(tokens)
    return run


def prepare_inductor_cpu():
    """Lets inductor vectorise its CPU kernels where it can; returns the vector ISA it compiles for.

    Inductor's vectorised kernels call SLEEF (Sleef_expf8_u10, ...). Debian's torch links the
    system libsleef.so.3 into libtorch_cpu (PyPI's wheels carry SLEEF inside), so a kernel library
    finds those symbols only if libsleef's are global, and inductor's check of the ISA loads a test
    kernel in a fresh Python where they are not: the check fails, and every kernel is compiled
    scalar, without a word. Making libsleef global here, and preloading it into child processes
    (that check), avoids it. The check also needs sleef.h (Debian: libsleef-dev); without it the
    kernels stay scalar, and the output says so."""
    import ctypes.util
    name = ctypes.util.find_library("sleef")
    if name:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        os.environ["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), name]))
    try:
        from torch._inductor import cpu_vec_isa  # private: a diagnostic only
        isa = str(cpu_vec_isa.pick_vec_isa())
    except Exception as e:  # noqa: BLE001 - the figures do not depend on it; the report says it is unknown
        return f"unknown ({type(e).__name__})"
    if not isa or "INVALID" in isa.upper():
        log("warning: inductor found no vector ISA it can compile for: compiled strategies run scalar kernels "
            "(on Debian, sleef.h from libsleef-dev is needed)")
        return "none (scalar kernels)"
    return isa


class Strategy:
    def __init__(self, key, system, name, *, policy=None, own_masks=False, note=""):
        self.key, self.system, self.name, self.policy = key, system, name, policy
        self.own_masks = own_masks  # draws dropout masks of its own: at dropout > 0 its loss is not compared
        self.note = note
        self.steps = []


class PytorchStrategySpec:
    """A --pytorch-strategies entry: which plan, attention, checkpoint kind, compile budget."""

    def __init__(self, token, name, policy, sdpa, kind, compile_budget=None, features=(), own_masks=False, note=""):
        self.token, self.name, self.policy, self.sdpa, self.kind = token, name, policy, sdpa, kind
        self.compile_budget, self.features, self.own_masks, self.note = compile_budget, features, own_masks, note


def pytorch_strategy_spec(token, args):
    compile_sdpa = args.compile_attention == "sdpa"
    if token == "sac":
        return PytorchStrategySpec(token, "sac", "block", False, "sac", features=("sac",),
                                   note="per-block non-reentrant checkpoint, selective: keeps every mm/addmm/bmm output")
    if token == "sdpa":
        return PytorchStrategySpec(token, "sdpa", "none", True, None, features=("sdpa",), own_masks=True,
                                   note="F.scaled_dot_product_attention (causal), no checkpoint")
    if token == "sdpa+block":
        return PytorchStrategySpec(token, "sdpa+block (non-reentrant)", "block", True, "non-reentrant",
                                   features=("sdpa",), own_masks=True, note="SDPA, each block checkpointed non-reentrant")
    if token == "sdpa+sac":
        return PytorchStrategySpec(token, "sdpa+sac", "block", True, "sac", features=("sdpa", "sac"), own_masks=True,
                                   note="SDPA, per-block selective checkpoint keeping the matmul and SDPA outputs")
    match = re.fullmatch(r"compile(?::([0-9.]+))?", token)
    if match:
        budget = 1.0 if match.group(1) is None else float(match.group(1))
        if not 0.0 <= budget <= 1.0:
            fail(f"--pytorch-strategies: {token}: the budget must be in [0, 1]")
        attention = "SDPA" if compile_sdpa else "the GPT's attention"
        name = "compile" if match.group(1) is None else f"compile, budget {budget:g}"
        return PytorchStrategySpec(token, name + (" (sdpa)" if compile_sdpa else ""), "none", compile_sdpa, None,
                                   compile_budget=budget, features=("compile_memory_budget",) + (("sdpa",) if compile_sdpa else ()),
                                   own_masks=True,
                                   note=f"torch.compile (inductor) of the whole forward, {attention}, "
                                        f"activation_memory_budget {budget:g}")
    fail(f"--pytorch-strategies: unknown strategy '{token}'; known: sac, sdpa, sdpa+block, sdpa+sac, compile, compile:B")
