#!/usr/bin/env python3
"""Training recipes against PyTorch: a Hugging Face GPT-2 trained 20 steps by DawnPiper (one
process, and a 4-rank 1F1B pipeline) and by eager PyTorch from the same weights on the same
token windows, with

  - AdamW, weight decay on matrices and embeddings only, transformers' cosine schedule with
    warmup and a floor (get_cosine_with_min_lr_schedule_with_warmup), clip_grad_norm_;
  - SGD with momentum and L2 weight decay, transformers' linear schedule with warmup, clipping
    (one process, and 2 ranks under GPipe).

Every step's loss, learning rate and gradient norm (from --metrics-out) must equal eager's.

usage: hf_training_equivalence.py path/to/dawnpiper WORKDIR   (run with scripts/python; exit 0 = pass)
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import export_model  # noqa: E402
import prepare_data  # noqa: E402

SEQ, BATCH, MICRO_BATCHES, STEPS = 16, 2, 2, 20
CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, use_cache=False)
RECIPES = {
    "adamw": dict(optimizer="adamw", lr=3e-3, weight_decay=0.1, schedule="cosine", warmup=5, min_lr=3e-4, clip=1.5),
    "sgd": dict(optimizer="sgd", lr=0.05, weight_decay=0.01, schedule="linear", warmup=3, min_lr=0.0, clip=1.5),
}
# (recipe, MPI ranks, schedule, data-parallel replicas); 1 rank: the reference trainer in one
# process. 2 replicas of 2 stages: each replica one of the step's micro-batches, gradients averaged
# before the norm.
RUNS = [("adamw", 1, "1f1b", 1), ("adamw", 4, "1f1b", 1), ("adamw", 4, "1f1b", 2), ("sgd", 1, "1f1b", 1),
        ("sgd", 2, "gpipe", 1)]
LOSS_TOLERANCE = 1e-6  # relative, every step
NORM_TOLERANCE = 1e-5  # relative: torch takes each norm in fp32, DawnPiper sums the squares in double


def eager(recipe, model, windows):
    """Per step (loss, lr, grad norm) of the recipe in plain PyTorch."""
    import torch
    import transformers

    r = RECIPES[recipe]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": r["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    if r["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=r["lr"], betas=(0.9, 0.999), eps=1e-8)
        scheduler = transformers.get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, r["warmup"], STEPS, min_lr=r["min_lr"])
    else:
        optimizer = torch.optim.SGD(groups, lr=r["lr"], momentum=0.9)
        scheduler = transformers.get_linear_schedule_with_warmup(optimizer, r["warmup"], STEPS)
    model.train()
    out = []
    for step in range(STEPS):
        lr = optimizer.param_groups[0]["lr"]
        total = 0.0
        for mb in range(MICRO_BATCHES):
            first = (step * MICRO_BATCHES + mb) * BATCH
            batch = windows[first:first + BATCH]
            loss = model(input_ids=batch, labels=batch).loss
            total += loss.item()
            (loss / MICRO_BATCHES).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), r["clip"]).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        out.append((total / MICRO_BATCHES, lr, norm))
    return out


def dawnpiper(binary, work, model_file, weights, tokens, recipe, ranks, schedule, replicas):
    r = RECIPES[recipe]
    metrics = os.path.join(work, f"{recipe}-{ranks}-{replicas}.jsonl")
    command = [binary, "train", "--model-file", model_file, "--init-from", weights, "--data", tokens,
               "--data-order", "sequential", "--micro-batch-size", str(BATCH), "--micro-batches",
               str(MICRO_BATCHES // replicas), "--data-parallel", str(replicas), "--steps", str(STEPS), "--optimizer", r["optimizer"], "--lr", str(r["lr"]),
               "--weight-decay", str(r["weight_decay"]), "--lr-schedule", r["schedule"], "--warmup-steps",
               str(r["warmup"]), "--grad-clip", str(r["clip"]), "--schedule", schedule, "--metrics-out", metrics,
               "--quiet"]
    if r["min_lr"] > 0:
        command += ["--min-lr", str(r["min_lr"])]
    if ranks > 1:
        command = ["mpirun", "--oversubscribe", "-np", str(ranks)] + command
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
               DAWNPIPER_CACHE="off")
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if run.returncode != 0:
        print(" ".join(command))
        print(run.stdout, run.stderr)
        return None
    with open(metrics) as f:
        lines = [json.loads(line) for line in f]
    return [(m["loss"], m["lr"], m["grad_norm"]) for m in lines if m["kind"] == "train"]


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.manual_seed(123)
    pretrained = os.path.join(work, "pretrained")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).save_pretrained(pretrained)
    weights = os.path.join(pretrained, "model.safetensors")
    overrides = ",".join(f"{k}={v}" for k, v in CONFIG.items() if k != "use_cache")
    model_file = os.path.join(work, "gpt2.dpm")
    export_model.main(["--hf", "gpt2", "--config", overrides, "--seq-len", str(SEQ), "--seed", "7", "--out", model_file])
    tokens = os.path.join(work, "tokens.bin")
    prepare_data.main(["--input", "/usr/share/common-licenses/GPL-3", "--vocab-size", "512", "--out", tokens])
    mask = os.umask(0)
    os.umask(mask)
    for path in (model_file, tokens):  # written as open() would: the user's umask, not mkstemp's 0600
        if os.stat(path).st_mode & 0o777 != 0o666 & ~mask:
            print(f"FAIL: {path} has mode {os.stat(path).st_mode & 0o777:o}, umask {mask:o}")
            return 1
    ids = np.fromfile(tokens, dtype=np.uint16).astype(np.int64)
    windows = torch.tensor(np.stack([ids[w * SEQ:w * SEQ + SEQ] for w in range(STEPS * MICRO_BATCHES * BATCH)]))

    expected = {}
    for recipe in RECIPES:
        expected[recipe] = eager(recipe, transformers.GPT2LMHeadModel.from_pretrained(pretrained), windows)
    ok = True
    for recipe, ranks, schedule, replicas in RUNS:
        got = dawnpiper(binary, work, model_file, weights, tokens, recipe, ranks, schedule, replicas)
        name = f"{recipe} on {ranks} rank(s) ({schedule}" + (f", {replicas} replicas)" if replicas > 1 else ")")
        if got is None or len(got) != STEPS:
            print(f"FAIL: {name}: no metrics for {STEPS} steps")
            ok = False
            continue
        loss_err = max(relative(g[0], e[0]) for g, e in zip(got, expected[recipe]))
        lr_err = max(abs(g[1] - e[1]) / RECIPES[recipe]["lr"] for g, e in zip(got, expected[recipe]))
        norm_err = max(relative(g[2], e[2]) for g, e in zip(got, expected[recipe]))
        clipped = sum(e[2] > RECIPES[recipe]["clip"] for e in expected[recipe])  # some steps, not all
        print(f"{name}: {STEPS} steps, loss {got[0][0]:.6f} -> {got[-1][0]:.6f}; largest relative difference "
              f"from eager: loss {loss_err:.1e}, lr {lr_err:.1e}, grad norm {norm_err:.1e}; clipped in {clipped} steps")
        if not (loss_err <= LOSS_TOLERANCE and lr_err <= 1e-12 and norm_err <= NORM_TOLERANCE):
            print(f"FAIL: {name} differs from eager PyTorch")
            for step, (g, e) in enumerate(zip(got, expected[recipe])):
                print(f"  step {step}: loss {g[0]:.9g} / {e[0]:.9g}  lr {g[1]:.6g} / {e[1]:.6g}  "
                      f"norm {g[2]:.9g} / {e[2]:.9g}")
            ok = False
        if clipped in (0, STEPS) or got[-1][0] >= got[0][0]:
            print(f"FAIL: {name} clipped in no step or in every step, or did not learn: the test would not see "
                  "a wrong clip or update")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
