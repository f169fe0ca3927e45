"""Loads the compiled extension (_C.so) that registers ``torch.ops.fused``."""
from __future__ import annotations

import glob
import importlib.util
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_extension() -> str:
    override = os.environ.get("GEMM_BN_SOFTMAX_LIBRARY")
    if override:
        return override
    # _C.so is a plain shared library (no Python module init), but its name is a valid extension
    # module file name, so the import system locates it without importing it: beside the sources,
    # in site-packages, or wherever an editable install (scikit-build-core) redirects it.
    try:
        spec = importlib.util.find_spec(__package__ + "._C")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        return spec.origin
    candidates = sorted(glob.glob(os.path.join(_HERE, "_C*.so")))
    if not candidates:
        raise ImportError(
            "gemm_bn_softmax: the compiled extension _C.so was not found next to the package "
            f"({_HERE}). Build it first: `pip install --no-build-isolation .` or "
            "`cmake -S . -B build -G Ninja && cmake --build build` from the repository root."
        )
    return candidates[0]


def load() -> None:
    if hasattr(torch.ops, "fused") and hasattr(torch.ops.fused, "gemm_bn_softmax"):
        return
    torch.ops.load_library(_find_extension())


load()
