#!/usr/bin/env python3
"""The peer side of scripts/bench_peer.sh: a Hugging Face GPT-2 trained with
torch.distributed.pipelining (gloo, CPU, one intra-op thread per rank), or eagerly in one process.

The model is cut at layer boundaries, as torch's pipelining asks its user to: stage 0 holds the
embeddings and the first blocks, the last stage the last blocks, the final norm, the LM head and
the loss (the shifted cross-entropy of GPT2LMHeadModel). `interleaved` (ScheduleInterleaved1F1B)
cuts twice as many stages, rank r holding stages r and r + N. Before timing, the stages composed in
one process must give the model's own loss (a check that the split is the model).

Prints one line: `peer <config> samples/s <after the first step> rss_mib <max over ranks>`.
  usage: bench_peer.py --config k=v,... --ranks N --schedule gpipe|1f1b|zb|interleaved|eager --micro-batch-size B
                       --micro-batches M --seq-len S --steps K
"""
import argparse
import os
import resource
import socket
import sys
import time


def build_model(config_text):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    values = {}
    for item in config_text.split(","):
        key, value = item.split("=")
        values[key] = float(value) if "." in value or "e-" in value else int(value)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(**values))
    model.train()
    return model


def stage_modules(model, stages):
    """nn.Modules for each stage: layers split as evenly as they go (earlier stages take the rest)."""
    import torch

    blocks = list(model.transformer.h)
    per, extra = divmod(len(blocks), stages)
    counts = [per + (1 if i < extra else 0) for i in range(stages)]

    class Stage(torch.nn.Module):
        def __init__(self, first, last, layers):
            super().__init__()
            self.first, self.last = first, last
            if first:
                self.wte, self.wpe = model.transformer.wte, model.transformer.wpe
            self.layers = torch.nn.ModuleList(layers)
            if last:
                self.ln_f, self.lm_head = model.transformer.ln_f, model.lm_head

        def forward(self, x):
            if self.first:
                positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
                x = self.wte(x) + self.wpe(positions)
            for layer in self.layers:
                out = layer(x)
                x = out[0] if isinstance(out, tuple) else out
            if self.last:
                x = self.lm_head(self.ln_f(x))
            return x

    modules, at = [], 0
    for i, c in enumerate(counts):
        modules.append(Stage(i == 0, i == stages - 1, blocks[at:at + c]))
        at += c
    return modules


def loss_fn(logits, tokens):
    import torch

    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def check_split(model, args):
    """The composed stages reproduce GPT2LMHeadModel's loss."""
    import torch

    tokens = torch.randint(0, model.config.vocab_size, (2, args.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(input_ids=tokens, labels=tokens).loss.item()
        x = tokens
        for m in stage_modules(model, max(args.ranks, 1)):
            x = m(x)
        got = loss_fn(x, tokens).item()
    if abs(got - want) > 1e-5 * abs(want):
        sys.exit(f"bench_peer.py: the stage split gives loss {got}, the model {want}")


def batches(args, vocab):
    import torch

    gen = torch.Generator().manual_seed(7)
    size = args.micro_batch_size * args.micro_batches
    return [torch.randint(0, vocab, (size, args.seq_len), generator=gen) for _ in range(args.steps)]


def report(args, step_ends, rss_kib):
    samples = args.micro_batch_size * args.micro_batches
    rate = samples * (len(step_ends) - 1) / (step_ends[-1] - step_ends[0])
    print(f"peer {args.schedule} x{args.ranks} samples/s {rate:.1f} rss_mib {max(rss_kib) / 1024:.0f}", flush=True)


def eager(args):
    import torch

    torch.set_num_threads(1)
    model = build_model(args.config)
    check_split(model, args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ends = []
    for tokens in batches(args, model.config.vocab_size):
        opt.zero_grad()
        for chunk in tokens.chunk(args.micro_batches):  # micro-batches, gradients accumulated
            (model(input_ids=chunk, labels=chunk).loss / args.micro_batches).backward()
        opt.step()
        ends.append(time.perf_counter())
    report(args, ends, [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss])


def rank_main(rank, args, port, queue):
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    model = build_model(args.config)
    if rank == 0:
        check_split(model, args)
    per_rank = 2 if args.schedule == "interleaved" else 1
    stages = per_rank * args.ranks
    indices = [rank + v * args.ranks for v in range(per_rank)]  # round robin, as Interleaved1F1B places them
    modules = [stage_modules(model, stages)[i] for i in indices]
    pipeline = [PipelineStage(m, i, stages, torch.device("cpu")) for m, i in zip(modules, indices)]
    if args.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(pipeline, args.micro_batches, loss_fn=loss_fn)
    elif args.schedule == "zb":  # zero bubble, one stage per rank: backwards split into I and W
        schedule = ScheduleInterleavedZeroBubble(pipeline, args.micro_batches, loss_fn=loss_fn)
    else:
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(pipeline[0], args.micro_batches, loss_fn=loss_fn)
    opt = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=args.lr)
    ends = []
    for tokens in batches(args, model.config.vocab_size):
        opt.zero_grad()
        if rank == 0:
            schedule.step(tokens)
        elif rank == args.ranks - 1:
            schedule.step(target=tokens, losses=[])
        else:
            schedule.step()
        opt.step()
        ends.append(time.perf_counter())
    dist.barrier()
    queue.put((rank, ends, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    dist.destroy_process_group()


def spawn_ranks(target, args):
    """args.ranks processes, each running target(rank, args, port, queue) (gloo on a free local
    port); returns them, started, and the queue they report on."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(r, args, port, queue)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    return procs, queue


def pipelined(args):
    procs, queue = spawn_ranks(rank_main, args)
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"bench_peer.py: a rank exited with {p.exitcode}")
    last = max(results)  # the last stage finishes each step last
    report(args, last[1], [r[2] for r in results])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--schedule", choices=["gpipe", "1f1b", "zb", "interleaved", "eager"], required=True)
    ap.add_argument("--micro-batch-size", type=int, required=True)
    ap.add_argument("--micro-batches", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    if args.steps < 2:
        sys.exit("bench_peer.py: --steps must be at least 2 (the first is left out)")
    eager(args) if args.schedule == "eager" else pipelined(args)


if __name__ == "__main__":
    main()
