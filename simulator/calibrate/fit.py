"""Fits: efficiency curves for compute and memory, alpha-beta for collectives (scipy.optimize.curve_fit).

Efficiency (hardware.Efficiency, compute.py): an operation of size x (FLOPs or bytes) on a
resource of peak rate P takes t(x) = (x + half) / (P·max), i.e. it runs at eff(x) =
max·x/(x + half) of the peak. The fit minimises the relative error of t over the samples
(sigma = measured time), with 0 < max <= 1 and half >= 0.

Collectives (comm.py): a ring all-reduce over n ranks takes 2(n-1)·latency +
2(n-1)/n·S / busbw. With n = 2 that is 2·latency + S/busbw; fitted the same way.
"""

from __future__ import annotations

import math

import numpy as np


def _rel_rms(pred, meas) -> float:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.sqrt(np.mean(((pred - meas) / meas) ** 2)))


def fit_efficiency(work, seconds, peak: float) -> dict:
    """max, half and the fit's relative RMS error for samples (work, seconds) against `peak` (work/s)."""
    import warnings

    from scipy.optimize import OptimizeWarning, curve_fit

    warnings.simplefilter("ignore", OptimizeWarning)  # two-sample fits have no covariance; fine
    x = np.asarray(work, float)
    t = np.asarray(seconds, float)
    if len(x) < 2:
        raise ValueError("need at least two samples to fit an efficiency curve")
    # Parameterise half by log10 so that the optimiser sees well-scaled parameters.
    def model(xv, m, log_half):
        return (xv + 10.0 ** log_half) / (peak * m)

    best = None
    for lh0 in (np.log10(np.median(x)) - 2, np.log10(np.median(x))):
        try:
            popt, _ = curve_fit(model, x, t, p0=(0.7, lh0), sigma=t, bounds=((1e-6, -3.0), (1.0, 16.0)),
                                maxfev=20000)
        except RuntimeError:
            continue
        err = _rel_rms(model(x, *popt), t)
        if best is None or err < best[1]:
            best = (popt, err)
    if best is None:
        raise ValueError("the efficiency fit did not converge")
    (m, log_half), err = best
    half = 10.0 ** log_half
    if half < 1.0:  # below one FLOP or byte of fixed cost: a constant efficiency
        half = 0.0
    return {"max": float(m), "half": float(half), "rel_rms": err, "samples": int(len(x))}


def fit_spill(work, seconds, peak: float) -> dict:
    """fit_efficiency plus a spill point: beyond `spill` units of work the rate drops to
    `spill_max` of the peak (hardware.Efficiency; a CPU core's data outgrowing its private cache).

    Kept only where it fits clearly better than the plain curve (relative RMS at most 3/4 of
    it) and at least 6 samples support its four parameters; otherwise the plain fit is returned.
    """
    from scipy.optimize import curve_fit

    plain = fit_efficiency(work, seconds, peak)
    x = np.asarray(work, float)
    t = np.asarray(seconds, float)
    if len(x) < 6:
        return plain

    def model(xv, m, log_half, log_spill, ratio):
        return ((xv + 10.0 ** log_half) / (peak * m)
                + np.maximum(xv - 10.0 ** log_spill, 0.0) * (1.0 / (m * ratio) - 1.0 / m) / peak)

    best = None
    lo, hi = np.log10(x.min()), np.log10(x.max())
    for ls0 in np.linspace(lo, hi, 5)[1:-1]:
        try:
            popt, _ = curve_fit(model, x, t, p0=(min(1.0, plain["max"] * 1.5), np.log10(np.median(x)) - 2, ls0, 0.4),
                                sigma=t, bounds=((1e-6, -3.0, lo, 0.01), (1.0, 16.0, hi, 1.0)), maxfev=20000)
        except RuntimeError:
            continue
        err = _rel_rms(model(x, *popt), t)
        if best is None or err < best[1]:
            best = (popt, err)
    if best is None or best[1] > 0.75 * plain["rel_rms"]:
        return plain
    (m, log_half, log_spill, ratio), err = best
    half = 10.0 ** log_half
    return {"max": float(m), "half": float(half if half >= 1.0 else 0.0), "spill": float(10.0 ** log_spill),
            "spill_max": float(m * ratio), "rel_rms": err, "samples": int(len(x))}


def fit_allreduce(nbytes, seconds, ranks: int) -> dict:
    """Per-step latency (s) and bus bandwidth (B/s) of a ring all-reduce over `ranks` processes."""
    from scipy.optimize import curve_fit

    s = np.asarray(nbytes, float)
    t = np.asarray(seconds, float)
    steps = 2 * (ranks - 1)
    factor = 2 * (ranks - 1) / ranks

    def model(sv, lat_us, log_bw):
        return steps * lat_us * 1e-6 + factor * sv / 10.0 ** log_bw

    popt, _ = curve_fit(model, s, t, p0=(10.0, 9.0), sigma=t, bounds=((0.0, 6.0), (1e5, 13.0)), maxfev=20000)
    lat_us, log_bw = popt
    return {"latency_s": float(lat_us) * 1e-6, "bus_bytes_per_s": float(10.0 ** log_bw),
            "rel_rms": _rel_rms(model(s, *popt), t), "samples": int(len(s))}


def best_rate(samples: list[dict]) -> float:
    """The highest work/second among samples (the measured peak)."""
    rates = [s["work"] / s["seconds"] for s in samples if s["seconds"] > 0]
    if not rates:
        return math.nan
    return max(rates)
