"""What the import tests' Python scripts share: the environment dawnpiper runs in, a check that
records failures, a relative comparison, and a model file's graph."""
import json
import os

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
           DAWNPIPER_CACHE="off")
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)
    return ok


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * abs(b)


def graph_of(path):
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return json.loads(f.metadata()["dawnpiper_model"])
