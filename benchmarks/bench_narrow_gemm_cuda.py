"""Narrow GEMMs against wide ones of the same FLOPs, interleaved (the shape effect alone).

    python benchmarks/bench_narrow_gemm_cuda.py [--smoke]

docs/validation.md names a pattern across sources: rows whose tensor-parallel GEMMs are
128-512 wide per rank are predicted fast, and llmsim's GEMM efficiency is a curve of a
kernel's FLOPs, not of its shape. This times F.linear (bf16, as nn.Linear runs) with one
narrow dimension, N (output features) or K (input features), against the same FLOPs on a
4096 x 4096 weight (M scaled to match), every case in every round (simulator/calibrate/
timing.interleaved: lower quartile of 9 rounds of >= 4 ms batches), so that clock drift
under load moves all cases alike. Prints TFLOP/s and narrow/wide.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from simulator.calibrate.timing import interleaved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="torch._scaled_mm in float8_e4m3fn, tensor-wise scales "
                    "(torchao's tensorwise recipe's GEMM)")
    args = ap.parse_args()
    cuda = not args.smoke and torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    scale = 1 if cuda else 64
    if cuda:
        p = torch.cuda.get_device_properties(0)
        what = "fp8 _scaled_mm(x[M,K], w[N,K].t())" if args.fp8 else "bf16 F.linear(x[M,K], w[N,K])"
        print(f"# {p.name}, torch {torch.__version__}, CUDA {torch.version.cuda}; {what}")
    wide = 4096 // scale
    cases = []  # (label, M, K, N)
    for m in (16384 // scale, 98304 // scale):
        for d in (128, 256, 384, 512, 1024, 1792):
            d = max(1, d // scale)
            cases.append((f"N={d}", m, wide, d))
            cases.append((f"K={d}", m, d, wide))
            cases.append((f"wide for N/K={d}", m * d // wide, wide, wide))
    fns, flops = [], []
    for _, m, k, n in cases:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        if args.fp8 and cuda:
            one = torch.ones((), device=dev)
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
            fns.append(lambda x8=x8, w8=w8, one=one: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                                       out_dtype=torch.bfloat16))
        else:
            fns.append(lambda x=x, w=w: F.linear(x, w))
        flops.append(2.0 * m * k * n)
    timed = interleaved(fns, rounds=9 if cuda else 1, sync=torch.cuda.synchronize if cuda else None)
    rate = {i: f / t.seconds / 1e12 for i, (f, t) in enumerate(zip(flops, timed))}
    print("label            M       K      N     TFLOP/s  narrow/wide  spread")
    for i in range(0, len(cases), 3):
        for j in (i, i + 1):
            label, m, k, n = cases[j]
            print(f"  {label:8s} {m:7d} {k:6d} {n:6d} {rate[j]:8.1f}  {rate[j] / rate[i + 2]:.3f}        "
                  f"{timed[j].spread:.3f}")
        label, m, k, n = cases[i + 2]
        print(f"  {'wide':8s} {m:7d} {k:6d} {n:6d} {rate[i + 2]:8.1f}  1            {timed[i + 2].spread:.3f}")


if __name__ == "__main__":
    main()
