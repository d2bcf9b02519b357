#!/usr/bin/env python3
"""Pretrained round trip: weights saved by transformers go into DawnPiper (--init-from), train one
step there on a token file (2 MPI ranks), come back (--save-weights DIR: the weights and
config.json) and load with from_pretrained(DIR); the result must equal the same step taken in
PyTorch eager.

usage: hf_roundtrip.py path/to/dawnpiper WORKDIR   (run with scripts/python; exit 0 = pass)
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import export_model  # noqa: E402
import prepare_data  # noqa: E402

SEQ, BATCH, LR = 16, 2, 0.05
CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, use_cache=False)


def relative(a, b):
    return float((a - b).norm() / b.norm())


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.manual_seed(123)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG))
    pretrained = os.path.join(work, "pretrained")
    model.save_pretrained(pretrained)  # ties lm_head to wte: the file holds the embedding once
    # The model file comes from another initialization: only --init-from gives these weights.
    overrides = ",".join(f"{k}={v}" for k, v in CONFIG.items() if k != "use_cache")
    model_file = os.path.join(work, "gpt2.dpm")
    export_model.main(["--hf", "gpt2", "--config", overrides, "--seq-len", str(SEQ), "--seed", "7", "--out", model_file])
    tokens = os.path.join(work, "tokens.bin")
    prepare_data.main(["--input", "/usr/share/common-licenses/GPL-3", "--vocab-size", "512", "--out", tokens])

    trained = os.path.join(work, "trained", "gpt2")  # made by --save-weights, with config.json
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    run = subprocess.run(
        ["mpirun", "--oversubscribe", "-np", "2", binary, "train", "--model-file", model_file, "--init-from",
         os.path.join(pretrained, "model.safetensors"), "--data", tokens, "--data-order", "sequential",
         "--micro-batch-size", str(BATCH), "--micro-batches", "1", "--steps", "1", "--lr", str(LR),
         "--save-weights", trained],
        capture_output=True, text=True, env=env, timeout=300)
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        return 1
    dawnpiper_loss = float(re.search(r"step 0 loss (\S+)", run.stdout).group(1))

    # The same step in eager PyTorch: windows 0 and 1 of the token file, labels = inputs.
    ids = np.fromfile(tokens, dtype=np.uint16).astype(np.int64)
    batch = torch.tensor(np.stack([ids[w * SEQ: w * SEQ + SEQ] for w in range(BATCH)]))
    model.train()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9).step()  # the first step: plain SGD
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=batch).logits
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(trained, output_loading_info=True)
    loaded.eval()
    with torch.no_grad():
        got = loaded(input_ids=batch).logits
    ok = True
    if abs(dawnpiper_loss - loss.item()) > 1e-5 * abs(loss.item()):
        print(f"FAIL: DawnPiper's step-0 loss {dawnpiper_loss} != eager {loss.item()}")
        ok = False
    missing = [k for k in info["missing_keys"] if "lm_head" not in k]  # tied: from the embedding
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        print(f"FAIL: from_pretrained: missing {missing}, unexpected {info['unexpected_keys']}, "
              f"mismatched {info['mismatched_keys']}")
        ok = False
    err = relative(got, expected)
    print(f"round trip: step-0 loss {dawnpiper_loss:.9g} (eager {loss.item():.9g}), logits relative error {err:.2e}")
    if not err <= 1e-5:
        print("FAIL: the weights DawnPiper trained give other logits than the eager step")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
