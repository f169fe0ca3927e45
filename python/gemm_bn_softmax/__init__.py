"""Fused Linear -> BatchNorm1d -> scale -> softmax(dim=1) for PyTorch, fast on Hopper GPUs.

    from gemm_bn_softmax import FusedGemmBNSoftmax, gemm_bn_softmax, convert

The operator itself is ``torch.ops.fused.gemm_bn_softmax`` (CPU, CUDA and Meta kernels).
"""
from .convert import Scale, convert
from .functional import dispatch_path, gemm_bn_softmax
from .module import FusedGemmBNSoftmax

__all__ = ["FusedGemmBNSoftmax", "Scale", "convert", "dispatch_path", "gemm_bn_softmax"]
__version__ = "0.1.0"
