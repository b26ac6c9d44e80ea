"""remat's side: `remat worker` (measured steps on request) and remat's planner at each --budget
(`remat profile`, `remat plan`, and `remat bench` where the worker takes policy names only)."""
import json
import os
import subprocess

from .common import fail, log, mib
from .plans import remat_model_flags, run_remat


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
