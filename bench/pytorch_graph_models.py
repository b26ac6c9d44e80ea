#!/usr/bin/python3
"""torch.compile's activation memory budget on the two graph-planning examples' models, on CPU:
exact activation peaks and step times beside eager PyTorch, to put beside remat's PlannedStep
figures (docs/results/graph-planning/).

    bench/pytorch_graph_models.py --model unet|encoder-decoder [--budgets 0.7,0.5,0.3[,0.1]]
                                  [--rounds 21] [--warmup 2] [--threads 2] [--settle 0.02]
                                  [--tracker build-forky/libremat_memory_tracker.so]
                                  [--causal-hint off|on|both] [--omp-wait-policy passive|active|inherit]
                                  [--json FILE] [--markdown FILE]

The models are those of examples/unet.cpp and examples/encoder_decoder.cpp, in train mode:

  unet             DoubleConv (conv 3x3 without bias, BatchNorm, ReLU, twice) 3->16, 16->32, bottom
                   32->64, ConvTranspose2d(2, stride 2) up, skips concatenated, DoubleConv 64->32 and
                   32->16, 1x1 conv head to 4 classes; images 4x3x64x64, cross_entropy over 4x64x64 labels
  encoder-decoder  torch.nn.Transformer(d_model 64, nhead 4, 3 + 3 layers, dim_feedforward 256,
                   dropout 0.1); src 48x8x64, tgt 32x8x64, causal target mask, mse_loss to 32x8x64

Rows: eager (unchecked), torch.compile (inductor, fullgraph, no budget), and torch.compile with
torch._functorch.config.activation_memory_budget = B for each B of --budgets. Each row's step is
forward + backward with the gradients allocated (zeroed) beforehand, as remat's examples measure it
(examples/support/planned_training.h): the activation peak is the peak of the bytes allocated minus
the bytes held before the step, counted by remat's tracking allocator installed as LibTorch's CPU
allocator in this process (build it: the target remat_memory_tracker). After --warmup rounds (the
compiles happen there; a recompilation afterwards is an error), --rounds rounds run every row once
each, in an order reversed every other round, with one dropout seed per round; a row's time is
given as its ratio to the eager step of the same round (median, quartiles, min and max over the
rounds), which cancels most of a loaded machine's drift.

nn.Transformer's forward checks whether tgt_mask is causal by comparing its values
(_detect_is_causal_mask), which Dynamo cannot trace without a data-dependent guard: with fullgraph
the compile fails, and without it the graph breaks there and Dynamo runs the Transformer eagerly.
Eager PyTorch finds the mask causal and sets tgt_is_causal itself, so passing tgt_is_causal=True
beside the mask computes the same: --causal-hint both (the default) measures the example's call and
the hinted one, each with its own eager row; times are divided by the example's call's eager step.

The process re-executes itself under remat's memory conditions (glibc keeps freed memory, BLAS on
--threads threads; bench/side_by_side/common.py), with OMP_WAIT_POLICY=passive unless told otherwise:
on 2 cores shared with another job, OpenMP's spinning makes small operators 10-30x slower. Inductor's CPU kernels need g++, Python's headers
and, on Debian, sleef.h (libsleef-dev) to be vectorised (bench/side_by_side/strategies.py). If a
compile fails, its row records the error text and the others are still measured; a fullgraph
failure is retried without fullgraph (graph breaks allowed) and the row says so.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

from side_by_side.common import argv_option, log, reexec_under_remat_conditions  # bench/: the script's own directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 2.0 ** 20


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["unet", "encoder-decoder"], required=True)
    p.add_argument("--budgets", default="0.7,0.5,0.3", help="activation_memory_budget values, comma-separated")
    p.add_argument("--rounds", type=int, default=21, help="measured rounds (default 21)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up rounds, compiles included (default 2)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2, as the examples)")
    p.add_argument("--settle", type=float, default=0.02, help="seconds of sleep before each step (default 0.02)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tracker", default=None,
                   help="remat's libremat_memory_tracker.so (default: build-forky/, then build/)")
    p.add_argument("--causal-hint", choices=["off", "on", "both"], default="both",
                   help="encoder-decoder: pass tgt_is_causal=True beside the causal mask (off: the example's call "
                        "only; on: the hinted call only; both: rows for each, the default)")
    p.add_argument("--omp-wait-policy", default="passive",
                   help="OMP_WAIT_POLICY for this process (default passive; 'inherit': leave the environment's)")
    p.add_argument("--no-fullgraph-retry", action="store_true",
                   help="do not retry a failed fullgraph compile with graph breaks allowed")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args()
    try:
        args.budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    except ValueError:
        p.error(f"--budgets: not numbers: {args.budgets}")
    if any(not 0.0 <= b <= 1.0 for b in args.budgets):
        p.error("--budgets: each budget must be in [0, 1]")
    if args.rounds < 1 or args.warmup < 1:
        p.error("--rounds and --warmup must be at least 1")
    return args


def find_tracker(path):
    if path:
        return path
    for build in ("build-forky", "build"):
        candidate = os.path.join(ROOT, build, "libremat_memory_tracker.so")
        if os.path.exists(candidate):
            return candidate
    return os.path.join(ROOT, "build-forky", "libremat_memory_tracker.so")


# --- the models: examples/unet.cpp and examples/encoder_decoder.cpp, in Python --------------------

def build_unet(torch):
    nn, F = torch.nn, torch.nn.functional

    class DoubleConv(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)

        def forward(self, x):
            return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc1 = DoubleConv(3, 16)
            self.enc2 = DoubleConv(16, 32)
            self.bottom = DoubleConv(32, 64)
            self.up2 = nn.ConvTranspose2d(64, 32, 2, stride=2)
            self.dec2 = DoubleConv(64, 32)
            self.up1 = nn.ConvTranspose2d(32, 16, 2, stride=2)
            self.dec1 = DoubleConv(32, 16)
            self.head = nn.Conv2d(16, 4, 1)

        def forward(self, x):
            e1 = self.enc1(x)
            e2 = self.enc2(F.max_pool2d(e1, 2))
            b = self.bottom(F.max_pool2d(e2, 2))
            d2 = self.dec2(torch.cat([self.up2(b), e2], 1))  # skip from the second level
            d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))  # and from the first
            return self.head(d1)

    torch.manual_seed(0)
    model = UNet()
    images = torch.randn(4, 3, 64, 64)
    labels = torch.randint(4, (4, 64, 64))

    def loss_of(net, images, labels):
        return F.cross_entropy(net(images), labels)
    return model, (images, labels), loss_of


def build_encoder_decoder(torch):
    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    # LibTorch's TransformerOptions(64, 4).num_encoder_layers(3).num_decoder_layers(3).dim_feedforward(256):
    # dropout 0.1, ReLU, post-norm, (length, batch, d_model), as Python's defaults.
    model = nn.Transformer(d_model=64, nhead=4, num_encoder_layers=3, num_decoder_layers=3, dim_feedforward=256,
                           dropout=0.1)
    src = torch.randn(48, 8, 64)
    tgt = torch.randn(32, 8, 64)
    target = torch.randn(32, 8, 64)
    causal = nn.Transformer.generate_square_subsequent_mask(32)

    def loss_of(net, src, tgt, causal, target):
        return F.mse_loss(net(src, tgt, tgt_mask=causal), target)

    # The same computation: eager PyTorch detects that tgt_mask is causal and sets tgt_is_causal
    # itself (_detect_is_causal_mask), by comparing the mask's values, which Dynamo cannot trace
    # without a data-dependent guard; the hint skips the comparison.
    def loss_of_hinted(net, src, tgt, causal, target):
        return F.mse_loss(net(src, tgt, tgt_mask=causal, tgt_is_causal=True), target)
    return model, (src, tgt, causal, target), loss_of, loss_of_hinted


# --- the rows -----------------------------------------------------------------------------------

# The compiled function's outer frame, compiled from source once per row: Dynamo keeps compiled
# code on the code object of the frame it compiles and does not guard on functorch's config, so
# two torch.compile wrappers of one function would both run whichever budget compiled first
# (bench/side_by_side/strategies.py, compiled_forward).
COMPILED_SOURCE = "def compiled_forward_loss(*inputs):\n    return forward_loss(*inputs)\n"


class Row:
    def __init__(self, key, name, budget=None):
        self.key, self.name, self.budget = key, name, budget  # budget None: eager; 1.0: compile, no budget
        self.run = None
        self.error = None
        self.fullgraph = None
        self.compile_seconds = None
        self.graph_note = ""
        self.loss_of = None
        self.steps = []  # measured: {seconds, peak, loss, ratio}


def make_eager(model, loss_of):
    return lambda *inputs: loss_of(model, *inputs)


def make_compiled(torch, model, loss_of, budget, label, fullgraph):
    import torch._functorch.config as functorch_config

    def forward_loss(*inputs):
        return loss_of(model, *inputs)

    namespace = {"forward_loss": forward_loss}
    exec(compile(COMPILED_SOURCE, f"<{label}>", "exec"), namespace)  # noqa: S102 - our own constant source
    compiled = torch.compile(namespace["compiled_forward_loss"], backend="inductor", fullgraph=fullgraph, dynamic=False)
    if budget is None:
        return compiled

    def run(*inputs):
        # The partitioner reads the budget when the first call compiles; every call sets it.
        with functorch_config.patch(activation_memory_budget=budget):
            return compiled(*inputs)
    return run


def step(torch, model, run, inputs, seed, tracker):
    model.zero_grad(set_to_none=False)
    torch.manual_seed(seed)
    before = tracker.current()
    tracker.reset_peak()
    start = time.perf_counter()
    loss = run(*inputs)
    loss.backward()
    seconds = time.perf_counter() - start
    peak = tracker.peak() - before
    return {"seconds": seconds, "peak": peak, "loss": loss.item()}


def first_lines(e, n=6):
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return f"{type(e).__name__}: " + "\n".join(lines[:n]) + (" ..." if len(lines) > n else "")


def dynamo_summary(counters):
    """What Dynamo made of a row's first call: graphs compiled, graph breaks and their first lines."""
    graphs = counters["stats"].get("unique_graphs", 0)
    breaks = counters["graph_break"]
    text = f"Dynamo: {graphs} graph(s) compiled, {sum(breaks.values())} graph break(s)"
    if breaks:
        text += " (" + "; ".join(sorted({k.strip().splitlines()[0] for k in breaks})) + ")"
    return text


