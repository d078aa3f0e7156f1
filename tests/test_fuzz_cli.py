"""Hypothesis over scenario files: `llmsim evaluate` exits 0 with a result or 2 with one line,
never a traceback or an internal error, and never takes more than 10 s. Run in-process (main()),
kept small for CI; HYPOTHESIS_PROFILE=long runs more examples."""

import contextlib
import csv
import io
import os
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.sweep import sweep

TORCHTITAN = Path(__file__).parent / "data" / "imports" / "torchtitan-llama3_70b.toml"

settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

BASE = {"model": {"preset": "megatron-gpt-1.7b"}, "cluster": {"node": "dgx-a100", "nodes": 1},
        "plan": {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1, "global_batch": 8, "schedule": "1f1b",
                 "recompute": "selective", "zero_stage": 1}, "training": {"tokens": 1.0e+10}}
FIELDS = ["model.preset", "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.seq_len",
          "model.document_tokens", "model.sliding_window", "model.sliding_window_freq",
          "model.sliding_window_skip_freq", "model.window_kind", "model.qk_norm", "model.qk_norm_scope",
          "model.qk_norm_kind", "model.nope_layer_interval", "model.moe_layer_offset",
          "model.pre_norms", "model.post_norms", "model.rotary_fraction", "model.parallel_block",
          "model.shared_norm", "model.qkv_bias",
          "model.vocab", "model.activation", "cluster.node", "cluster.nodes", "cluster.accelerator",
          "cluster.devices_per_node", "plan.tp", "plan.pp", "plan.dp", "plan.cp", "plan.vpp", "plan.micro_batch",
          "plan.global_batch", "plan.schedule", "plan.sequence_parallel", "plan.recompute", "plan.zero_stage",
          "plan.precision", "plan.offload.optimizer", "plan.offload.params", "plan.offload.activations",
          "plan.grad_precision", "plan.rank_order", "plan.flash_attention", "plan.dp_replicate",
          "plan.cp_attention", "plan.cp_ulysses", "plan.fp8_recipe", "plan.bf16_layers_at_start",
          "plan.bf16_layers_at_end", "plan.optimizer", "plan.muon_ns_steps", "plan.muon_tp_mode", "plan.moe.grouped_gemm",
          "plan.moe.dispatcher", "plan.moe.dispatcher_sms", "model.router_groups", "model.router_group_topk",
          "training.tokens",
          "training.price_usd_per_device_hour", "plan.extra", "extra"]
