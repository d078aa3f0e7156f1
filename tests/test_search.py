"""Plan search: exactly the plans validate accepts, ranked by the objective, numbers of evaluate()."""

import itertools
import math
import subprocess
import sys
from dataclasses import replace

import pytest

from simulator import InputError, evaluate
from simulator.hardware import cluster_from_dict
from simulator.model import model_from_dict
from simulator.plan import Plan, validate
from simulator.scenario import Scenario, Training
from simulator.stagesplit import balanced_layout
from simulator.search import OFFLOADS, SearchOptions, _scenario_of, evaluate_all, search

MODEL = {"preset": "megatron-gpt-1.7b"}
CLUSTER = {"node": "dgx-a100", "nodes": 1}
OPTS = SearchOptions(max_micro_batch=4, max_vpp=3, max_cp=2, offloads=("none", "optimizer-cpu"))
HYBRID = replace(OPTS, dp_replicates=(1, 2, 4))
CP_METHODS = replace(OPTS, cp_attentions=("ring", "ulysses", "kv-allgather"))
HIERARCHICAL_CP = replace(OPTS, max_cp=8, max_micro_batch=2, schedules=("1f1b",), offloads=("none",),
                          cp_attentions=("ring", "ulysses-ring"))
# a framework's options held on every plan: one needs full recomputation (a setting), one tp > 1 (a shape)
FIXED = replace(OPTS, plan_options=(("recompute_method", "block"), ("recompute_num_layers", 2),
                                    ("projections", "separate"), ("loss", "loss-parallel")))


