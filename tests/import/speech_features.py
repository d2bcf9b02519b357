#!/usr/bin/env python3
"""Models whose inputs are not tokens (export_model.py --hf, --data FILE.safetensors).

- `--hf whisper` (a tiny config) picks AutoModelForSpeechSeq2Seq from transformers' tables and
  exports the log-mel features as a float input; `--task seq2seq`, and an architecture that
  transformers maps to no Auto class the exporter knows (wav2vec2: CTC, classification), are one
  line naming --module, exit 2, and write nothing; a decoder start token outside the vocabulary
  is one line naming the setting.
- A sample file (safetensors: one array per input, samples along dim 0) feeds the features and
  the labels: 2 steps in 1 process and on 2 MPI ranks give the same losses (1e-5 relative), equal
  to eager PyTorch's (SGD) on the file's samples in order with the same weights (--init-from);
  a shuffled order reads other samples (another first loss), and a held-out split evaluates.
- A sample file that does not fit the model (an array missing, a sample shape, floats for ids,
  ids beyond the vocabulary, arrays of different lengths), and a token file for the features, are
  one line naming what to change, exit 2.

usage: speech_features.py path/to/dawnpiper WORKDIR   (run with scripts/python; exit 0 = pass)
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import export_model  # noqa: E402
from script_checks import ENV, check, close, failures, graph_of  # noqa: E402

SEQ, BATCH, MICRO_BATCHES, LR, VOCAB, SAMPLES = 12, 2, 2, 0.05, 128, 24
WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
               encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=16,
               max_target_positions=32, vocab_size=VOCAB, decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
               eos_token_id=2)
FRAMES = 2 * WHISPER["max_source_positions"]  # Whisper's two convolutions: stride 1, then 2
def overrides(values):
    return ",".join(f"{k}={v}" for k, v in values.items())


def dawnpiper(binary, *args, ranks=1):
    cmd = [binary, *args]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)


def losses(run):
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        return None
    return [float(x) for x in re.findall(r"^step \d+ loss (\S+)", run.stdout, re.M)]


def refused_export(argv, work, *needles):
    """export_model.py as a user runs it: exit 2, one line holding every needle, nothing written."""
    out = os.path.join(work, "refused.dpm")
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_model.py"), *argv, "--out", out],
                         capture_output=True, text=True, env=ENV, timeout=600)
    lines = run.stderr.strip().splitlines()
    ok = run.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles) and not os.path.exists(out)
    return check(ok, f"{' '.join(argv[:2])}: exit {run.returncode}, {lines}")


def refused_run(binary, args, *needles):
    run = dawnpiper(binary, *args)
    lines = run.stderr.strip().splitlines()
    ok = run.returncode == 2 and len(lines) == 1 and all(n in lines[0] for n in needles)
    return check(ok, f"refused ({' '.join(needles)}): exit {run.returncode}, {lines}")


def main():
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    import torch
    import transformers
    from safetensors.torch import save_file

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)

    # The model: transformers' own Whisper with its weights saved under the module's names.
    config = transformers.AutoConfig.for_model("whisper", **WHISPER)
    torch.manual_seed(7)
    model = transformers.AutoModelForSpeechSeq2Seq.from_config(config)
    weights = os.path.join(work, "whisper-weights.safetensors")
    save_file({k: v.detach().clone() for k, v in model.state_dict().items()}, weights)  # tied: a copy each
    model_file = os.path.join(work, "whisper.dpm")
    export_model.main(["--hf", "whisper", "--config", overrides(WHISPER), "--seq-len", str(SEQ), "--out", model_file,
                       "--dawnpiper", binary])
    graph = graph_of(model_file)
    inputs = {i["name"]: i for i in graph["inputs"]}
    check(graph["model"]["task"] == "speech-seq2seq" and graph["model"]["model_class"] ==
          "WhisperForConditionalGeneration", f"whisper: {graph['model']['task']}, {graph['model']['model_class']}")
    features = inputs.get("input_features", {})
    check(features.get("dtype") == "float32" and features.get("shape", [])[1:] == [WHISPER["num_mel_bins"], FRAMES]
          and inputs.get("labels", {}).get("role") == "tokens", f"whisper inputs: {sorted(inputs)} {features}")

    # Synthetic inputs train without any file.
    synthetic = losses(dawnpiper(binary, "train", "--model-file", model_file, "--steps", "2",
                                 "--micro-batch-size", str(BATCH)))
    check(synthetic is not None and len(synthetic) == 2, f"whisper trains on synthetic features: {synthetic}")

    # The sample file: features and label sequences (a learnable rule, no ignored positions, so
    # that every micro-batch's mean loss weighs its samples alike).
    gen = torch.Generator().manual_seed(3)
    mel = torch.randn(SAMPLES, WHISPER["num_mel_bins"], FRAMES, generator=gen)
    start = torch.randint(3, VOCAB, (SAMPLES, 1), generator=gen)
    labels = (start + 5 * torch.arange(SEQ)) % (VOCAB - 3) + 3
    samples = os.path.join(work, "features.safetensors")
    save_file({"input_features": mel.contiguous(), "labels": labels.contiguous()}, samples)
    common = ["--model-file", model_file, "--init-from", weights, "--data", samples, "--micro-batch-size", str(BATCH),
              "--micro-batches", str(MICRO_BATCHES), "--lr", str(LR), "--steps", "2"]
    one = losses(dawnpiper(binary, "train", *common, "--data-order", "sequential"))
    two = losses(dawnpiper(binary, "train", *common, "--data-order", "sequential", ranks=2))
    if check(one is not None and len(one) == 2 and two is not None and len(two) == 2,
             f"whisper trains 2 steps on the sample file in 1 process ({one}) and on 2 ranks ({two})"):
        check(all(close(a, b) for a, b in zip(two, one)), f"2-rank losses {two} equal the 1-process {one}")
        # Eager PyTorch, two steps of SGD (DawnPiper's default momentum 0.9) on the file's samples
        # in order: the micro-batches' mean gradient is the batch's (no ignored labels).
        windows = BATCH * MICRO_BATCHES
        model.train()
        sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR, momentum=0.9)
        eager = []
        for step in range(2):
            batch = slice(step * windows, (step + 1) * windows)
            loss = model(input_features=mel[batch], labels=labels[batch]).loss
            eager.append(loss.item())
            sgd.zero_grad()
            loss.backward()
            sgd.step()
        check(all(close(a, b) for a, b in zip(one, eager)), f"losses {one} equal eager PyTorch's {eager} on the "
                                                             f"file's samples in order")
        shuffled = losses(dawnpiper(binary, "train", *common))
        check(shuffled is not None and shuffled[0] != one[0], f"the shuffled order reads other samples: {shuffled}")
    run = dawnpiper(binary, "train", *common, "--validation-fraction", "0.25", "--eval-every", "2")
    check(run.returncode == 0 and re.search(r"^validation step \d+ loss \S+", run.stdout, re.M) is not None,
          f"a held-out split evaluates (exit {run.returncode}) {run.stderr.strip()[-300:]}")

    # Sample files that do not fit, each one line naming what to change.
    def bad_file(name, arrays):
        path = os.path.join(work, name + ".safetensors")
        save_file({k: v.contiguous() for k, v in arrays.items()}, path)
        return ["train", "--model-file", model_file, "--data", path, "--steps", "1", "--micro-batch-size", str(BATCH)]

    refused_run(binary, bad_file("no-labels", {"input_features": mel}), "no array labels", "input_features")
    refused_run(binary, bad_file("short-frames", {"input_features": mel[:, :, :-1], "labels": labels}),
                "input_features", f"[{WHISPER['num_mel_bins']}, {FRAMES - 1}]", f"[{WHISPER['num_mel_bins']}, {FRAMES}]")
    refused_run(binary, bad_file("float-labels", {"input_features": mel, "labels": labels.float()}), "labels",
                "float32", "int64")
    refused_run(binary, bad_file("big-ids", {"input_features": mel, "labels": labels + VOCAB}), "labels",
                f"vocabulary of {VOCAB}")
    refused_run(binary, bad_file("lengths", {"input_features": mel[:-1], "labels": labels}), "samples",
                "one row per sample")
    refused_run(binary, bad_file("too-few", {"input_features": mel[:3], "labels": labels[:3]}), "too short")
    tokens = os.path.join(work, "tokens.bin")
    labels.to(torch.int16).numpy().astype("uint16").tofile(tokens)
    with open(tokens + ".json", "w") as f:
        json.dump({"format": "dawnpiper-tokens", "dtype": "uint16", "tokens": labels.numel(), "vocab_size": VOCAB}, f)
    refused_run(binary, ["train", "--model-file", model_file, "--data", tokens, "--steps", "1"], "input_features",
                "cannot come from a token file", ".safetensors")

    # Exports that transformers' tables do not support: one line naming --module.
    refused_export(["--hf", "whisper", "--config", overrides(WHISPER), "--task", "seq2seq"], work, "whisper",
                   "--module", "speech-seq2seq")
    refused_export(["--hf", "wav2vec2", "--config", "hidden_size=64,num_attention_heads=4"], work, "wav2vec2",
                   "Wav2Vec2ForCTC", "--module")
    small = {k: v for k, v in WHISPER.items() if not k.endswith("token_id")}
    refused_export(["--hf", "whisper", "--config", overrides(small)], work, "decoder_start_token_id", "vocab_size")

    print(f"speech features: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
