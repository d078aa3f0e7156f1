"""Any plan the validator accepts evaluates to a finite result; any it rejects is an InputError."""

import math

import pytest

from hypothesis import given, settings, strategies as st

from plans import FIXED_DRAWS

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
    if d["peak_memory_gib"] > d["memory_capacity_gib"]:
        assert not d["feasible"] and d["reason"].startswith("out of memory")
    elif not d["feasible"]:
        assert d["reason"].startswith("out of host memory")


@given(plans)
@settings(max_examples=50, deadline=None, derandomize=FIXED_DRAWS, database=None)
def test_a_plan_read_from_its_section_is_the_dataclass_built_from_its_fields(plan):
    """plan_from_dict sets the fields without Plan's __init__: the same plan, every field set."""
    from dataclasses import fields

    from simulator.plan import Plan, plan_from_dict

    got = plan_from_dict({**plan, "dp": 2}, cache={})
    built = Plan(**{f.name: getattr(got, f.name) for f in fields(Plan)})
    assert set(vars(got)) == {f.name for f in fields(Plan)}
    assert got == built and hash(got) == hash(built) and repr(got) == repr(built)


def test_a_plan_built_from_some_fields_takes_the_dataclass_defaults_for_the_rest():
    from dataclasses import MISSING, fields

    from simulator.plan import Plan, new_plan

    assert all(f.default_factory is MISSING for f in fields(Plan))  # new_plan shares each default as Plan() does
    some = dict(tp=2, pp=4, dp=8, micro_batch=2, global_batch=512, schedule="zb-h1", zero_stage=1)
    got = new_plan(**some)
    assert got == Plan(**some) and set(vars(got)) == {f.name for f in fields(Plan)}
    with pytest.raises(TypeError, match="unexpected keyword argument 'pipeline_stages'"):
        new_plan(**some, pipeline_stages=4)
