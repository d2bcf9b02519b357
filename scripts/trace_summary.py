#!/usr/bin/env python3
"""Where a traced step's time goes: a Chrome trace of PyTorch's profiler (`dawnpiper train
--torch-trace FILE`, or torch.profiler's export_chrome_trace) summed up.

  python3 scripts/trace_summary.py TRACE [--steps N] [--top 15]

Prints the traced wall time per step (first to last event), the GPU's busy time (the union of
kernel and copy intervals) and its idle share, kernels by total time, and the CPU operators
called most (casts and copies show there).
"""
import argparse
import collections
import json


def union_length(intervals):
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--steps", type=int, default=2, help="steps the trace holds")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    cpu = [e for e in events if e.get("cat") == "cpu_op"]
    start = min(e["ts"] for e in events)
    end = max(e["ts"] + e["dur"] for e in events)
    wall = (end - start) / 1e3 / args.steps
    busy = union_length([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / 1e3 / args.steps
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for e in gpu:
        k = kernels[(e["cat"], e["name"][:90])]
        k[0] += 1
        k[1] += e["dur"] / 1e3 / args.steps
    print(f"per step: wall {wall:.2f} ms, GPU busy {busy:.2f} ms ({100 * (1 - busy / wall) if wall else 0:.1f}% idle), "
          f"{len(gpu) // args.steps} kernels and copies, {sum(v[1] for v in kernels.values()):.2f} ms summed")
    for (cat, name), (count, ms) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"  {ms:8.3f} ms {count // args.steps:5d}x {cat:10s} {name}")
    ops = collections.Counter()
    op_ms = collections.defaultdict(float)
    for e in cpu:
        ops[e["name"]] += 1
        op_ms[e["name"]] += e["dur"] / 1e3 / args.steps
    print("CPU operators called most (per step: calls, inclusive ms):")
    for name, count in ops.most_common(args.top):
        print(f"  {count // args.steps:6d}x {op_ms[name]:8.2f} ms {name}")


if __name__ == "__main__":
    main()
