#!/usr/bin/python3
"""Plots a training run's metrics (`dawnpiper train --metrics-out run.jsonl`): the training and
validation loss, the learning rate and the gradient norm against the step, as one PNG.

usage: scripts/plot_metrics.py RUN.jsonl [--out FILE.png] [--smooth K]
writes FILE.png (default: RUN.png). A step logged twice (a run resumed from a checkpoint before
it) is drawn once, as trained last.
needs: python3-matplotlib (Debian package)
"""
import argparse
import json
import math
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # one clear line, not a traceback
    sys.exit(f"plot_metrics: {e}; install with: apt-get install python3-matplotlib")


def fail(message):
    """One line on stderr, exit 2 (a user's mistake)."""
    print(f"plot_metrics: {message}", file=sys.stderr)
    sys.exit(2)


def read_metrics(path):
    """The last training and validation record of every step, in step order."""
    train, validation = {}, {}
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    kind, step = record["kind"], int(record["step"])
                except (ValueError, KeyError, TypeError):
                    fail(f"{path} line {number} is not a --metrics-out record")
                (train if kind == "train" else validation)[step] = record
    except OSError as e:
        fail(f"{e.strerror}: {path}")
    if not train:
        fail(f"{path} has no training step")
    return [train[s] for s in sorted(train)], [validation[s] for s in sorted(validation)]


def smoothed(values, k):
    """Running mean over the last k values."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / min(i + 1, k))
    return out


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("metrics")
    parser.add_argument("--out")
    parser.add_argument("--smooth", type=int, default=1, help="running mean of the training loss over K steps")
    args = parser.parse_args(argv)
    if args.smooth < 1:
        fail("--smooth must be at least 1")
    train, validation = read_metrics(args.metrics)
    out = args.out or os.path.splitext(args.metrics)[0] + ".png"
    steps = [r["step"] for r in train]
    norms = [(r["step"], r["grad_norm"]) for r in train if r.get("grad_norm") is not None]
    panels = 3 if norms else 2
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels), sharex=True)
    loss = [r["loss"] for r in train]
    axes[0].plot(steps, smoothed(loss, args.smooth), label="train" + (f" (mean of {args.smooth})" if args.smooth > 1 else ""))
    if validation:
        axes[0].plot([r["step"] for r in validation], [r["loss"] for r in validation], "o-", label="validation")
    axes[0].set_ylabel("loss")
    axes[0].legend()
    axes[1].plot(steps, [r["lr"] for r in train], color="tab:green")
    axes[1].set_ylabel("learning rate")
    if norms:
        axes[2].plot([s for s, _ in norms], [n for _, n in norms], color="tab:red")
        axes[2].set_ylabel("gradient norm")
        if min(n for _, n in norms) > 0 and max(n for _, n in norms) / min(n for _, n in norms) > 100:
            axes[2].set_yscale("log")
    axes[-1].set_xlabel("step")
    rate = [r["tokens_per_s"] if "tokens_per_s" in r else r["samples_per_s"] for r in train[1:]]
    unit = "tokens/s" if "tokens_per_s" in train[-1] else "samples/s"
    title = os.path.basename(args.metrics) + f": {len(train)} steps, final loss {loss[-1]:.4g}"
    if rate and all(math.isfinite(x) for x in rate):
        title += f", median {sorted(rate)[len(rate) // 2]:.4g} {unit}"
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
