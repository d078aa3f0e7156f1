"""Sweep spaces: axis values, product order, constraints, errors."""

import re
import subprocess
import sys

import pytest

from simulator import InputError
from simulator.space import load_space, space_from_dict

BASE = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 2},
        "plan": {"global_batch": 64}}


def _space(sweep, constraints=None):
    data = {"base": BASE, "sweep": sweep}
    if constraints is not None:
        data["constraints"] = constraints
    return space_from_dict(data)


def test_list_values_range_and_pow2_expand():
    s = _space({"plan.tp": [1, 2], "plan.micro_batch": {"range": [1, 7, 2]}, "plan.pp": {"pow2": [2, 8]},
                "plan.zero_stage": {"values": [0, 1]}})
    assert dict(s.axes) == {"plan.tp": (1, 2), "plan.micro_batch": (1, 3, 5), "plan.pp": (2, 4, 8),
                            "plan.zero_stage": (0, 1)}


def test_a_list_of_lists_sweeps_a_list_field_and_nesting_deeper_is_refused():
    s = _space({"plan.recompute_modules": [["core_attn"], ["core_attn", "mlp"]]})
    assert dict(s.axes) == {"plan.recompute_modules": (["core_attn"], ["core_attn", "mlp"])}
    with pytest.raises(InputError, match="a list of them"):
        _space({"plan.pipeline_layout": [[[12, 12]]]})


def test_points_are_the_product_with_the_last_axis_fastest():
    points = _space({"plan.tp": [1, 2], "plan.pp": [1, 4]}).points()
    assert points == [{"plan.tp": 1, "plan.pp": 1}, {"plan.tp": 1, "plan.pp": 4},
                      {"plan.tp": 2, "plan.pp": 1}, {"plan.tp": 2, "plan.pp": 4}]


def test_constraints_drop_points():
    points = _space({"plan.tp": [1, 2, 4], "plan.pp": [1, 2, 4]}, ["plan.tp * plan.pp <= 4", "plan.tp != 2"]).points()
    assert [(p["plan.tp"], p["plan.pp"]) for p in points] == [(1, 1), (1, 2), (1, 4), (4, 1)]


def test_constraint_reads_fields_from_the_base_and_plan_defaults():
    points = _space({"plan.micro_batch": [1, 2, 4]}, ["plan.micro_batch * plan.cp <= plan.global_batch / 32"]).points()
    assert [p["plan.micro_batch"] for p in points] == [1, 2]


def test_auto_dp_reads_as_devices_over_model_parallel_size_in_constraints():
    points = _space({"plan.tp": [1, 2, 4], "plan.dp": "auto"}, ["plan.dp >= 8"]).points()
    assert [p["plan.tp"] for p in points] == [1, 2]  # 16 devices: dp = 16, 8, 4


def test_constraint_with_a_function_call_is_refused():
    with pytest.raises(InputError, match="Call is not allowed"):
        _space({"plan.tp": [1]}, ["__import__('os').system('true')"])


def test_constraint_with_a_private_attribute_on_a_value_is_refused():
    with pytest.raises(InputError):
        _space({"plan.tp": [1]}, ["(1).__class__ == 1"])


def test_auto_is_only_for_dp():
    with pytest.raises(InputError, match="plan.dp only"):
        _space({"plan.tp": "auto"})


def test_base_file_is_resolved_beside_the_space(tmp_path):
    (tmp_path / "base.yaml").write_text("model: {preset: megatron-gpt-1.7b}\ncluster: {node: dgx-a100, nodes: 1}\n"
                                        "plan: {global_batch: 8}\n")
    (tmp_path / "space.yaml").write_text("base_file: base.yaml\nsweep:\n  plan.tp: [1, 2]\n")
    assert load_space(tmp_path / "space.yaml").base["plan"] == {"global_batch": 8}


def test_bad_space_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text("base: {}\nsweep:\n  plan.tp: {range: [4, 1]}\n")
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", str(path), "-o", str(tmp_path / "o.csv")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "sweep.plan.tp.range" in proc.stderr


@pytest.mark.parametrize("bad", [10**400, float("nan"), 1e31])
def test_a_range_end_beyond_any_plan_is_one_input_error(bad):
    with pytest.raises(InputError, match="magnitude"):
        _space({"plan.tp": {"range": [0, bad]}})


@pytest.mark.parametrize("bad", [10**400, -1e31])
def test_a_listed_value_beyond_any_plan_is_one_input_error(bad):
    """Found by the long CLI fuzz: a 400-digit tp reached the table writer's float conversion."""
    with pytest.raises(InputError, match="magnitude"):
        _space({"plan.tp": [bad, 2]})


BOUNDED = {"2 ** 2 ** 2 ** 40": "exponents", "((2**64)**64)**64": "beyond", "10.0 ** 400": "beyond",
           "1e20 * 1e20": "beyond", "'a' * 10**9": "repetition", "[1] * 10**6": "repetition", "-'x'": "negate",
           "'%*d' % (10**9, 1)": "formatting", "plan.tp in 5": "`in`", "1 / 0": "division by zero",
           "(-8) ** 0.5": "complex", "0 ** -1": "negative power", "x" * 501: "500 characters"}


@pytest.mark.parametrize("constraint", sorted(BOUNDED))
def test_constraints_are_bounded_and_fail_as_one_input_error(constraint):
    import time
    base = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 2},
            "plan": {"global_batch": 64}}
    start = time.monotonic()
    with pytest.raises(InputError, match=re.escape(BOUNDED[constraint])):
        space_from_dict({"base": base, "sweep": {"plan.tp": [1, 2]}, "constraints": [constraint]}).points()
    assert time.monotonic() - start < 1.0
