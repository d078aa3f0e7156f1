"""`llmsim calibrate` and `llmsim validate --torch`: the pipeline runs and its numbers are sane.

Quick versions only (a few shapes, three tiny configurations); no timing asserts beyond a
loose sanity factor: CI machines are noisy. CUDA tests skip without a GPU.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")

from simulator.calibrate.calibration import cpu_has_bf16  # noqa: E402
from simulator.cli import main  # noqa: E402
from simulator.hardware import cluster_from_dict, load_accelerator, load_node  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SANITY = 3.0  # predictions within this factor of measurements


@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "quick-cpu.yaml"
    # one thread, CPU clock: robust to other work on a shared CI machine
    assert main(["calibrate", "--device", "cpu", "--quick", "--threads", "1", "--clock", "cpu", "-o", str(out),
                 "--json"]) == 0
    return out


def test_a_calibrated_profile_states_a_source_for_every_number(quick_profile):
    from simulator.provenance import provenance_rows, unsourced
    from simulator.yamlio import load_yaml

    stem = quick_profile.with_suffix("")
    for path in (quick_profile, Path(f"{stem}-node.yaml"), Path(f"{stem}-net.yaml")):
        assert unsourced(provenance_rows(load_yaml(path))) == [], path.name


def test_profile_loads_with_the_normal_loader(quick_profile):
    acc = load_accelerator(str(quick_profile))
    assert acc.name == "quick-cpu"
    for eff in (acc.matmul, acc.attention, acc.memory, *acc.memory_kernels.values()):
        assert 0 < eff.max <= 1 and eff.half >= 0
    assert {"norm", "gelu", "cross_entropy", "optimizer"} <= set(acc.memory_kernels)
    assert 1e9 < acc.peak("fp32") < 1e15
    assert acc.hbm_bytes_per_s > 1e8
    node = load_node(str(quick_profile.with_name("quick-cpu-node.yaml")))
    assert node.devices_per_node >= 1 and node.scaleup.bytes_per_s > 0 and node.scaleup.latency_s > 0
    cluster = cluster_from_dict({"node": str(quick_profile.with_name("quick-cpu-node.yaml"))})
    assert cluster.accelerator.name == "quick-cpu"
    data = __import__("yaml").safe_load(quick_profile.read_text())
    cal = data["calibration"]
    assert cal["torch"] == str(torch.__version__) and cal["device"] == "cpu" and cal["threads"] >= 1
    assert cal["date"] and len(cal["samples"]) > 10 and len(cal["collective_samples"]) >= 3


def test_validate_torch_quick_is_sane(quick_profile, capfd):
    rc = main(["validate", "--torch", "--quick", "--profile", str(quick_profile), "--json"])
    assert rc == 0
    captured = capfd.readouterr()
    out = json.loads(captured.out)
    rows = out["rows"]
    assert len(rows) >= 2 and math.isfinite(out["mape_pct"]) and math.isfinite(out["memory_mape_pct"])
    for r in rows:
        for meas, pred in ((r["measured_step_s"], r["predicted_step_s"]),
                           (r["measured_memory_mib"], r["predicted_memory_mib"])):
            assert math.isfinite(pred) and pred > 0 and meas > 0
            assert 1 / SANITY < pred / meas < SANITY, r
        assert r["noise_pct"] >= 0 and len(r["cpu_times_s"]) >= 3
    assert any(r["dp"] == 2 for r in rows) and any(r["recompute"] == "full" for r in rows)
    assert any(r["experts"] for r in rows)  # an MoE layer trained and predicted end to end
    assert any(r["precision"] == "bf16" for r in rows) == cpu_has_bf16()
    assert "USDT" not in captured.err and "profiler_start" not in captured.err  # the profiler's chatter is gone
    # the rows are recorded in the profile they validated (this machine's): prediction intervals use them
    assert out["recorded"] == str(quick_profile)
    acc = load_accelerator(str(quick_profile))
    assert len(acc.validation_residuals) == len(rows) and "validate --torch" in acc.validation_basis


def test_profile_has_per_pass_curves_host_overhead_and_the_cpus_low_precisions(quick_profile):
    acc = load_accelerator(str(quick_profile))
    assert {"matmul_bwd_input", "matmul_bwd_weight", "attention_bwd"} <= set(acc.pass_efficiency)
    assert {"bias_grad", "grad_accumulate", "zero_fill"} <= set(acc.memory_kernels)
    assert set(acc.host_overhead_s) == {"microbatch", "step", "param_tensor"} and acc.op_overhead_s > 0
    if cpu_has_bf16():
        assert acc.peak("bf16") > acc.peak("fp32") and "matmul" in acc.precision_efficiency["bf16"]
    else:
        assert "bf16" not in acc.peak_flops
    # SDPA's CPU flash kernel, counted by its blocks; three sequence lengths fit its keys half
    from simulator.attentiontiles import PYTORCH_CPU_FLASH
    assert acc.attention_tiles == PYTORCH_CPU_FLASH and acc.attention_keys_half >= 0
    cal = __import__("yaml").safe_load(quick_profile.read_text())["calibration"]
    assert cal["flush_denormal"] is True and cal["clock"] == "cpu" and 0 <= cal["noise"]["median_spread"] < 1


def test_device_flushes_subnormal_floats():
    from simulator.calibrate.device import configure

    before = torch.get_num_threads()
    try:
        configure(1)
        assert torch.tensor([1e-39]).mul(1.0).item() == 0.0  # a subnormal operand reads as zero
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(before)


def test_validation_model_feeds_no_subnormal_operands_to_its_gemms():
    """The Intel miss: torch's N(0, 1) embedding tied to the lm_head gave softmax probabilities
    below the smallest normal float, and the lm_head's backward GEMMs ran ~50x slower on them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from simulator.calibrate.torch_model import GPTConfig, build_model

    tiny = torch.finfo(torch.float32).tiny
    subnormal = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("mm", "addmm"):
                subnormal.extend(int(((a.abs() < tiny) & (a != 0)).sum()) for a in args if torch.is_tensor(a))
            return func(*args, **(kwargs or {}))

    torch.set_flush_denormal(False)
    model = build_model(GPTConfig(layers=2, hidden=128, heads=4, vocab=512, seq_len=128))
    idx = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(0))
    with Watch():
        model(idx, idx).backward()
    assert subnormal and sum(subnormal) == 0


