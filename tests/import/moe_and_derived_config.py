#!/usr/bin/env python3
"""Mixtures of experts and configs whose values follow others (export_model.py).

- Mixtral, Qwen3-MoE and Qwen2-MoE (shared experts; a sliding-window mask no layer uses, read
  only by torch.export's assertions) export with default settings (experts in ATen operations)
  and train 2 steps on a token file in 1 process and on 2 MPI ranks: the same losses (1e-5
  relative), and a first-step loss equal to PyTorch eager's (transformers' own experts
  implementation) on the same windows and weights (--init-from of save_pretrained's file, whose
  experts are saved one by one; the module's fused names give the same losses).
- The exporter loads what it wrote with dawnpiper's own checks: with its dead-node pass undone,
  Qwen2-MoE's export is refused (one line, exit 2, the node named) and nothing is written.
- A custom operator is refused at export time: experts_implementation=grouped_mm traces to
  transformers::grouped_mm_fallback, which names the operator and the setting to change.
- --config num_attention_heads=4 on Mistral and Phi: num_key_value_heads and head_dim follow it,
  and the model exports and trains; an inconsistent override (hidden_size not a multiple of the
  heads, heads not a multiple of the key/value heads) is one line, exit 2.

usage: moe_and_derived_config.py path/to/dawnpiper WORKDIR   (run with scripts/python; exit 0 = pass)
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import export_model  # noqa: E402
from script_checks import ENV, check, close, failures, graph_of  # noqa: E402
import prepare_data  # noqa: E402

SEQ, BATCH, MICRO_BATCHES, LR, VOCAB = 16, 2, 2, 0.05, 512
ATTENTION = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                 max_position_embeddings=64)
MOE = {
    "mixtral": dict(ATTENTION, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(ATTENTION, intermediate_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(ATTENTION, intermediate_size=128, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                      num_experts=4, num_experts_per_tok=2),
}
# Only the heads among the attention's settings: the others follow (export_model.hf_config).
DERIVED = "num_hidden_layers=1,hidden_size=64,num_attention_heads=4,intermediate_size=128,vocab_size=256," \
          "max_position_embeddings=64"
def train(binary, model_file, ranks, *extra):
    """Losses per step of `dawnpiper train` (on `ranks` MPI ranks; 1: no mpirun)."""
    cmd = [binary, "train", "--model-file", model_file, "--steps", "2", *extra]
    if ranks > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
    run = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if run.returncode != 0:
        print(run.stdout, run.stderr)
        return None
    return [float(x) for x in re.findall(r"^step \d+ loss (\S+)", run.stdout, re.M)]


def moe(binary, work, arch, tokens, token_ids):
    import torch
    import transformers
    from safetensors.torch import save_file

    config = transformers.AutoConfig.for_model(arch, **MOE[arch])
    torch.manual_seed(123)
    model = transformers.AutoModelForCausalLM.from_config(config)  # transformers' default experts
    # Its weights as transformers saves them: save_pretrained writes the experts one by one, under
    # the names of the original checkpoints (Mixtral: block_sparse_moe.experts.E.w1/w2/w3), which
    # --init-from reads into the module's fused experts; and under the module's own names.
    saved = os.path.join(work, arch + "-saved")
    model.save_pretrained(saved)
    weights = os.path.join(saved, "model.safetensors")
    module_weights = os.path.join(work, arch + "-weights.safetensors")
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, module_weights)
    # Default settings: the exporter chooses the experts implementation.
    model_file = os.path.join(work, arch + ".dpm")
    overrides = ",".join(f"{k}={v}" for k, v in MOE[arch].items())
    export_model.main(["--hf", arch, "--config", overrides, "--seq-len", str(SEQ), "--out", model_file,
                       "--dawnpiper", binary])
    graph = graph_of(model_file)
    foreign = sorted({n["op"] for n in graph["nodes"] if not n["op"].startswith("aten::")})
    check(not foreign, f"{arch}: every node is an ATen call (others: {foreign})")
    check(graph["model"].get("experts_implementation") == export_model.DENSE_EXPERTS,
          f"{arch}: exported with experts_implementation {graph['model'].get('experts_implementation')}")

    args = ["--init-from", weights, "--data", tokens, "--data-order",
            "sequential", "--micro-batch-size", str(BATCH), "--micro-batches", str(MICRO_BATCHES), "--lr", str(LR)]
    one, two = train(binary, model_file, 1, *args), train(binary, model_file, 2, *args)
    if not check(one is not None and len(one) == 2 and two is not None and len(two) == 2,
                 f"{arch}: trains 2 steps in 1 process ({one}) and on 2 ranks ({two})"):
        return
    check(all(close(a, b) for a, b in zip(two, one)), f"{arch}: 2-rank losses {two} equal the 1-process {one}")
    fused = train(binary, model_file, 1, *[module_weights if a == weights else a for a in args])
    check(fused == one, f"{arch}: the module's fused names give the same losses ({fused}) as save_pretrained's ({one})")

    # Eager PyTorch on the same windows (labels = inputs; the model shifts them inside).
    windows = BATCH * MICRO_BATCHES
    batch = torch.tensor(token_ids[: windows * SEQ].reshape(windows, SEQ))
    model.train()
    with torch.no_grad():
        eager = model(input_ids=batch, labels=batch).loss.item()
    check(close(one[0], eager, rel=1e-6), f"{arch}: step-0 loss {one[0]:.9g} equals eager PyTorch's {eager:.9g} "
                                f"({config._experts_implementation} experts)")


def refused(argv, *needles):
    """export_model.main(argv) raises a UserError (exit 2) whose message holds every needle."""
    try:
        export_model.main(argv)
    except export_model.UserError as e:
        message = str(e)
        return check(all(n in message for n in needles) and "\n" not in message, f"refused: {message}")
    return check(False, f"{' '.join(argv)} was not refused")


def main():
    binary, work = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(work, exist_ok=True)
    import numpy as np
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    tokens = os.path.join(work, "tokens.bin")
    prepare_data.main(["--input", "/usr/share/common-licenses/GPL-3", "--vocab-size", str(VOCAB), "--out", tokens])
    token_ids = np.fromfile(tokens, dtype=np.uint16).astype(np.int64)
    for arch in MOE:
        moe(binary, work, arch, tokens, token_ids)

    # A graph the trainer refuses is refused at export: Qwen2-MoE without the dead-node pass.
    dead = os.path.join(work, "dead.dpm")
    live_nodes = export_model.live_nodes
    export_model.live_nodes = lambda nodes, loss: nodes
    try:
        refused(["--hf", "qwen2_moe", "--config", ",".join(f"{k}={v}" for k, v in MOE["qwen2_moe"].items()),
                 "--seq-len", str(SEQ), "--out", dead, "--dawnpiper", binary], "dawnpiper would refuse",
                "produces nothing the graph reads", "node ")
    finally:
        export_model.live_nodes = live_nodes
    check(not os.path.exists(dead), "nothing written for the export dawnpiper refuses")

    # A custom operator is refused at export, with the setting to change; nothing is written.
    grouped = os.path.join(work, "grouped.dpm")
    refused(["--hf", "mixtral", "--config", ",".join(f"{k}={v}" for k, v in MOE["mixtral"].items()) +
             ",experts_implementation=grouped_mm", "--seq-len", str(SEQ), "--out", grouped],
            "transformers::grouped_mm_fallback", "experts_implementation=dense")
    check(not os.path.exists(grouped), "nothing written for the refused export")

    # Values that follow num_attention_heads when not given.
    expected = {"phi": {"num_key_value_heads": 4}, "mistral": {"num_key_value_heads": 1, "head_dim": 16}}
    for arch, values in expected.items():
        model_file = os.path.join(work, arch + ".dpm")
        export_model.main(["--hf", arch, "--config", DERIVED, "--seq-len", str(SEQ), "--out", model_file])
        config = graph_of(model_file)["model"]["hf_config"]
        check(all(config.get(k) == v for k, v in values.items()),
              f"{arch}: {', '.join(f'{k} {config.get(k)}' for k in values)} with num_attention_heads 4")
        losses = train(binary, model_file, 1, "--micro-batch-size", "2")
        check(losses is not None and len(losses) == 2, f"{arch}: num_attention_heads=4 trains ({losses})")

    # Inconsistent settings: one line naming them, exit 2, no traceback.
    refused(["--hf", "mistral", "--config", DERIVED + ",num_key_value_heads=3", "--out", os.path.join(work, "x.dpm")],
            "num_attention_heads 4", "num_key_value_heads 3")
    run = subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_model.py"), "--hf", "phi", "--config",
                          DERIVED.replace("num_attention_heads=4", "num_attention_heads=3"), "--out",
                          os.path.join(work, "x.dpm")], capture_output=True, text=True, env=ENV, timeout=300)
    lines = run.stderr.strip().splitlines()
    named = len(lines) == 1 and "hidden_size 64" in lines[0] and "num_attention_heads 3" in lines[0]
    check(run.returncode == 2 and named, f"phi hidden_size=64,num_attention_heads=3: exit {run.returncode}, {lines}")
    check(not os.path.exists(os.path.join(work, "x.dpm")), "nothing written for the inconsistent configs")

    print(f"moe and derived config: {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
