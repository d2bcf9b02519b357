#!/usr/bin/env python3
"""GPT-2 in plain PyTorch (the architecture of Hugging Face's GPT2LMHeadModel: learned positions,
pre-norm blocks with a fused QKV projection and causal attention, a tanh-GELU MLP, an output
projection tied to the token embedding), so that the same model runs eagerly and through
DawnPiper on a machine without transformers.

  scripts/export_model.py --module gpt2_reference:build --path scripts --config layers=12 --out gpt2.dpm
  python3 scripts/gpt2_reference.py --device cuda --precision bf16 --batch 8 --seq 512 --steps 10

The second form times eager training steps (SGD with momentum 0.9, DawnPiper's default optimizer)
and prints `eager <precision> <ms> ms/step`.
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(hidden)
        self.c_attn = torch.nn.Linear(hidden, 3 * hidden)
        self.attn_proj = torch.nn.Linear(hidden, hidden)
        self.ln_2 = torch.nn.LayerNorm(hidden)
        self.c_fc = torch.nn.Linear(hidden, 4 * hidden)
        self.mlp_proj = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, layers=12, hidden=768, heads=12, vocab=50257, positions=1024):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, hidden)
        self.wpe = torch.nn.Embedding(positions, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                torch.nn.init.normal_(p, std=std)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied output projection


def lm_loss(logits, batch):
    ids = batch["input_ids"]
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))


def build(layers=12, hidden=768, heads=12, vocab=50257, seq=512, batch=2):
    """export_model.py --module gpt2_reference:build: (model, inputs, loss, roles)."""
    model = GPT2(layers, hidden, heads, vocab, max(seq, 1024))
    inputs = {"input_ids": torch.randint(0, vocab, (batch, seq))}
    return model, inputs, lm_loss, {"input_ids": {"role": "randint", "high": vocab}}


def main():
    parser = argparse.ArgumentParser(description="times eager training steps of the reference GPT-2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10, help="timed steps, after one warm-up step")
    parser.add_argument("--torch-trace", help="also write torch.profiler's Chrome trace of two steps here")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = GPT2(args.layers, args.hidden, args.heads, args.vocab, max(args.seq, 1024)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = lm_loss(model(ids), {"input_ids": ids})
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # One warm-up step, as `dawnpiper train` reports its rate after the first step.
    step()
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    ms = 1e3 * (time.perf_counter() - start) / args.steps
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    print(f"eager {args.precision} {ms:.2f} ms/step peak {peak / 2**20:.1f} MiB")
    if args.torch_trace:  # after the timed steps: the profiler's overhead does not touch them
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, record_shapes=True) as profiler:
            for _ in range(2):
                step()
            sync()
        profiler.export_chrome_trace(args.torch_trace)


if __name__ == "__main__":
    main()
