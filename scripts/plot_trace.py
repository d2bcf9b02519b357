#!/usr/bin/python3
"""Plots a DawnPiper trace (docs/trace-format.md): a pipeline timeline (Gantt chart) and the
per-stage memory over time as PNGs, and optionally Chrome / Perfetto trace-event JSON.

usage: scripts/plot_trace.py TRACE.h5 [--out-prefix PREFIX] [--chrome-json FILE]
writes PREFIX-timeline.png and PREFIX-memory.png (PREFIX defaults to TRACE without .h5)
needs: python3-h5py python3-matplotlib python3-numpy (Debian packages)
"""
import argparse
import json
import os
import sys

try:
    import h5py
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    import numpy as np
except ImportError as e:  # one clear line, not a traceback
    sys.exit(f"plot_trace: {e}; install with: apt-get install python3-h5py python3-matplotlib python3-numpy")

MIB = 1024.0 * 1024.0
COMPUTE_KINDS = ("F", "B", "U", "RECOMPUTE", "SWAP_OUT", "SWAP_IN")
COLOURS = {"F": "#1f77b4", "B": "#d62728", "U": "#2ca02c", "RECOMPUTE": "#9467bd",
           "SWAP_OUT": "#8c564b", "SWAP_IN": "#e377c2",
           "SEND_F": "#9ecae1", "RECV_F": "#c6dbef", "SEND_B": "#fc9272", "RECV_B": "#fcbba1"}
ACTION_COLUMNS = ("stage", "kind", "micro_batch", "step", "start_s", "end_s",
                  "bytes_sent", "bytes_received", "live_bytes", "peak_bytes")


