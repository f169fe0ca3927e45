"""Fused Linear -> BatchNorm1d -> scale -> softmax(dim=1) for PyTorch, fast on Hopper GPUs.

    from gemm_bn_softmax import FusedGemmBNSoftmax, gemm_bn_softmax, convert, enable_compile_fusion

The operator itself is ``torch.ops.fused.gemm_bn_softmax`` (CPU, CUDA and Meta kernels).
"""
import os as _os

from .convert import ConversionReport, ConversionWarning, Scale, convert
from .functional import dispatch_path, gemm_bn_softmax
from .module import FusedGemmBNSoftmax

# The torch.compile hook lives in compile_fusion, which imports Inductor (about a second): it is
# loaded on first use of these names, or at import when GEMM_BN_SOFTMAX_COMPILE_FUSION=1.
_COMPILE_FUSION_API = ("enable_compile_fusion", "disable_compile_fusion", "compile_fusion_enabled")

__all__ = ["ConversionReport", "ConversionWarning", "FusedGemmBNSoftmax", "Scale", "convert", "dispatch_path",
           "gemm_bn_softmax", *_COMPILE_FUSION_API]
__version__ = "0.1.0"


def __getattr__(name):
    if name in _COMPILE_FUSION_API:
        from . import compile_fusion

        return getattr(compile_fusion, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if _os.environ.get("GEMM_BN_SOFTMAX_COMPILE_FUSION", "").strip().lower() in ("1", "true", "yes", "on"):
    from .compile_fusion import enable_compile_fusion as _enable

    _enable()
