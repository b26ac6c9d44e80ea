"""remat and PyTorch side by side on the same GPT: the package behind bench/pytorch_side_by_side.py
(the entry script; what it measures and how: docs/guide-cli.md, "Side by side with PyTorch").

Modules, in the order a run goes through them (the GPT itself is bench/pytorch_gpt.py):

    common        messages, the setup-error exit (2), MiB figures, the re-execution under remat's
                  memory conditions (torch-free: it runs before torch is imported)
    config        the presets and the default policies, from train/presets.json (shared with C++)
    cli           arguments, their version-dependent defaults, main()
    features      the installed torch and what it offers
    plans         remat's plans (`remat plan --json`), executed in PyTorch
    strategies    the rows of the comparison; PyTorch 2.x's strategies; torch.compile's forward
    export        the worker's weights and batch, read as tensors only
    remat_side    `remat worker` and the planner's plans (--budget)
    measurement   the tracking allocator, measured steps, the comparison and its rounds
    overhead      the per-call overhead of a checkpoint on a tiny function
    summary       per-strategy and per-policy summaries, the loss check
    report        text tables, Markdown, JSON
    plot          the gnuplot Pareto plot

Only common and config may be imported before common.reexec_under_remat_conditions(): every other
module imports torch.
"""
