"""Rates of the kernels behind the published rows llmsim misses most (docs/validation.md).

    python benchmarks/bench_kernels_cuda.py [--smoke]

On one CUDA GPU (bf16), prints TFLOP/s and the fraction of the profile-independent
datasheet peak given by --peak-tflops:
- PyTorch SDPA with the FlashAttention-2 backend (the flash kernel torchtitan's SDPA ran in
  2024-25) on the shapes of PyTorch's context-parallel ring with load balancing
  (torch/distributed/tensor/experimental/_attention.py): the local causal block, and the
  two half blocks of every later step (all queries against half the keys, half the queries
  against all keys), at the 8B model's 32 heads of 128, forward and backward separately;
  FLOPs as llmsim counts them (forward 4·Sq·Skv·d·heads, halved when causal; backward 2.5x);
- the GEMMs of one Llama 3.1 8B layer under TP 8 (torchtitan's separate wq/wk/wv, wo,
  w1/w3, w2) at 12 x 8192 tokens, against a square 8192 GEMM.
--smoke runs tiny shapes on the CPU (a syntax check, no numbers worth reading).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def timed(fn, reps: int, cuda: bool) -> float:
    """Median seconds of fn() over reps calls after three warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def attention(sq: int, skv: int, causal: bool, heads: int, dim: int, device, reps: int, cuda: bool):
    q = torch.randn(1, heads, sq, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, heads, skv, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, heads, skv, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, heads, sq, dim, device=device, dtype=torch.bfloat16)
    fwd_flops = 4.0 * sq * skv * dim * heads * (0.5 if causal else 1.0)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(grad)

    t_f = timed(fwd, reps, cuda)
    t_fb = timed(fwd_bwd, reps, cuda)
    return fwd_flops, t_f, max(t_fb - t_f, 1e-12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100/H200 SXM: 989)")
    args = ap.parse_args()
    cuda = not args.smoke and torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    scale = 1 if cuda else 256
    reps = 10 if cuda else 1
    peak = args.peak_tflops * 1e12
    if cuda:
        p = torch.cuda.get_device_properties(0)
        print(f"# {p.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = [SDPBackend.FLASH_ATTENTION] if cuda else [SDPBackend.MATH]
    print("attention (SDPA flash): shape, forward TFLOP/s (of peak), backward TFLOP/s (of peak)")
    s = 32768 // scale
    cases = [("causal 8192", 8192 // scale, 8192 // scale, True), ("causal 32768 (CP 1, a ring's first step)", s, s, True),
             ("all q x half kv (ring step)", s, s // 2, False), ("half q x all kv (ring step)", s // 2, s, False),
             ("non-causal 32768 x 32768", s, s, False)]
    with sdpa_kernel(backend):
        for name, sq, skv, causal in cases:
            flops, t_f, t_b = attention(sq, skv, causal, 32, 128, device, reps, cuda)
            print(f"  {name:42s} fwd {flops / t_f / 1e12:7.1f} ({flops / t_f / peak:.3f})  "
                  f"bwd {2.5 * flops / t_b / 1e12:7.1f} ({2.5 * flops / t_b / peak:.3f})  "
                  f"[{1e3 * t_f:.2f} + {1e3 * t_b:.2f} ms]")

    print("GEMMs of a Llama 3.1 8B layer, TP 8, 12 x 8192 tokens: M x K x N, TFLOP/s (of peak)")
    m = 12 * 8192 // scale
    shapes = [("square 8192", 8192 // scale, 8192 // scale, 8192 // scale), ("wq", m, 4096, 512), ("wk / wv", m, 4096, 128),
              ("wo", m, 512, 4096), ("w1 / w3", m, 4096, 1792), ("w2", m, 1792, 4096),
              ("wq grad input", m, 512, 4096), ("wq grad weight", 4096, m, 512), ("w2 grad weight", 1792, m, 4096)]
    for name, mm, kk, nn in shapes:
        a = torch.randn(mm, kk, device=device, dtype=torch.bfloat16)
        b = torch.randn(kk, nn, device=device, dtype=torch.bfloat16)
        t = timed(lambda: a @ b, reps, cuda)
        flops = 2.0 * mm * kk * nn
        print(f"  {name:16s} {mm:6d} x {kk:6d} x {nn:5d}  {flops / t / 1e12:7.1f} ({flops / t / peak:.3f})  "
              f"[{1e6 * t:.0f} us, {flops / 1e9:.0f} GFLOP]")


if __name__ == "__main__":
    main()