def _balanced_tried(model, pp, chunks):
    """Whether the search tries the balanced split (the schedules here place virtual stage k
    on rank k mod pp): where it differs from the even split and its middle ranks hold alike
    layer counts."""
    layout = balanced_layout(model.layers, pp * chunks)
    ranks = [sum(layout[r::pp]) for r in range(pp)]
    return layout != (model.layers // (pp * chunks),) * (pp * chunks) and len(set(ranks[1:-1])) <= 1


def _brute_force(model, cluster, global_batch, opts):
    """Every combination of every field in range (with the fixed plan fields), kept when
    validate accepts it."""
    fixed = dict(opts.plan_options)
    n = cluster.devices
    methods = opts.cp_attentions or ("ring",)  # the default for a model without sliding windows
    out = set()
    for tp, pp, cp, mb, vpp in itertools.product(range(1, n + 1), range(1, n + 1), range(1, opts.max_cp + 1),
                                                 range(1, opts.max_micro_batch + 1), range(1, opts.max_vpp + 1)):
        if n % (tp * pp * cp):
            continue
        for schedule, sp, recompute, zero, off, r, attention, ulysses, split in itertools.product(
                opts.schedules, (False, True), ("none", "full"), opts.zero_stages, opts.offloads, opts.dp_replicates,
                methods, range(1, cp + 1), opts.pipeline_splits):
            if (sp and tp == 1) or (schedule == "interleaved" and vpp == 1):
                continue  # the same plan as sp off; interleaving one chunk is 1F1B (search skips both)
            if cp == 1 and attention != methods[0]:
                continue  # without CP the implementations are one plan
            if ulysses == cp > 1:
                continue  # ulysses-ring with one group of all CP ranks is ulysses
            if split == "balanced" and not _balanced_tried(model, pp, vpp if schedule == "interleaved" else 1):
                continue
            plan = Plan(tp=tp, pp=pp, dp=n // (tp * pp * cp), cp=cp, vpp=vpp, micro_batch=mb,
                        global_batch=global_batch, schedule=schedule, sequence_parallel=sp, recompute=recompute,
                        zero_stage=zero, offload=OFFLOADS[off], dp_replicate=r, cp_attention=attention,
                        cp_ulysses=ulysses, pipeline_split=split, **fixed)
            try:
                validate(plan, model, cluster)
            except InputError:
                continue
            out.add((tp, pp, plan.dp, cp, vpp, mb, schedule, sp, recompute, zero, plan.offload.optimizer, r,
                     attention, ulysses, split))
    return out


@pytest.mark.parametrize("opts", [OPTS, HYBRID, CP_METHODS, HIERARCHICAL_CP, FIXED],
                         ids=["default", "hybrid-sharding", "cp-methods", "hierarchical-cp", "fixed-plan-fields"])
def test_search_enumerates_exactly_the_plans_validate_accepts(opts):
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    table, _ = evaluate_all(model, cluster, 16, opts)
    got = {(r.tp, r.pp, r.dp, r.cp, r.vpp, r.micro_batch, r.schedule, bool(r.sequence_parallel), r.recompute,
            r.zero_stage, r.offload_optimizer, r.dp_replicate, r.cp_attention, r.cp_ulysses, r.pipeline_split)
           for r in table.itertuples(index=False)}
    assert len(got) == len(table)
    assert got == _brute_force(model, cluster, 16, opts)
    assert {r[-4] for r in got} == set(opts.dp_replicates)
    assert {r[-3] for r in got} == set(opts.cp_attentions or ("ring",))


def test_a_search_over_a_model_with_sliding_windows_tries_the_cp_methods_te_runs_them_with():
    # TE runs windows under CP by its all-gather and all-to-alls only; the default ring is refused
    model = model_from_dict({**MODEL, "sliding_window": 512})
    table, _ = evaluate_all(model, cluster_from_dict(CLUSTER), 16, OPTS)
    assert set(table[table.cp > 1].cp_attention) == {"kv-allgather", "ulysses"}
    assert set(table[table.cp == 1].cp_attention) == {"ring"}


def test_search_tries_ulysses_ring_at_every_group_size_short_of_all_cp_ranks():
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    table, _ = evaluate_all(model, cluster, 16, HIERARCHICAL_CP)
    hierarchical = table[table.cp_attention == "ulysses-ring"]
    assert {(int(r.cp), int(r.cp_ulysses)) for r in hierarchical.itertuples()} == {(4, 2), (8, 2), (8, 4)}


@pytest.mark.parametrize("opts", [OPTS, replace(OPTS, dp_replicates=(2,), zero_stages=(1, 2, 3))],
                         ids=["zero-over-dp", "hybrid-sharding-only"])
def test_ranked_plans_carry_the_numbers_of_single_evaluations(opts):
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    result = search(model, cluster, 16, top=5, engine="analytic", options=opts)
    assert set(result.table.dp_replicate) == set(opts.dp_replicates)
    for row in result.table.itertuples(index=False):
        want = evaluate(_scenario_of(row, model, cluster, Training()), engine="analytic").to_dict()
        for key in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "usd_per_million_tokens"):
            assert math.isclose(getattr(row, key), want[key], rel_tol=1e-12), key


def test_a_model_whose_ranks_hold_different_layer_mixes_is_searched_with_single_evaluations():
    """Windows on every other of 12 layers: 2 stages of 6 hold 3 each, 4 stages of 3 hold 2, 1,
    2, 1 (the batch is split per pipeline size; it once crashed the search)."""
    model = model_from_dict({"layers": 12, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                             "seq_len": 2048, "activation": "swiglu", "norm": "rmsnorm",
                             "position_embedding": "rope", "bias": False, "sliding_window": 256,
                             "sliding_window_freq": 2})
    cluster = cluster_from_dict(CLUSTER)
    opts = replace(OPTS, schedules=("1f1b",), max_cp=1, offloads=("none",))
    table, _ = evaluate_all(model, cluster, 16, opts)
    assert {2, 4} <= set(table.pp)
    for pp in (2, 4):
        for row in table[table.pp == pp].head(6).itertuples(index=False):
            want = evaluate(_scenario_of(row, model, cluster, Training()), engine="analytic").to_dict()
            for key in ("step_time_s", "peak_memory_gib"):
                assert math.isclose(getattr(row, key), want[key], rel_tol=1e-12), key