def test_fit_recovers_a_cache_spill():
    from simulator.calibrate.fit import fit_spill

    x = np.logspace(4, 8, 14)
    peak, m, spill, spill_max = 50e9, 0.9, 2e6, 0.25
    t = x / (peak * m) + np.maximum(x - spill, 0) * (1 / spill_max - 1 / m) / peak
    f = fit_spill(x, t, peak)
    assert f["spill"] == pytest.approx(spill, rel=0.05) and f["spill_max"] == pytest.approx(spill_max, rel=0.02)
    assert f["max"] == pytest.approx(m, rel=0.02)


def test_interleaved_timing_orders_work_and_reports_spread():
    from simulator.calibrate.timing import interleaved

    a, b = torch.randn(64, 64), torch.randn(256, 256)
    small, large = interleaved([lambda: a @ a, lambda: b @ b], rounds=5, min_batch_s=0.001, clock="cpu")
    assert 0 < small.seconds < large.seconds and small.rounds == 5 and small.spread >= 0


def test_fit_recovers_a_known_curve():
    from simulator.calibrate.fit import fit_allreduce, fit_efficiency

    x = np.logspace(5, 10, 12)
    peak = 1e11
    t = (x + 3e7) / (peak * 0.8)
    f = fit_efficiency(x, t, peak)
    assert f["max"] == pytest.approx(0.8, rel=1e-3) and f["half"] == pytest.approx(3e7, rel=1e-2)
    s = np.logspace(3, 8, 8)
    ar = fit_allreduce(s, 2 * 50e-6 + s / 2e9, ranks=2)
    assert ar["latency_s"] == pytest.approx(50e-6, rel=1e-2) and ar["bus_bytes_per_s"] == pytest.approx(2e9, rel=1e-2)


