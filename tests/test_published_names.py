"""A published run by name (published/<row id>) wherever a scenario is expected: evaluate shows
what the run measured beside the prediction, scenarios list and show them, a sweep starts
from one, and validate --published --only keeps one source. The expected values are read
from the CSV copies with the csv module, not through llmsim's row mapping."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from simulator import load_scenario
from simulator.validation.runs import PUBLISHED_DIR

from test_cli import cli, one_line_error

ROW = "narayanan21_t1_1.7B"  # published-runs.csv: 32 GPUs, TP 1, PP 1, 24 layers of 2304, 137 TFLOP/s measured


def csv_rows(name: str) -> list[dict]:
    with (PUBLISHED_DIR / name).open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def the_row(rid: str) -> dict:
    return next(r for r in csv_rows("published-runs.csv") + csv_rows("more-runs.csv") if r["id"] == rid)


def test_a_published_name_is_the_scenario_its_csv_row_states():
    row, s = the_row(ROW), load_scenario(f"published/{ROW}")
    assert (s.model.layers, s.model.hidden, s.model.seq_len) == (int(row["layers"]), int(row["hidden"]),
                                                                 int(row["seq_len"]))
    assert (s.plan.tp, s.plan.pp, s.plan.dp, s.plan.global_batch) == (
        int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["global_batch"]))
    assert s.cluster.devices == int(row["num_gpus"])


def test_evaluate_by_name_shows_what_the_run_measured_beside_the_prediction():
    proc = cli("evaluate", f"published/{ROW}", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    (cmp,) = d["published"]["comparisons"]
    assert cmp["metric"] == "hardware_tflops_per_device"
    assert cmp["measured"] == float(the_row(ROW)["measured_tflops_per_gpu"])
    # Megatron-LM's count (Narayanan et al. 2021, Eq. 3) over the predicted step time
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert cmp["predicted"] == pytest.approx(flops / 32 / d["step_time_s"] / 1e12, rel=1e-12)
    assert cmp["error_pct"] == pytest.approx(100 * (cmp["predicted"] / cmp["measured"] - 1), rel=1e-12)
    text = cli("evaluate", f"published/{ROW}").stdout
    assert "published  Narayanan et al." in text and "hardware_tflops_per_device  137" in text


def test_a_changed_published_scenario_is_not_compared_with_the_run():
    proc = cli("evaluate", f"published/{ROW}", "--set", "plan.micro_batch=8", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "published" not in json.loads(proc.stdout)


def test_compare_shows_what_each_published_run_measured():
    a, b = "vtrain_multi_L17", "vtrain_multi_L22"
    text = cli("compare", f"published/{a}", f"published/{b}", "quickstart", "--engine", "analytic").stdout
    row = next(line for line in text.splitlines() if "measured (published run)" in line)
    for rid in (a, b):
        assert f"step_time_s {float(the_row(rid)['measured_iter_time_s']):.4g} (" in row
    assert row.rstrip().endswith("-")  # the shipped scenario measured nothing
    plain = cli("compare", "quickstart", "gpt3-175b-1024xa100", "--engine", "analytic").stdout
    assert "measured (published run)" not in plain


def test_an_unknown_published_name_is_one_line_naming_the_nearest():
    one_line_error(cli("evaluate", "published/narayanan21_t1_1.7"), "published/narayanan21_t1_1.7",
                   f"did you mean published/{ROW}")


def test_scenarios_list_published_names_every_row_of_every_copy():
    ids = [r["id"] for name in ("published-runs.csv", "more-runs.csv", "nemo-dgxc-h100.csv", "moe-runs.csv")
           for r in csv_rows(name)]
    listed = [line.split()[0] for line in cli("scenarios", "list", "--published").stdout.splitlines()
              if line.startswith("published/")]
    assert sorted(listed) == sorted(f"published/{i}" for i in ids)


def test_scenarios_show_prints_a_published_scenario_that_loads_back(tmp_path):
    text = cli("scenarios", "show", f"published/{ROW}").stdout
    assert "# measured hardware_tflops_per_device = 137 (measured_tflops_per_gpu)" in text
    supplement = yaml.safe_load((PUBLISHED_DIR / "supplement.yaml").read_text())
    narayanan = next(s for s in supplement["sources"] if s["key"] == "narayanan21")
    for field in narayanan["provenance"]:  # where each supplemented field comes from
        assert f"# {field}: " in text
    path = tmp_path / "row.yaml"
    path.write_text(text)
    assert load_scenario(path) == load_scenario(f"published/{ROW}")


def test_scenarios_show_prints_a_shipped_scenario_as_written():
    text = cli("scenarios", "show", "quickstart").stdout
    assert text == (Path(PUBLISHED_DIR).parent / "quickstart.yaml").read_text(encoding="utf-8")


def test_a_sweep_space_can_start_from_a_published_run(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"base_file": f"published/{ROW}", "sweep": {"plan.micro_batch": [8, 16]}}))
    out = tmp_path / "out.csv"
    proc = cli("sweep", str(space), "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert [r["plan.micro_batch"] for r in rows] == ["8", "16"] and {r["model"] for r in rows} == {ROW}


@pytest.mark.parametrize("only, prefixes", [("vtrain", ("vtrain_",)),  # a source
                                            ("vtrain_single_,narayanan21", ("narayanan21_", "vtrain_single_"))])
def test_validate_only_keeps_the_runs_it_names(only, prefixes):
    proc = cli("validate", "--published", "--only", only, "--json")
    assert proc.returncode == 0, proc.stderr
    ids = [r["id"] for r in json.loads(proc.stdout)["rows"]]
    assert ids == [r["id"] for name in ("more-runs.csv", "published-runs.csv") for r in csv_rows(name)  # file order
                   if r["id"].startswith(prefixes)]


@pytest.mark.parametrize("args, needle", [
    (("validate", "--published", "--only", "nosuchsource"), "sources: "),
    (("validate", "--torch", "--only", "vtrain"), "only with --published"),
    (("scenarios", "show"), "give a scenario name"),
])
def test_bad_published_flags_exit_2_with_one_line(args, needle):
    one_line_error(cli(*args), needle)
