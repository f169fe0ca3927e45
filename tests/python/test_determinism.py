"""Bitwise determinism between a fresh process and a warmed-up one (CPU, and CUDA when present)."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import DEVICES, ROOT

import gemm_bn_softmax as gbs

SCRIPT = r"""
import hashlib, sys, torch
sys.path.insert(0, {python!r})
import gemm_bn_softmax as gbs
device = {device!r}
g = torch.Generator().manual_seed(11)
x = torch.rand(257, 96, generator=g).to(device)
w = torch.randn(130, 96, generator=g).to(device)
b = torch.randn(130, generator=g).to(device)
rm, rv = torch.zeros(130, device=device), torch.ones(130, device=device)
out = gbs.gemm_bn_softmax(x, w, b, running_mean=rm, running_var=rv)
h = hashlib.sha256()
for t in (out, rm, rv):
    h.update(t.cpu().numpy().tobytes())
print(h.hexdigest())
"""


@pytest.mark.parametrize("device", DEVICES)
def test_fresh_process_matches_warm_process(device):
    code = SCRIPT.format(python=os.path.join(ROOT, "python"), device=device)
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    # warm this process up with other shapes first, then run the same computation here
    for _ in range(3):
        gbs.gemm_bn_softmax(torch.rand(64, 32, device=device), torch.randn(16, 32, device=device))
    namespace = {}
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, "<determinism>", "exec"), namespace)
    assert buf.getvalue().strip() == fresh
