"""Plans: remat's JSON (`remat plan --json`), executed generically in PyTorch: a
{"checkpoint": [...]} item becomes torch.utils.checkpoint.checkpoint over the inner items."""
import functools
import json
import re
import subprocess

import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import checkpoint

from pytorch_gpt import sac_policy_ops  # bench/, the entry script's directory
from .common import fail, log


def remat_model_flags(args):
    return ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
            "--seq", str(args.seq), "--batch", str(args.batch), "--dropout", repr(args.dropout)]


def run_remat(command, what):
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        fail(f"{what}: `{' '.join(command)}` failed:\n{done.stderr.strip()}")
    return done.stdout


def get_plan(remat, args, policy):
    """The policy's plan as remat's JSON; None for a default policy the model is too small for."""
    command = [remat, "plan", *remat_model_flags(args), "--policy", policy, "--json"]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0 and not args.policies_given:
        log(f"  skipping {policy}: {done.stderr.strip()}")
        return None
    if done.returncode != 0:
        fail(f"`{' '.join(command)}` failed:\n{done.stderr.strip()}")
    return json.loads(done.stdout)


def remat_only_options(plan):
    """The plan's stage options that only remat's C++ model has (PyTorch runs only 'full')."""
    return sorted({o for o in plan["options"] if o != "full"})


def compact(items):
    """The compact form of remat/chain/plan.h (options omitted: all 'full')."""
    return " ".join(i if isinstance(i, str) else "[" + compact(i["checkpoint"]) + "]" for i in items)


def checkpoints_anything(items):
    return any(not isinstance(i, str) for i in items)


def stage_functions(model, plan, targets, sdpa=False):
    """Stage name -> function of the previous stage's output, as GptChain::forward_stage."""
    stages = {"embed": model.embed, "head": lambda x: model.loss(x, targets)}
    for i, block in enumerate(model.blocks):
        stages[f"block{i}"] = lambda x, b=block: b.mlp_half(b.attention_half(x, sdpa))
        stages[f"attn{i}"] = lambda x, b=block: b.attention_half(x, sdpa)
        stages[f"mlp{i}"] = block.mlp_half
    unknown = [s for s in plan["stages"] if s not in stages]
    if unknown:
        fail(f"the plan has stages this script does not know: {', '.join(unknown)}")
    return stages


def checkpoint_function(kind):
    """f(function, x) -> checkpointed output, for kind reentrant, non-reentrant or sac."""
    if kind == "reentrant":
        return lambda f, x: checkpoint(f, x, use_reentrant=True)
    if kind == "non-reentrant":
        return lambda f, x: checkpoint(f, x, use_reentrant=False)
    if kind == "sac":
        context_fn = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, sac_policy_ops())
        return lambda f, x: checkpoint(f, x, use_reentrant=False, context_fn=context_fn)
    raise ValueError(kind)


def run_items(items, x, stages, kind):
    for item in items:
        if isinstance(item, str):
            x = stages[item](x)
        else:
            inner = item["checkpoint"]
            if kind == "reentrant" and not x.requires_grad:
                fail("the plan checkpoints a segment whose input does not require grad (the embed stage?): "
                     "PyTorch's reentrant checkpoint would give its parameters no gradient.")
            x = checkpoint_function(kind)(lambda y, inner=inner: run_items(inner, y, stages, kind), x)
    return x


def without_options(compact_form):
    """A plan's compact form without its ':option' suffixes (the worker's replies carry them)."""
    return re.sub(r":[A-Za-z0-9+_-]+", "", compact_form)


def get_plans(remat, args):
    plans = {}
    for policy in args.policies:
        plan = get_plan(remat, args, policy)
        if plan is not None:
            plans[policy] = plan
            only = remat_only_options(plan)
            log(f"plan {policy}: {compact(plan['plan'])}"
                + (f" (stage options {', '.join(only)}: remat's side only)" if only else ""))
    return plans
