"""CPU GEMMs over a short reduction dimension against wide ones of the same FLOPs (one thread).

    python benchmarks/bench_narrow_gemm_cpu.py [fp32|bf16]

The CUDA profiles slow a GEMM by K / (K + matmul_k_half) for its reduction dimension K
(compute._reduced; benchmarks/bench_narrow_gemm_cuda.py on an H200); the CPU profiles have no
such factor. This times, at 1.07 GFLOP each, the weight-gradient GEMM over K tokens
(g.t() @ x, as a linear's backward runs it) and the forward over K input features
(F.linear(x[1024, K], w[N, K])) for K = 32 ... 2048, on one thread set up as `llmsim
calibrate` sets it (simulator/calibrate/device.py), every case in every round on the CPU clock
(simulator/calibrate/timing.interleaved, as the calibration times its microbenchmarks), and
prints each rate over the widest case's.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from simulator.calibrate.device import configure
from simulator.calibrate.timing import interleaved

FLOPS = 2 * 512 * 1024 * 1024
KS = (32, 64, 128, 256, 512, 1024, 2048)


def main() -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1] if len(sys.argv) > 1 else "fp32"]
    configure(1, "cpu")
    fns, flops = [], []
    for k in KS:
        side = int((FLOPS // (2 * k)) ** 0.5)  # the weight gradient's M = N
        g, x = torch.randn(k, side, dtype=dtype), torch.randn(k, side, dtype=dtype)
        n = FLOPS // (2 * k * 1024)
        xf, w = torch.randn(1024, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        fns += [lambda g=g, x=x: g.t() @ x, lambda xf=xf, w=w: F.linear(xf, w)]
        flops += [2 * k * side * side, FLOPS]
    rates = [f / t.seconds for f, t in zip(flops, interleaved(fns, clock="cpu"))]
    rows = [(k, rates[2 * i], rates[2 * i + 1]) for i, k in enumerate(KS)]
    wide_w, wide_f = rows[-1][1], rows[-1][2]
    print(f"# torch {torch.__version__}, {dtype}, one thread, 1.07 GFLOP per GEMM; GFLOP/s and rate / K = {KS[-1]}'s")
    print("    K   weight gradient (K tokens)    forward (K input features)")
    for k, w_rate, f_rate in rows:
        print(f"{k:5d}   {w_rate / 1e9:7.1f}  {w_rate / wide_w:5.2f}              {f_rate / 1e9:7.1f}  {f_rate / wide_f:5.2f}")


if __name__ == "__main__":
    main()