@pytest.mark.parametrize("objective,column,ascending", [("throughput", "tokens_per_s", False),
                                                        ("cost", "usd_per_million_tokens", True),
                                                        ("time-to-train", "step_time_s", True)])
def test_plans_are_ranked_best_first_by_the_objective(objective, column, ascending):
    result = search(MODEL, CLUSTER, 16, objective=objective, top=8, engine="analytic", options=OPTS)
    values = list(result.table[column])
    assert values == sorted(values, reverse=not ascending)
    assert list(result.table["rank"]) == list(range(1, 9))


def test_ranked_plans_with_fixed_plan_fields_carry_the_numbers_of_those_plans():
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    result = search(model, cluster, 16, top=5, engine="analytic", options=FIXED)
    assert len(result.table) and set(result.table.recompute) == {"full"} and (result.table.tp > 1).all()
    assert result.notes[0] == "every plan: loss=loss-parallel, projections=separate, recompute_method=block, " \
        "recompute_num_layers=2"
    for row in result.table.itertuples(index=False):
        plan = replace(_scenario_of(row, model, cluster, Training()).plan, **dict(FIXED.plan_options))
        want = evaluate(Scenario(model, cluster, plan, Training()), engine="analytic").to_dict()
        assert math.isclose(row.step_time_s, want["step_time_s"], rel_tol=1e-12)
        assert math.isclose(row.peak_memory_gib, want["peak_memory_gib"], rel_tol=1e-12)


def test_flash_attention_held_off_on_every_plan_adds_selective_recomputation():
    # without flash attention selective recomputation re-runs the attention core: a third
    # recompute mode beside none and full for every shape and setting
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    flash = search(model, cluster, 16, top=5, engine="analytic", options=OPTS)
    eager = search(model, cluster, 16, top=5, engine="analytic",
                   options=replace(OPTS, plan_options=(("flash_attention", False),)))
    assert 2 * eager.enumerated == 3 * flash.enumerated
    assert eager.notes[0] == "every plan: flash_attention=False"
    assert len(eager.table) and not eager.table.flash_attention.any()
    for row in eager.table.itertuples(index=False):
        plan = replace(_scenario_of(row, model, cluster, Training()).plan, flash_attention=False)
        want = evaluate(Scenario(model, cluster, plan, Training()), engine="analytic").to_dict()
        assert math.isclose(row.step_time_s, want["step_time_s"], rel_tol=1e-12)


@pytest.mark.parametrize("options, field", [
    ((("tp", 2),), "search plan.tp"),  # the search varies it
    ((("offload", {"optimizer": "cpu"}),), "search plan.offload"),
    ((("projections", "split"),), "plan.projections"),
    ((("bogus", 1),), "plan.bogus"),
])
def test_fixed_plan_fields_the_search_cannot_hold_are_refused_by_name(options, field):
    with pytest.raises(InputError) as e:
        search(MODEL, CLUSTER, 16, engine="analytic", options=replace(OPTS, plan_options=options))
    assert e.value.field == field


def test_a_search_whose_fixed_fields_refuse_every_plan_says_which():
    # BF16 layers are the exception to FP8 linears: refused in a BF16 search
    result = search(MODEL, CLUSTER, 16, engine="analytic",
                    options=replace(OPTS, precision="bf16", plan_options=(("bf16_layers_at_end", 1),)))
    assert result.valid == 0
    assert "plan.bf16_layers_at_end" in result.notes[-1]


def test_a_search_whose_fixed_fields_no_setting_allows_says_which():
    # Megatron's block recomputation needs full recomputation, which this search leaves out
    result = search(MODEL, CLUSTER, 16, engine="analytic",
                    options=replace(OPTS, recompute=("none",), plan_options=(("recompute_method", "block"),)))
    assert result.valid == 0
    assert "plan.recompute_method" in result.notes[-1]


