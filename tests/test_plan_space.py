"""Any plan the validator accepts evaluates to a finite result; any it rejects is an InputError."""

import math

from hypothesis import given, settings, strategies as st

from simulator import InputError, evaluate, scenario_from_dict

plans = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4, 8, 16]),
    "pp": st.sampled_from([1, 2, 4, 8]),
    "cp": st.sampled_from([1, 2]),
    "vpp": st.sampled_from([1, 2]),
    "micro_batch": st.sampled_from([1, 2, 4]),
    "global_batch": st.sampled_from([64, 128, 256]),
    "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zb-h1"]),
    "sequence_parallel": st.booleans(),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "zero_stage": st.integers(0, 3),
    "precision": st.sampled_from(["bf16", "fp16", "fp8", "fp32"]),
    "flash_attention": st.booleans(),
    "dp_overlap": st.booleans(),
    "offload": st.fixed_dictionaries({"optimizer": st.sampled_from(["none", "cpu", "nvme"]),
                                      "params": st.sampled_from(["none", "cpu"]),
                                      "activations": st.sampled_from(["none", "cpu"])}),
})


@given(plans, st.sampled_from(["llama-2-7b", "megatron-gpt-3.6b", "llama-3.1-8b"]), st.sampled_from([4, 16]))
@settings(max_examples=150, deadline=None)
def test_accepted_plans_evaluate_to_finite_results(plan, preset, nodes):
    try:
        s = scenario_from_dict({"model": {"preset": preset}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                                "plan": plan})
    except InputError as exc:
        assert str(exc).startswith(("plan.", "model.", "cluster."))
        return
    d = evaluate(s).to_dict()
    assert math.isfinite(d["step_time_s"]) and d["step_time_s"] > 0
    assert all(v >= 0 and math.isfinite(v) for v in d["breakdown_s"].values())
    assert d["peak_memory_gib"] > 0
    assert d["feasible"] == (d["peak_memory_gib"] <= d["memory_capacity_gib"])
