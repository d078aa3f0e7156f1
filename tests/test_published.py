"""Published runs become scenarios compared in their own conventions; the error statistics
are the stated formulas; nothing is dropped or approximated silently; the Megatron-LM runs
stay within the stated error with the A100 matmul efficiency at its stated fit."""

import csv
import json
import subprocess
import sys

import pytest

from simulator import plan as plan_schema
from simulator.hardware import load_accelerator
from simulator.published import fit_matmul_max
from simulator.validation import load_runs, validate_published
from simulator.validation.report import Comparison, summaries, Outcome
from simulator.validation.runs import PUBLISHED_DIR, read_csv
from simulator.validation.features import feature
from simulator.validation.stats import relative_error, summarise
from simulator.errors import InputError

SHARED_FILES = {"published-runs.csv": 18, "more-runs.csv": 59, "nemo-dgxc-h100.csv": 19, "moe-runs.csv": 6}


@pytest.fixture(scope="module")
def report():
    return validate_published()  # the graph engine, as `llmsim validate --published`


@pytest.fixture(scope="module")
def runs():
    return {r.id: r for r in load_runs()}


# ---------------------------------------------------------------- statistics, by hand

def test_relative_error_is_predicted_minus_measured_over_measured():
    assert relative_error(2.0, 3.0) == pytest.approx(0.5)
    assert relative_error(4.0, 3.0) == pytest.approx(-0.25)


def test_summary_is_mape_signed_mean_and_the_largest_absolute_error():
    s = summarise([("a", 0.10), ("b", -0.20), ("c", 0.05)])
    assert s.n == 3
    assert s.mape_pct == pytest.approx(35.0 / 3)  # (10 + 20 + 5) / 3
    assert s.signed_mean_pct == pytest.approx(-5.0 / 3)  # (10 - 20 + 5) / 3
    assert (s.worst_id, s.worst_error_pct) == ("b", pytest.approx(-20.0))


def test_summary_worst_row_on_a_tie_is_the_first():
    assert summarise([("a", -0.1), ("b", 0.1)]).worst_id == "a"


def test_a_shorter_step_time_is_a_positive_speed_error():
    assert Comparison("step_time_s", 10.0, 8.0, True).speed_error == pytest.approx(0.2)
    assert Comparison("tokens_per_s_per_device", 100.0, 120.0, True).speed_error == pytest.approx(0.2)


# ---------------------------------------------------------------- the mapping, on small files

HEADER = list(read_csv(PUBLISHED_DIR / "published-runs.csv")[0].keys())
BASE_ROW = dict(id="x_run", gpus_per_node="8", num_gpus="16", layers="4", hidden="256", heads="4", ffn_hidden="1024",
                vocab="1024", seq_len="512", activation="gelu", tp="2", pp="2", dp="4", cp="1", vpp="2",
                micro_batch="1", global_batch="16", seq_parallel="yes", recompute="full", zero_stage="0",
                precision="fp16/bf16 mixed", offload="none", measured_iter_time_s="2.0", measured_mfu_pct="40")
SUPPLEMENT = """
file: runs.csv
format: table
sources:
  - key: x
    match: x_
    framework: test
    scenario: {cluster: {node: dgx-a100}, plan: {precision: bf16}}
    metrics: {measured_iter_time_s: step_time_s, measured_mfu_pct: mfu}
rows:
"""