def text(value):
    """Variable-length UTF-8 strings may come back from h5py as bytes."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8")
    return str(value)


def load(path):
    if not os.path.exists(path):
        raise ValueError(f"no such file: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"'{path}' is not a file")
    if not h5py.is_hdf5(path):
        raise ValueError(f"'{path}' is not an HDF5 file")
    with h5py.File(path, "r") as f:
        fmt = text(f.attrs["format"]) if "format" in f.attrs else None
        if fmt != "dawnpiper-trace":
            raise ValueError(f"'{path}' is not a DawnPiper trace (format attribute {fmt!r})")
        version = f.attrs.get("schema_version")
        if version is None or version not in (1, 2):
            raise ValueError(f"'{path}' has trace schema version {version}; this script reads versions 1 and 2")
        meta = {k: (text(v) if isinstance(v, (str, bytes, np.bytes_)) else v.item() if hasattr(v, "item") else v)
                for k, v in f.attrs.items()}
        try:
            group = f["actions"]
            actions = {name: group[name][:] for name in ACTION_COLUMNS}
            stages = {name: f["stages"][name][:] for name in ("stage", "predicted_peak_bytes")}
        except KeyError as e:
            raise ValueError(f"'{path}' lacks a group or column the trace format requires ({e})")
    actions["kind"] = np.array([text(k) for k in actions["kind"]], dtype=object)
    return meta, actions, stages


def stage_count(meta, actions):
    seen = int(actions["stage"].max()) + 1 if len(actions["stage"]) else 0
    return max(int(meta.get("stages", 0)), seen, 1)


def action_name(kind, micro_batch):
    return kind if micro_batch < 0 else f"{kind}{micro_batch}"


def plot_timeline(meta, actions, out_path):
    n_stages = stage_count(meta, actions)
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.7 * n_stages))
    start, end = actions["start_s"], actions["end_s"]
    span = max(float(end.max()) if len(end) else 0.0, 1e-9)
    kinds_seen = list(dict.fromkeys(actions["kind"]))  # in order of first appearance
    outline = len(start) <= 300 * n_stages  # bar outlines only while bars are wide enough to see
    for kind in kinds_seen:  # one bar collection per (stage, kind): fast for long runs
        compute = kind in COMPUTE_KINDS
        height = 0.8 if compute else 0.3
        for stage in np.unique(actions["stage"]):
            rows = np.flatnonzero((actions["kind"] == kind) & (actions["stage"] == stage))
            if not len(rows):
                continue
            y = stage - height / 2 if compute else stage + 0.4 - height  # transfers: thin strip at the bottom
            ax.broken_barh(list(zip(start[rows], end[rows] - start[rows])), (y, height),
                           facecolors=COLOURS.get(kind, "#7f7f7f"), linewidth=0.3, alpha=1.0 if compute else 0.8,
                           edgecolor="black" if compute and outline else "none")
    for i in np.flatnonzero(np.isin(actions["kind"], ["F", "B"])):
        label = str(int(actions["micro_batch"][i]))
        if (end[i] - start[i]) / span > 0.009 * len(label):  # only where the label fits
            ax.text((start[i] + end[i]) / 2, int(actions["stage"][i]), label, ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_ylim(n_stages - 0.5, -0.5)  # stage 0 on top
    ax.set_yticks(range(n_stages))
    ax.set_yticklabels([f"stage {s}" for s in range(n_stages)])
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("time (s)")
    ax.set_title(f"{meta.get('preset', '?')}  schedule {meta.get('schedule', '?')}  "
                 f"{n_stages} stages  {meta.get('micro_batches', '?')} micro-batches per step")
    order = [k for k in COLOURS if k in kinds_seen] + [k for k in kinds_seen if k not in COLOURS]
    ax.legend(handles=[Patch(facecolor=COLOURS.get(k, "#7f7f7f"), label=k) for k in order],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def plot_memory(meta, actions, stages, out_path):
    n_stages = stage_count(meta, actions)
    fig, axes = plt.subplots(n_stages, 1, figsize=(12, 1.0 + 1.8 * n_stages), sharex=True, sharey=True,
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    predicted = dict(zip(stages["stage"].tolist(), stages["predicted_peak_bytes"].tolist()))
    for s, ax in enumerate(axes[:, 0]):
        colour = colours[s % len(colours)]
        rows = np.flatnonzero(actions["stage"] == s)
        rows = rows[np.argsort(actions["end_s"][rows], kind="stable")]
        t = actions["end_s"][rows]
        ax.step(t, actions["live_bytes"][rows] / MIB, where="post", color=colour, label="live at action end")
        ax.plot(t, actions["peak_bytes"][rows] / MIB, linestyle="none", marker="v", markersize=3,
                color="black", alpha=0.5, label="peak during action")
        if predicted.get(s, 0) > 0:
            ax.axhline(predicted[s] / MIB, color=colour, linestyle="--", linewidth=1, label="predicted peak")
        ax.set_ylabel(f"stage {s}\nMiB")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)
    highest = max([1.0] + list(actions["peak_bytes"]) + list(actions["live_bytes"]) + list(predicted.values()))
    axes[0, 0].set_ylim(0, highest / MIB * 1.08)  # shared by all stages
    axes[-1, 0].set_xlabel("time (s)")
    axes[-1, 0].set_xlim(left=0)
    axes[0, 0].set_title(f"device memory per stage: {meta.get('preset', '?')}  schedule {meta.get('schedule', '?')}")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def chrome_events(meta, actions):
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
               "args": {"name": f"DawnPiper {meta.get('preset', '')} {meta.get('schedule', '')}".strip()}}]
    for s in range(stage_count(meta, actions)):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": s, "args": {"name": f"stage {s}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": s, "args": {"sort_index": s}})
    for i in range(len(actions["kind"])):
        kind, stage = actions["kind"][i], int(actions["stage"][i])
        start, end = float(actions["start_s"][i]), float(actions["end_s"][i])
        live = int(actions["live_bytes"][i])
        events.append({"ph": "X", "pid": 0, "tid": stage, "cat": kind,
                       "name": action_name(kind, int(actions["micro_batch"][i])),
                       "ts": start * 1e6, "dur": max(end - start, 0.0) * 1e6,
                       "args": {"step": int(actions["step"][i]),
                                "bytes_sent": int(actions["bytes_sent"][i]),
                                "bytes_received": int(actions["bytes_received"][i]),
                                "live_bytes": live, "peak_bytes": int(actions["peak_bytes"][i])}})
        events.append({"ph": "C", "pid": 0, "tid": stage, "name": f"memory stage {stage}",
                       "ts": end * 1e6, "args": {"MiB": live / MIB}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main():
    parser = argparse.ArgumentParser(description="Plot a DawnPiper trace (timeline, memory, Chrome JSON).")
    parser.add_argument("trace", help="trace file written by dawnpiper train --trace")
    parser.add_argument("--out-prefix", help="output prefix (default: the trace path without .h5)")
    parser.add_argument("--chrome-json", metavar="FILE", help="also write Chrome / Perfetto trace-event JSON")
    args = parser.parse_args()
    try:
        meta, actions, stages = load(args.trace)
    except (ValueError, OSError) as e:
        sys.exit(f"plot_trace: {e}")
    prefix = args.out_prefix or (args.trace[:-3] if args.trace.endswith(".h5") else args.trace)
    try:
        plot_timeline(meta, actions, f"{prefix}-timeline.png")
        plot_memory(meta, actions, stages, f"{prefix}-memory.png")
        print(f"wrote {prefix}-timeline.png and {prefix}-memory.png")
        if args.chrome_json:
            with open(args.chrome_json, "w") as out:
                json.dump(chrome_events(meta, actions), out)
            print(f"wrote {args.chrome_json}")
    except OSError as e:
        sys.exit(f"plot_trace: {e}")


if __name__ == "__main__":
    main()