def test_cpu_peak_memory_counts_live_tensor_bytes():
    from simulator.calibrate.memtrack import peak_live_bytes

    x = torch.randn(256, 1024, requires_grad=True)  # 1 MiB

    def step():
        y = (x * 2).relu()  # two 1 MiB tensors live, then the gradient
        y.sum().backward()

    peak = peak_live_bytes(step, baseline=2**20)
    assert 3 * 2**20 <= peak <= 5 * 2**20


def test_import_simulator_does_not_import_torch():
    code = ("import sys, simulator, simulator.cli, simulator.calibrate; "
            "assert 'torch' not in sys.modules and 'scipy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_missing_torch_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert main(["calibrate", "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install -e '.[calibrate]'" in err
    assert main(["validate", "--torch"]) == 2
    assert "pip install" in capsys.readouterr().err


def test_bad_output_path_is_exit_2(capsys, tmp_path):
    assert main(["calibrate", "--quick", "-o", str(tmp_path / "x.txt")]) == 2
    assert "-o" in capsys.readouterr().err


def test_committed_calibrated_profile_loads_by_name():
    folder = ROOT / "hardware_profiles" / "calibrated"
    names = [p.stem for p in folder.glob("*-node.yaml")]
    assert names, "a calibrated profile is committed"
    for node_name in names:
        node = load_node(node_name)
        acc = load_accelerator(node.accelerator)
        assert acc.peak("fp32") > 0 and 0 < acc.matmul.max <= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_calibrate_and_validate_quick(tmp_path, capsys):
    out = tmp_path / "quick-cuda.yaml"
    assert main(["calibrate", "--device", "cuda", "--quick", "-o", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["validate", "--torch", "--device", "cuda", "--quick", "--profile", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(math.isfinite(r["predicted_step_s"]) for r in rows)


def test_memory_bound_cases_cycle_through_tensors_filling_the_cold_pool():
    # each call of a memory-bound case takes the next of ceil(256 MB / its bytes) copies, so
    # a loop over the case never finds its tensors in a cache (microbench.Bench.cold)
    from simulator.calibrate.microbench import COLD_POOL_BYTES, Bench

    nbytes = 4 * 2**20
    nxt = Bench(quick=True).cold(lambda: (torch.empty(2**20),), nbytes)
    first = [nxt()[0].data_ptr() for _ in range(COLD_POOL_BYTES // nbytes)]
    assert len(set(first)) == COLD_POOL_BYTES // nbytes == 64
    assert nxt()[0].data_ptr() == first[0]  # then round again


def _samples_on_curve(kind: str, dtype: str, passes, works, peak: float, eff_max: float, half: float) -> list[dict]:
    """Samples whose times follow work / (peak·max·work/(work + half)) exactly."""
    return [{"op": kind, "kind": kind, "shape": [], "dtype": dtype, "pass": p, "work": w,
             "seconds": (w + half) / (peak * eff_max)} for p in passes for w in works]


def test_sdpas_flash_backend_samples_become_the_profiles_flashattention2_curve():
    """On CUDA the default SDPA kernel (cuDNN's on Hopper) is `attention`; SDPA restricted to
    its flash backend, measured beside it in bf16, is efficiency.attention_flash2, one curve
    over both passes against the bf16 peak."""
    from simulator.calibrate.calibration import fit_all
    from simulator.calibrate.profile_writer import build_profiles
    from simulator.hardware import accelerator_from_dict

    gemm = (1e9, 1e10, 1e11)
    samples = (_samples_on_curve("matmul", "fp32", ("fwd",), gemm, 50e12, 1.0, 0.0)
               + _samples_on_curve("matmul", "bf16", ("fwd",), gemm, 800e12, 1.0, 0.0)
               + _samples_on_curve("attention", "fp32", ("fwd", "bwd"), gemm, 50e12, 0.6, 2e9)
               + _samples_on_curve("attention", "bf16", ("fwd", "bwd"), gemm, 800e12, 0.6, 2e9)
               + _samples_on_curve("attention_flash2", "bf16", ("fwd", "bwd"), gemm, 800e12, 0.3, 1e9))
    samples += [{**s, "op": "copy", "kernel": "copy"} for s in
                _samples_on_curve("memory", "fp32", ("fwd",), (1e6, 1e8), 3e12, 1.0, 0.0)]
    collectives = [{"ranks": 2, "bytes": b, "seconds": 20e-6 + b / 100e9} for b in (1e3, 1e6, 1e8)]
    fits = fit_all(samples, collectives)
    info = {"device": "cuda", "threads": 1, "quick": False, "torch": "2.13.0", "date": "2026-12-05T00:00:00Z",
            "devices_per_node": 1, "gpu_name": "GPU", "memory_bytes": 80 * 2**30, "tdp_w": 700.0,
            "framework_overhead_bytes": 2**30, "host_memory_bytes": 2**40}
    acc, _, _ = build_profiles("synthetic", info, fits, samples, collectives)
    loaded = accelerator_from_dict(acc, "synthetic")
    assert loaded.attention_flash2.max == pytest.approx(0.3, rel=1e-2)
    assert loaded.attention_flash2.half == pytest.approx(1e9, rel=1e-2)
    assert not loaded.attention_is_flash2


def test_a_cpu_profiles_attention_is_sdpas_flash_kernel(quick_profile):
    """On a CPU the attention samples run SDPA restricted to its flash backend, so a plan that
    names FlashAttention-2 runs at the profile's own attention curves."""
    acc = load_accelerator(str(quick_profile))
    assert acc.attention_is_flash2 and acc.attention_flash2 is None


def test_attention_is_not_called_flashattention2_where_sdpas_flash_backend_declines(monkeypatch):
    """A device whose SDPA has no flash kernel for the inputs (here: SDPA held to cuDNN's
    backend, which a CPU lacks) is timed with its default kernel and claims no FlashAttention-2."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from simulator.calibrate.microbench import Bench

    bench = Bench("cpu", quick=True, rounds=1)
    monkeypatch.setattr(bench, "_flash_only", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    bench.attention("fp32")
    assert not bench.attention_is_flash2
    assert {s["kind"] for s in bench.samples} == {"attention"}


def test_sdpa_held_to_its_flash_backend_is_timed_beside_the_default_kernel():
    """The CUDA path (Bench.times_flash2_beside), run on this CPU: bf16 samples of SDPA held to
    its flash backend, forward and backward per shape, the kind fit_all turns into the
    attention_flash2 curve."""
    from simulator.calibrate.microbench import Bench

    bench = Bench("cpu", quick=True, rounds=1)
    bench.times_flash2_beside = True
    bench.attention("bf16")
    flash = [s for s in bench.samples if s["kind"] == "attention_flash2"]
    shapes = bench.attention_shapes()
    assert len(flash) == 2 * len(shapes) and {s["pass"] for s in flash} == {"fwd", "bwd"}
    assert all(s["op"] == "sdpa_flash_causal" and s["dtype"] == "bf16" and s["seconds"] > 0 for s in flash)


def test_the_validation_models_packed_documents_attend_only_inside_themselves():
    """Tokens of the second of two 64-token documents see nothing of the first: changing the
    first document's input leaves the second's layer output unchanged, and changes it where the
    sequence is one causal document."""
    from simulator.calibrate.torch_model import GPTConfig, build_model

    def second_document(document_tokens, x):
        model = build_model(GPTConfig(layers=1, hidden=64, heads=2, vocab=64, seq_len=128,
                                      document_tokens=document_tokens))
        with torch.no_grad():
            return model.blocks[0](x)[:, 64:]

    x = torch.randn(1, 128, 64)
    y = x.clone()
    y[:, :64] = torch.randn(1, 64, 64)  # not a shift of every feature, which LayerNorm removes
    assert torch.equal(second_document(64, x), second_document(64, y))
    assert not torch.allclose(second_document(0, x), second_document(0, y))


@pytest.mark.parametrize("norms", [{"qk_norm": True}, {"qk_norm": True, "post_norms": True},
                                   {"qk_norm": True, "qk_norm_scope": "full", "pre_norms": False, "post_norms": True},
                                   {"parallel_block": True, "shared_norm": True}])
def test_the_validation_models_extra_norms_are_the_simulators_parameters(norms):
    """The torch model's query/key and post-norms (LayerNorms with a shift), and OLMo 2's layer
    without pre-norms, hold exactly the parameters the simulator counts for the same model
    section."""
    from simulator.calibrate.torch_model import GPTConfig, build_model, param_count
    from simulator.model import model_from_dict

    cfg = GPTConfig(layers=2, hidden=64, heads=2, vocab=64, seq_len=32, **norms)
    assert param_count(build_model(cfg)) == model_from_dict(cfg.model_fields()).params()
    assert param_count(build_model(cfg)) != param_count(build_model(GPTConfig(layers=2, hidden=64, heads=2, vocab=64,
                                                                              seq_len=32)))


def test_the_validation_models_experts_are_the_simulators_parameters():
    """The torch MoE layer (a router with its bias, four experts of two linears with biases)
    holds exactly the parameters the simulator counts for the same model section."""
    from simulator.calibrate.torch_model import GPTConfig, build_model, param_count
    from simulator.model import model_from_dict

    cfg = GPTConfig(layers=2, hidden=64, heads=2, vocab=64, seq_len=32, experts=4, top_k=2)
    assert param_count(build_model(cfg)) == model_from_dict(cfg.model_fields()).params()


@pytest.mark.parametrize("probs_in_experts", [False, True])
def test_the_validation_models_moe_layer_sums_each_tokens_top_k_experts_by_their_gates(probs_in_experts):
    """Against a token-by-token loop: each token's output is the sum over its k highest-scoring
    experts of softmax(their logits) x expert(token); with Megatron-Core 0.13's placement the
    gate scales the GELU's output inside the expert, before its second linear (and its bias)."""
    from torch.nn import functional as F

    from simulator.calibrate.torch_model import GPTConfig, build_model

    moe = build_model(GPTConfig(layers=1, hidden=32, heads=2, vocab=64, seq_len=16, experts=4, top_k=2,
                                probs_in_experts=probs_in_experts)).blocks[0].moe
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        out = moe(x).reshape(-1, 32)
        for i, token in enumerate(x.reshape(-1, 32)):
            logits = moe.router(token)
            top, chosen = torch.topk(logits, 2)
            gates = torch.softmax(top, dim=-1)
            if probs_in_experts:
                expected = sum(moe.down[e](g * F.gelu(moe.up[e](token))) for g, e in zip(gates, chosen.tolist()))
            else:
                expected = sum(g * moe.down[e](F.gelu(moe.up[e](token))) for g, e in zip(gates, chosen.tolist()))
            assert torch.allclose(out[i], expected, atol=1e-5)


def test_the_validation_models_torchtitan_layer_is_the_simulators_parameters():
    """torchtitan's layer in the torch model (a gate and SwiGLU experts without biases, wq, wk,
    wv apart, no linear or norm bias) holds what the simulator counts for its model section."""
    from simulator.calibrate.torch_model import GPTConfig, build_model, param_count
    from simulator.model import model_from_dict

    cfg = GPTConfig(layers=2, hidden=64, heads=2, vocab=64, seq_len=32, experts=4, top_k=2, moe_layer="torchtitan")
    assert param_count(build_model(cfg)) == model_from_dict(cfg.model_fields()).params()


def test_the_validation_models_torchtitan_layer_weights_each_tokens_experts_by_their_normalised_scores():
    """Against a token-by-token loop: the k experts with the highest softmax score plus the expert
    bias, each token's SwiGLU through them weighted by its scores over their sum."""
    from torch.nn import functional as F

    from simulator.calibrate.torch_model import GPTConfig, build_model

    cfg = GPTConfig(layers=1, hidden=32, heads=2, vocab=64, seq_len=16, experts=4, top_k=2, moe_layer="torchtitan")
    moe = build_model(cfg).blocks[0].moe
    moe.expert_bias.copy_(torch.tensor([0.0, 0.5, 0.0, -0.5]))
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        out = moe(x).reshape(-1, 32)
        for i, token in enumerate(x.reshape(-1, 32)):
            scores = torch.softmax(moe.gate(token), dim=-1)
            chosen = torch.topk(scores + moe.expert_bias, 2).indices.tolist()
            weights = scores[chosen] / scores[chosen].sum()
            expected = sum(w * (F.silu(moe.w1[e] @ token) * (moe.w3[e] @ token)) @ moe.w2[e].t()
                           for w, e in zip(weights, chosen))
            assert torch.allclose(out[i], expected, atol=1e-5)


def test_a_precision_this_cpu_has_no_instructions_for_is_not_run():
    """On a CPU without AVX512-BF16 or AMX torch converts bf16 in software, at a rate no profile of
    it measured (on a Zen 3 EPYC the Zen 4 profile's bf16 rows ran past the grid's time): bf16 rows
    and Muon's bf16 Newton-Schulz GEMMs are not run, with the reason; fp32 rows are."""
    from simulator.calibrate.validate_torch import GRID, not_native

    by_name = {rc.name: rc for rc in GRID}
    muon = by_name["l4-h256-s256-b2-muon"]
    bf16 = next(rc for rc in GRID if rc.precision == "bf16")
    assert not_native(by_name["l4-h256-s256-b2"], {"fp32"}) is None
    assert not_native(muon, {"fp32"}) == not_native(bf16, {"fp32"}) == \
        "this CPU has no native bf16 (AVX512-BF16 or AMX)"
    assert not_native(muon, {"fp32", "bf16"}) is None and not_native(bf16, {"fp32", "bf16"}) is None


def test_a_measuring_process_that_fails_is_one_line_exit_1_naming_its_error(monkeypatch, capsys):
    """A measuring process's failure is the machine's, not bad input and not a model bug: the
    launcher names the process and its exception (pow(0, 1, 0) raises in the spawned process), and
    the CLI prints that line alone and exits 1."""
    from simulator.calibrate import validate_torch
    from simulator.calibrate.dist import launch
    from simulator.errors import MeasurementError

    with pytest.raises(MeasurementError) as failed:
        launch(pow, 1, (0,))
    first = str(failed.value).splitlines()[0]
    assert first.startswith("measuring process 0 of 1 failed: ValueError: pow()")

    def fail(*args, **kwargs):
        raise failed.value

    monkeypatch.setattr(validate_torch, "run_validation", fail)
    assert main(["validate", "--torch", "--profile", "cpu-epyc-zen3-2c"]) == 1
    assert capsys.readouterr().err == f"llmsim: measurement failed: {first}\n"


def test_a_configuration_the_profile_cannot_express_is_listed_not_run():
    # the EPYC profile has no bf16 rate; Megatron-Core's Muon runs its Newton-Schulz GEMMs in bf16
    from simulator.calibrate.validate_torch import GRID, predict_all

    configs = [rc for rc in GRID if rc.name in ("l4-h256-s256-b2", "l4-h256-s256-b2-muon")]
    predictions, not_run = predict_all(configs, "cpu-epyc-2c-node")
    assert list(predictions) == ["l4-h256-s256-b2"] and predictions["l4-h256-s256-b2"]["step_time_s"] > 0
    assert [r["config"] for r in not_run] == ["l4-h256-s256-b2-muon"]
    assert "plan.optimizer" in not_run[0]["reason"] and "bf16" in not_run[0]["reason"]