def quantiles(values):
    v = sorted(values)
    if len(v) < 2:
        return v[0], v[0]
    q = statistics.quantiles(v, n=4, method="inclusive")
    return q[0], q[2]


def summarise(row, eager_peak):
    if not row.steps:
        return {"key": row.key, "name": row.name, "budget": row.budget, "error": row.error}
    peaks = [s["peak"] for s in row.steps]
    seconds = [s["seconds"] for s in row.steps]
    ratios = [s["ratio"] for s in row.steps]
    q1, q3 = quantiles(ratios)
    peak = statistics.median(peaks)
    return {
        "key": row.key, "name": row.name, "budget": row.budget, "error": row.error, "fullgraph": row.fullgraph,
        "graph_note": row.graph_note, "compile_seconds": row.compile_seconds,
        "activation_peak_bytes": int(peak), "activation_peak_bytes_min": min(peaks), "activation_peak_bytes_max": max(peaks),
        "activation_peak_mib": peak / MIB, "peak_fraction_of_eager": peak / eager_peak if eager_peak else None,
        "median_seconds": statistics.median(seconds), "min_seconds": min(seconds), "max_seconds": max(seconds),
        "time_ratio_median": statistics.median(ratios), "time_ratio_q1": q1, "time_ratio_q3": q3,
        "time_ratio_min": min(ratios), "time_ratio_max": max(ratios),
        "loss_round_1": row.steps[0]["loss"], "steps": row.steps,
    }


