#!/usr/bin/env python3
"""Writes the broken inputs the import command-line tests feed DawnPiper, from a good model file:
  version99.dpm     a model file of another format version
  unknown_op.dpm    a node calling an operator no LibTorch has
  missing.safetensors / misshaped.safetensors   --init-from checkpoints lacking a weight / with
                    one of the wrong shape
  short.bin         a token file too short for one batch
and a module whose forward branches on data (for the exporter), with two good functions beside it
(one a user's LM calling the fused LM loss).
usage: bad_inputs.py GOOD.dpm OUTDIR   (run with scripts/python)
"""
import json
import os
import sys

from safetensors import safe_open
from safetensors.torch import save_file

DATA_DEPENDENT = '''
import torch


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        if h.sum() > 0:  # the branch depends on the data
            return h * 2
        return h


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Gate()

    def forward(self, x):
        return self.gate(x)


def build():
    return Net(), {"x": torch.randn(4, 8)}, lambda out, batch: out.pow(2).mean()


def good():
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    return net, {"x": torch.randn(4, 8)}, lambda out, batch: out.pow(2).mean()


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.mix = torch.nn.Linear(16, 16)

    def forward(self, ids, labels):
        import dawnpiper_ops  # noqa: F401 - the fused LM loss, from the exporter's directory

        h = torch.tanh(self.mix(self.embed(ids)))
        return torch.ops.dawnpiper.linear_cross_entropy(h, self.embed.weight, None, labels, 8)


def fused():
    ids = torch.randint(0, 64, (4, 6))
    return TiedLM(), {"ids": ids, "labels": ids.roll(-1, 1)}, lambda out, batch: out
'''


def main():
    good, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with safe_open(good, "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = dict(f.metadata())
    graph = json.loads(meta["dawnpiper_model"])

    def write(name, g, ts=tensors):
        save_file(ts, os.path.join(out, name), metadata={"format": "pt", "dawnpiper_model": json.dumps(g)})

    write("version99.dpm", dict(graph, version=99))
    odd = json.loads(meta["dawnpiper_model"])
    odd["nodes"][5]["op"] = "aten::no_such_op"
    write("unknown_op.dpm", odd)
    params = [w["name"] for w in graph["weights"] if w["kind"] == "param"]
    save_file({k: v for k, v in tensors.items() if k != params[-1]}, os.path.join(out, "missing.safetensors"))
    wrong = dict(tensors)
    wrong[params[0]] = wrong[params[0]][:-1].contiguous()
    save_file(wrong, os.path.join(out, "misshaped.safetensors"))
    import numpy as np

    np.arange(20, dtype=np.uint16).tofile(os.path.join(out, "short.bin"))
    with open(os.path.join(out, "short.bin.json"), "w") as f:
        json.dump({"format": "dawnpiper-tokens", "version": 1, "dtype": "uint16", "tokens": 20, "vocab_size": 512}, f)
    with open(os.path.join(out, "branchy.py"), "w") as f:
        f.write(DATA_DEPENDENT)
    print(f"missing {params[-1]}; misshaped {params[0]}")


if __name__ == "__main__":
    main()
