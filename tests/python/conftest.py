import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))  # the bench tools, for the tests that share them

# Unwritten outputs become NaN and fail the comparisons (see allocate_outputs in the binding).
os.environ.setdefault("GEMM_BN_SOFTMAX_POISON", "1")

HAS_CUDA = torch.cuda.is_available()
IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
requires_hopper = pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper (sm_90) GPU")

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
    yield
