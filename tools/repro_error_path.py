"""Calls the op with invalid arguments one by one, printing before each call: locates a crash on
the error path (run under `python3 -X faulthandler`)."""
import sys

import torch

sys.path.insert(0, "python")
import gemm_bn_softmax  # noqa: E402,F401

op = torch.ops.fused.gemm_bn_softmax.default
for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
    n, k = 6, 4
    base = dict(x=torch.rand(8, k, device=device), w=torch.randn(n, k, device=device))
    cases = {
        "ok": (base["x"], base["w"]),
        "x 3-D": (base["x"][None], base["w"]),
        "K mismatch": (base["x"], torch.randn(n, 5, device=device)),
        "float64": (base["x"].double(), base["w"].double()),
    }
    for name, (x, w) in cases.items():
        print(f"{device} {name} ...", flush=True)
        try:
            out = op(x, w, None, None, None, None, None, None, torch.ones(1, device=device), True, 0.1, 1e-5)
            print("   ok", out[0].shape, flush=True)
        except Exception as e:  # noqa: BLE001
            print("   raised", type(e).__name__, str(e).splitlines()[0], flush=True)
