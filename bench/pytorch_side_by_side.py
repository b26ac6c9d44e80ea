#!/usr/bin/python3
"""remat and PyTorch side by side on the same GPT, the same weights and the same batch: exact
activation peaks, step times and losses, interleaved step by step.

    bench/pytorch_side_by_side.py [--preset reference | --layers 8 --hidden 256 --heads 8 --seq 256
                                   --batch 8 --dropout 0.1] [--policies none,block,...] [--rounds 3]
                                  [--[no-]non-reentrant] [--pytorch-strategies sac,sdpa,compile:0.5,...]
                                  [--budget 30%,50%,70%] [--no-overhead]
                                  [--json FILE] [--markdown FILE] [--plot FILE.png]

Needs the built project (scripts/build.sh): build/tools/remat, build/libremat_memory_tracker.so and,
for the per-call overhead, build/bench/remat_checkpoint_bench; and the python3-torch of the LibTorch
remat links (Debian 12: 1.13.1; Debian 13: 2.6, build with --build build-debian13).

What runs (features are detected from the installed torch, not assumed from its version):
- --policies (remat's policies, plans from `remat plan --policy P --json`): each on both sides, remat
  (`remat worker`) and PyTorch (torch.utils.checkpoint, use_reentrant=True; --non-reentrant adds
  use_reentrant=False, on by default where PyTorch is 2.x). Policies whose plans use stage options
  that exist only in remat's C++ model (selective, fused, fused+matmul-inputs, matmul-inputs) run on
  remat's side only.
- --budget (remat's planner, `remat plan --budget B`): the fastest plan predicted to fit B, a
  percentage of remat's *predicted* unchecked activation peak (from a profile taken once at the
  start), on remat's side.
- --pytorch-strategies (PyTorch 2.x): sac (per-block non-reentrant checkpoint with
  create_selective_checkpoint_contexts saving every matmul output: mm, addmm, bmm, so the T x T
  attention scores too), sdpa (attention by F.scaled_dot_product_attention, causal, unchecked),
  sdpa+block (the same, each block checkpointed non-reentrant), sdpa+sac (SDPA, and SAC saving
  the matmul and SDPA outputs), compile (torch.compile of the whole forward with inductor, the
  default partition), compile:B (the same with torch._functorch.config.activation_memory_budget =
  B: B is a fraction of what the default compiled partition saves, between recomputing everything
  that can be (0) and that default (1), by the partitioner's estimate: not of the eager peak).
  --compile-attention chooses the compiled model's attention (the GPT's own, default, or sdpa).
Defaults: on 1.13, the policies of earlier versions of this script and nothing else; on 2.x those
plus selective, non-reentrant and sac, and, at dropout 0 only, fused, fused+matmul-inputs, sdpa,
sdpa+block, sdpa+sac, compile and compile:0.3/0.5/0.7 and the budgets 30%/50%/70% (those draw
dropout masks of their own, or may: see below).

How it works:
- The remat side is `remat worker`, a separate process. It builds the GPT (seeded), exports its
  weights and one batch of its corpus (torch::pickle_save: tensors in dicts, read here so that
  only tensors can come out: see read_export), then runs one measured training step per request line on stdin
  under a policy's plan and answers one JSON line. The planner's plans (--budget) run in
  `remat bench --profile P --measure-steps 1` once per round unless the worker takes plans itself
  (a ready line listing "plan" among its "requests").
- This process builds the same GPT in PyTorch (models/src/gpt.cpp, op for op, with the same dropout
  calls in the same order and the same tensor lifetimes), loads the exported weights and batch, and
  runs each policy's plan generically: a {"checkpoint": [...]} item becomes
  torch.utils.checkpoint.checkpoint over the inner items (nested checkpoints inside, as remat
  recomputes them).
- Bytes come from remat's tracking allocator loaded into this process (ctypes), under the
  conditions remat's programs set for themselves: --threads OpenBLAS threads and one LibTorch
  intra-op thread, freed memory kept in the process (glibc tunables; the script re-executes itself).
  Activation peak = peak during forward + backward minus the bytes held before the forward, with
  the gradients existing and zeroed, as remat::measure_step counts. A compiled forward's buffers
  come from the same allocator and are counted the same way.
- One warm-up round (not counted; torch.compile compiles there), then --rounds rounds; in each,
  every strategy runs one step, the order reversed every other round. Every step seeds the CPU
  generator with the round's seed right before the forward.
- Time: each strategy's step over PyTorch's unchecked eager step of the same round; the median of
  those per-round ratios (and their IQR). The policy table also pairs remat's and PyTorch's step
  of the same plan.
- Losses. Same plan, both sides: same dropout masks, so the losses must be equal (relative
  difference <= --loss-tolerance, 1e-5). Every strategy against PyTorch's unchecked eager loss of
  the same round: relative difference <= --strategy-loss-tolerance (1e-4: SDPA, compiled graphs,
  remat's fused and matmul-inputs options compute in another order), except, at dropout > 0, for
  those that draw their own dropout masks (sdpa*, compile*, remat plans with a fused option),
  whose losses are shown but not compared. The script exits 1 if a compared loss differs.
- The per-call overhead of a checkpoint on a tiny function (16 floats, (in*w).tanh(), as
  bench/checkpoint_bench.cpp): PyTorch's measured here, remat's by running remat_checkpoint_bench.
"""
import argparse
import collections
import ctypes
import functools
import io
import json
import math
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"
PRESETS = {
    "demo": dict(layers=4, hidden=128, heads=4, seq=128, batch=8, dropout=0.1),
    "reference": dict(layers=8, hidden=256, heads=8, seq=256, batch=8, dropout=0.1),
}
DEFAULT_POLICIES = "none,block,every:2,segments:2,segments:4,ffn,attn"  # 1.13's, and the start of 2.x's
MIB = 2.0 ** 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), help="model and batch of `remat --preset`; flags override")
    for name, default in PRESETS["reference"].items():
        p.add_argument("--" + name, type=type(default), default=None, help=f"(default {default})")
    p.add_argument("--policies", default=None,
                   help="remat policies, comma-separated (default: see above, less those the model is too small for)")
    p.add_argument("--non-reentrant", action=argparse.BooleanOptionalAction, default=None,
                   help="also run PyTorch's use_reentrant=False for every policy that checkpoints (default: on 2.x)")
    p.add_argument("--pytorch-strategies", default=None,
                   help="PyTorch 2.x strategies, comma-separated: sac, sdpa, sdpa+block, sdpa+sac, compile, "
                        "compile:B (B in [0, 1]); '' for none (default: see above)")
    p.add_argument("--compile-attention", choices=("gpt", "sdpa"), default="gpt",
                   help="attention inside the compiled forward: the GPT's own ops (default) or SDPA")
    p.add_argument("--budget", default=None,
                   help="remat's planner: budgets as `remat plan --budget` takes them (e.g. 30%%,50%%,70%%; a %% is "
                        "of remat's predicted unchecked peak), comma-separated; '' for none (default: see above)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds after one warm-up round")
    p.add_argument("--seed", type=int, default=0, help="the worker's seed (weights, batch); dropout seeds follow")
    p.add_argument("--threads", type=int, default=2, help="OpenBLAS threads, both sides (default 2)")
    p.add_argument("--no-overhead", action="store_true", help="skip the per-call overhead benchmark")
    p.add_argument("--overhead-calls", type=int, default=2000, help="calls per round of the overhead benchmark")
    p.add_argument("--overhead-rounds", type=int, default=7)
    # OpenBLAS threads spin 2^28 cycles (~0.1 s at 2.6 GHz) after their last call before sleeping:
    # pausing longer keeps one process's spinning threads out of the other's measured step.
    p.add_argument("--settle", type=float, default=0.25,
                   help="seconds to pause between steps so the other process's BLAS threads go idle (default 0.25)")
    p.add_argument("--loss-tolerance", type=float, default=1e-5,
                   help="largest relative loss difference between remat and PyTorch on the same plan")
    p.add_argument("--strategy-loss-tolerance", type=float, default=1e-4,
                   help="largest relative difference of any strategy's loss from PyTorch's unchecked eager loss")
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory")
    p.add_argument("--json", metavar="FILE", help="write all figures as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the tables as Markdown")
    p.add_argument("--plot", metavar="FILE", help="draw activation peak vs paired time ratio (PNG, with gnuplot)")
    args = p.parse_args()
    preset = PRESETS[args.preset or "reference"]
    for name, default in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    check_run_args(p, args)
    return p, args


