"""An attention kernel's calls as a profile's kernel runs them: the causal blocks it computes
(efficiency.attention_tiles) and its rate in the keys each query runs over (attention_keys_half)."""

from dataclasses import replace

import numpy as np
import pytest

from attention_bands import DENSE, scenario as _scenario
from simulator import InputError
from simulator.attentiontiles import PYTORCH_CPU_FLASH, executed_fraction, tiled_pairs
from simulator.calibrate.calibration import KEYS_HALF_GRID, fit_keys_half
from simulator.compute import op_times
from simulator.hardware import accelerator_from_dict, load_accelerator, profiles_dir
from simulator.layermix import layer_operators
from simulator.workload import ATTENTION_CORE, Shard
from simulator.yamlio import load_yaml

H100 = load_accelerator("h100-sxm-80gb")
KEYS_HALF = 512.0


def _core(model: dict, **plan):
    sc = _scenario(model, **plan)
    shard = Shard(micro_batch=1, seq_len=sc.model.seq_len, cp=sc.plan.cp)
    return next(op for op in layer_operators(sc.model, shard, sc.plan) if op.group == ATTENTION_CORE)


def _slowdown(model: dict, acc=None, **plan) -> list[float]:
    """Forward, backward seconds of one layer's attention kernel on `acc` (default: the H100
    with a keys half of 512) over the H100's."""
    core = _core(model, **plan)
    slow = op_times(core, acc or replace(H100, attention_keys_half=KEYS_HALF), "bf16")
    fast = op_times(core, H100, "bf16")
    return [float(slow.fwd_s / fast.fwd_s), float(slow.bwd_input_s / fast.bwd_input_s)]


def test_causal_attention_over_a_sequence_runs_at_its_keys_per_query_over_the_keys_half():
    # 4096 tokens, causal: 2048 keys per query, (2048 + 512) / 2048 of the time
    assert _slowdown(DENSE) == pytest.approx([1.25, 1.25], rel=1e-12)


def test_packed_documents_run_each_query_over_its_own_documents_keys():
    # documents of 256: 16 x 256²/2 pairs over 4096 queries = 128 keys each, (128 + 512) / 128
    assert _slowdown({**DENSE, "document_tokens": 256}) == pytest.approx([5.0, 5.0], rel=1e-12)


@pytest.mark.parametrize("method,plan,keys", [
    ("ring", {}, 2048 / 4),  # a call a step over one chunk: a query's keys spread over 4 steps
    ("torch-allgather", {}, 2048 / 4),  # PyTorch loops over the gathered chunks all the same
    ("ulysses-ring", {"cp_ulysses": 2}, 2048 / 2),  # the ring over 4 / 2 groups
    ("kv-allgather", {}, 2048),  # every query over all its keys in one call
    ("ulysses", {}, 2048),  # whole sequences of heads / cp heads
])
def test_context_parallel_calls_run_over_the_keys_of_one_step(method, plan, keys):
    got = _slowdown(DENSE, cp=4, dp=2, cp_attention=method, **plan)
    assert got == pytest.approx([(keys + KEYS_HALF) / keys] * 2, rel=1e-12)


def test_a_profile_without_tiles_or_keys_half_times_attention_by_its_flop_curve_alone():
    # forward: QK^T and AV over the causal half, 2 x 4096² x 1024 FLOPs, at 989 TFLOP/s x 0.59
    # after the curve's 5.6e10 FLOPs of start-up (h100-sxm-80gb)
    assert H100.attention_keys_half == 0.0 and H100.attention_tiles is None
    assert op_times(_core(DENSE), H100, "bf16").fwd_s == pytest.approx(
        (2 * 4096**2 * 1024 + 5.6e10) / (989e12 * 0.59), rel=1e-12)