def test_cli_search_holds_the_fields_set_on_every_plan():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "megatron-gpt-1.7b",
                           "--cluster", "dgx-a100", "--global-batch", "16", "--top", "2", "--engine", "analytic",
                           "--set", "plan.projections=separate", "--set", "plan.moe.load_imbalance=1.0"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "note: every plan: moe.load_imbalance=1.0, projections=separate" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "megatron-gpt-1.7b",
                          "--cluster", "dgx-a100", "--global-batch", "16", "--set", "tp=2"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "plan.FIELD=VALUE" in bad.stderr


def test_the_best_plan_is_the_best_feasible_plan_of_the_full_table():
    model, cluster = model_from_dict(MODEL), cluster_from_dict(CLUSTER)
    table, _ = evaluate_all(model, cluster, 16, OPTS)
    best = table[table["feasible"]]["tokens_per_s"].max()
    assert search(model, cluster, 16, top=1, engine="analytic", options=OPTS).table.loc[0, "tokens_per_s"] == best


def test_out_of_memory_plans_are_not_ranked():
    result = search({"preset": "megatron-gpt-39b"}, CLUSTER, 16, top=50, engine="analytic", options=OPTS)
    assert result.feasible < result.valid
    assert result.table["feasible"].all()


def test_a_search_where_nothing_fits_says_so():
    result = search({"preset": "megatron-gpt-1t"}, CLUSTER, 16, engine="analytic",
                    options=SearchOptions(offloads=("none",), max_micro_batch=1, max_vpp=2))
    assert result.valid > 0 and result.feasible == 0 and len(result.table) == 0
    assert "fits in memory" in result.notes[0]


def test_asking_for_the_graph_engine_says_which_engine_ranked():
    result = search(MODEL, CLUSTER, 16, top=3, engine="graph", options=OPTS)
    assert result.ranked_by.startswith("analytic pre-filter, graph for the top")
    assert search(MODEL, CLUSTER, 16, top=3, engine="analytic", options=OPTS).ranked_by == "analytic"


def test_a_search_over_several_precisions_ranks_each_precisions_plans_together():
    """bf16 and fp8 side by side on H100s: every plan of each single-precision search is in
    the joint table, whose best is the better of the two bests, each with its own numbers."""
    h100 = {"node": "dgx-h100", "nodes": 1}
    joint = evaluate_all(model_from_dict(MODEL), cluster_from_dict(h100), 16, replace(OPTS, precision=("bf16", "fp8")))
    alone = {p: evaluate_all(model_from_dict(MODEL), cluster_from_dict(h100), 16, replace(OPTS, precision=p))
             for p in ("bf16", "fp8")}
    assert len(joint[0]) == sum(len(t) for t, _ in alone.values())
    assert joint[1] == sum(n for _, n in alone.values())
    best = search(MODEL, h100, 16, top=1, engine="analytic", options=replace(OPTS, precision=("bf16", "fp8")))
    fastest = {p: search(MODEL, h100, 16, top=1, engine="analytic", options=replace(OPTS, precision=p)).table
               for p in ("bf16", "fp8")}
    winner = min(fastest.values(), key=lambda t: t.step_time_s.iloc[0])
    assert best.table.precision.iloc[0] == winner.precision.iloc[0]
    assert best.table.step_time_s.iloc[0] == winner.step_time_s.iloc[0]


def test_a_precision_the_cluster_cannot_run_is_refused_before_searching():
    with pytest.raises(InputError, match="plan.precision"):
        search(MODEL, CLUSTER, 16, engine="analytic", options=replace(OPTS, precision=("bf16", "nvfp4")))


def test_a_precision_whose_every_plan_a_fixed_field_refuses_is_named_with_the_refusal():
    opts = replace(OPTS, precision=("bf16", "fp8"), schedules=("1f1b",), offloads=("none",), zero_stages=(1,),
                   plan_options=(("fp8_recipe", "current"), ("moe", {"router_padding": True})))
    result = search({"preset": "mixtral-8x7b", "seq_len": 1024}, {"node": "dgx-h100", "nodes": 1}, 16, top=1,
                    engine="analytic", options=opts)
    assert result.valid > 0  # fp8's plans
    assert any(n.startswith("no valid plan in bf16: plan.moe.router_padding") for n in result.notes)