def reexec_under_remat_conditions():
    """Keep freed memory in the process (remat's mallopt calls as glibc tunables); BLAS threads."""
    if os.environ.get("GLIBC_TUNABLES") == TUNABLES:
        return
    os.environ["GLIBC_TUNABLES"] = TUNABLES
    threads = "2"
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            threads = sys.argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    os.environ["OPENBLAS_NUM_THREADS"] = threads
    os.execv(sys.executable, [sys.executable] + sys.argv)


def log(message):
    print(message, file=sys.stderr, flush=True)


def fail(message):
    log(f"pytorch_side_by_side: {message}")
    sys.exit(2)


reexec_under_remat_conditions()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.utils.checkpoint as torch_checkpoint  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

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


from pytorch_gpt import GPT, check_run_args, sac_policy_ops  # noqa: E402  (bench/: the script's own directory)


def cpp_name(python_name):
    """blocks.3.qkv.weight -> block3.qkv.weight (the C++ module path)."""
    if python_name.startswith("blocks."):
        _, index, rest = python_name.split(".", 2)
        return f"block{index}.{rest}"
    return python_name


STORAGE_DTYPES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
                  "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
                  "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool"}


class TensorsOnlyUnpickler(pickle.Unpickler):
    """Reads a torch.save-format archive into tensors and plain containers, and nothing else: the
    pickle may name only the tensor rebuild function, storage classes, OrderedDict (a tensor's
    empty hooks) and restore_type_tag, and each resolves to a function of this class that builds
    data. Storages are the archive's raw bytes, little-endian as written on this machine."""

    class Storage:
        def __init__(self, name):
            self.dtype = getattr(torch, STORAGE_DTYPES[name])

    def __init__(self, archive, pickle_name):
        super().__init__(io.BytesIO(archive.read(pickle_name)))
        self.archive, self.folder = archive, pickle_name[: -len("data.pkl")]

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *rest: storage.as_strided(size, stride, offset)
        if module == "torch" and name in STORAGE_DTYPES:
            return functools.partial(TensorsOnlyUnpickler.Storage, name)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch.jit._pickle", "restore_type_tag"):
            return lambda value, type_string: value
        raise pickle.UnpicklingError(f"the file names {module}.{name}, which is not part of a tensor")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unexpected persistent id {pid!r}")
        storage_type, key = pid[1], pid[2]
        if not isinstance(storage_type, functools.partial) or storage_type.func is not TensorsOnlyUnpickler.Storage:
            raise pickle.UnpicklingError(f"persistent id {pid!r} does not name a storage class")
        dtype = storage_type().dtype
        data = bytearray(self.archive.read(f"{self.folder}data/{key}"))
        return torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)


def read_export(path):
    """The worker's export, read so that it can only produce tensors in plain containers.

    torch::pickle_save follows each typed dict (Dict[str, Tensor], Dict[str, Any]) with a call of
    torch.jit._pickle.restore_type_tag(dict, "Dict[str, Tensor]"), PyTorch's own function that
    returns the dict unchanged (the tag matters to TorchScript only). torch.load(weights_only=True)
    allows tensors and containers but not that function, so PyTorch 2.6, where weights_only=True is
    the default, refuses the file. Where torch.serialization.safe_globals exists (2.5+) the load is
    torch.load(weights_only=True) with that one function allowlisted for this call. Older versions
    (1.13) have no allowlist and ignore a pickle_module unless weights_only=False: there the archive
    is read by TensorsOnlyUnpickler above, which builds tensors from the stored bytes itself."""
    import torch.jit._pickle as jit_pickle

    safe_globals = getattr(torch.serialization, "safe_globals", None)
    try:
        if safe_globals is not None:
            with safe_globals([jit_pickle.restore_type_tag]):
                return torch.load(path, weights_only=True)
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise pickle.UnpicklingError(f"expected one */data.pkl in the archive, found {len(pickles)}")
            return TensorsOnlyUnpickler(archive, pickles[0]).load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure is the same user-facing error
        fail(f"cannot load the worker's export {path} (tensors only): {e}")


