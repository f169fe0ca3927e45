"""The CUDA backward's rounding at large logits, emulated in float32 on the CPU.

The backward recomputes each row's softmax from y and the fp32 row log-normaliser (out = exp(z - lse))
and computes, in fp32, the row sums ([B1]), dz = out * (g - r) and its column sums S1 = sum_i dz,
S2 = sum_i dz * xhat ([B2]); a scalar scale's gradient is sum_n (gamma S2 + beta S1). At logits of about
100 (scale 10) that gradient is a small remainder of large terms, so the roundings show. This script
follows the kernels' arithmetic (the column maps in log2 units, fmaf, exp2) with torch float32 tensors
(their summation order is torch's, not the kernels': the figures move by about 2x between orders), and
variants of it, against float64 on the same fp32 inputs, next to eager's fp32 backward:

  before normalisation   r_i = sum g * out, out as recomputed (the kernels before git 51387c3)
  kernels                out and r_i divided by the row's sum of out (the kernels now)
  r in float64           as "kernels", the row sums, r_i and 1 / sum out in float64
  dz and sums in float64 as that, and dz, xhat and the column sums in float64 too

    python bench/backward_precision.py [--shape 256x1000x64] [--scale 10] [--beta-std 0 10] [--seeds 0 1 2]
"""
import argparse

import torch

LOG2E = 1.4426950408889634
VARIANTS = ("before normalisation", "kernels", "r in float64", "dz and sums in float64")


def rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def make_problem(m, n, k, scale, beta_std, seed=0):
    """The problem of tests/python/test_backward.py's test_gradients_at_large_logits at seed 0: its
    make_problem's draws in its order (the running statistics' too, unused here), scale and beta set."""
    g = torch.Generator().manual_seed(seed)
    p = {"x": torch.rand(m, k, generator=g), "weight": torch.randn(n, k, generator=g) / k ** 0.5,
         "bias": 0.1 * torch.randn(n, generator=g), "gamma": 0.5 + torch.rand(n, generator=g),
         "beta": 0.3 * torch.randn(n, generator=g)}
    torch.rand(1, generator=g), torch.randn(n, generator=g), torch.rand(n, generator=g)  # scale, rm, rv
    p["scale"] = torch.full((1,), float(scale))
    if beta_std:
        p["beta"] = beta_std * torch.randn(n, generator=torch.Generator().manual_seed(5 + seed))
    return p, torch.randn(m, n, generator=g)


def eager_grads(p, grad_out, dtype):
    """Gradients of gamma, beta and scale through the eager block (training-mode BatchNorm)."""
    t = {k: v.to(dtype).requires_grad_(k in ("gamma", "beta", "scale")) for k, v in p.items()}
    y = torch.nn.functional.linear(t["x"], t["weight"], t["bias"])
    z = t["scale"] * torch.nn.functional.batch_norm(y, None, None, t["gamma"], t["beta"], True, 0.1, 1e-5)
    (torch.softmax(z, dim=1) * grad_out.to(dtype)).sum().backward()
    return {k: t[k].grad for k in ("gamma", "beta", "scale")}


def fp32_inputs(p):
    """What the backward reads: y, the batch statistics and row_lse in fp32, as the forward saves them."""
    y = (p["x"].double() @ p["weight"].double().T + p["bias"].double()).float()
    mean = y.double().mean(0).float()
    invstd = (y.double().var(0, unbiased=False) + 1e-5).rsqrt().float()
    a = p["scale"].double() * p["gamma"].double() * invstd.double()  # the logit map z = a (y - mean) + c
    c = p["scale"].double() * p["beta"].double()
    lse = torch.logsumexp(a * (y.double() - mean.double()) + c, dim=1).float()
    return y, mean, invstd, a, c, lse


def emulate(p, grad_out, variant):
    """Gradients of gamma, beta and scale as the kernels compute them, in the given variant."""
    y, mean, invstd, a, c, lse = fp32_inputs(p)
    d = y - mean
    a2, c2 = (a * LOG2E).float(), (c * LOG2E).float()
    z2 = (a2.double() * d.double() + c2.double()).float()  # fmaf: one rounding
    out = torch.exp2(z2 - (lse * torch.tensor(LOG2E, dtype=torch.float32))[:, None])
    g = grad_out
    wide = variant in ("r in float64", "dz and sums in float64")
    acc = torch.float64 if wide else torch.float32
    dot, out_sum = (g.to(acc) * out.to(acc)).sum(1), out.to(acc).sum(1)
    if variant == "before normalisation":
        norm, r = torch.ones_like(out_sum), dot
    else:
        norm = 1 / out_sum
        r = dot * norm
    if variant == "dz and sums in float64":
        xhat = d.double() * invstd.double()
        dz = out.double() * norm[:, None] * (g.double() - r[:, None])
        s1, s2 = dz.sum(0), (dz * xhat).sum(0)
    else:
        xhat = d * invstd
        o = out.to(acc) * norm[:, None]
        g_minus_r = (g.to(acc) - r[:, None]).float()  # rounded to fp32, as the kernels' g - r
        dz = (o * g_minus_r.to(acc)).float()
        s1, s2 = dz.sum(0).double(), (dz * xhat).sum(0).double()
    s = p["scale"].double()
    return {"gamma": s * s2, "beta": s * s1,
            "scale": (p["gamma"].double() * s2 + p["beta"].double() * s1).sum().reshape(1)}


def run(shape, scale, beta_std, seed=0):
    m, n, k = shape
    p, grad_out = make_problem(m, n, k, scale, beta_std, seed)
    ref = eager_grads(p, grad_out, torch.float64)
    rows = {"eager fp32": eager_grads(p, grad_out, torch.float32)}
    rows.update({v: emulate(p, grad_out, v) for v in VARIANTS})
    return {name: {key: rel(grads[key], ref[key]) for key in ref} for name, grads in rows.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="256x1000x64", help="MxNxK")
    ap.add_argument("--scale", type=float, default=10.0)
    ap.add_argument("--beta-std", type=float, nargs="+", default=[0.0, 10.0],
                    help="0: the default init's beta (0.3 N(0, 1)); else beta ~ N(0, std^2)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="problems to draw (0: the test's); the errors differ a lot from one to the next")
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    for beta_std, seed in [(b, s) for b in args.beta_std for s in args.seeds]:
        print(f"{args.shape}, scale {args.scale:g}, beta {'default' if not beta_std else f'~ N(0, {beta_std:g}^2)'}, "
              f"seed {seed}: relative error against float64")
        for name, errs in run(shape, args.scale, beta_std, seed).items():
            print(f"  {name:24s} " + "  ".join(f"{key} {err:.2e}" for key, err in errs.items()))


if __name__ == "__main__":
    main()