VALUES = st.one_of(
    st.integers(-3, 130), st.sampled_from([0, 1, 2, 4, 8, 16, 64, 96, 2**31, 2**63, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.sampled_from(["1f1b", "interleaved", "gpipe", "zb-h1", "none", "full", "cpu", "nvme", "bf16", "fp8",
                     "auto", "gpt3-175b", "llama-3.1-8b", "dgx-h100", "mi300x", "tp-cp-dp-pp", "", "1e9", "ü",
                     "muon", "adam", "blockwise", "distributed", "ulysses", "ulysses-ring", "kv-allgather", "current", "mxfp8",
                     "nvfp4", "dgx-b200", "head", "deepep", "hybridep", "gb200-nvl72",
                     "chunked", "l2", "llama-4-scout"]),
    st.lists(st.integers(0, 4), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _set(data, dotted, value):
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _run(args):
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse
            rc = exc.code
    return rc, out.getvalue(), err.getvalue(), time.monotonic() - start


def _check(rc, out, err, seconds):
    assert seconds < 10, seconds
    assert "Traceback" not in err and "internal error" not in err, err
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, err
    else:
        assert out


@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), max_size=4),
       engine=st.sampled_from(["analytic", "graph"]))
def test_evaluate_any_scenario_is_a_result_or_one_line(tmp_path_factory, changes, engine):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in changes:
        _set(data, dotted, value)
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except (ValueError, OverflowError):
        return
    path.write_text(text, encoding="utf-8")
    _check(*_run(["evaluate", str(path), "--engine", engine, "--json"]))


@given(text=st.text(max_size=200))
def test_evaluate_any_text_is_a_result_or_one_line(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_text(text, encoding="utf-8")
    _check(*_run(["evaluate", str(path), "--engine", "analytic"]))


@given(flag=st.sampled_from(["--tp", "--pp", "--global-batch", "--nodes", "--tokens", "--vpp", "--schedule",
                             "--precision", "--zero-stage", "--micro-batch", "--offload-optimizer", "--cp"]),
       value=st.one_of(st.integers(-5, 2**70).map(str), st.floats().map(repr),
                       st.sampled_from(["1e21", "-1", "0", "nan", "inf", "true", "8.5", "", "auto", "010", "1:04"])),
       imported=st.booleans())
def test_any_flag_value_is_a_result_or_one_line(flag, value, imported):
    source = ["--from", "torchtitan", str(TORCHTITAN), "--node", "dgx-h100"] if imported else ["quickstart"]
    _check(*_run(["evaluate", *source, flag, value, "--engine", "analytic"]))


CONSTRAINTS = st.sampled_from(["plan.tp * plan.pp <= 8", "plan.tp ** plan.pp < 100", "plan.recompute != 'none'",
                               "plan.tp in [1, 2]", "plan.dp > 0", "plan.micro_batch // 0", "plan.zz > 1",
                               "not plan.tp", "'a' * plan.tp == 'aa'", "plan.tp ** 2 ** 2 ** 9", "(", "x.y.z",
                               "__import__('os')", "plan.tp.real", "[1][0]", "plan.global_batch % plan.dp == 0"])


@given(axes=st.dictionaries(st.sampled_from(["plan.tp", "plan.pp", "plan.micro_batch", "plan.recompute",
                                             "plan.zero_stage", "cluster.nodes", "plan.dp", "model.preset", "tp",
                                             "plan.schedule"]),
                            st.one_of(st.lists(VALUES, max_size=3), VALUES,
                                      st.fixed_dictionaries({"range": st.lists(VALUES, max_size=3)}),
                                      st.fixed_dictionaries({"pow2": st.lists(VALUES, max_size=3)})), max_size=3),
       constraints=st.lists(CONSTRAINTS, max_size=2))
def test_sweep_of_any_space_is_a_table_or_one_line(tmp_path_factory, axes, constraints):
    folder = tmp_path_factory.mktemp("fuzz")
    space = {"base": BASE, "sweep": axes, "constraints": constraints}
    try:
        text = yaml.safe_dump(space, allow_unicode=True)
    except (ValueError, OverflowError):
        return
    (folder / "space.yaml").write_text(text, encoding="utf-8")
    rc, out, err, seconds = _run(["sweep", str(folder / "space.yaml"), "-o", str(folder / "o.csv"), "--workers", "1",
                                  "--no-progress"])
    _check(rc, out, err, seconds)


IMPORTS = Path(__file__).parent / "data" / "imports"
MEGATRON_FIELDS = ["num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                   "ffn_hidden_size", "num_moe_experts", "moe_router_topk", "moe_layer_freq", "expert_model_parallel_size",
                   "expert_tensor_parallel_size", "moe_token_dispatcher_type", "moe_shared_expert_intermediate_size",
                   "moe_grouped_gemm", "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms",
                   "moe_router_num_groups", "moe_router_group_topk", "moe_enable_deepep",
                   "multi_latent_attention", "q_lora_rank", "mtp_num_layers", "window_size", "window_attn_skip_freq",
                   "pipeline_model_parallel_layout", "num_layers_in_first_pipeline_stage",
                   "account_for_embedding_in_pipeline_split", "recompute_granularity", "recompute_method",
                   "recompute_num_layers", "recompute_modules", "tensor_model_parallel_size",
                   "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size", "context_parallel_size",
                   "seq_length", "vocab_size", "cp_comm_type", "global_batch_size"]
MEGATRON_VALUES = st.one_of(VALUES, st.sampled_from(
    ["Et*15|(t*16|)*6,t*15L", "([0]*3+[1]*58)", "[1,0]*16", "selective", "full", "block", ["moe_act"], "alltoall",
     "flex", "deepep", "hybridep", "ncclep", [127, 0], "(127,0)", "p2p", "$((8*1))"]))


@given(changes=st.lists(st.tuples(st.sampled_from(MEGATRON_FIELDS), MEGATRON_VALUES), max_size=4),
       source=st.sampled_from(["bridge-llama3_8b_sft_gb200_fp8_mx_v1.yaml", "nemo-grok1_314b.yaml"]))
def test_any_megatron_config_value_is_a_result_or_one_line(tmp_path_factory, changes, source):
    """NeMo and Megatron-Bridge YAML (a field of TransformerConfig under model, or Bridge's
    train.global_batch_size), imported and evaluated."""
    data = yaml.safe_load((IMPORTS / source).read_text())
    for field, value in changes:
        _set(data, f"{'train' if field == 'global_batch_size' and source.startswith('bridge') else 'model'}.{field}",
             value)
    folder = tmp_path_factory.mktemp("fuzz")
    try:
        (folder / "c.yaml").write_text(yaml.safe_dump(data))
    except (ValueError, OverflowError):
        return
    _check(*_run(["evaluate", "--from", "megatron", str(folder / "c.yaml"), "--node", "dgx-h100", "--nodes", "8"]))


TOML_VALUES = st.sampled_from(['"x"', "0", "-1", "8", "1.5", "1e400", "nan", "true", "false", "[]", '["a", "b"]', "[1, 2]",
                               "{a = 1}", '"float8"', '["float8"]', '"rowwise"', '"Interleaved1F1B"', '"full"',
                               '"selective"', '"op"', '"alltoall"', '"block_causal"', '"never"', '""', '"8B"'])


@given(changes=st.lists(st.tuples(st.integers(0, 10**6), TOML_VALUES), min_size=1, max_size=4),
       source=st.sampled_from(sorted(p.name for p in IMPORTS.glob("torchtitan-*.toml"))))
def test_any_torchtitan_config_value_is_a_result_or_one_line(tmp_path_factory, changes, source):
    """A torchtitan TOML job config whose values (any `key = value` line) are replaced, imported and evaluated."""
    lines = (IMPORTS / source).read_text().splitlines()
    settable = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith(("#", "["))]
    for pick, value in changes:
        i = settable[pick % len(settable)]
        lines[i] = lines[i].split("=", 1)[0] + "= " + value
    path = tmp_path_factory.mktemp("fuzz") / "c.toml"
    path.write_text("\n".join(lines) + "\n")
    _check(*_run(["evaluate", "--from", "torchtitan", str(path), "--node", "dgx-h100", "--nodes", "8"]))


PLOT_KINDS = ["pareto", "heatmap", "breakdown", "memory", "scatter", "timeline", "accelerators"]
CELLS = st.one_of(st.sampled_from(["", "abc", "nan", "inf", "-inf", "-1", "0", "1e308", "True", "[]", "{bad", "null",
                                   "[1,2]", '[{"weights": "x"}]', '[{"weights": -1}]', "[null]", "1.5", "0x1f"]),
                  st.text(max_size=8))


@pytest.fixture(scope="module")
def sweep_table(tmp_path_factory):
    """A small sweep's CSV: feasible, out-of-memory and invalid rows."""
    out = tmp_path_factory.mktemp("plots") / "t.csv"
    sweep({"base": {**BASE, "cluster": {"node": "dgx-a100", "nodes": 2}, "plan": {"global_batch": 64, "dp": "auto"}},
           "sweep": {"plan.tp": [1, 2, 4], "plan.pp": [1, 2, 3], "plan.micro_batch": [1, 2]}},
          workers=1, progress=False, out=out)
    return out.read_text()


@pytest.fixture(scope="module")
def timeline_table():
    """The graph engine's timeline of a small plan, as `plot --kind timeline` reads it from CSV."""
    from simulator import load_scenario
    from simulator.evaluate import compile_scenario
    from simulator.trace import chrome_trace, execute, trace_timeline

    scenario = load_scenario("quickstart", {"plan.global_batch": 64, "cluster.nodes": 1, "plan.dp": "auto"})
    return trace_timeline(chrome_trace(execute(compile_scenario(scenario)), scenario.name)).to_csv(index=False)


@given(cells=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 200), CELLS), min_size=1, max_size=6),
       dropped=st.lists(st.integers(0, 200), max_size=4), kind=st.sampled_from(PLOT_KINDS), timeline=st.booleans())
def test_plot_of_any_damaged_table_is_a_picture_or_one_line(tmp_path_factory, sweep_table, timeline_table, cells,
                                                            dropped, kind, timeline):
    header, *rows = list(csv.reader(io.StringIO(timeline_table if timeline else sweep_table)))
    for row, column, value in cells:
        rows[row % len(rows)][column % len(header)] = value
    keep = [i for i in range(len(header)) if i not in {d % len(header) for d in dropped}]
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows([[r[i] for i in keep] for r in [header, *rows]])
    path = tmp_path_factory.mktemp("fuzz") / "t.csv"
    path.write_text(text.getvalue(), encoding="utf-8")
    rc, out, err, seconds = _run(["plot", str(path), "--kind", kind, "-o", str(path.with_suffix(".png"))])
    _check(rc, out, err, seconds)
    if rc == 0:
        assert not err  # no warnings beside the picture