def add_loss_diffs(report):
    """Each row's largest |loss - the baseline eager loss| over the rounds (same dropout seed): 0 or
    float rounding where the row ran the eager computation, dropout masks of its own otherwise."""
    base = next(r for r in report["rows"] if r["name"] == report["baseline"])
    by_seed = {s["seed"]: s["loss"] for s in base.get("steps", [])}
    for r in report["rows"]:
        diffs = [abs(s["loss"] - by_seed[s["seed"]]) for s in r.get("steps", []) if s["seed"] in by_seed]
        r["loss_max_abs_diff_vs_baseline"] = max(diffs) if diffs else None


def markdown(report):
    lines = [f"# torch.compile activation memory budget: {report['model']}", ""]
    lines.append(f"PyTorch {report['torch']}, CPU, {report['threads']} threads, inductor vector ISA "
                 f"{report['inductor_vec_isa']}; {report['rounds']} measured rounds after {report['warmup']} "
                 f"warm-up rounds; {report['machine']}. Command: `{report['command']}`")
    lines.append("")
    lines.append(f"Model: {report['model_description']}")
    lines.append("")
    lines.append(f"OMP_WAIT_POLICY={report['omp_wait_policy']}. Time ratios are to the row '{report['baseline']}' "
                 "of the same round.")
    lines.append("")
    e = report["eager_peak_bytes"]
    lines.append(f"Eager unchecked activation peak: **{e / MIB:.2f} MiB** ({e} bytes); remat's budgets at "
                 + ", ".join(f"{k} of it: {v / MIB:.2f} MiB" for k, v in report["remat_budgets_bytes"].items()) + ".")
    lines.append("")
    lines.append("| row | activation peak MiB | peak / eager | step s (median) | time / eager, same round: median (IQR; min-max) "
                 "| max abs loss diff vs eager | first step s | note |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        if r.get("activation_peak_bytes") is None:
            lines.append(f"| {r['name']} | failed | | | | | | {(r['error'] or '').splitlines()[0] if r['error'] else ''} |")
            continue
        peak = f"{r['activation_peak_mib']:.2f}"
        if r["activation_peak_bytes_min"] != r["activation_peak_bytes_max"]:
            peak += f" ({r['activation_peak_bytes_min'] / MIB:.2f}-{r['activation_peak_bytes_max'] / MIB:.2f})"
        note = r["graph_note"] or ""
        if r["error"]:
            note = (note + "; " if note else "") + r["error"].splitlines()[0]
        comp = "" if r["compile_seconds"] is None else f"{r['compile_seconds']:.0f}"
        diff = r.get("loss_max_abs_diff_vs_baseline")
        diff = "" if diff is None else f"{diff:.2e}"
        lines.append(f"| {r['name']} | {peak} | {r['peak_fraction_of_eager']:.3f} | {r['median_seconds']:.4f} | "
                     f"{r['time_ratio_median']:.3f} ({r['time_ratio_q1']:.3f}-{r['time_ratio_q3']:.3f}; "
                     f"{r['time_ratio_min']:.3f}-{r['time_ratio_max']:.3f}) | {diff} | {comp} | {note.replace('|', '/')} |")
    lines.append("")
    lines.append("Activation peak: bytes allocated above those held before the step, over forward and backward, "
                 "gradients allocated beforehand (remat's tracking allocator; as examples/support/planned_training.h). "
                 "Time: forward + backward; each round runs every row once (order reversed every other round), and "
                 "each row's time is divided by the baseline eager step's of the same round (a loaded machine: "
                 "see the spread). Loss diff: largest |loss - baseline eager loss| over the rounds, same dropout seed "
                 "(float rounding: the row ran eager's computation, dropout masks included; larger: inductor drew "
                 "its own masks). First step s: the first warm-up step's wall time, compiling included (inductor's "
                 "on-disk caches from earlier runs in the same place shorten it).")
    errors = [r for r in report["rows"] if r.get("error")]
    if errors:
        lines.append("")
        lines.append("Errors:")
        for r in errors:
            lines.append("")
            lines.append(f"- {r['name']}:")
            lines.append("")
            lines.append("  ```text")
            lines.extend("  " + l for l in r["error"].splitlines())
            lines.append("  ```")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters
    from side_by_side.measurement import Tracker
    from side_by_side.strategies import prepare_inductor_cpu

    torch.set_num_threads(args.threads)
    tracker = Tracker(find_tracker(args.tracker))
    isa = prepare_inductor_cpu()
    log(f"torch {torch.__version__}, {torch.get_num_threads()} threads, inductor vector ISA {isa}")

    if args.model == "unet":
        model, inputs, loss_of = build_unet(torch)
        variants = [("", loss_of)]
        description = ("examples/unet.cpp's U-Net: DoubleConv(conv3x3 no bias, BN, ReLU)x2 3->16->32, bottom 64, "
                       "ConvTranspose2d up, skips concatenated, 1x1 head to 4 classes; images 4x3x64x64, cross_entropy; train mode")
    else:
        model, inputs, loss_of, loss_of_hinted = build_encoder_decoder(torch)
        variants = {"off": [("", loss_of)], "on": [(" [tgt_is_causal=True]", loss_of_hinted)],
                    "both": [("", loss_of), (" [tgt_is_causal=True]", loss_of_hinted)]}[args.causal_hint]
        description = ("examples/encoder_decoder.cpp's torch.nn.Transformer(d_model 64, nhead 4, 3+3 layers, "
                       "dim_feedforward 256, dropout 0.1); src 48x8x64, tgt 32x8x64, causal mask, mse_loss; train mode")
    model.train()
    for p in model.parameters():  # gradients exist (zeroed) before every measured step, as in remat's examples
        p.grad = torch.zeros_like(p)

    rows = []
    for suffix, loss in variants:
        eager = Row("eager" + suffix, "eager, unchecked" + suffix)
        eager.run, eager.loss_of = make_eager(model, loss), loss
        rows.append(eager)
        rows.append(Row("compile" + suffix, "torch.compile, no budget" + suffix, budget=None))
        for b in args.budgets:
            rows.append(Row(f"compile:{b:g}" + suffix, f"torch.compile, budget {b:g}" + suffix, budget=b))
        for r in rows:
            if r.key != eager.key and r.run is None and r.fullgraph is None:
                r.loss_of, r.fullgraph = loss, True
                r.run = make_compiled(torch, model, loss, r.budget, f"compiled {r.key}", True)
    base = rows[0]  # the example's own call, eager: every row's time is divided by its

    def run_round(index, warm):
        seed = args.seed + 1000 + index + (0 if warm else args.warmup)
        order = rows if index % 2 == 0 else rows[::-1]
        results = {}
        for r in order:
            if r.run is None:
                continue
            time.sleep(args.settle)
            wall = time.perf_counter()
            if warm and index == 0:
                counters.clear()
            try:
                s = step(torch, model, r.run, inputs, seed, tracker)
            except Exception as e:  # noqa: BLE001 - inductor's failures have many types; the row records them
                if not warm:
                    raise
                text = first_lines(e, 12)
                log(f"  {r.name}: failed: {text.splitlines()[0]}")
                if r.fullgraph and not args.no_fullgraph_retry:
                    r.error = f"fullgraph=True failed: {text}"
                    r.fullgraph = False
                    r.graph_note = "fullgraph failed; compiled with graph breaks allowed"
                    r.run = make_compiled(torch, model, r.loss_of, r.budget, f"compiled {r.key} (breaks)", False)
                    try:
                        s = step(torch, model, r.run, inputs, seed, tracker)
                    except Exception as e2:  # noqa: BLE001
                        r.error += f"\nwithout fullgraph: {first_lines(e2, 12)}"
                        r.run = None
                        continue
                else:
                    r.error = text
                    r.run = None
                    continue
            wall = time.perf_counter() - wall
            if warm and index == 0 and r.fullgraph is not None:
                r.compile_seconds = wall
                r.graph_note = "; ".join(filter(None, [r.graph_note, dynamo_summary(counters)]))
                log(f"  {r.name}: {r.graph_note}")
            results[r.key] = s
            log(f"  {r.name:28s} {s['seconds']:.4f} s  {s['peak'] / MIB:8.3f} MiB  loss {s['loss']:.6f}"
                + (f"  (took {wall:.1f} s)" if warm and index == 0 else ""))
        if not warm and base.key in results:
            for r in rows:
                if r.key in results:
                    s = dict(results[r.key], seed=seed, ratio=results[r.key]["seconds"] / results[base.key]["seconds"])
                    r.steps.append(s)

    for i in range(args.warmup):
        log(f"warm-up round {i + 1}/{args.warmup}")
        run_round(i, True)
    torch._dynamo.config.error_on_recompile = True  # a recompilation now would be timed as a step
    started = time.perf_counter()
    for i in range(args.rounds):
        log(f"round {i + 1}/{args.rounds}")
        run_round(i, False)
        if i == 0:
            log(f"  (a round {time.perf_counter() - started:.1f} s: about "
                f"{(time.perf_counter() - started) * (args.rounds - 1) / 60:.1f} min to go)")

    eager_peak = statistics.median(s["peak"] for s in base.steps)
    report = {
        "model": args.model, "model_description": description, "torch": torch.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(), "inductor_vec_isa": isa,
        "rounds": args.rounds, "warmup": args.warmup, "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join(["bench/pytorch_graph_models.py"] + sys.argv[1:]),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "baseline": base.name,
        "eager_peak_bytes": int(eager_peak),
        "remat_budgets_bytes": {f"{p}%": int(eager_peak * p / 100) for p in (30, 50, 60, 70)},
        "rows": [summarise(r, eager_peak) for r in rows],
    }
    add_loss_diffs(report)
    print(markdown(report))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")


def set_omp_wait_policy():
    """OMP_WAIT_POLICY from --omp-wait-policy, before torch (and libgomp) is loaded: on 2 shared cores
    with another job running, OpenMP's spinning threads make each parallel region wait for a time
    slice, many small operators (the Transformer's) 10-30x slower (docs/results.md)."""
    policy = argv_option("--omp-wait-policy", "passive")
    if policy != "inherit":
        os.environ["OMP_WAIT_POLICY"] = policy


if __name__ == "__main__":
    set_omp_wait_policy()
    reexec_under_remat_conditions()  # before torch is imported
    main()
