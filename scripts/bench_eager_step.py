#!/usr/bin/env python3
"""PyTorch eager training steps of a Hugging Face model, timed as DawnPiper's reference trainer
times its steps (forward, backward, SGD with momentum), for bench_import.sh.
usage: scripts/python scripts/bench_eager_step.py --hf gpt2 --seq-len 256 --batch-size 4 --steps 8 --threads 2"""
import argparse
import statistics
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", default="gpt2")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.for_model(args.hf)
    config.use_cache = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    steady = times[2:] if len(times) > 3 else times
    print(f"eager step median {1e3 * statistics.median(steady):.1f} ms over {len(steady)} steps "
          f"(batch {args.batch_size} x {args.seq_len}, {args.threads} threads, torch {torch.__version__})")


if __name__ == "__main__":
    main()
