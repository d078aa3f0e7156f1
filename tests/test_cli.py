"""The command line around the physics: version, compare, search restrictions, flag checks,
scenario names, traces, sweeps that refuse, and no traceback on any path."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=None, **env):
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "NO_COLOR": "1", **env}, timeout=300)


def scenario_files(folder, **scenarios) -> list:
    """Each scenario mapping written to its own YAML file in `folder`, in order."""
    paths = []
    for name, data in scenarios.items():
        paths.append(folder / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(data))
    return paths


def one_line_error(proc, *needles):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_version():
    from importlib.metadata import version
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"llmsim {version('llmsim')}"


def test_compare_shows_scenarios_side_by_side_and_marks_differences():
    proc = cli("compare", "scenarios/quickstart.yaml", "scenarios/gpt3-175b-1024xa100.yaml", "--engine", "analytic",
               cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1] if line.startswith("*") else line.split()[0]: line.startswith("*")
            for line in proc.stdout.splitlines()[2:] if line.strip() and not line.startswith("* differs")}
    assert rows["model"] and rows["tp"] and not rows["cp"] and not rows["precision"]
    # the GPT-3 plan runs ZeRO-1 in bf16 where every published A100 run is ZeRO-0 (fp16)
    beyond = next(line for line in proc.stdout.splitlines() if "beyond the runs" in line)
    assert beyond.split()[-1] == "plan.zero_stage" and "80%" in proc.stdout
    proc = cli("compare", "quickstart", "quickstart", "--tp", "4", "--engine", "analytic", "--json")
    d = json.loads(proc.stdout)
    assert d["differing_keys"] == [] and len(d["results"]) == 2


def test_compare_lists_the_fields_its_rows_do_not_show_where_the_scenarios_differ(tmp_path):
    base = {"model": {"preset": "llama-3.1-8b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "plan": {"tp": 1, "pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 64, "precision": "fp8"}}
    other = {**base, "cluster": {**base["cluster"], "nics": 4},
             "plan": {**base["plan"], "fp8_recipe": "current", "bf16_layers_at_end": 1, "tp": 1}}
    paths = scenario_files(tmp_path, fp8=base, fp8_cs=other)
    proc = cli("compare", *map(str, paths), "--engine", "analytic")
    assert proc.returncode == 0, proc.stderr
    extra = {line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines()
             if line.startswith("*") and "." in line.split()[1]}
    assert extra == {"plan.fp8_recipe": ["delayed", "current"], "plan.bf16_layers_at_end": ["0", "1"],
                     "cluster.node.nics": ["8", "4"]}
    d = json.loads(cli("compare", *map(str, paths), "--engine", "analytic", "--json").stdout)
    assert d["differing_fields"]["plan.fp8_recipe"] == ["delayed", "current"]
    assert json.loads(cli("compare", str(paths[0]), str(paths[0]), "--json").stdout)["differing_fields"] == {}


def test_compare_shows_a_plan_that_does_not_fit_without_its_numbers():
    """The README's plan that does not fit (quickstart at tp 1, micro-batch 8): no cost, no
    speed, its memory; it once crashed compare (an infeasible plan has no cost per token)."""
    proc = cli("compare", "quickstart", "quickstart", "--tp", "1", "--micro-batch", "8", "--recompute", "none",
               "--engine", "analytic", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    cells = {label: values[-1] for label, *values in (re.split(r"\s{2,}", line.lstrip("* ").strip())
                                                      for line in proc.stdout.splitlines()[2:]
                                                      if line.strip() and not line.startswith("* differs"))}
    assert cells["feasible"] == "NO" and cells["$ per M tokens"] == "-" and cells["tokens/s"] == "-"


def test_scenario_name_follows_the_overrides():
    d = json.loads(cli("evaluate", "quickstart", "--preset", "llama-3.1-70b", "--tp", "8", "--engine", "analytic",
                       "--json").stdout)
    assert d["scenario"] == "quickstart-llama3-8b-64xh100 + preset=llama-3.1-70b, tp=8"


def test_node_refills_dp_and_vpp_picks_the_schedule():
    d = json.loads(cli("evaluate", "quickstart", "--node", "dgx-b200", "--nodes", "2", "--engine", "analytic",
                       "--json").stdout)
    assert d["devices"] == 16 and d["feasible"] is not None  # dp refilled: 16 / tp 2
    proc = cli("evaluate", "scenarios/gpt3-175b-1024xa100.yaml", "--tp", "4", "--pp", "32", "--vpp", "1",
               "--micro-batch", "2", "--engine", "analytic")
    assert proc.returncode == 0 and "schedule=1f1b" in proc.stdout and "feasible   yes" in proc.stdout


def test_an_infeasible_plan_shows_why_and_what_would_fit_not_a_step_time():
    proc = cli("evaluate", "quickstart", "--tp", "1", "--micro-batch", "8", "--recompute", "none", "--engine",
               "analytic")
    assert proc.returncode == 0
    out = proc.stdout
    assert "NO: out of memory" in out and "What would fit" in out
    before = out.split("The plan does not fit")[0]
    assert "step time" not in before and "throughput" not in before and "$" not in before
    change = out.split("What would fit")[1].splitlines()[3].split("  ")[0].split()
    fixed = cli("evaluate", "quickstart", "--tp", "1", "--micro-batch", "8", "--recompute", "none", *change,
                "--engine", "analytic", "--json")
    assert json.loads(fixed.stdout)["feasible"] is True  # the suggested change does fit


def test_an_infeasible_plan_under_op_level_ac_is_offered_full_recomputation_and_smaller_batches():
    proc = cli("evaluate", "quickstart", "--tp", "1", "--micro-batch", "8", "--recompute", "op-selective",
               "--engine", "analytic")
    assert proc.returncode == 0, proc.stderr
    fits = proc.stdout.split("What would fit")[1]
    assert "--recompute selective" not in fits  # op-level AC recomputes about as much as Megatron's selective


def test_the_report_has_a_row_per_stage_and_offload_per_node():
    out = cli("evaluate", "scenarios/gpt3-175b-1024xa100.yaml", "--pp", "4", "--vpp", "1", "--zero-stage", "1",
              "--offload-optimizer", "cpu", "--engine", "analytic").stdout
    table = out.split("peak at stage")[1].split("\noffload")[0].splitlines()[3:]
    assert [row.split()[0] for row in table] == ["0", "1", "2", "3"]
    assert "offload    per node (8 devices): host RAM" in out


def test_trace_prints_the_path_it_wrote(tmp_path):
    proc = cli("evaluate", "quickstart", "--trace", "new/step.json", "--json", cwd=tmp_path)
    assert proc.returncode == 0
    assert str(tmp_path / "new" / "step.json") in proc.stderr and (tmp_path / "new" / "step.json").is_file()
    json.loads(proc.stdout)  # stdout stays one JSON object


def test_search_restrictions_and_collapsed_duplicates():
    proc = cli("search", "--model", "megatron-gpt-1.7b", "--cluster", "dgx-a100", "--global-batch", "64", "--engine",
               "analytic", "--no-offload", "--schedule", "1f1b", "--max-tp", "2", "--recompute", "none,full",
               "--memory-headroom", "0.5", "--top", "20", "--json")
    assert proc.returncode == 0, proc.stderr
    plans = json.loads(proc.stdout)["plans"]
    assert plans and all(p["tp"] <= 2 and p["schedule"] == "1f1b" and p["recompute"] in ("none", "full")
                         and p["offload_optimizer"] == p["offload_params"] == p["offload_activations"] == "none"
                         and p["peak_memory_gib"] <= 0.5 * p["memory_capacity_gib"] for p in plans)
    numbers = [(p["step_time_s"], p["peak_memory_gib"], p["usd_per_million_tokens"]) for p in plans]
    assert len(set(numbers)) == len(numbers)
    assert "seconds" not in json.loads(proc.stdout) and "diagnostics" in json.loads(proc.stdout)


BAD_FLAGS = [
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "1e21"), "--global-batch"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--tokens", "-1"),
     "--tokens"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--precision", "fp7"),
     "--precision"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--top", "0"), "--top"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--schedule", "zigzag"),
     "--schedule"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--memory-headroom", "2"),
     "--memory-headroom"),
    (("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--global-batch", "64", "--pipeline-split",
      "even,uneven"), "--pipeline-split"),
    (("evaluate", "quickstart", "--tp", "1e3"), "plan.tp"),
    (("evaluate", "quickstart", "--tokens", "-1"), "training.tokens"),
    (("evaluate", "quickstart", "--sequence-parallel", "maybe"), "plan.sequence_parallel"),
    (("sweep", "sweeps/gpt3-175b-tp-pp", "-o", "x.csv", "--workers", "0"), "--workers"),
    (("sweep", "sweeps/gpt3-175b-tp-pp", "-o", ".", "--workers", "1"), "-o"),
    (("sweep", "sweeps/gpt3-175b-tp-pp", "-o", "x.csv", "--dask", "tcp://127.0.0.1:1", "--no-progress"), "--dask"),
    (("evaluate", "no-such-scenario"), "file not found"),
]


@pytest.mark.parametrize("args,needle", BAD_FLAGS, ids=[" ".join(a[:2] + a[-2:]) for a, _ in BAD_FLAGS])
def test_bad_flags_exit_2_with_one_line(args, needle, tmp_path):
    one_line_error(cli(*args, cwd=tmp_path), needle)


@pytest.mark.parametrize("content", ["- a\n- b\n", "", "cluster: [1, 2]\n"])
def test_search_cluster_files_that_are_not_mappings(tmp_path, content):
    f = tmp_path / "c.yaml"
    f.write_text(content)
    one_line_error(cli("search", "--model", "gpt3-175b", "--cluster", str(f), "--global-batch", "64"), "--cluster")


def test_a_search_model_files_hf_config_is_relative_to_that_file(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "llama.json").write_text((ROOT / "tests" / "data" / "hf" / "llama-3.1-8b.json").read_text())
    (folder / "m.yaml").write_text("model: {hf_config: llama.json, seq_len: 4096}\n")
    proc = cli("search", "--model", str(folder / "m.yaml"), "--cluster", "dgx-h100", "--global-batch", "16",
               "--top", "1", "--engine", "analytic", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plans"]


def test_a_sweep_whose_points_are_all_invalid_exits_2_with_the_first_reasons(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text("base_file: " + str(ROOT / "scenarios" / "quickstart.yaml") + "\nsweep:\n  plan.tp: [3, 5]\n")
    proc = cli("sweep", str(space), "-o", str(tmp_path / "o.csv"), "--workers", "1", "--no-progress")
    one_line_error(proc, "none of its 2 points", "first reasons: plan.dp")


def test_a_second_sweep_into_the_same_output_is_one_line(tmp_path):
    from simulator import sweep as sweep_fn  # noqa: F401
    import importlib
    store = importlib.import_module("simulator.sweep")._store(tmp_path / "o.csv", {}, print)
    store.lock()
    try:
        proc = cli("sweep", "sweeps/gpt3-175b-tp-pp", "-o", str(tmp_path / "o.csv"), "--no-progress")
    finally:
        store.release()
    one_line_error(proc, "another sweep is writing")


def test_calibrate_to_a_name_writes_to_the_user_folder(tmp_path):
    from simulator.cli import _calibration_output
    os.environ["LLMSIM_HOME"] = str(tmp_path)
    try:
        assert _calibration_output("mybox") == tmp_path / "calibrated" / "mybox.yaml"
        assert _calibration_output("profiles/mybox.yaml") == Path("profiles/mybox.yaml")
    finally:
        del os.environ["LLMSIM_HOME"]


def test_user_calibrated_profiles_are_found_by_name(tmp_path):
    import shutil
    calibrated = tmp_path / "calibrated"
    calibrated.mkdir()
    shipped = ROOT / "hardware_profiles" / "calibrated"
    for f in shipped.glob("cpu-epyc-2c*.yaml"):
        text = f.read_text().replace("cpu-epyc-2c", "userbox")
        (calibrated / f.name.replace("cpu-epyc-2c", "userbox")).write_text(text)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: {preset: megatron-gpt-1.7b, layers: 2}\ncluster: {node: userbox-node}\n"
                        "plan: {micro_batch: 1, global_batch: 2, precision: fp32}\n")
    proc = cli("evaluate", str(scenario), "--engine", "analytic", "--json", LLMSIM_HOME=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"] >= 1
    shutil.rmtree(calibrated)


def test_offload_per_node_is_the_offloaded_states_of_its_devices():
    """ZeRO-3 over the 8 devices of one node: optimizer states (12 B/param) and fp32 gradients
    (4 B/param) sharded 8 ways to NVMe, 16-bit weights (2 B/param) to host RAM, so the node
    holds 16 B and 2 B per parameter of the model in all."""
    from simulator.model import load_preset
    from simulator.report import offload_bytes_per_node
    from simulator import scenario_from_dict
    params = load_preset("megatron-gpt-1.7b").params()
    s = scenario_from_dict({"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100"},
                            "plan": {"dp": 8, "global_batch": 8, "zero_stage": 3,
                                     "offload": {"optimizer": "nvme", "params": "cpu"}}})
    off = offload_bytes_per_node(s)
    assert off["nvme_bytes"] == pytest.approx(16 * params, rel=1e-12)
    assert off["host_bytes"] == pytest.approx(2 * params, rel=1e-12)


def test_models_show_gives_a_presets_fields_its_parameters_and_its_source():
    d = json.loads(cli("models", "show", "llama-3.1-8b", "--json").stdout)
    f = d["fields"]
    assert (f["layers"], f["hidden"], f["kv_heads"], f["ffn_hidden"], f["vocab"]) == (32, 4096, 8, 14336, 128256)
    # by hand: untied embedding and head 2·V·h; per layer Q, K, V, O (h·(h + 2·8·128) + h·h),
    # SwiGLU 3·h·f and two norms; the final norm
    h, L, V, F = 4096, 32, 128256, 14336
    assert d["parameters"] == 2 * V * h + L * (h * (h + 2 * 1024) + h * h + 3 * h * F + 2 * h) + h
    assert "config.json" in d["source"]
    one_line_error(cli("models", "show", "llama-9"), "model.preset", "llama-3.1-8b")


def test_hardware_list_with_a_name_lists_only_the_profiles_containing_it():
    out = cli("hardware", "list", "mi300").stdout
    listed = {line.split()[0] for line in out.splitlines() if line[:1].isalnum()}
    assert {"mi300x", "mi300x-node"} <= listed
    assert not {"h100-sxm-80gb", "dgx-h100", "a100-sxm-80gb"} & listed
    one_line_error(cli("hardware", "list", "nothing-like-it"), "hardware list", "nothing-like-it")


def test_models_list_with_a_name_lists_only_the_presets_containing_it():
    out = cli("models", "list", "mixtral").stdout
    rows = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]
    assert rows and all("mixtral" in r for r in rows)
    one_line_error(cli("models", "list", "gpt-9"), "models list", "gpt-9")


def test_compare_marks_the_sequence_where_packed_documents_differ(tmp_path):
    base = {"model": {"preset": "llama-3.1-8b", "seq_len": 32768}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "plan": {"tp": 8, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 8, "recompute": "full"}}
    packed = {**base, "model": {**base["model"], "document_tokens": 4096}}
    paths = scenario_files(tmp_path, causal=base, packed=packed)
    proc = cli("compare", *map(str, paths), "--engine", "analytic")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if " sequence " in line)
    assert line.startswith("*") and line.split()[-4:] == ["32768", "(documents", "of", "4096)"]


def test_validate_torch_without_a_profile_takes_one_calibrated_on_this_kind_of_machine(tmp_path):
    """The newest calibrated profile may be another machine's (a CUDA one beside CPU ones): a
    CPU run is predicted with a profile calibrated on this CPU model, or refused by name."""
    import time

    from simulator import InputError
    from simulator.calibrate.profile_writer import cpu_identity, cpu_model
    from simulator.calibrate.validate_torch import default_profile

    def write(name, device_name):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"calibration": {"device_name": device_name,
                                                                               "cpu": cpu_identity()}}))
        (tmp_path / f"{name}-node.yaml").write_text("{}\n")

    write("mine", f"{cpu_model()}, 1 thread(s) per device")
    write("gpu", "NVIDIA H200")
    newer = time.time() + 60
    os.utime(tmp_path / "gpu.yaml", (newer, newer))
    assert default_profile("cpu", [tmp_path]) == tmp_path / "mine.yaml"
    (tmp_path / "mine.yaml").unlink()
    with pytest.raises(InputError, match="--profile"):
        default_profile("cpu", [tmp_path])


ZEN3 = {"vendor": "AuthenticAMD", "family": 25, "model": 1, "isa": ["avx2"]}
ZEN4 = {"vendor": "AuthenticAMD", "family": 25, "model": 17, "isa": ["avx2", "avx512f", "avx512_bf16"]}


def test_a_calibration_names_the_cpus_family_model_and_the_instruction_sets_torch_dispatches_on():
    """/proc/cpuinfo of a Zen 4 EPYC under KVM (first processor's block): the model name says only
    "AMD EPYC", family 25 model 17 and its AVX-512 BF16 flag say which generation."""
    from simulator.calibrate.profile_writer import cpu_identity

    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 vaes\n\n"
            "processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nflags\t\t: amx_bf16\n")
    assert cpu_identity(text) == ZEN4
    assert cpu_identity("processor\t: 0\n") == {}


def _profiles(tmp_path, profiles: dict):
    from simulator.calibrate.profile_writer import cpu_model

    for name, (date, cpu) in profiles.items():
        cal = {"device": "cpu", "device_name": f"{cpu_model()}, 1 thread(s) per device", "date": date,
               **({"cpu": cpu} if cpu else {})}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"peak_tflops": {"fp32": 0.1}, "calibration": cal}))
        (tmp_path / f"{name}-node.yaml").write_text("{}\n")


def test_validate_torch_never_takes_a_profile_calibrated_on_another_cpu_generation(tmp_path, monkeypatch):
    """On a Zen 3 EPYC, a later profile of a Zen 4 one (the same model name) is never taken: one that
    records this CPU is; with only the Zen 4 one it is refused by name."""
    from simulator import InputError
    from simulator.calibrate import profile_writer
    from simulator.calibrate.validate_torch import default_profile

    monkeypatch.setattr(profile_writer, "cpu_identity", lambda: ZEN3)
    _profiles(tmp_path, {"zen4": ("2026-12-06T10:00:00Z", ZEN4), "zen3": ("2026-12-01T10:00:00Z", ZEN3)})
    assert default_profile("cpu", [tmp_path]) == tmp_path / "zen3.yaml"
    (tmp_path / "zen3.yaml").unlink()
    with pytest.raises(InputError, match=r"another CPU generation \(AuthenticAMD family 25 model 17"):
        default_profile("cpu", [tmp_path])


def test_validate_torch_takes_a_profile_recording_no_cpu_only_when_asked(tmp_path, monkeypatch):
    """A profile written before calibrations recorded their CPU is no evidence of this one (the
    older EPYC profile on a Zen 5: 27 % off): refused by name, with --profile as the way to use
    it; taken where this CPU cannot be identified either."""
    from simulator import InputError
    from simulator.calibrate import profile_writer
    from simulator.calibrate.validate_torch import default_profile

    _profiles(tmp_path, {"unrecorded": ("2026-12-05T10:00:00Z", None)})
    monkeypatch.setattr(profile_writer, "cpu_identity", lambda: ZEN3)
    with pytest.raises(InputError, match=r"AuthenticAMD family 25 model 1 \(avx2\)\); unrecorded records no CPU"):
        default_profile("cpu", [tmp_path])
    monkeypatch.setattr(profile_writer, "cpu_identity", lambda: {})
    assert default_profile("cpu", [tmp_path]) == tmp_path / "unrecorded.yaml"


def test_validate_torch_records_no_residuals_in_another_cpus_profile(tmp_path, monkeypatch):
    """The rows measured on a Zen 3 are not the Zen 4 profile's prediction intervals."""
    from simulator.calibrate import profile_writer
    from simulator.calibrate.validate_torch import record

    monkeypatch.setattr(profile_writer, "cpu_identity", lambda: ZEN3)
    _profiles(tmp_path, {"zen4": ("2026-12-06T10:00:00Z", ZEN4)})
    path = tmp_path / "zen4.yaml"
    before = path.read_text()
    why = record(path, yaml.safe_load(before), {"rows": [], "quick": False}, "cpu")
    assert why.startswith("not recorded: the profile was calibrated on AuthenticAMD family 25 model 17")
    assert path.read_text() == before


def test_validate_torch_records_no_residuals_in_a_shipped_profile(monkeypatch):
    """A user's run on their Zen 4 does not rewrite the intervals the package gives every user,
    even on the CPU the shipped profile was calibrated on."""
    from simulator.calibrate import profile_writer, validate_torch
    from simulator.hardware import CALIBRATED, profiles_dir

    monkeypatch.setattr(profile_writer, "cpu_identity", lambda: ZEN4)
    monkeypatch.setattr(validate_torch, "_this_device", lambda device: "AMD EPYC")
    path = profiles_dir() / CALIBRATED / "cpu-epyc-zen4-2c.yaml"
    before = path.read_text()
    why = validate_torch.record(path, yaml.safe_load(before), {"rows": [], "quick": False}, "cpu")
    assert why.startswith("not recorded: cpu-epyc-zen4-2c.yaml ships with llmsim")
    assert path.read_text() == before


@pytest.mark.parametrize("has_bf16", [True, False])
def test_validate_torch_takes_the_profile_of_this_cpus_generation_then_the_latest_calibration(tmp_path, monkeypatch,
                                                                                                has_bf16):
    """Two EPYC generations both call themselves "AMD EPYC": the one whose bf16 rate this CPU
    has (or lacks) is taken, and of those the latest calibration date, not the newest file."""
    import time

    from simulator.calibrate import calibration
    from simulator.calibrate.profile_writer import cpu_identity, cpu_model
    from simulator.calibrate.validate_torch import default_profile

    def write(name, date, precisions):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({
            "peak_tflops": {p: 0.1 for p in precisions},
            "calibration": {"device_name": f"{cpu_model()}, 1 thread(s) per device", "date": date,
                            "cpu": cpu_identity()}}))
        (tmp_path / f"{name}-node.yaml").write_text("{}\n")

    write("fp32-old", "2026-12-01T10:00:00Z", ["fp32"])
    write("fp32-new", "2026-12-02T10:00:00Z", ["fp32"])
    write("bf16", "2026-12-06T10:00:00Z", ["fp32", "bf16"])
    newer = time.time() + 60
    os.utime(tmp_path / "fp32-old.yaml", (newer, newer))
    monkeypatch.setattr(calibration, "cpu_has_bf16", lambda: has_bf16)
    assert default_profile("cpu", [tmp_path]) == tmp_path / ("bf16.yaml" if has_bf16 else "fp32-new.yaml")
