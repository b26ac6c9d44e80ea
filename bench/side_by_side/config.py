"""The presets and the default policies, from train/presets.json: the file remat's C++ side
(train/src/presets.cpp) embeds, so `--preset reference` means the same model on both sides."""
import json
import os

from .common import fail

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS_FILE = os.path.join(ROOT, "train", "presets.json")


def read_presets_file(path=PRESETS_FILE):
    """(presets, policies): the runnable presets as this script's flags (layers, hidden, heads, seq,
    batch, dropout, in --help's order), and the default policies, comma-separated."""
    try:
        with open(path) as f:
            data = json.load(f)
        presets = {p["name"]: dict(layers=int(p["layers"]), hidden=int(p["hidden"]), heads=int(p["heads"]),
                                   seq=int(p["sequence"]), batch=int(p["batch"]), dropout=float(p["dropout"]))
                   for p in data["presets"] if p["runnable"]}
        policies = ",".join(str(p) for p in data["side_by_side_policies"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"cannot read the presets from {path}: {type(e).__name__}: {e}")
    if "reference" not in presets or not policies:
        fail(f"{path}: expected a runnable preset 'reference' and a non-empty 'side_by_side_policies'")
    return presets, policies


PRESETS, DEFAULT_POLICIES = read_presets_file()  # DEFAULT_POLICIES: 1.13's, and the start of 2.x's
