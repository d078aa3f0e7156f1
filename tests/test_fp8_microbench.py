"""torchao's rowwise FP8 cast path against its published H100 speedup table: the profile's
cast curve reproduces the table, the roofline bytes alone do not."""

import numpy as np
import pytest

from simulator.hardware import cluster_from_dict
from simulator.validation.fp8_microbench import CAST_KERNEL, fit_rowwise_cast, linear_speedup, load_table, log_errors


@pytest.fixture(scope="module")
def h100():
    return cluster_from_dict({"node": "dgx-h100", "nodes": 1}).accelerator


def test_the_h100_profile_reproduces_torchaos_rowwise_speedup_table(h100):
    errors = log_errors(h100, load_table())
    assert len(errors) == 216
    assert np.sqrt(np.mean(errors**2)) < 0.15 and abs(np.mean(errors)) < 0.05


def test_rowwise_fp8_is_slower_than_bf16_for_small_linears_and_faster_for_large_ones(h100):
    # the table: 0.51 at 32768 x 1024 x 1024, 1.52-1.73 at 32768 x 16384+ x 16384+
    assert linear_speedup(h100, 32768, 1024, 1024) < 0.8
    assert linear_speedup(h100, 32768, 16384, 16384) > 1.3


def test_the_fit_recovers_the_profiles_cast_curve_and_holds_out_of_sample(h100):
    fit = fit_rowwise_cast(h100)
    shipped = h100.memory_kernels[CAST_KERNEL]
    assert fit.curve.max == pytest.approx(shipped.max, rel=0.01)
    assert fit.curve.half == pytest.approx(shipped.half, rel=0.05)
    assert max(fit.held_out.values()) < 0.2 < 0.3 < fit.roofline_rms_log_error