def test_pytorchs_cpu_kernel_computes_causal_attention_over_512_tokens_as_full_attention():
    # 8 query blocks of 64 rows, each over the one block of 512 keys
    assert tiled_pairs(512, PYTORCH_CPU_FLASH) == 512 * 512
    # under 192 queries: blocks of 32 rows over the one block of 128 keys
    assert tiled_pairs(128, PYTORCH_CPU_FLASH) == 128 * 128


def test_pytorchs_cpu_kernel_skips_the_key_blocks_after_a_query_block():
    # 1,024 tokens: 4 query blocks of 256 rows over 512, 512, 1024 and 1024 keys
    assert tiled_pairs(1024, PYTORCH_CPU_FLASH) == 256 * (512 + 512 + 1024 + 1024)
    # 1,000 tokens: blocks of 256, 256, 256 and 232 rows; the second block of keys holds 488
    assert tiled_pairs(1000, PYTORCH_CPU_FLASH) == 256 * 512 + 256 * 512 + 256 * 1000 + 232 * 1000


def test_packed_documents_are_tiled_one_by_one():
    # 4,096 tokens as 16 documents of 256: each computed in full, twice its causal half
    assert executed_fraction(((256, 16),), PYTORCH_CPU_FLASH) == 2.0
    tiled = replace(H100, attention_tiles=PYTORCH_CPU_FLASH)
    core = _core({**DENSE, "document_tokens": 256})
    half = 16 * 256**2 / 2 * 4 * 1024  # forward FLOPs of the documents' causal pairs
    assert op_times(core, tiled, "bf16").fwd_s == pytest.approx((2 * half + 5.6e10) / (989e12 * 0.59), rel=1e-12)


@pytest.mark.parametrize("model,plan", [
    ({**DENSE, "sliding_window": 1024}, {}),  # windowed calls are no whole causal documents
    (DENSE, {"cp": 4, "dp": 2, "cp_attention": "ring"}),  # a ring's steps hold chunks
    (DENSE, {"cp": 4, "dp": 2, "cp_attention": "kv-allgather"}),
])
def test_calls_that_are_not_whole_causal_documents_are_counted_at_the_causal_half(model, plan):
    assert _slowdown(model, replace(H100, attention_tiles=PYTORCH_CPU_FLASH), **plan) == [1.0, 1.0]


def test_without_context_parallelism_the_cp_method_named_changes_nothing():
    tiled = replace(H100, attention_tiles=PYTORCH_CPU_FLASH, attention_keys_half=KEYS_HALF)
    want = op_times(_core(DENSE), tiled, "bf16")
    for method in ("kv-allgather", "ring", "torch-allgather"):
        got = op_times(_core(DENSE, cp_attention=method), tiled, "bf16")
        assert (got.fwd_s, got.bwd_input_s) == (want.fwd_s, want.bwd_input_s), method


def test_ulysses_calls_attend_whole_sequences_and_are_tiled():
    # 4,096 tokens in blocks of 256 rows over 512-key blocks: 1.0625 of the causal half
    tiled = replace(H100, attention_tiles=PYTORCH_CPU_FLASH)
    core = _core(DENSE, cp=4, dp=2, cp_attention="ulysses")
    executed = 256 * 512 * 2 * sum(range(1, 9)) / (4096**2 / 2)
    assert executed == 1.125
    flops = core.fwd_flops
    assert op_times(core, tiled, "bf16").fwd_s == pytest.approx((executed * flops + 5.6e10) / (989e12 * 0.59),
                                                               rel=1e-12)


