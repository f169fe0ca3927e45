"""The CUDA backward's rounding at large logits, emulated on the CPU.

The backward recomputes each row's softmax from y and the row log-normaliser lse (out = exp(z - lse)),
and computes the row sums ([B1]: sum g * out, sum out), dz = out / sum out * (g - r) with
r = sum g * out / sum out, its column sums S1 = sum_i dz, S2 = sum_i dz * xhat ([B2]; taken as
invstd * sum_i dz * (y - mean) since git d45ad84, as "before normalisation" does not), and
dy = a dz + b xhat + c ([B4]). A scalar scale's gradient is sum_n (gamma S2 + beta S1): at logits of
about 100 (scale 10) a small remainder of large terms, so the roundings show; x's and W's come from dy.
This script follows the kernels' arithmetic (the logit map in log2 units, fmaf, exp2) in torch on the
CPU (its sums in torch's order, not the kernels': the figures move by about 2x between orders), and
variants of it, against float64 on the same fp32 inputs, next to eager's fp32 backward:

  before normalisation  all fp32, r = sum g * out, out as recomputed (the kernels before git 51387c3)
  fp32                  all fp32, out and r divided by the row's sum of out (git 51387c3 to 116113c;
                        the kernels for bf16 and fp16 gradients since)
  row sums and dz in float64   as "fp32", and the row sums, dz and the column sums in float64 (not built)
  wide                  as that, and the exponent's offset c2 - lse2 and its fma in float64: the kernels
                        for fp32 gradients since git 84cddc0

    python bench/backward_precision.py [--shape 256x1000x64] [--scale 10] [--beta-std 0 10] [--seeds 0 1 2]
"""
import argparse

import torch

LOG2E = 1.4426950408889634
VARIANTS = ("before normalisation", "fp32", "row sums and dz in float64", "wide")
GRADS = ("x", "weight", "gamma", "beta", "scale")


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
    """Gradients through the eager block (training-mode BatchNorm), x's and W's included."""
    t = {k: v.to(dtype).requires_grad_(k != "bias") for k, v in p.items()}
    y = torch.nn.functional.linear(t["x"], t["weight"], t["bias"])
    z = t["scale"] * torch.nn.functional.batch_norm(y, None, None, t["gamma"], t["beta"], True, 0.1, 1e-5)
    (torch.softmax(z, dim=1) * grad_out.to(dtype)).sum().backward()
    return {k: t[k].grad for k in GRADS}


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
    """Every gradient as the kernels compute it, in the given variant (dx = dy W and dW = dy^T x exact,
    so that they show dy's error alone)."""
    y, mean, invstd, a, c, lse = fp32_inputs(p)
    d = y - mean
    lse2 = lse * torch.tensor(LOG2E, dtype=torch.float32)
    a2 = (a * LOG2E).float()
    if variant == "wide":  # fma(a2, d, c2 - lse2) in double, c2 unrounded
        z2 = (a2.double() * d.double() + ((c * LOG2E) - lse2.double()[:, None])).float()
        out = torch.exp2(z2)
    else:  # fmaf(a2, d, c2) rounded once, then - lse2
        z2 = (a2.double() * d.double() + (c * LOG2E).float().double()).float()
        out = torch.exp2(z2 - lse2[:, None])
    g = grad_out
    wide = variant in ("row sums and dz in float64", "wide")
    acc = torch.float64 if wide else torch.float32
    dot, out_sum = (g.to(acc) * out.to(acc)).sum(1), out.to(acc).sum(1)
    if variant == "before normalisation":
        norm, r = torch.ones_like(out_sum), dot
    else:
        norm = 1 / out_sum
        r = dot * norm
    xhat = d * invstd
    # S2 as the kernels take it since git d45ad84: invstd * sum dz * (y - mean), not sum dz * xhat
    if wide:
        dz = out.double() * norm[:, None] * (g.double() - r[:, None])
        s1, s2 = dz.sum(0), (dz * d.double()).sum(0) * invstd.double()
    else:
        dz = (out * norm[:, None]) * (g - r[:, None])
        s1 = dz.sum(0).double()
        s2 = (dz * xhat).sum(0).double() if variant == "before normalisation" else ((dz * d).sum(0) * invstd).double()
    # [B4]: fp32 dz from r and the normaliser rounded to fp32, and the coefficients of [B3] rounded to fp32
    s, m = p["scale"].double(), y.shape[0]
    b, c_dy = -a * s2 / m, -a * s1 / m
    dz4 = (out * norm.float()[:, None]) * (g - r.float()[:, None])
    dy = (a.float() * dz4 + (b.float() * xhat + c_dy.float())).double()
    return {"x": dy @ p["weight"].double(), "weight": dy.T @ p["x"].double(), "gamma": s * s2, "beta": s * s1,
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
    worst = {}
    for beta_std, seed in [(b, s) for b in args.beta_std for s in args.seeds]:
        print(f"{args.shape}, scale {args.scale:g}, beta {'default' if not beta_std else f'~ N(0, {beta_std:g}^2)'}, "
              f"seed {seed}: relative error against float64")
        errs = run(shape, args.scale, beta_std, seed)
        for name, e in errs.items():
            print(f"  {name:28s} " + "  ".join(f"{key} {err:.2e}" for key, err in e.items()))
            for key in GRADS:
                worst[name, key] = max(worst.get((name, key), 0.0), e[key] / errs["eager fp32"][key])
    print("largest ratio to eager fp32's error over these problems:")
    for name in VARIANTS:
        print(f"  {name:28s} " + "  ".join(f"{key} {worst[name, key]:.2f}" for key in GRADS))


if __name__ == "__main__":
    main()
