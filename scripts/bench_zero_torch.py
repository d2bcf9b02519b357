#!/usr/bin/env python3
"""The torch side of scripts/bench_zero_torch.sh: a Hugging Face GPT-2 trained data-parallel on N
CPU ranks (gloo, one intra-op thread each) with AdamW, as DawnPiper's `--stages 1 --data-parallel
N --zero-stage Z` trains it:

- ddp: DistributedDataParallel (every rank keeps the whole optimizer state; ZeRO level 0);
- ddp-zero: DistributedDataParallel with ZeroRedundancyOptimizer (the optimizer state split over
  the ranks; ZeRO level 1);
- fsdp2: fully_shard (FSDP2) per block and on the whole model, parameters resharded after the
  forward (ZeRO level 3);
- fsdp2-keep: the same, parameters kept gathered between the forward and the backward (ZeRO
  level 2's memory: gradients and optimizer state split, parameters whole during the step).

Each rank takes its own micro-batches (the same tokens on every run), accumulates the gradients of
`--micro-batches` of them (the synchronization on the last only) and steps. Prints one line:
`torch <mode> x<ranks> samples/s <after the first step> rss_mib <max over ranks>`, or
`torch <mode> x<ranks> failed: <the error's first line>` where torch cannot run the mode here.
  usage: bench_zero_torch.py --config k=v,... --ranks N --mode ddp|ddp-zero|fsdp2|fsdp2-keep
                             --micro-batch-size B --micro-batches M --seq-len S --steps K
"""
import argparse
import contextlib
import os
import resource
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_peer import build_model, spawn_ranks  # noqa: E402  (the pipelines' benchmark's GPT-2)


def wrap(model, mode):
    """The model as the mode trains it, and its optimizer."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    adamw = dict(lr=1e-3, weight_decay=0.01)
    if mode == "ddp":
        ddp = DistributedDataParallel(model)
        return ddp, torch.optim.AdamW(ddp.parameters(), **adamw)
    if mode == "ddp-zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        ddp = DistributedDataParallel(model)
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    reshard = mode == "fsdp2"
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model, torch.optim.AdamW(model.parameters(), **adamw)


def rank_main(rank, args, port, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    try:
        base = build_model(args.config)
        vocab = base.config.vocab_size
        model, opt = wrap(base, args.mode)
        gen = torch.Generator().manual_seed(7 + rank)
        ends = []
        for _ in range(args.steps):
            tokens = torch.randint(0, vocab, (args.micro_batches, args.micro_batch_size, args.seq_len), generator=gen)
            opt.zero_grad()
            for m in range(args.micro_batches):
                last = m == args.micro_batches - 1
                quiet = model.no_sync() if args.mode.startswith("ddp") and not last else contextlib.nullcontext()
                if args.mode.startswith("fsdp2"):
                    model.set_requires_gradient_sync(last)
                with quiet:
                    (model(input_ids=tokens[m], labels=tokens[m]).loss / args.micro_batches).backward()
            opt.step()
            ends.append(time.perf_counter())
        dist.barrier()
        queue.put((rank, ends, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ""))
    except Exception as e:  # reported, not raised: the other ranks would wait for this one
        lines = traceback.format_exception_only(type(e), e)[-1].strip().splitlines()
        queue.put((rank, [], 0, lines[0] if lines else type(e).__name__))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mode", choices=["ddp", "ddp-zero", "fsdp2", "fsdp2-keep"], required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("bench_zero_torch.py: --steps must be at least 2 (the first is left out)")
    procs, queue = spawn_ranks(rank_main, args)
    results = []
    for _ in procs:
        results.append(queue.get())
        if results[-1][3]:  # one rank failed: the others may wait for it forever
            break
    errors = [r[3] for r in results if r[3]]
    for p in procs:
        p.join(timeout=None if not errors else 10)
        if p.is_alive():
            p.kill()
    if errors:
        print(f"torch {args.mode} x{args.ranks} failed: {errors[0]}", flush=True)
        return
    ends = max(results)[1]
    samples = args.micro_batch_size * args.micro_batches * args.ranks
    rate = samples * (len(ends) - 1) / (ends[-1] - ends[0])
    rss = max(r[2] for r in results) / 1024
    print(f"torch {args.mode} x{args.ranks} samples/s {rate:.1f} rss_mib {rss:.0f}", flush=True)


if __name__ == "__main__":
    main()
