#!/usr/bin/python3
"""CDF of per-node activation memory and memory consumption from DawnPiper profiles (the
paper's Figure 4), as a PNG, plus a short Markdown table on stdout.

Activation memory of a node: the bytes of its output (views allocate nothing).
Memory consumption of a node: bytes allocated minus bytes released while its forward runs
(output, internal buffers, minus inputs whose last reader it is and that no backward keeps).

usage: scripts/plot_profile_cdf.py OUT.png PROFILE.h5 [PROFILE.h5 ...]
needs: python3-h5py python3-matplotlib (Debian packages)
"""
import sys

try:
    import h5py
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
except ImportError as e:  # one clear line, not a traceback
    sys.exit(f"plot_profile_cdf: {e}; install with: apt-get install python3-h5py python3-matplotlib")


def csr(group, name):
    values, offsets = group[name][:], group[name + "_offsets"][:]
    return [values[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def per_node(path):
    with h5py.File(path, "r") as f:
        t, n = f["tensors"], f["nodes"]
        kinds = [k.decode() if isinstance(k, bytes) else k for k in n["kind"][:]]
        producer, nbytes = t["producer"][:], t["bytes"][:]
        alias, param_view, internal = t["alias_of"][:], t["param_view"][:], t["internal"][:]
        consumers, saved_by = csr(t, "consumers"), csr(t, "saved_by")
        label = f"{f.attrs['preset']} (B={f.attrs['micro_batch_size']})"
    owns = (alias < 0) & (param_view == 0)

    def owner(i):
        while alias[i] >= 0:
            i = alias[i]
        return i

    refs = np.zeros(len(nbytes), dtype=np.int64)
    for i in range(len(nbytes)):
        refs[owner(i)] += len(consumers[i]) + len(saved_by[i])
    inputs = [[] for _ in kinds]
    for i, cs in enumerate(consumers):
        for c in cs:
            inputs[c].append(i)
    activation, consumed = [], []
    for node, kind in enumerate(kinds):
        if kind == "input":
            continue
        outs = [i for i in range(len(nbytes)) if producer[i] == node]
        out_bytes = sum(int(nbytes[i]) for i in outs if owns[i] and not internal[i])
        delta = sum(int(nbytes[i]) for i in outs if owns[i])
        for i in inputs[node]:
            o = owner(i)
            refs[o] -= 1
            if refs[o] == 0:
                delta -= int(nbytes[o])
        activation.append(out_bytes)
        consumed.append(delta)
    return label, np.array(activation) / 2**20, np.array(consumed) / 2**20


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    print("| profile | nodes | activation p50 / p90 (MiB) | consumption p50 / p90 (MiB) |")
    print("| --- | --- | --- | --- |")
    for path in paths:
        label, act, con = per_node(path)
        for ax, values in zip(axes, (act, con)):
            xs = np.sort(values)
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label)
        print(f"| {label} | {len(act)} | {np.percentile(act, 50):.1f} / {np.percentile(act, 90):.1f} "
              f"| {np.percentile(con, 50):.1f} / {np.percentile(con, 90):.1f} |")
    for ax, title in zip(axes, ("activation memory per node", "memory consumption per node")):
        ax.set_xlabel("MiB")
        ax.set_ylabel("CDF of nodes")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_xscale("symlog", linthresh=1)
    axes[1].set_xscale("symlog", linthresh=1)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
