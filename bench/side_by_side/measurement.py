"""Measurement: remat's tracking allocator in this process, PyTorch's measured step, the comparison
of every strategy, and the interleaved rounds."""
import ctypes
import os
import time

import torch

from pytorch_gpt import GPT  # bench/, the entry script's directory
from .common import fail, log, mib
from .export import load_export
from .plans import (checkpoints_anything, compact, get_plan, get_plans, remat_only_options, run_items,
                    stage_functions, without_options)
from .remat_side import BudgetPlans, Worker
from .strategies import Strategy, compiled_forward


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
