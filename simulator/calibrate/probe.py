"""The machine's speed now, relative to when it was calibrated: a fixed probe of kernels.

On a shared machine the speed of a core drifts by tens of percent over minutes (other
tenants of the host's cores and caches), steadily enough that every round of a measurement
agrees and the next run is 35 % slower (docs/calibration.md, "Noise"). A profile describes
the machine at calibration time; `llmsim validate --torch` runs minutes or days later. So
`llmsim calibrate` times this probe among its microbenchmarks (once in every interleaved
group) and records it (`calibration.probe_s`), and `llmsim validate --torch` times it again
before every configuration's timed steps in every round (the other ranks idle): the median
ratio over the run is the machine's speed during validation relative to calibration, and
the steps are compared with the predictions at the calibration-time speed (the measured
step divided by the ratio; both are reported). The probe is microbenchmarks, not training
steps, so nothing is fitted to the validation runs. Not on a GPU: there the probe reads the
clock its own power draw sets, not the steps' (validate_torch.run_validation).

The probe does a training step's kinds of work in one precision: GEMMs (forward, and
backward with a transposed operand), causal attention, a norm, GELU, and a copy beyond the
private cache. There is one probe per calibrated precision and a configuration is compared
with the probe of its own: on the development machine bf16 (AMX) steps swung by up to 2x
from round to round while fp32 ones stayed within 10 %.

Its GEMMs are also timed alone (the probe named "<precision>-gemm"): the AMX GEMMs of the
development machine ran 1.9x faster in one hour than in the hour the profile was calibrated
in while the whole probe, a quarter of it GEMMs, moved by 5 % (docs/calibration.md). A
calibration rescales its GEMM samples by the GEMM probe, and a validation corrects a
configuration by both: the GEMM probe for the share of its predicted step spent in GEMMs,
the rest of the probe for the rest (validate_torch.gemm_share).
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16")
GEMM = "-gemm"  # suffix of a precision's GEMM-only probe


def names(precision: str) -> tuple[str, str]:
    """The whole probe's name and its GEMMs' in `precision`."""
    return precision, precision + GEMM


def make_probe(device: str = "cpu", name: str = "fp32"):
    """A function running the probe's kernels once (about 5-20 ms); `name` is a precision, or a
    precision + "-gemm" for its GEMMs alone."""
    import torch
    import torch.nn.functional as F

    precision, gemm_only = name.removesuffix(GEMM), name.endswith(GEMM)

    dev = torch.device(device)
    big = device == "cuda"
    t, d, f = (4096, 2048, 8192) if big else (512, 256, 1024)
    dt = getattr(torch, {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[precision])
    x, w, g = (torch.randn(*s, device=dev, dtype=dt) for s in ((t, d), (f, d), (t, f)))
    h = torch.randn(t, f, device=dev, dtype=dt)
    qkv = torch.randn(2, t // 2, 3 * d, device=dev, dtype=dt)
    q, k, v = (a.view(2, t // 2, 4, d // 4).transpose(1, 2) for a in qkv.split(d, dim=-1))
    ln = torch.nn.LayerNorm(d, device=dev, dtype=dt)
    src = torch.randn(2**25 if big else 2**21, device=dev)
    dst = torch.empty_like(src)

    def gemms():
        with torch.no_grad():
            F.linear(x, w)
            g.t() @ x

    if gemm_only:
        return gemms

    def probe():
        gemms()
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ln(x)
            F.gelu(h)
            dst.copy_(src)

    return probe