def test_cli_search_prints_the_ranked_plans():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "megatron-gpt-1.7b",
                           "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "16", "--top", "3"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "plans enumerated" in lines[0]
    assert [ln.split()[0] for ln in lines[-3:]] == ["1", "2", "3"]


def test_cli_search_with_a_bad_objective_exits_2():
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "megatron-gpt-1.7b",
                           "--cluster", "dgx-a100", "--global-batch", "16", "--objective", "fastest"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1


def test_the_balanced_split_reaches_pipeline_sizes_that_do_not_divide_the_layers():
    """14 layers: no even split over 4 ranks; weighing the embedding and the output as a layer
    each, 16 over 4 stages give 3, 4, 4, 3 (by hand), and the ranked plans carry evaluate()'s
    numbers for that split."""
    model = model_from_dict({**MODEL, "layers": 14})
    cluster = cluster_from_dict(CLUSTER)
    opts = replace(OPTS, schedules=("1f1b",), max_cp=1, offloads=("none",))
    table, _ = evaluate_all(model, cluster, 16, opts)
    assert set(table[table.pp == 4].pipeline_split) == {"balanced"}
    even_only, _ = evaluate_all(model, cluster, 16, replace(opts, pipeline_splits=("even",)))
    assert 4 not in set(even_only.pp)
    ranked = search(model, cluster, 16, top=10**4, engine="analytic", options=opts).table
    row = next(r for r in ranked.itertuples(index=False) if r.pp == 4)
    assert row.stage_layers == "[3, 4, 4, 3]"
    want = evaluate(_scenario_of(row, model, cluster, Training()), engine="analytic").to_dict()
    for key in ("step_time_s", "peak_memory_gib"):
        assert math.isclose(getattr(row, key), want[key], rel_tol=1e-12), key


def test_cli_search_shows_the_layers_of_a_balanced_split():
    """Llama 3.1 405B's 126 layers over 16 ranks of 128 H100s: 7, 8 x 14, 7."""
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "llama-3.1-405b",
                           "--cluster", "dgx-h100", "--nodes", "16", "--global-batch", "512", "--engine", "analytic",
                           "--schedule", "1f1b", "--max-pp", "16", "--no-offload", "--pipeline-split", "balanced",
                           "--top", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[-3], proc.stdout.splitlines()[-1]
    cells = dict(zip(header.split(), row.split()))
    # 128 weighed layers over 4, 8 or 16 ranks: 32, 16 or 8 each, the first and last a layer less
    assert cells["layers"] == {"4": "31,32x2,31", "8": "15,16x6,15", "16": "7,8x14,7"}[cells["pp"]]


def test_an_unknown_pipeline_split_is_refused_naming_the_option():
    with pytest.raises(InputError) as err:
        search(MODEL, CLUSTER, 16, options=replace(OPTS, pipeline_splits=("even", "uneven")))
    assert err.value.field == "search.pipeline_splits"


def test_a_search_result_shows_itself_as_llmsim_search_prints_it():
    result = search("llama-3.1-8b", {"node": "dgx-h100", "nodes": 8}, 512, top=3, engine="analytic",
                    objective="cost")
    shown = repr(result).splitlines()
    assert shown[0] == (f"{result.enumerated:,} plans enumerated, {result.valid:,} valid, {result.feasible:,} fit in "
                        "memory; ranked by cost (analytic)")
    assert [line.split()[0] for line in shown[-3:]] == ["1", "2", "3"]
    cli = subprocess.run([sys.executable, "-m", "simulator.cli", "search", "--model", "llama-3.1-8b", "--cluster",
                          "dgx-h100", "--nodes", "8", "--global-batch", "512", "--top", "3", "--engine", "analytic",
                          "--objective", "cost"], capture_output=True, text=True, check=True)
    assert cli.stdout.splitlines() == shown