def write(tmp_path, rows, supplement=SUPPLEMENT):
    with (tmp_path / "runs.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, HEADER)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: "" for k in HEADER}, **r})
    (tmp_path / "supplement.yaml").write_text(supplement)
    return tmp_path


def test_table_row_becomes_the_scenario_its_columns_and_supplement_say(tmp_path):
    (run,) = load_runs(write(tmp_path, [BASE_ROW]))
    s = run.scenario
    assert run.status == "predicted"
    assert s["cluster"] == {"nodes": 2, "devices_per_node": 8, "node": "dgx-a100"}
    assert s["plan"]["precision"] == "bf16"  # the free-text cell settled by the supplement
    assert s["plan"]["schedule"] == "interleaved"  # vpp 2
    assert s["plan"]["sequence_parallel"] is True and s["model"]["heads"] == 4
    assert run.build().plan.microbatches == 4  # global 16 / (micro-batch 1 x dp 4)


def test_a_run_on_part_of_a_node_is_one_node_of_that_many_devices(tmp_path):
    row = {**BASE_ROW, "num_gpus": "2", "tp": "1", "pp": "1", "dp": "2", "vpp": "1", "global_batch": "4"}
    (run,) = load_runs(write(tmp_path, [row]))
    assert run.scenario["cluster"]["nodes"] == 1 and run.scenario["cluster"]["devices_per_node"] == 2


def test_measurements_keep_the_source_order_and_percentages_become_fractions(tmp_path):
    (run,) = load_runs(write(tmp_path, [BASE_ROW]))
    assert [(m.metric, m.value, m.primary) for m in run.measurements] == [("step_time_s", 2.0, True),
                                                                         ("mfu", 0.40, False)]


def test_a_measured_column_neither_compared_nor_excused_is_an_error(tmp_path):
    with pytest.raises(InputError, match="measured_tokens_per_s_per_gpu"):
        load_runs(write(tmp_path, [{**BASE_ROW, "measured_tokens_per_s_per_gpu": "100"}]))


def test_a_free_text_cell_nothing_resolves_is_an_error(tmp_path):
    sup = SUPPLEMENT.replace("plan: {precision: bf16}", "plan: {}")
    with pytest.raises(InputError, match="plan.precision"):
        load_runs(write(tmp_path, [BASE_ROW], sup))


def test_a_row_no_source_matches_is_an_error(tmp_path):
    with pytest.raises(InputError, match="y_run"):
        load_runs(write(tmp_path, [{**BASE_ROW, "id": "y_run"}]))


def test_an_fp8_row_without_its_recipe_is_an_error(tmp_path):
    sup = SUPPLEMENT.replace("plan: {precision: bf16}", "plan: {precision: fp8}")
    with pytest.raises(InputError, match="fp8-linears"):
        load_runs(write(tmp_path, [BASE_ROW], sup.replace("a100", "h100")))


@pytest.fixture
def without_op_sac(monkeypatch):
    """The schema as it was before it learnt torchtitan's op-level selective AC."""
    monkeypatch.setattr(plan_schema, "RECOMPUTE", tuple(m for m in plan_schema.RECOMPUTE if m != "op-selective"))


def test_an_unsupported_feature_keeps_the_row_with_its_reason(tmp_path, without_op_sac):
    sup = SUPPLEMENT + "  x_run: {features: {op-selective-recompute: true}}\n"
    (run,) = load_runs(write(tmp_path, [BASE_ROW], sup))
    assert run.status == "not_expressible" and run.scenario is None
    assert [f for f, _ in run.reasons] == ["op-selective-recompute"]


def test_approximate_mode_names_the_approximation(tmp_path, without_op_sac):
    sup = SUPPLEMENT + "  x_run: {features: {op-selective-recompute: true}}\n"
    (run,) = load_runs(write(tmp_path, [BASE_ROW], sup), approximate=True)
    assert run.status == "approximated" and run.scenario["plan"]["recompute"] == "selective"
    assert len(run.approximations) == 1


def test_an_equivalent_feature_is_predicted_and_stated(tmp_path):
    sup = SUPPLEMENT + "  x_run: {features: {squared-relu: true}}\n"
    (run,) = load_runs(write(tmp_path, [BASE_ROW], sup))
    assert run.status == "predicted" and run.scenario["model"]["activation"] == "gelu"
    assert any("squared-ReLU" in a for a in run.assumptions)


def test_a_row_is_predicted_once_the_schema_learns_its_feature(tmp_path, monkeypatch):
    sup = SUPPLEMENT.replace("a100", "h100") + "  x_run: {features: {fp8-linears: {recipe: delayed}}}\n"
    folder = write(tmp_path, [BASE_ROW], sup)
    keys = plan_schema.PLAN_KEYS
    monkeypatch.setattr(plan_schema, "PLAN_KEYS", tuple(k for k in keys if k != "fp8_recipe"))
    assert load_runs(folder)[0].status == "not_expressible"
    monkeypatch.setattr(plan_schema, "PLAN_KEYS", keys)
    (run,) = load_runs(folder)
    assert run.status == "predicted"
    assert run.scenario["plan"]["precision"] == "fp8" and run.scenario["plan"]["fp8_recipe"] == "delayed"


def test_an_infeasible_prediction_of_a_run_that_ran_is_a_false_out_of_memory():
    run = load_runs()[0]
    ok = Outcome(run, (Comparison("step_time_s", 1.0, 1.1, True),), feasible=True)
    oom = Outcome(run, (Comparison("step_time_s", 1.0, 0.9, True),), feasible=False)
    speed = next(s for s in summaries([ok, oom]) if s["by"] == "all" and s["metric"] == "speed")
    assert speed["false_oom"] == 1 and speed["mape_pct"] == pytest.approx(10.0)


# ---------------------------------------------------------------- the shipped runs

def test_the_copies_are_the_shared_files_and_every_row_is_a_run(runs):
    for name, n in SHARED_FILES.items():
        assert len(read_csv(PUBLISHED_DIR / name)) == n
        assert sum(r.file == name for r in runs.values()) == n


def test_moe_runs_are_their_own_sources(runs):
    moe = {rid: r for rid, r in runs.items() if r.file == "moe-runs.csv"}
    assert {r.source for r in moe.values()} == {"nemo-dgxc-moe", "megatron-moe"}
    grok = moe["dgxc2411-h100-grok1-314b-bf16-512gpu"].scenario
    assert (grok["plan"]["ep"], grok["plan"]["etp"], grok["model"]["experts"]) == (8, 4, 8)
    assert grok["plan"]["moe"] == {"dispatcher": "alltoall", "capacity_factor": 1.0, "pad_to_capacity": True,
                                   "folding": False, "grouped_gemm": False, "probs_in_experts": False}


def test_every_run_is_predicted_or_has_a_named_reason(runs):
    for r in runs.values():
        assert (r.status == "predicted") == (not r.reasons), r.id
        assert all(f != "scenario-rejected" for f, _ in r.reasons), (r.id, r.reasons)


def test_every_run_is_expressible(runs):
    assert [rid for rid, r in runs.items() if r.status != "predicted"] == []


def test_the_fp8_moe_run_casts_its_expert_linears_with_delayed_scaling(runs):
    plan = runs["dgxc2411-h100-grok1-314b-fp8-512gpu"].scenario["plan"]
    assert (plan["precision"], plan["fp8_recipe"]) == ("fp8", "delayed")


def test_torchtitan_405b_runs_are_said_as_first_and_last_rank_layers_or_a_stage_layout(runs):
    plan = runs["tt_t5_405B_512gpu_1F1B"].scenario["plan"]
    assert (plan["first_stage_layers"], plan["last_stage_layers"]) == (15, 15)
    layout = runs["tt_t5_405B_512gpu_Interleaved1F1B"].scenario["plan"]["pipeline_layout"]
    assert layout == [7] + [8] * 14 + [7]


def test_nemo_fp8_runs_are_transformer_engine_delayed_scaling_with_fp8_primary_weights(runs):
    fp8 = [r for rid, r in runs.items() if rid.startswith("dgxc-") and "-fp8-" in rid]
    assert len(fp8) == 5
    assert all((r.scenario["plan"]["fp8_recipe"], r.scenario["plan"]["fp8_params"]) == ("delayed", True) for r in fp8)


def test_uneven_ranks_are_said_as_megatrons_first_and_last_rank_layers():
    ranks = [15, 16, 16, 16, 16, 16, 16, 15]  # 126 layers: 15 + 6 x 16 + 15
    scenario = {"plan": {}}
    feature("uneven-pipeline-stages").apply(scenario, {"rank_layers": ranks})
    assert scenario["plan"] == {"first_stage_layers": 15, "last_stage_layers": 15}
    with pytest.raises(InputError, match="equal"):
        feature("uneven-pipeline-stages").apply({"plan": {}}, {"rank_layers": [15, 16, 17, 15]})


def test_vtrain_vocab_is_gpt2_padded_to_128_times_tp(runs):
    assert runs["vtrain_single_2"].scenario["model"]["vocab"] == 50432  # tp 2: 197 x 256
    assert runs["vtrain_multi_L23"].scenario["model"]["vocab"] == 51200  # tp 16: 25 x 2048


def test_readme_mfu_of_korthikanti_22b_is_model_flops_at_the_measured_time(runs):
    """72·B·s·l·h²(1 + s/6h + V/12lh) / (1.10 s x 8 x 312 TFLOP/s) = 41.6 %, the README's 41.5 %:
    comparing our mfu with it respects its convention."""
    b, s, l, h, v = 4, 2048, 48, 6144, 51200
    flops = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert flops / (1.10 * 8 * 312e12) == pytest.approx(0.415, abs=0.002)
    mfu = next(m for m in runs["korthikanti22_t5_22B_selsp"].measurements if m.metric == "mfu")
    assert mfu.value == pytest.approx(0.415) and not mfu.primary


def test_narayanan_rows_compare_hardware_tflops_and_nemo_rows_step_time(runs):
    assert runs["narayanan21_t1_1T"].primary.metric == "hardware_tflops_per_device"
    assert runs["dgxc-gpt3-175b-bf16-128gpu"].primary.metric == "step_time_s"
    assert [m.metric for m in runs["tt_t1_8B_8gpu_FSDP"].measurements] == ["tokens_per_s_per_device",
                                                                             "peak_reserved_gib"]


def test_the_torchtitan_part_names_its_fit_and_what_it_transfers():
    v = load_accelerator("h100-sxm-96gb-500w").validation
    assert v is not None and "fit-matmul tt_t1_,tt_t3_:bf16" in v.reason and "transferred" in v.reason


def test_a_profile_without_a_fit_of_its_own_says_it_is_not_validated():
    for name in ("h200-sxm-141gb", "b200", "gb200", "gb300", "mi300x", "mi355x", "mi250x", "gaudi3", "tpu-v5p",
                 "v100-sxm-32gb", "a100-sxm-40gb"):
        v = load_accelerator(name).validation
        assert v is not None and v.validated is False and "transferred" in v.reason


@pytest.mark.parametrize("name,spec", [("h100-sxm-80gb", "dgxc-:bf16"), ("h100-sxm-96gb-500w", "tt_t1_,tt_t3_:bf16")])
def test_hopper_matmul_efficiencies_are_the_stated_fits(name, spec):
    fitted, _ = fit_matmul_max(spec)
    assert load_accelerator(name).matmul.max == pytest.approx(fitted, abs=0.002)


# ---------------------------------------------------------------- the report and the error today

def test_report_summarises_every_source_on_speed(report):
    predicted_sources = {r["source"] for r in report["rows"] if r["status"] == "predicted"}
    speed = {s["group"] for s in report["summary"] if s["by"] == "source" and s["metric"] == "speed"}
    assert speed == predicted_sources
    assert report["counts"]["rows"] == sum(SHARED_FILES.values())


def test_megatron_runs_are_reproduced_feasibly_within_10_percent(report):
    rows = [r for r in report["rows"] if r["file"] == "published-runs.csv"]
    assert len(rows) == 18 and all(r["feasible"] for r in rows)  # these runs did fit in 80 GB
    assert sum(abs(r["error_pct"]) for r in rows) / len(rows) <= 10.0


def test_holdout_rows_not_used_by_the_fit_are_within_10_percent(report):
    holdout = [r for r in report["rows"] if r["source"] == "narayanan21"]
    assert sum(abs(r["error_pct"]) for r in holdout) / len(holdout) <= 10.0


def test_a100_profile_matmul_efficiency_is_the_stated_fit():
    fitted, _ = fit_matmul_max("korthikanti22")
    assert load_accelerator("a100-sxm-80gb").matmul.max == pytest.approx(fitted, abs=0.002)


def test_cli_json_carries_rows_summary_and_reasons():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "validate", "--published", "--json", "--engine",
                           "analytic"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"rows", "summary", "not_expressible", "counts", "accelerators", "sources"} <= out.keys()
    assert out["counts"]["rows"] == sum(SHARED_FILES.values())
