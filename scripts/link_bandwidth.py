#!/usr/bin/env python3
"""Host<->device copy bandwidth of one GPU, as a swapping stage uses the link: pinned host
buffers, copies on side streams, device-to-host, host-to-device, and both at once (each
direction on its own stream).

  python3 scripts/link_bandwidth.py [--sizes-mib 1,4,16,64,256] [--repeats 5]

Prints one line per size and direction, `link <dir> <MiB> MiB <GB/s> GB/s` (GB: 1e9 bytes; the
best of --repeats rounds), the gpu-check report's rows.
"""
import argparse

import torch


def timed(device, copies, repeats):
    """The best time in seconds of `copies` (a function issuing work on its streams), of `repeats`."""
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        copies()
        torch.cuda.synchronize(device)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="1,4,16,64,256")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device("cuda")
    d2h_stream, h2d_stream = torch.cuda.Stream(device), torch.cuda.Stream(device)
    print(f"device {torch.cuda.get_device_name(device)}")
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        n = mib << 20
        dev_out = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
        dev_in = torch.empty(n, dtype=torch.uint8, device=device)
        host_out = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host_in = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(2)

        def d2h():
            with torch.cuda.stream(d2h_stream):
                host_out.copy_(dev_out, non_blocking=True)

        def h2d():
            with torch.cuda.stream(h2d_stream):
                dev_in.copy_(host_in, non_blocking=True)

        def both():
            d2h()
            h2d()

        timed(device, both, 1)  # warm-up
        for name, fn, moved in (("d2h", d2h, n), ("h2d", h2d, n), ("both", both, 2 * n)):
            seconds = timed(device, fn, args.repeats)
            print(f"link {name} {mib} MiB {moved / seconds / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
