#!/usr/bin/env python3
"""How even can a pipeline split of a profiled model be? For a profile and a stage count, by
trying every contiguous split of the node sequence (forward + backward time per node): the split
with the smallest bottleneck and its spread (max/min - 1 of the stage times), and the split with
the smallest spread. Reads the profile with h5dump (HDF5 tools); exhaustive, so meant for small
models (C(n-1, l-1) splits).
  usage: scripts/split_spread.py PROFILE.h5 [STAGES]"""
import itertools
import re
import subprocess
import sys


def column(path, name):
    text = subprocess.run(["h5dump", "-y", "-w", "0", "-d", "/nodes/" + name, path], check=True,
                          capture_output=True, text=True).stdout
    start = text.index("DATA {") + len("DATA {")
    body = text[start:text.index("}", start)]
    return [v.strip().strip('"') for v in re.split(r",\s*", body.strip()) if v.strip()]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path, stages = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    names = column(path, "name")
    times = [float(f) + float(b) for f, b in zip(column(path, "fwd_ms"), column(path, "bwd_ms"))]
    prefix = list(itertools.accumulate(times, initial=0.0))
    fastest = evenest = None
    for cuts in itertools.combinations(range(1, len(times)), stages - 1):
        bounds = (0,) + cuts + (len(times),)
        t = [prefix[e] - prefix[b] for b, e in zip(bounds, bounds[1:])]
        spread = max(t) / min(t) - 1 if min(t) > 0 else float("inf")
        if fastest is None or (max(t), spread) < (max(fastest[1]), fastest[2]):
            fastest = (cuts, t, spread)
        if evenest is None or spread < evenest[2]:
            evenest = (cuts, t, spread)
    largest = max(range(len(times)), key=times.__getitem__)
    print(f"{len(times)} nodes, {prefix[-1]:.1f} ms per micro-batch; largest node {names[largest]} "
          f"{times[largest]:.1f} ms ({100 * times[largest] / prefix[-1]:.0f}%)")
    for what, (cuts, t, spread) in (("smallest bottleneck", fastest), ("smallest spread", evenest)):
        print(f"{what}: cuts {list(cuts)}, stages {' / '.join(f'{x:.1f}' for x in t)} ms, "
              f"bottleneck {max(t):.1f} ms, spread {100 * spread:.0f}%")


if __name__ == "__main__":
    main()