def _attention_samples(keys_half: float, tiles=None) -> list[dict]:
    """Causal SDPA samples of the calibration's CPU shapes whose times follow a FLOP curve (max
    0.3, half 1e6) over the pairs `tiles` compute, times (K + keys_half) / K, K those pairs per
    query, on a 100 GFLOP/s peak."""
    out = []
    for b, h, s, d in [(b, h, s, 64) for b in (1, 4) for h in (2, 8) for s in (128, 256, 512)] + [
            (1, h, s, 64) for h in (2, 8) for s in (1024, 2048)]:
        executed = tiled_pairs(s, tiles) / (s * s / 2) if tiles else 1.0
        for pass_, flops in (("fwd", 2 * b * h * s * s * d), ("bwd", 5 * b * h * s * s * d)):
            k = executed * s / 2
            seconds = (executed * flops + 1e6) / (100e9 * 0.3) * (k + keys_half) / k
            out.append({"op": "sdpa_causal", "kind": "attention", "shape": [b, h, s, d], "dtype": "fp32",
                        "pass": pass_, "work": flops, "seconds": seconds})
    return out


@pytest.mark.parametrize("tiles", [None, PYTORCH_CPU_FLASH])
@pytest.mark.parametrize("keys_half", [0.0, 398.1])
def test_calibration_recovers_the_keys_half_its_samples_follow(keys_half, tiles):
    fit = fit_keys_half(_attention_samples(keys_half, tiles), 100e9, tiles)
    grid = np.array(KEYS_HALF_GRID)
    assert fit["keys_half"] == grid[np.argmin(abs(grid - keys_half))]
    assert fit["rel_rms"] < 1e-3 <= fit["rel_rms_without"] or keys_half == 0.0


def test_samples_of_fewer_than_three_sequence_lengths_leave_the_keys_half_unfitted():
    samples = [s for s in _attention_samples(398.1) if s["shape"][2] in (128, 256)]
    assert fit_keys_half(samples, 100e9) is None


@pytest.mark.parametrize("field,value", [
    ("attention_keys_half", -1),
    ("attention_tiles", {"kv": 512, "q": [[192, 64]]}),  # no block size below 192 queries
    ("attention_tiles", {"kv": 512, "q": [[0, 32], [768, 256], [192, 64]]}),
    ("attention_tiles", {"kv": 0, "q": [[0, 32]]}),
])
def test_a_bad_attention_kernel_description_is_refused(field, value):
    data = dict(load_yaml(profiles_dir() / "accelerators" / "a100-sxm-80gb.yaml", "profile"))
    data["efficiency"] = {**data["efficiency"], field: value}
    with pytest.raises(InputError, match=rf"efficiency\.{field}"):
        accelerator_from_dict(data, "a100")


def test_a_cpu_calibration_states_its_kernels_tiles_and_fits_the_pairs_it_computes():
    from simulator.calibrate.calibration import fit_all
    from simulator.calibrate.profile_writer import build_profiles

    gemms = [{"op": "linear", "kind": "matmul", "shape": [], "dtype": "fp32", "pass": "fwd", "work": w,
              "seconds": w / 100e9} for w in (1e8, 1e9, 1e10)]
    copies = [{"op": "copy", "kind": "memory", "kernel": "copy", "shape": [], "dtype": "fp32", "pass": "fwd",
               "work": b, "seconds": b / 20e9} for b in (1e6, 1e8)]
    samples = gemms + copies + _attention_samples(0.0, PYTORCH_CPU_FLASH)
    collectives = [{"ranks": 2, "bytes": b, "seconds": 20e-6 + b / 2e9} for b in (1e3, 1e6, 1e8)]
    fits = fit_all(samples, collectives, tiles=PYTORCH_CPU_FLASH)
    info = {"device": "cpu", "threads": 1, "quick": False, "torch": "2.13.0", "date": "2026-12-05T00:00:00Z",
            "devices_per_node": 2, "cpu_model": "CPU", "memory_bytes": 2**34, "tdp_w": 10.0,
            "framework_overhead_bytes": 2**28, "host_memory_bytes": 2**35}
    acc = accelerator_from_dict(build_profiles("synthetic", info, fits, samples, collectives)[0], "synthetic")
    assert acc.attention_tiles == PYTORCH_CPU_FLASH and acc.attention_keys_half == 0.0
    assert (acc.attention.max, acc.attention.half) == pytest.approx((0.3, 1e6), rel=1e-3)
