"""The reference block, in plain PyTorch modules: Linear -> BatchNorm1d -> scale -> Softmax(dim=1)
(KernelBench level-2 problem 84's model).

Used by the CLI, tests and benchmarks as the eager baseline; FusedGemmBNSoftmax loads its state_dict.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class ReferenceModel(nn.Module):
    def __init__(self, in_features, out_features, bn_eps=1e-5, bn_momentum=0.1, scale_shape=(1,)):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.bn = nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum)
        self.scale = nn.Parameter(torch.ones(scale_shape))
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.gemm(x)
        x = self.bn(x)
        x = self.scale * x
        return self.softmax(x)
