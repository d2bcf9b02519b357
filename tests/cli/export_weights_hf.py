#!/usr/bin/env python3
"""export-weights out of a Hugging Face model's checkpoint (issue 55, item 5): a GPT-2 file trained
on 2 MPI ranks with checkpoints; `dawnpiper export-weights CKPT DIR` writes model.safetensors and
config.json equal, byte for byte, to what --save-weights DIR writes after the same steps;
transformers' from_pretrained(DIR) loads it with every weight; and an earlier kept checkpoint
exported and given to --init-from has the validation loss that --resume-from of that
checkpoint reports (2 ranks on its plan: equal; 1 rank: within 1e-6).

usage: export_weights_hf.py path/to/dawnpiper WORKDIR   (run with scripts/python; exit 0 = pass)
"""
import filecmp
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import export_model  # noqa: E402
import prepare_data  # noqa: E402

SEQ = 16
CONFIG = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, use_cache=False)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.manual_seed(5)
    pretrained = os.path.join(work, "pretrained")
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG)).save_pretrained(pretrained)
    overrides = ",".join(f"{k}={v}" for k, v in CONFIG.items() if k != "use_cache")
    model_file = os.path.join(work, "gpt2.dpm")
    export_model.main(["--hf", "gpt2", "--config", overrides, "--seq-len", str(SEQ), "--out", model_file,
                       "--dawnpiper", binary])
    tokens = os.path.join(work, "tokens.bin")
    prepare_data.main(["--input", "/usr/share/common-licenses/GPL-3", "--vocab-size", "512", "--out", tokens])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    common = ["train", "--model-file", model_file, "--data", tokens, "--validation-fraction", "0.2",
              "--micro-batch-size", "2"]

    def dawnpiper(args, ranks=2):
        launcher = ["mpirun", "--oversubscribe", "-np", str(ranks)] if ranks > 1 else []
        run = subprocess.run(launcher + [binary] + args, capture_output=True, text=True, env=env, timeout=300)
        if run.returncode != 0:
            print(f"FAIL: dawnpiper {' '.join(args)}: exit {run.returncode}\n{run.stdout}\n{run.stderr}")
            sys.exit(1)
        return run.stdout

    def validation_loss(out):
        return float(re.search(r"^validation loss (\S+):", out, re.M).group(1))

    ck, saved = os.path.join(work, "ck"), os.path.join(work, "saved")
    dawnpiper(common + ["--init-from", os.path.join(pretrained, "model.safetensors"), "--micro-batches", "2",
                        "--steps", "3", "--optimizer", "adam", "--lr", "0.01", "--checkpoint-dir", ck,
                        "--checkpoint-every", "1", "--save-weights", saved])
    exported, earlier = os.path.join(work, "exported"), os.path.join(work, "step2")
    out = dawnpiper(["export-weights", ck, exported], ranks=1)
    ok = True
    if f"from_pretrained(\"{exported}\") loads them" not in out:
        print(f"FAIL: export-weights says {out!r}")
        ok = False
    for name in ("model.safetensors", "config.json"):
        if not filecmp.cmp(os.path.join(exported, name), os.path.join(saved, name), shallow=False):
            print(f"FAIL: the exported {name} differs from --save-weights'")
            ok = False
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(exported, output_loading_info=True)
    missing = [k for k in info["missing_keys"] if "lm_head" not in k]  # tied: from the embedding
    if missing or info["unexpected_keys"] or info["mismatched_keys"]:
        print(f"FAIL: from_pretrained: missing {missing}, unexpected {info['unexpected_keys']}, "
              f"mismatched {info['mismatched_keys']}")
        ok = False

    # Step 2's checkpoint, kept (the default keeps 2), into --init-from.
    dawnpiper(["export-weights", ck, earlier, "--step", "2"], ranks=1)
    evaluation = ["--eval-only", "--eval-batches", "3"]
    resumed = validation_loss(dawnpiper(common + evaluation + ["--checkpoint-dir", ck, "--resume-from", "2"]))
    init = os.path.join(earlier, "model.safetensors")
    two = validation_loss(dawnpiper(common + evaluation + ["--init-from", init, "--plan-in",
                                                          os.path.join(ck, "plan.json")]))
    one = validation_loss(dawnpiper(common + evaluation + ["--init-from", init], ranks=1))
    print(f"validation loss of step 2's weights: resumed {resumed:.9g}, --init-from the export on 2 ranks {two:.9g}, "
          f"on 1 rank {one:.9g}")
    if two != resumed:
        print("FAIL: --init-from of the exported weights on the checkpoint's plan differs from --resume-from's")
        ok = False
    if abs(one - resumed) > 1e-6 * abs(resumed):
        print("FAIL: --init-from of the exported weights on 1 rank is not within 1e-6 of --resume-from's")
        ok = False
    untrained = validation_loss(dawnpiper(common + evaluation + ["--init-from", os.path.join(pretrained,
                                                                                         "model.safetensors")], ranks=1))
    if untrained == resumed:
        print("FAIL: the trained weights evaluate as the untrained ones (the test would not see a bad export)")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
