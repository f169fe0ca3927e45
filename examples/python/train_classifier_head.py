"""Trains a small classifier whose head is Linear -> BatchNorm1d -> Softmax(dim=1), after
``gemm_bn_softmax.convert`` has put the fused op in place of that head. Runs on the CPU in a few
seconds (from a checkout: ``PYTHONPATH=python python examples/python/train_classifier_head.py``).

It checks what convert() promises and exits non-zero otherwise: the state_dict keys stay the same,
the converted model computes what the original computes, and it trains (the loss falls).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import gemm_bn_softmax

STEPS = 50
SAMPLES_PER_CLASS = 64


def three_blobs(generator: torch.Generator):
    """A separable 2-D problem: three Gaussian blobs, one per class."""
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    labels = torch.arange(3).repeat_interleave(SAMPLES_PER_CLASS)
    points = centers[labels] + 0.6 * torch.randn(len(labels), 2, generator=generator)
    return points, labels


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(2, 16), nn.ReLU(),                                # features
        nn.Linear(16, 3), nn.BatchNorm1d(3), nn.Softmax(dim=1),     # the head that convert() fuses
    )


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    points, labels = three_blobs(generator)

    model = make_model()
    original = copy.deepcopy(model)  # convert() may change the model in place: keep a copy to compare with
    keys = list(model.state_dict())
    model = gemm_bn_softmax.convert(model)

    # Checkpoints stay interchangeable: same keys as the original model.
    if sorted(model.state_dict()) != sorted(keys):
        raise SystemExit(f"state_dict keys changed by convert(): {keys} -> {list(model.state_dict())}")
    # Same outputs: training mode (batch statistics, running statistics updated), then eval mode.
    with torch.no_grad():
        for mode in ("train", "eval"):
            model.train(mode == "train")
            original.train(mode == "train")
            torch.testing.assert_close(model(points), original(points), rtol=1e-5, atol=1e-6)
    print(f"converted: same state_dict keys ({len(keys)}), same outputs in train and eval mode")

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(STEPS):
        probabilities = model(points)  # the model ends in Softmax: cross-entropy from its log
        loss = F.nll_loss(torch.log(probabilities), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")

    model.eval()
    with torch.no_grad():
        accuracy = (model(points).argmax(dim=1) == labels).float().mean().item()
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}, training accuracy {accuracy:.1%}")
    if not losses[-1] < 0.5 * losses[0]:
        raise SystemExit("the loss did not fall by half: the converted model does not train")


if __name__ == "__main__":
    main()