def load_export(model, path, args):
    """Copies the worker's exported weights into `model`; returns (tokens, targets)."""
    export = read_export(path)
    if not isinstance(export, dict) or not {"weights", "tokens", "targets"} <= set(export):
        fail(f"{path}: expected a dict with 'weights', 'tokens' and 'targets', got "
             f"{sorted(export) if isinstance(export, dict) else type(export).__name__}")
    weights = dict(export["weights"])
    ours = {cpp_name(n): p for n, p in model.named_parameters()}
    problems = [f"missing in the export: {n}" for n in sorted(set(ours) - set(weights))]
    problems += [f"not in the PyTorch model: {n}" for n in sorted(set(weights) - set(ours))]
    problems += [f"{n}: export {tuple(weights[n].shape)}, PyTorch {tuple(p.shape)}"
                 for n, p in sorted(ours.items()) if n in weights and weights[n].shape != p.shape]
    if problems:
        fail("the exported weights do not match the PyTorch GPT:\n  " + "\n  ".join(problems))
    with torch.no_grad():
        for n, p in ours.items():
            p.copy_(weights[n])
    tokens, targets = export["tokens"], export["targets"]
    for name, t in (("tokens", tokens), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != (args.batch, args.seq):
            fail(f"export's {name}: expected int64 of shape ({args.batch}, {args.seq}), got "
                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    return tokens.contiguous(), targets.contiguous()


# ---------------------------------------------------------------------------------------------
# Plans: remat's JSON, executed generically.

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


# ---------------------------------------------------------------------------------------------
# Strategies: one row of the comparison each (a way to run the step, on one system).

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


def resolve_defaults(parser, args):
    """Fills the version-dependent defaults, and refuses what this torch cannot run."""
    two = TORCH_MAJOR >= 2
    args.policies_given = args.policies is not None
    if args.policies is None:
        args.policies = DEFAULT_POLICIES + (",selective" if two else "")
        if two and args.dropout == 0:
            args.policies += ",fused,fused+matmul-inputs"
    args.policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    if "none" not in args.policies:  # the baseline of every time ratio and loss comparison
        args.policies.insert(0, "none")
        log("note: added policy 'none': PyTorch's unchecked eager step is the baseline of the time ratios")
    if args.non_reentrant is None:
        args.non_reentrant = two
    if args.pytorch_strategies is None:
        args.pytorch_strategies = ""
        if two:
            args.pytorch_strategies = "sac" + (",sdpa,sdpa+block,sdpa+sac,compile,compile:0.7,compile:0.5,compile:0.3"
                                               if args.dropout == 0 else "")
    args.budget_given = args.budget is not None
    if args.budget is None:
        args.budget = "30%,50%,70%" if two and args.dropout == 0 else ""
    args.budgets = [b.strip() for b in args.budget.split(",") if b.strip()]
    tokens = [t.strip() for t in args.pytorch_strategies.split(",") if t.strip()]
    if len(set(tokens)) != len(tokens):
        parser.error("--pytorch-strategies lists a strategy twice")
    args.pytorch_specs = [pytorch_strategy_spec(t, args) for t in tokens]
    for spec in args.pytorch_specs:
        missing = [f for f in spec.features if not FEATURES[f]]
        if missing:
            fail(f"--pytorch-strategies {spec.token}: this torch ({torch.__version__}) lacks "
                 f"{', '.join(missing)} (torch.nn.functional.scaled_dot_product_attention, "
                 "torch.utils.checkpoint.create_selective_checkpoint_contexts, torch.compile with "
                 "torch._functorch.config.activation_memory_budget: PyTorch 2.x)")


# ---------------------------------------------------------------------------------------------
# Measurement.

class Tracker:
    """remat's tracking allocator, installed as LibTorch's CPU allocator of this process."""

    def __init__(self, path):
        if not os.path.exists(path):
            fail(f"{path} not found: build the project first: scripts/build.sh")
        lib = ctypes.CDLL(path)
        lib.remat_cpu_current_bytes.restype = ctypes.c_int64
        lib.remat_cpu_peak_bytes.restype = ctypes.c_int64
        lib.remat_install_cpu_memory_tracker()
        self.lib = lib

    def current(self):
        return self.lib.remat_cpu_current_bytes()

    def peak(self):
        return self.lib.remat_cpu_peak_bytes()

    def reset_peak(self):
        self.lib.remat_cpu_reset_peak()


def pytorch_step(model, forward_loss, tokens, seed, tracker):
    model.zero_grad(set_to_none=False)
    torch.manual_seed(seed)
    before = tracker.current()
    tracker.reset_peak()
    start = time.perf_counter()
    loss = forward_loss(tokens)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = tracker.peak() - before
    return {"seconds": seconds, "activation_peak_bytes": peak, "loss": loss.item()}


class Worker:
    """`remat worker`: one JSON request line in, one JSON reply line out."""

    def __init__(self, remat, args, export_path):
        command = [remat, "worker", *remat_model_flags(args), "--seed", str(args.seed),
                   "--threads", str(args.threads), "--export", export_path]
        self.command = " ".join(command)
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.ready = self.read_reply()
        if not self.ready.get("ready"):
            self.die(f"expected a ready line, got {self.ready}")
        # A worker that runs plans sent as JSON says so; older ones take policy names only.
        self.takes_plans = "plan" in self.ready.get("requests", [])

    def die(self, message):
        self.close()
        fail(f"remat worker ({self.command}): {message}")

    def read_reply(self):
        while True:
            line = self.process.stdout.readline()
            if not line:
                code = self.process.wait()
                self.die(f"exited with status {code} without replying (its messages are above)")
            line = line.strip()
            if not line.startswith("{"):
                log(f"  worker: {line}")
                continue
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                self.die(f"replied with a line that is not JSON: {line!r}")
            if "error" in reply:
                self.die(f"error: {reply['error']}")
            return reply

    def step(self, request, seed):
        """request: {"policy": name} or, where the worker takes them, {"plan": remat's plan JSON}."""
        try:
            self.process.stdin.write(json.dumps(dict(request, steps=1, seed=seed)) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.read_reply()  # reports how it ended
        reply = self.read_reply()
        for key in ("seconds", "activation_peak_bytes", "loss"):
            if not isinstance(reply.get(key), list) or len(reply[key]) != 1:
                self.die(f"reply without a one-element '{key}' list: {reply}")
        return {"seconds": reply["seconds"][0], "activation_peak_bytes": reply["activation_peak_bytes"][0],
                "loss": reply["loss"][0], "plan": reply.get("plan")}

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


class BudgetPlans:
    """remat's planner at each --budget: one profile, taken once, so every round runs the same plans."""

    def __init__(self, remat, args, workdir):
        self.remat, self.args, self.workdir = remat, args, workdir
        self.profile = os.path.join(workdir, "profile.json")
        log(f"profiling the GPT for the planner (remat profile, {args.threads} threads)")
        run_remat([remat, "profile", *remat_model_flags(args), "--seed", str(args.seed), "--threads", str(args.threads),
                   "--save-profile", self.profile], "profiling for --budget")
        self.plans = {}
        for b in args.budgets:  # one at a time: a default budget the model is too small for is skipped
            command = [remat, "plan", *remat_model_flags(args), "--seed", str(args.seed), "--profile", self.profile,
                       "--budget", b, "--json"]
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0 and not args.budget_given:
                log(f"  skipping budget {b}: {done.stderr.strip().splitlines()[-1]}")
                continue
            if done.returncode != 0:
                fail(f"planning for --budget {b}: `{' '.join(command)}` failed:\n{done.stderr.strip()}")
            self.plans[b] = json.loads(done.stdout)
        args.budgets = list(self.plans)
        for b, r in self.plans.items():
            log(f"plan optimal {b} (budget {mib(r['budget_bytes'])} MiB = {b} of the predicted unchecked peak "
                f"{mib(r['unchecked_peak_bytes'])} MiB): {r['plan']}")

    def name(self, budget):
        return f"optimal {budget} ({mib(self.plans[budget]['budget_bytes'])} MiB)"

    def bench_round(self, seed):
        """One `remat bench` run: a warm-up round and one measured round of none and every budget's plan.

        The fallback where the worker does not run plans sent to it: a process of its own per round,
        measured in the same round as everything else (its steps time the same machine drift), but
        without the losses, which `remat bench` does not report."""
        out_dir = os.path.join(self.workdir, "bench")
        command = [self.remat, "bench", *remat_model_flags(self.args), "--seed", str(self.args.seed),
                   "--threads", str(self.args.threads), "--profile", self.profile, "--policies", "none",
                   "--budget", ",".join(self.args.budgets), "--measure-steps", "1", "--no-plots", "--no-trace",
                   "--out", out_dir, "--json"]
        report = json.loads(run_remat(command, "the planner's plans"))
        rows = {r["strategy"]: r for r in report["strategies"]}
        steps = {}
        for b, planned in self.plans.items():
            row = rows.get(f"optimal {b}")
            if row is None:
                fail(f"`remat bench` did not report 'optimal {b}' (it reported {', '.join(rows)})")
            if row["plan"] != planned["plan"]:
                fail(f"`remat bench` ran '{row['plan']}' for budget {b}, `remat plan` gave '{planned['plan']}' "
                     "from the same profile")
            steps[f"remat:optimal {b}"] = {"seconds": row["median_step_seconds"],
                                           "activation_peak_bytes": row["activation_peak_bytes"], "loss": None,
                                           "plan": row["plan"]}
        none = rows["none"]
        steps["remat-bench:none"] = {"seconds": none["median_step_seconds"],
                                     "activation_peak_bytes": none["activation_peak_bytes"], "loss": None}
        return steps


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


def build_pytorch_model(args, export_path):
    """The PyTorch GPT with the worker's weights, gradients allocated; returns (model, tokens, targets)."""
    model = GPT(args.layers, args.hidden, args.heads, args.seq, args.dropout)
    model.train()
    tokens, targets = load_export(model, export_path, args)
    for p in model.parameters():  # gradients exist (zeroed) before every measured forward, as in remat
        p.grad = torch.zeros_like(p)
    return model, tokens, targets


class Comparison:
    """Every strategy, and the round's tasks that measure them (a task may measure several)."""

    def __init__(self, args, remat, tracker, workdir):
        self.args, self.remat, self.tracker = args, remat, tracker
        self.plans = get_plans(remat, args)
        args.policies = list(self.plans)
        if "none" not in self.plans:
            fail("policy 'none' did not plan: it is the baseline of every comparison")
        self.strategies = {}  # key -> Strategy, in table order
        self.tasks = []  # (label, function of the seed -> {key: step})
        self.budget_plans = BudgetPlans(remat, args, workdir) if args.budgets else None
        if self.budget_plans and not self.budget_plans.plans:
            self.budget_plans = None
        export_path = os.path.join(workdir, "export.pt")
        log(f"starting the remat worker (GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, "
            f"sequence {args.seq}, batch {args.batch}, dropout {args.dropout})")
        self.worker = Worker(remat, args, export_path)
        self.model, self.tokens, self.targets = build_pytorch_model(args, export_path)
        self._add_policies()
        self._add_budgets()
        self._add_pytorch_strategies()

    def add(self, strategy):
        self.strategies[strategy.key] = strategy
        return strategy

    def _pytorch_task(self, key, forward_loss):
        return (key, lambda seed: {key: pytorch_step(self.model, forward_loss, self.tokens, seed, self.tracker)})

    def _add_policies(self):
        for policy, plan in self.plans.items():
            only = remat_only_options(plan)
            own_masks = "fused" in "".join(only)  # remat::ops::dropout regenerates masks from Philox
            self.add(Strategy(f"remat:{policy}", "remat", policy, policy=policy, own_masks=own_masks,
                              note=f"stage options {', '.join(only)}" if only else ""))
            self.tasks.append((f"remat:{policy}", self._worker_task(f"remat:{policy}", {"policy": policy}, plan)))
            if only:
                continue
            stages = stage_functions(self.model, plan, self.targets)
            kinds = ["reentrant"] + (["non-reentrant"] if self.args.non_reentrant and checkpoints_anything(plan["plan"])
                                     else [])
            for kind in kinds:
                key = f"pytorch:{policy}" if kind == "reentrant" else f"pytorch-nr:{policy}"
                name = policy if kind == "reentrant" or policy == "none" else f"{policy} (non-reentrant)"
                self.add(Strategy(key, "PyTorch", name, policy=policy,
                                  note="eager, unchecked" if policy == "none" else f"torch.utils.checkpoint, {kind}"))
                self.tasks.append(self._pytorch_task(
                    key, lambda tokens, p=plan, s=stages, k=kind: run_items(p["plan"], tokens, s, k)))

    def _worker_task(self, key, request, plan):
        def run(seed):
            r = self.worker.step(request, seed)
            if plan is not None and r["plan"] and without_options(r["plan"]) != compact(plan["plan"]):
                log(f"  note: the worker ran '{r['plan']}' for {key}; `remat plan` gave '{compact(plan['plan'])}'")
            return {key: r}
        return run

    def _add_budgets(self):
        if not self.budget_plans:
            return
        for b, planned in self.budget_plans.plans.items():
            options = sorted(set(planned["plan_json"]["options"]) - {"full"})
            self.add(Strategy(f"remat:optimal {b}", "remat", self.budget_plans.name(b), own_masks="fused" in "".join(options),
                              note=f"remat plan --budget {b}: {planned['plan']}"))
        if self.worker.takes_plans:
            for b, planned in self.budget_plans.plans.items():
                key = f"remat:optimal {b}"
                self.tasks.append((key, self._worker_task(key, {"plan": planned["plan_json"]}, None)))
        else:
            log("note: this remat worker takes policy names only: the planner's plans run in `remat bench`, "
                "once per round, without losses")
            self.add(Strategy("remat-bench:none", "remat", "none (remat bench)", note="cross-check of the bench process"))
            self.tasks.append(("remat bench: planner's plans", self.budget_plans.bench_round))

    def _add_pytorch_strategies(self):
        for spec in self.args.pytorch_specs:
            key = f"pytorch2:{spec.token}"
            self.add(Strategy(key, "PyTorch", spec.name, own_masks=spec.own_masks, note=spec.note))
            if spec.compile_budget is not None:
                forward = compiled_forward(self.model, self.targets, spec.sdpa, spec.compile_budget,
                                           f"compiled forward of {spec.token}")
            else:
                plan = self.plans.get(spec.policy) or get_plan(self.remat, self.args, spec.policy)
                stages = stage_functions(self.model, plan, self.targets, sdpa=spec.sdpa)
                forward = (lambda tokens, p=plan, s=stages, k=spec.kind: run_items(p["plan"], tokens, s, k))
            self.tasks.append(self._compile_guarded(self._pytorch_task(key, forward), spec))

    def _compile_guarded(self, task, spec):
        if spec.compile_budget is None:
            return task
        label, run = task

        def guarded(seed):
            try:
                return run(seed)
            except Exception as e:  # noqa: BLE001 - inductor's failures have many types; all end here
                first = str(e).strip().splitlines()
                fail(f"torch.compile failed for {spec.token} ({type(e).__name__}: {first[0] if first else ''}"
                     f"{' ...' if len(first) > 1 else ''}). Inductor on CPU needs g++ and Python's headers; "
                     "leave the compile strategies out with --pytorch-strategies.")
        return (label, guarded)

    def close(self):
        self.worker.close()


def without_options(compact_form):
    """A plan's compact form without its ':option' suffixes (the worker's replies carry them)."""
    return re.sub(r":[A-Za-z0-9+_-]+", "", compact_form)


def run_round(round_index, comparison):
    """One step of every strategy, all with the same dropout seed; stores them after the warm-up."""
    args = comparison.args
    seed = args.seed + 1000 + round_index + 1
    log(f"round {'warm-up' if round_index < 0 else f'{round_index + 1}/{args.rounds}'} (dropout seed {seed})")
    tasks = comparison.tasks if round_index % 2 == 0 else comparison.tasks[::-1]  # warm-up (-1): reversed
    started = time.perf_counter()
    for label, task in tasks:
        time.sleep(args.settle)
        task_start = time.perf_counter()
        steps = task(seed)
        wall = time.perf_counter() - task_start
        for key, step in steps.items():
            s = comparison.strategies[key]
            loss = "-" if step["loss"] is None else f"{step['loss']:.6f}"
            log(f"  {s.system:7s} {s.name:34s} {step['seconds']:.3f} s  {mib(step['activation_peak_bytes']):>8s} MiB  "
                f"loss {loss}" + (f"  (took {wall:.0f} s: compiling)" if round_index < 0 and wall > 10 * step["seconds"] + 5
                                  else ""))
            if round_index >= 0:
                s.steps.append(dict(step, seed=seed))
    return time.perf_counter() - started


def compare(comparison):
    args = comparison.args
    warmup = run_round(-1, comparison)
    if any(s.compile_budget is not None for s in args.pytorch_specs):
        # Every compiled strategy compiled in the warm-up: a recompilation now would be timed as a
        # step, so it is refused instead.
        torch._dynamo.config.error_on_recompile = True
    for round_index in range(args.rounds):
        seconds = run_round(round_index, comparison)
        if round_index == 0:
            compiling = ", compiling included" if any(s.compile_budget is not None for s in args.pytorch_specs) else ""
            log(f"  (warm-up round {warmup:.0f} s{compiling}; a measured round {seconds:.0f} s: "
                f"about {seconds * (args.rounds - 1) / 60:.1f} min to go)")


# ---------------------------------------------------------------------------------------------
# Summaries.

def quartiles(values):
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize_strategies(comparison):
    """Per strategy: peak, paired time ratio to PyTorch's eager unchecked step, losses vs its loss."""
    args = comparison.args
    base = comparison.strategies["pytorch:none"].steps
    rows = []
    for s in comparison.strategies.values():
        peaks = [st["activation_peak_bytes"] for st in s.steps]
        ratios = [st["seconds"] / b["seconds"] for st, b in zip(s.steps, base)]
        low, high = quartiles(ratios)
        compared = s.steps[0]["loss"] is not None and not (s.own_masks and args.dropout > 0)
        rels = [abs(st["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for st, b in zip(s.steps, base)] \
            if s.steps[0]["loss"] is not None else []
        rows.append({"key": s.key, "system": s.system, "strategy": s.name, "note": s.note,
                     "activation_peak_bytes": max(peaks), "peak_varied": len(set(peaks)) > 1,
                     "median_seconds": statistics.median(st["seconds"] for st in s.steps),
                     "time_ratio_to_pytorch_none_paired_median": statistics.median(ratios),
                     "time_ratio_to_pytorch_none_paired_iqr": [low, high],
                     "first_round_loss": s.steps[0]["loss"],
                     "loss_max_rel_diff_to_pytorch_none": max(rels) if rels else None,
                     "loss_compared": compared, "own_dropout_masks": s.own_masks, "steps": s.steps})
    return rows


def summarize_pairs(comparison):
    """The policy table: remat and PyTorch on the same plan."""
    rows = []
    for policy, plan in comparison.plans.items():
        remat = comparison.strategies[f"remat:{policy}"]
        row = {"policy": policy, "plan": compact(plan["plan"]), "remat": side_summary(remat)}
        if f"pytorch:{policy}" not in comparison.strategies:
            continue  # remat-only stage options
        for side, key in (("pytorch", f"pytorch:{policy}"), ("pytorch_nonreentrant", f"pytorch-nr:{policy}")):
            other = comparison.strategies.get(key)
            if other is None:
                continue
            o = row[side] = side_summary(other)
            r = row["remat"]
            o["peak_ratio_remat_over_this"] = r["activation_peak_bytes"] / max(o["activation_peak_bytes"], 1)
            o["time_ratio_remat_over_this"] = r["median_seconds"] / o["median_seconds"]
            # Per round, the two steps ran back to back: their ratio cancels the machine's drift
            # between rounds, and the spread of those ratios is the comparison's resolution.
            paired = [a["seconds"] / b["seconds"] for a, b in zip(remat.steps, other.steps)]
            o["time_ratio_paired_median"] = statistics.median(paired)
            o["time_ratio_paired_iqr"] = list(quartiles(paired))
            diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(remat.steps, other.steps)]
            rels = [abs(a["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for a, b in zip(remat.steps, other.steps)]
            o["loss_max_abs_diff"], o["loss_max_rel_diff"] = max(diffs), max(rels)
        rows.append(row)
    return rows


def side_summary(strategy):
    peaks = [s["activation_peak_bytes"] for s in strategy.steps]
    return {"median_seconds": statistics.median(s["seconds"] for s in strategy.steps),
            "activation_peak_bytes": max(peaks), "peak_varied": len(set(peaks)) > 1, "steps": strategy.steps}


def loss_failures(pairs, strategy_rows, args):
    failures = [f"{row['policy']} ({v}): relative loss difference {row[v]['loss_max_rel_diff']:.3e} > {args.loss_tolerance:g}"
                for row in pairs for v in ("pytorch", "pytorch_nonreentrant")
                if v in row and row[v]["loss_max_rel_diff"] > args.loss_tolerance]
    failures += [f"{r['strategy']} ({r['system']}): relative difference from PyTorch's unchecked loss "
                 f"{r['loss_max_rel_diff_to_pytorch_none']:.3e} > {args.strategy_loss_tolerance:g}"
                 for r in strategy_rows
                 if r["loss_compared"] and r["loss_max_rel_diff_to_pytorch_none"] > args.strategy_loss_tolerance]
    return failures


# ---------------------------------------------------------------------------------------------
# Per-call overhead on a tiny function.

def seconds_per_call(calls, f):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls


def pytorch_overhead(calls, rounds):
    torch.manual_seed(0)
    w = torch.randn(16, requires_grad=True)
    x = torch.randn(16, requires_grad=True)

    def tiny(inp):
        return (inp * w).tanh()

    cases = {
        "forward_direct": lambda: tiny(x),
        "forward_reentrant": lambda: checkpoint(tiny, x, use_reentrant=True),
        "forward_nonreentrant": lambda: checkpoint(tiny, x, use_reentrant=False),
        "step_direct": lambda: tiny(x).sum().backward(),
        "step_reentrant": lambda: checkpoint(tiny, x, use_reentrant=True).sum().backward(),
        "step_nonreentrant": lambda: checkpoint(tiny, x, use_reentrant=False).sum().backward(),
    }
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, f in cases.items():
            times[k].append(seconds_per_call(calls, f))
    us = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    rows = []
    for mode in ("forward", "step"):
        for variant in ("reentrant", "nonreentrant"):
            rows.append({"who": f"PyTorch checkpoint, use_reentrant={variant == 'reentrant'}", "mode": mode,
                         "direct_us": us[f"{mode}_direct"], "checkpoint_us": us[f"{mode}_{variant}"]})
    return rows


def remat_overhead(build, calls, rounds, threads, workdir):
    bench = os.path.join(build, "bench", "remat_checkpoint_bench")
    if not os.path.exists(bench):
        fail(f"{bench} not found: build the project first: scripts/build.sh (or --no-overhead)")
    path = os.path.join(workdir, "checkpoint_bench.json")
    command = [bench, "--skip-stack", "--calls", str(calls), "--rounds", str(rounds), "--threads", str(threads),
               "--json", path]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        fail(f"`{' '.join(command)}` failed (an old build without --skip-stack? rebuild it: "
             f"cd build && make remat_checkpoint_bench):\n{done.stderr.strip()}")
    with open(path) as f:
        j = json.load(f)
    rows = [{"who": "remat::checkpoint", "mode": mode, "direct_us": j[f"tiny_{mode}_direct_us"],
             "checkpoint_us": j[f"tiny_{mode}_checkpoint_us"]} for mode in ("forward", "step")]
    rows += [{"who": "remat::checkpoint, non-reentrant", "mode": mode, "direct_us": j[f"tiny_{mode}_direct_us"],
              "checkpoint_us": j[f"tiny_{mode}_checkpoint_nonreentrant_us"]}
             for mode in ("forward", "step") if f"tiny_{mode}_checkpoint_nonreentrant_us" in j]
    return rows


def measure_overhead(args, workdir):
    log(f"per-call overhead: {args.overhead_rounds} rounds of {args.overhead_calls} calls, remat then PyTorch")
    rows = remat_overhead(args.build, args.overhead_calls, args.overhead_rounds, args.threads, workdir)
    rows += pytorch_overhead(args.overhead_calls, args.overhead_rounds)
    for r in rows:
        r["overhead_us"] = r["checkpoint_us"] - r["direct_us"]
    return sorted(rows, key=lambda r: (r["mode"], not r["who"].startswith("remat::checkpoint"), r["who"]))


# ---------------------------------------------------------------------------------------------
# Output.

def mib(n):
    return f"{n / MIB:.1f}" if n >= 10 * MIB else f"{n / MIB:.3f}"


def pair_table(rows, non_reentrant):
    header = ["policy", "remat peak MiB", "PyTorch peak MiB", "peak remat/PyTorch", "PyTorch - remat KiB",
              "remat step s", "PyTorch step s", "time remat/PyTorch", "per-round ratio: median (IQR)"]
    if non_reentrant:
        header += ["PyTorch non-reentrant step s", "time remat/non-reentrant"]
    header += ["max abs loss diff"]
    body = []
    for row in rows:
        remat, pt = row["remat"], row["pytorch"]
        cells = [row["policy"], mib(remat["activation_peak_bytes"]), mib(pt["activation_peak_bytes"]),
                 f"{pt['peak_ratio_remat_over_this']:.3f}",
                 f"{(pt['activation_peak_bytes'] - remat['activation_peak_bytes']) / 1024:.1f}",
                 f"{remat['median_seconds']:.4g}", f"{pt['median_seconds']:.4g}", f"{pt['time_ratio_remat_over_this']:.3f}",
                 f"{pt['time_ratio_paired_median']:.3f} ({pt['time_ratio_paired_iqr'][0]:.3f}-{pt['time_ratio_paired_iqr'][1]:.3f})"]
        if non_reentrant:
            nr = row.get("pytorch_nonreentrant")
            cells += [f"{nr['median_seconds']:.4g}", f"{nr['time_ratio_remat_over_this']:.3f}"] if nr else ["-", "-"]
        cells.append(f"{max(row[v]['loss_max_abs_diff'] for v in ('pytorch', 'pytorch_nonreentrant') if v in row):.2e}")
        body.append(cells)
    return header, body


def strategy_table(rows, args):
    header = ["strategy", "system", "activation peak MiB", "time / PyTorch eager none: median (IQR)", "loss (round 1)",
              "loss vs eager none (max rel diff)"]
    body = []
    for r in rows:
        if r["key"] == "remat-bench:none":
            continue  # a cross-check, in the JSON
        if r["first_round_loss"] is None:
            loss, versus = "-", "not reported (remat bench)"
        else:
            loss = f"{r['first_round_loss']:.6f}"
            versus = f"{r['loss_max_rel_diff_to_pytorch_none']:.1e}"
            if not r["loss_compared"]:
                versus += " (own dropout masks: not compared)"
        low, high = r["time_ratio_to_pytorch_none_paired_iqr"]
        body.append([r["strategy"], r["system"], mib(r["activation_peak_bytes"]) + ("*" if r["peak_varied"] else ""),
                     f"{r['time_ratio_to_pytorch_none_paired_median']:.3f} ({low:.3f}-{high:.3f})", loss, versus])
    return header, body


def overhead_table(rows):
    header = ["per call, 16 floats (in*w).tanh()", "mode", "direct µs", "checkpoint µs", "overhead µs"]
    body = [[r["who"], "forward" if r["mode"] == "forward" else "forward + backward", f"{r['direct_us']:.1f}",
             f"{r['checkpoint_us']:.1f}", f"{r['overhead_us']:.1f}"] for r in rows]
    return header, body


def text_table(header, body):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(header), "-" * (sum(widths) + 2 * (len(widths) - 1))] + [fmt(c) for c in body])


def markdown_table(header, body, text_columns=1):
    """Text columns left-aligned, the numbers after them right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] * text_columns + ["---:"] * (len(header) - text_columns)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body])


def describe(args):
    return (f"GPT layers {args.layers}, hidden {args.hidden}, heads {args.heads}, sequence {args.seq}, "
            f"batch {args.batch}, dropout {args.dropout}; {args.threads} OpenBLAS threads, 1 LibTorch intra-op "
            f"thread; median of {args.rounds} interleaved rounds after one warm-up; torch {torch.__version__}")


def strategy_notes(comparison, strategy_rows):
    args = comparison.args
    notes = [
        "Activation peak: exact bytes above those held before the forward (parameters, zeroed gradients, batch), "
        "remat's tracking allocator in both processes; * = varied between rounds (the largest shown).",
        "Time: each strategy's step over PyTorch's unchecked eager step (`none`, PyTorch) in the same round; median "
        f"and IQR of the {args.rounds} per-round ratios.",
        "Loss: every strategy against PyTorch's unchecked eager loss of the same round (same weights, batch and "
        f"dropout seed); compared within {args.strategy_loss_tolerance:g} (relative)"
        + (" except where a strategy draws its own dropout masks (SDPA, compiled graphs, remat's fused option)."
           if args.dropout > 0 else "; at dropout 0 no strategy has masks to differ in."),
    ]
    if comparison.budget_plans:
        b = next(iter(comparison.budget_plans.plans.values()))
        notes.append(f"optimal B: remat's planner (`remat plan --budget B`), B a percentage of remat's predicted "
                     f"unchecked activation peak ({mib(b['unchecked_peak_bytes'])} MiB, from `remat profile`), "
                     "run reentrant" + ("; measured by `remat bench` once per round (the worker here takes policy "
                                        "names only), which reports no loss" if not comparison.worker.takes_plans else ""))
    if any(s.compile_budget is not None for s in args.pytorch_specs):
        attention = "SDPA" if args.compile_attention == "sdpa" else "the GPT's own attention ops"
        notes.append(f"compile: torch.compile (inductor, CPU, kernels for vector ISA {args.inductor_vec_isa}; "
                     f"fullgraph, static shapes) of the whole forward, with {attention}, compiled in the warm-up "
                     "round (a recompilation afterwards is an error). "
                     "compile, budget B: the same with torch._functorch.config.activation_memory_budget = B, a "
                     "fraction of the activations the default compiled partition (budget 1) saves above what "
                     "recomputing everything possible saves (0), as the partitioner estimates them: not a fraction "
                     "of any measured peak.")
    for spec in args.pytorch_specs:
        if spec.compile_budget is None:
            notes.append(f"{spec.name}: {spec.note}")
    for s in comparison.strategies.values():
        if s.key.startswith("remat:optimal"):
            notes.append(f"{s.name}: {s.note}")
    return notes


def write_outputs(comparison, pairs, strategy_rows, overhead, failures):
    args = comparison.args
    pair = pair_table(pairs, args.non_reentrant)
    strat = strategy_table(strategy_rows, args)
    notes = strategy_notes(comparison, strategy_rows)
    print(describe(args))
    print(text_table(*pair))
    print()
    print(text_table(*strat))
    for n in notes:
        print("  " + n)
    if overhead:
        print()
        print(text_table(*overhead_table(overhead)))
    if args.markdown:
        command = " ".join(["bench/pytorch_side_by_side.py"] + sys.argv[1:])
        parts = [describe(args) + ".", "", f"`{command}`", "",
                 "remat and PyTorch on the same plan (PyTorch = torch.utils.checkpoint, use_reentrant=True):", "",
                 markdown_table(*pair), "", "Every strategy:", "", markdown_table(*strat, text_columns=2), ""]
        parts += [f"- {n}" for n in notes]
        if overhead:
            parts += ["", f"Median of {args.overhead_rounds} rounds of {args.overhead_calls} calls.", "",
                      markdown_table(*overhead_table(overhead))]
        with open(args.markdown, "w") as f:
            f.write("\n".join(parts) + "\n")
    if args.json:
        config = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "dropout", "seed",
                                                 "threads", "rounds", "policies", "budgets", "non_reentrant",
                                                 "compile_attention", "inductor_vec_isa", "loss_tolerance",
                                                 "strategy_loss_tolerance")}
        config["pytorch_strategies"] = [s.token for s in args.pytorch_specs]
        capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        report = {"config": config, "torch_version": torch.__version__, "features": FEATURES,
                  "aten_cpu_capability": capability,
                  "time_baseline": "PyTorch's unchecked eager step (policy none) of the same round",
                  "notes": notes, "policies": pairs, "strategies": strategy_rows, "plans": comparison.plans,
                  "budget_plans": comparison.budget_plans.plans if comparison.budget_plans else {},
                  "overhead": overhead, "loss_check_failures": failures}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot:
        plot_pareto(args, strategy_rows, args.plot)


# ---------------------------------------------------------------------------------------------
# The plot: activation peak vs paired time ratio, one point per strategy, one marker per system.

def gnuplot_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def place_labels(points, x_range, y_range, plot_px=(1060.0, 600.0)):
    """Per point (x, y, label): a spot for its label overlapping no point and no earlier label.

    Gnuplot places labels where told and strategies cluster, so this tries a few spots around each
    point with the label's box estimated from its length (6 px a character at 9 pt)."""
    px_x, px_y = plot_px[0] / x_range, plot_px[1] / y_range
    taken = [(x * px_x - 6, x * px_x + 6, y * px_y - 6, y * px_y + 6) for x, y, _ in points]
    candidates = [(9, 7, False), (9, -9, False), (-9, 7, True), (-9, -9, True), (9, 20, False), (-9, 20, True),
                  (9, -22, False), (-9, -22, True), (0, 32, False), (0, -34, False)]
    spots = []
    for x, y, label in points:
        cx, cy, width = x * px_x, y * px_y, 6.0 * len(label)
        chosen = None
        for dx, dy, right in candidates:
            ax, ay = cx + dx, cy + dy
            box = (ax - width if right else ax, ax if right else ax + width, ay - 6, ay + 6)
            if all(not (box[0] < t[1] and t[0] < box[1] and box[2] < t[3] and t[2] < box[3]) for t in taken):
                chosen = (box, (ax / px_x, ay / px_y, right))
                break
        if chosen is None:  # crowded everywhere: the first spot
            dx, dy, right = candidates[0]
            chosen = ((cx + dx, cx + dx + width, cy + dy - 6, cy + dy + 6), ((cx + dx) / px_x, (cy + dy) / px_y, False))
        taken.append(chosen[0])
        spots.append(chosen[1])
    return spots


def plot_pareto(args, rows, path):
    rows = [r for r in rows if r["key"] != "remat-bench:none"]
    points = [(r["activation_peak_bytes"] / MIB, r["time_ratio_to_pytorch_none_paired_median"], r["strategy"], r["system"])
              for r in rows]
    x_max = max(p[0] for p in points) * 1.15
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    pad = 0.1 * (y_hi - y_lo + 1e-9)
    y_min, y_max = max(0.0, y_lo - pad), y_hi + 1.5 * pad
    spots = place_labels([(x, y - y_min, label) for x, y, label, _ in points], x_max, y_max - y_min)
    base = os.path.splitext(path)[0]
    systems = {"remat": ("7", "#1f77b4"), "PyTorch": ("9", "#d62728")}  # filled circle, filled triangle
    for system in systems:
        with open(f"{base}-{system.lower()}.dat", "w") as f:
            f.write("# activation_peak_MiB\ttime_ratio_to_pytorch_eager_none\tstrategy\n")
            for x, y, label, sys_ in points:
                if sys_ == system:
                    f.write(f"{x:.6f}\t{y:.6f}\t\"{label}\"\n")
    for system in systems:  # each system's Pareto frontier: no point of its own both smaller and faster
        mine = sorted((x, y) for x, y, _, sys_ in points if sys_ == system)
        with open(f"{base}-{system.lower()}-frontier.dat", "w") as f:
            best = math.inf
            for x, y in mine:
                if y < best:
                    f.write(f"{x:.6f}\t{y:.6f}\n")
                    best = y
    terminal = "pngcairo size 1200,760 font \"DejaVu Sans,11\" noenhanced"
    if "pngcairo" not in subprocess.run(["gnuplot", "-e", "set terminal"], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True).stdout:
        terminal = "png size 1200,760 noenhanced"
    title = (f"GPT {args.layers} layers, hidden {args.hidden}, seq {args.seq}, batch {args.batch}, dropout {args.dropout}: "
             f"remat and PyTorch {torch.__version__}")
    gp = [f"set terminal {terminal}", f"set output {gnuplot_string(path)}", f"set title {gnuplot_string(title)}",
          "set xlabel \"activation peak (MiB): exact bytes above parameters, gradients and batch\"",
          "set ylabel \"step time / PyTorch's unchecked eager step, same round (median)\"",
          "set grid", "set key bottom right box opaque", f"set xrange [0:{x_max:.6f}]", f"set yrange [{y_min:.6f}:{y_max:.6f}]",
          "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dashtype 2 linecolor rgb \"#888888\""]
    for i, ((x, y, label, system), (lx, ly, right)) in enumerate(zip(points, spots), start=1):
        color = systems[system][1]
        gp.append(f"set label {i} {gnuplot_string(label)} at {lx:.6f}, {ly + y_min:.6f} "
                  f"{'right' if right else 'left'} font \",9\" textcolor rgb \"{color}\" front")
    gp.append("plot " + ", ".join(
        f"{gnuplot_string(f'{base}-{system.lower()}.dat')} using 1:2 with points pointtype {pt} pointsize 1.6 "
        f"linecolor rgb \"{color}\" title {gnuplot_string(system)}, "
        f"{gnuplot_string(f'{base}-{system.lower()}-frontier.dat')} using 1:2 with lines dashtype 2 linewidth 1.2 "
        f"linecolor rgb \"{color}\" title {gnuplot_string(system + ': Pareto frontier')}"
        for system, (pt, color) in systems.items()))
    with open(f"{base}.gp", "w") as f:
        f.write("\n".join(gp) + "\n")
    done = subprocess.run(["gnuplot", f"{base}.gp"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        fail(f"gnuplot {base}.gp failed:\n{done.stdout.strip()}")


def main():
    parser, args = parse_args()
    resolve_defaults(parser, args)
    remat = os.path.join(args.build, "tools", "remat")
    if not os.path.exists(remat):
        fail(f"{remat} not found: build the project first: scripts/build.sh")
    tracker = Tracker(os.path.join(args.build, "libremat_memory_tracker.so"))
    torch.set_num_threads(1)
    log(f"torch {torch.__version__}; features: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in FEATURES.items()))
    args.inductor_vec_isa = None
    if any(spec.compile_budget is not None for spec in args.pytorch_specs):
        args.inductor_vec_isa = prepare_inductor_cpu()
        log(f"inductor's CPU vector ISA: {args.inductor_vec_isa}")
    with tempfile.TemporaryDirectory(prefix="remat-side-by-side-") as workdir:
        comparison = Comparison(args, remat, tracker, workdir)
        try:
            compare(comparison)
        finally:
            comparison.close()
        overhead = None if args.no_overhead else measure_overhead(args, workdir)
    pairs = summarize_pairs(comparison)
    strategy_rows = summarize_strategies(comparison)
    failures = loss_failures(pairs, strategy_rows, args)
    write_outputs(comparison, pairs, strategy_rows, overhead, failures)
    if failures:
        log("LOSS CHECK FAILED: losses differ where they must not:\n  " + "\n  ".join(failures))
        sys.exit(1)
    log(f"loss check passed: remat and PyTorch agree within {args.loss_tolerance:g} (relative) for every step of "
        f"the same plan, every compared strategy within {args.strategy_loss_tolerance:g} of PyTorch's unchecked loss")


if __name__ == "__main__":
    main()
