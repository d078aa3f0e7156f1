"""Bad input: exit code 2, one line naming the field, the value and what is allowed, no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

GOOD = """
model: {preset: megatron-gpt-1.7b}
cluster: {node: dgx-a100, nodes: 1}
plan: {tp: 1, pp: 1, dp: 8, micro_batch: 1, global_batch: 8}
"""


def run(tmp_path: Path, text: str, *flags):
    f = tmp_path / "s.yaml"
    f.write_text(text)
    return subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", str(f), *flags],
                          capture_output=True, text=True)


def assert_clean_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


CASES = {
    "not_yaml": ("model: [unclosed", ("invalid YAML",)),
    "empty": ("", ("empty",)),
    "wrong_shape": ("- a\n- b\n", ("scenario", "mapping")),
    "unknown_key": (GOOD + "extra: 1\n", ("extra", "unknown key")),
    "unknown_plan_key": (GOOD.replace("tp: 1,", "tp: 1, tensor: 2,"), ("plan.tensor", "unknown key")),
    "unknown_preset": (GOOD.replace("megatron-gpt-1.7b", "gpt-9"), ("model.preset", "gpt-9")),
    "unknown_node": (GOOD.replace("dgx-a100", "dgx-z9"), ("cluster.node", "dgx-z9")),
    "wrong_type": (GOOD.replace("tp: 1,", "tp: eight,"), ("plan.tp", "eight", "integer")),
    "string_number": (GOOD + "training: {tokens: '1e12'}\n", ("training.tokens", "1e12", "number")),
    "base_60": (GOOD.replace("global_batch: 8", "global_batch: 1:04"), ("plan.global_batch", "1:04", "integer")),
    "yaml11_bool": (GOOD + "plan: {sequence_parallel: on}\n", ("duplicate key 'plan'",)),
    "yes_is_text": (GOOD.replace("global_batch: 8", "global_batch: 8, sequence_parallel: yes"),
                    ("plan.sequence_parallel", "yes", "true or false")),
    "duplicate_key": (GOOD.replace("tp: 1,", "tp: 1, tp: 2,"), ("duplicate key 'tp'", "line 4")),
    "duplicate_section": (GOOD + "model: {preset: gpt3-175b}\n", ("duplicate key 'model'",)),
    "alias_bomb": ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                   "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                   "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n" + GOOD, ("aliases expand",)),
    "recursive_alias": ("a: &a [*a]\n" + GOOD, ("recursive alias",)),
    "merge_key": (GOOD.replace("plan: {", "plan: {<<: {zero_stage: 1}, "), ("plan.<<", "unknown key")),
    "negative": (GOOD.replace("micro_batch: 1", "micro_batch: -4"), ("plan.micro_batch", "-4")),
    "zero": (GOOD.replace("nodes: 1", "nodes: 0"), ("cluster.nodes", "0")),
    "nan": (GOOD + "training: {tokens: .nan}\n", ("training.tokens", "nan")),
    "absurd": (GOOD.replace("global_batch: 8", "global_batch: 100000000000000000000"), ("plan.global_batch",)),
    "indivisible_heads": (GOOD.replace("tp: 1, pp: 1, dp: 8", "tp: 16, pp: 1, dp: 1").replace("nodes: 1", "nodes: 2"),
                          ("plan.tp", "16", "heads")),
    "device_count": (GOOD.replace("dp: 8", "dp: 4"), ("plan.dp", "8 devices")),
    "batch_divisibility": (GOOD.replace("global_batch: 8", "global_batch: 12"), ("plan.global_batch", "12")),
    "python_tag": (GOOD + "name: !!python/object/apply:os.system ['echo pwned']\n", ("invalid YAML",)),
    "bool_for_number": (GOOD.replace("tp: 1,", "tp: true,"), ("plan.tp", "True")),
    "replicas_not_dividing_dp": (GOOD.replace("dp: 8,", "dp: 8, zero_stage: 3, dp_replicate: 3,"),
                                 ("plan.dp_replicate", "3", "divide plan.dp=8")),
    "replicas_without_zero": (GOOD.replace("dp: 8,", "dp: 8, dp_replicate: 2,"),
                              ("plan.dp_replicate", "2", "zero_stage >= 1")),
    "replicas_under_deepspeed": (GOOD.replace("dp: 8,", "dp: 8, zero_stage: 3, zero3_impl: deepspeed, "
                                 "dp_replicate: 2,"), ("plan.dp_replicate", "2", "fsdp2")),
    "ulysses_heads": (GOOD.replace("nodes: 1", "nodes: 2").replace("dp: 8,", "dp: 1, cp: 16, "
                      "cp_attention: ulysses,"), ("plan.cp", "16", "24 query", "ulysses")),
    "ulysses_group_without_hierarchy": (GOOD.replace("dp: 8,", "dp: 4, cp: 2, cp_ulysses: 2,"),
                                        ("plan.cp_ulysses", "2", "ulysses-ring")),
    "hierarchy_of_one": (GOOD.replace("dp: 8,", "dp: 4, cp: 2, cp_attention: ulysses-ring,"),
                         ("plan.cp_ulysses", "1", "2 or more")),
    "replicas_beyond_expert_dp": (GOOD.replace("megatron-gpt-1.7b", "mixtral-8x7b").replace("dp: 8,", "dp: 8, ep: 8, "
                                  "zero_stage: 1, dp_replicate: 2,"), ("plan.dp_replicate", "2", "expert data-parallel")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_scenario_exits_2_with_one_line(tmp_path, case):
    text, needles = CASES[case]
    assert_clean_error(run(tmp_path, text), *needles)


def test_yaml_numbers_follow_yaml_1_2(tmp_path):
    from simulator.yamlio import parse_yaml
    assert parse_yaml("a: 010\nb: 1e9\nc: 1:04\nd: 0o10\ne: 1_000\nf: no\ng: .inf\nh: 2001-12-14", "t") == {
        "a": 10, "b": 1e9, "c": "1:04", "d": "0o10", "e": "1_000", "f": "no", "g": float("inf"), "h": "2001-12-14"}


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_file_is_refused(device):
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", device], capture_output=True, text=True,
                          timeout=30)
    assert_clean_error(proc, device, "regular file")


def test_yaml_tag_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    proc = run(tmp_path, GOOD + f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    assert proc.returncode == 2 and not marker.exists()


def test_missing_file_is_a_clean_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True)
    assert_clean_error(proc, "nope.yaml", "not found")


def test_bad_flag_value_is_a_clean_error(tmp_path):
    assert_clean_error(run(tmp_path, GOOD, "--schedule", "zigzag"), "plan.schedule", "zigzag", "1f1b")


def test_unknown_flag_is_a_clean_error(tmp_path):
    assert_clean_error(run(tmp_path, GOOD, "--warp-speed", "9"), "unrecognized arguments")


def test_out_of_memory_plan_is_a_result_not_an_error(tmp_path):
    text = GOOD.replace("megatron-gpt-1.7b", "megatron-gpt-39b")
    proc = run(tmp_path, text, "--json")
    assert proc.returncode == 0, proc.stderr
    import json
    d = json.loads(proc.stdout)
    assert d["feasible"] is False
    assert "out of memory" in d["reason"] and "stage 0" in d["reason"] and "GiB" in d["reason"]


@pytest.mark.parametrize("flags,needle", [(["--torch", "--transferred"], "only with --published"),
                                          (["--published", "--transferred", "--fit-matmul", "korthikanti22"],
                                           "not with --fit-matmul")])
def test_validate_transferred_outside_the_published_report_is_refused(flags, needle):
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", *flags], capture_output=True, text=True)
    assert_clean_error(proc, "--transferred", needle)


def test_a_long_value_is_shortened_in_the_middle_keeping_the_file_name(tmp_path):
    deep = tmp_path.joinpath(*["a-long-folder-name"] * 6)
    deep.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "evaluate", str(deep / "nope.yaml")],
                          capture_output=True, text=True)
    assert_clean_error(proc, "nope.yaml'", str(tmp_path)[:20], "...", "not found")
