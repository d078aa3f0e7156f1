"""The compile step: a validated scenario resolved once into a Layout, which both engines read.

    Scenario ──compile──> Layout ──> analytic.py (closed forms)  ─┐
                           │                                      ├─> evaluate.py -> Result
                           └────────> graph.py -> engine.py ─────┘

A Layout holds everything an engine needs and nothing it must derive again: the placed
collective groups of the parallel dimensions (dims.py), the bound schedule (schedules.py),
the per-device geometry of a micro-batch (workload.Shard), and, per representative pipeline
stage, its layers, parameters, model states after ZeRO and offload, activation sizes,
buffers, pass times, pipeline sends, data-parallel collectives and buckets, offload
transfers and the optimizer step. The operator lists are built once per compile.

Representative stages: stage 0, stage 1 (standing for every middle stage, which hold the
same layers and costs) and stage p-1, with multiplicities 1, max(p-2, 0), 1 (p > 1). Where
the first and the last virtual stage sit comes from the schedule's placement (loop: stages
0 and p-1; V: both on stage 0). Sizes may be numpy arrays (one entry per plan) for the
vectorised analytic engine (vector.py); the schedule and every categorical plan field are
then shared by the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import numpy as np

from . import cpattention, fp8, framework_ops, fsdp, hostbound, mtp, muon, pipebuffers, stagesplit
from . import schedules as S
from .dataparallel import DPCosts, buckets, dp_costs
from .compute import memory_bound_time
from .fusion import eager_ops
from .tpoverlap import overlapped_tp_s
from .dims import Groups, expert_zero_group_size, grad_group_size, groups, zero_group_size
from .layermix import compile_mix, layer_operators, mix_activations, mixed_stage, needs_layer_mix, \
    padding_flops_per_micro_batch
from .memory import ActivationSizes, StageMemory, buffer_bytes, layer_activations, peak_activation_bytes, \
    stage_activations
from .offload import OffloadCosts, offload_costs, resident_chunks_with_offload
from .recompute import chunk_checkpoint, plan_checkpoint, rerun_flops, tp_rerun_fraction
from .passes import OpsTime, PassTimes, ops_time, pass_times, pp_hop_s, tp_layer_comm_s
from .states import FP32_BYTES, BytesPerParam, ModelStates, activation_bytes, bytes_per_param, layer_params_local, \
    model_states, optimizer_step_s, stage_params, upcasts_gradients
from .workload import Shard, embedding_ops, executed_flops_per_sequence, head_ops, layer_ops, model_flops_per_sequence, \
    window_pair_fraction


@dataclass(frozen=True)
class StageLayout:
    """One representative pipeline stage: what one of its devices holds and runs."""

    stage: object  # its index
    count: object  # how many stages it stands for
    layers: object
    has_embedding: object
    has_head: object
    params: object  # before ZeRO sharding
    states: ModelStates
    activations: ActivationSizes
    buffer_bytes: object
    passes: PassTimes
    sends: object  # pipeline sends per micro-batch (each blocks the sender for one hop)
    dp: DPCosts
    buckets: object  # gradient buckets per model chunk (ZeRO-3: its FSDP units, fsdp.units)
    offload: OffloadCosts
    optimizer_s: object
    framework_step_s: object  # per-step framework operators and host costs (framework_ops.py)
    # what the optimizer step allocates beside the model states, once the activations are freed
    # (Muon's Newton-Schulz of its largest matrix: muon.stage_costs; fp32 copies of 16-bit
    # gradients: states.upcasts_gradients)
    optimizer_workspace_bytes: object = 0.0


@dataclass(frozen=True)
class Layout:
    model: object
    cluster: object
    plan: object
    schedule: S.Schedule
    p: object  # pipeline stages
    m: object  # micro-batches per step per replica
    v: object  # model chunks per device
    shard: Shard
    groups: Groups
    zero_group: object  # ranks ZeRO shards the model states over (dp x cp; one replica's under HSDP)
    per_param: BytesPerParam
    pp_hop_s: object
    stages: tuple  # StageLayout of stage 0, the middle stages (one, or one per layer count), stage p-1
    model_flops_per_step: object
    hardware_flops_per_step: object
    rep_of_stage: tuple | None = None  # each stage's index into `stages` where the middle ranks differ
    pipe: pipebuffers.PipeBuffers | None = None  # the torch pipeline's buffers (plan.pp_impl: torch)

    def representative_index(self, stage: int) -> int:
        """Index into `stages` of the representative standing for scalar pipeline stage `stage`."""
        if self.rep_of_stage is not None:
            return self.rep_of_stage[stage]
        return 0 if stage == 0 else 2 if stage == self.p - 1 else 1

    def representative(self, stage: int) -> StageLayout:
        """The representative standing for scalar pipeline stage `stage`."""
        return self.stages[self.representative_index(stage)]

    @property
    def offloads_activations(self) -> bool:
        return self.plan.offload.activations != "none"

    def resident_chunks(self, rep: StageLayout, stage=None):
        """(chunks in flight, chunks on the device, embedding chunks in flight) at the stage's peak."""
        stage = rep.stage if stage is None else stage
        chunks, first = self.schedule.in_flight(self.p, self.m, self.v, stage)
        resident = chunks
        if self.offloads_activations:
            resident = resident_chunks_with_offload(rep.offload, chunks, rep.passes.fwd_s / self.v)
        return chunks, resident, first

    def stage_memory(self, rep: StageLayout, stage=None) -> StageMemory:
        """Peak bytes of a device of pipeline stage `stage` (default: the representative's own
        index; any stage it stands for), from the schedule's in-flight counts."""
        stage = rep.stage if stage is None else stage
        if self.pipe is None:
            _, resident, first = self.resident_chunks(rep, stage)
            acts = peak_activation_bytes(rep.activations, resident, first)
        else:  # the torch pipeline's buffers move its peak (no activation offload with it: plan.py)
            acts = pipebuffers.peak_activation_bytes(self.pipe, rep.activations, self.schedule, self.p, self.m,
                                                     self.v, stage, rep.has_embedding, rep.has_head)
        s = rep.states
        # the optimizer step's workspace, where larger than the activations it follows, raises
        # the peak: counted with the buffers ("other")
        other = rep.buffer_bytes + np.maximum(rep.optimizer_workspace_bytes - acts, 0.0)
        return StageMemory(stage, s.weights_bytes, s.gradients_bytes, s.optimizer_bytes, acts, other,
                           rep.activations.cached_free_bytes)

    def host_bytes(self, rep: StageLayout, stage=None):
        """Host memory one device of the stage takes for what it offloads to the CPU."""
        host = rep.states.host_bytes
        if self.plan.offload.activations == "cpu":
            chunks, resident, _ = self.resident_chunks(rep, stage)
            host = host + (chunks - resident) * rep.activations.chunk_bytes
        return host


@dataclass(frozen=True)
class DenseLayer:
    """One layer of a dense model as a device runs it: its operators, kernel times, exposed TP
    and CP seconds per micro-batch, and what recomputation re-runs of it."""

    ops: list
    t: object  # passes.OpsTime
    tp_s: tuple
    cp_s: tuple
    checkpoint: object  # recompute.LayerCheckpoint
    tp_rerun: object  # fraction of its forward TP seconds re-run
    rerun_s: object  # forward seconds of what it re-runs


def _dense_layer(model, cluster, plan, shard, g, precision, split=False) -> DenseLayer:
    """The layer of a dense model on `shard` (whose window band it attends: Shard.window_fraction);
    `split`: the schedule runs the weight gradients as passes of their own."""
    host_s = cluster.node.launch_overhead_s
    layer = layer_operators(model, shard, plan, acc=cluster.accelerator)
    layer_t = ops_time(layer, cluster, precision)
    tp_s = tp_layer_comm_s(model, shard, g, cluster, fp8.tp_gather_bytes_factor(plan))
    if plan.tp_comm_overlap:
        tp_s, layer_t = overlapped_tp_s(model, shard, g, cluster, plan, layer, layer_t, tp_s)
    cp_s = cpattention.exposed_s(model, shard, g, cluster, plan.cp_attention, layer_t.attention_fwd_s,
                                 layer_t.attention_bwd_s)
    checkpoint = plan_checkpoint(model, shard, plan, layer)
    # the MLP's TP collectives are half the layer's (tp_layer_comm_s)
    tp_rerun = tp_rerun_fraction(checkpoint, {"mlp": 0.5}, 1.0)
    # eager frameworks' launches (hostbound.py)
    rerun_kernels_s = ops_time(list(checkpoint.rerun), cluster, precision).fwd_s
    layer_t, rerun_s = hostbound.layer_floors(layer_t, layer, rerun_kernels_s, checkpoint, host_s, tp_s, cp_s,
                                              (0.0, 0.0), tp_rerun, plan, shard, split)
    return DenseLayer(layer, layer_t, tuple(tp_s), cp_s, checkpoint, tp_rerun, rerun_s)


def _mean_layer(fp8_layer: DenseLayer, bf16_layer: DenseLayer, share) -> DenseLayer:
    """The mean layer of a device whose fraction `share` of layers runs its linears in BF16
    and the rest in FP8 (fp8.bf16_layer_plan): per-layer seconds averaged, so that what a
    stage sums over its layers (passes.pass_times) is exact. What recomputation keeps and
    re-runs does not depend on the linears' precision. Interleaved, the BF16 layers sit in the
    rank's first (last) chunk, and its chunks are timed alike, as uneven chunks are."""
    def mean(a, b):
        return a + share * (b - a)
    t = OpsTime(*(mean(getattr(fp8_layer.t, f), getattr(bf16_layer.t, f)) for f in OpsTime.__dataclass_fields__))
    return replace(fp8_layer, t=t, tp_s=tuple(map(mean, fp8_layer.tp_s, bf16_layer.tp_s)),
                   cp_s=tuple(map(mean, fp8_layer.cp_s, bf16_layer.cp_s)),
                   rerun_s=mean(fp8_layer.rerun_s, bf16_layer.rerun_s))


def _mean_activations(fp8_acts: ActivationSizes, bf16_acts: ActivationSizes, share) -> ActivationSizes:
    """Saved bytes of a chunk whose fraction `share` of layers runs BF16 linears (which keep
    their inputs in BF16, not FP8); at the peak, the larger of the two layers' transients."""
    extra = np.maximum(fp8_acts.extra_bytes, bf16_acts.extra_bytes)
    reserved = np.maximum(fp8_acts.extra_bytes + fp8_acts.cached_free_bytes,
                          bf16_acts.extra_bytes + bf16_acts.cached_free_bytes)
    chunk = fp8_acts.chunk_bytes + share * (bf16_acts.chunk_bytes - fp8_acts.chunk_bytes)
    return ActivationSizes(chunk, fp8_acts.embedding_bytes, extra, reserved - extra)


def _band_key(band) -> tuple:
    """A hashable key of an attention band: a number, or a batch's array of them."""
    band = np.asarray(band, dtype=float)
    return band.shape, band.tobytes()


def compile_layout(model, cluster, plan) -> Layout:
    """Resolve a validated plan on a model and a cluster (plan sizes may be numpy arrays)."""
    schedule = S.plan_schedule(plan)
    p, m = plan.pp, plan.microbatches
    v = schedule.chunks(plan.vpp)
    act_bytes = activation_bytes(plan.precision)
    precision = fp8.compute_precision(plan)  # of every GEMM but FP8 linears
    shard = Shard(micro_batch=plan.micro_batch, seq_len=model.seq_len, tp=plan.tp, cp=plan.cp, sp=plan.sp,
                  flash_attention=plan.flash_attention, act_bytes=act_bytes, loss=plan.loss,
                  loss_chunk_tokens=plan.loss_chunk_tokens, tp_keeps_gathered=plan.tp_impl == "dtensor")
    g = groups(plan, cluster)
    zero_group = zero_group_size(plan)
    per = bytes_per_param(plan.precision, plan.grad_precision, plan.optimizer_precision, plan.fp32_params,
                          plan.master_weights)
    mixed = needs_layer_mix(model)

    def layer_kinds(layer_shard):
        """The layer a device runs (its kinds for a model with experts or MLA, layermix.py) on
        `layer_shard`, whose attention band is a rank's own where its windows differ."""
        if mixed:
            return compile_mix(model, cluster, plan, layer_shard, g, per, precision, schedule.split_backward)
        return _dense_layer(model, cluster, plan, layer_shard, g, precision, schedule.split_backward)

    base = layer_kinds(shard)
    bf16_plan = fp8.bf16_layer_plan(plan)  # FP8 plans with BF16 layers at the ends (a dense model's)
    bf16_banded = {}
    head = eager_ops(head_ops(model, shard), model, plan)
    if model.mtp_layers:  # each depth's embedding, projection, head and loss run on the head stage
        head = head + mtp.depth_ops(model, shard) * model.mtp_layers
    emb_t = ops_time(embedding_ops(model, shard), cluster, precision)
    head_t = ops_time(head, cluster, precision)
    host_s = cluster.node.launch_overhead_s
    linear_params = fp8.layer_linear_params(model, plan.tp)
    if not mixed:
        layer, checkpoint = base.ops, base.checkpoint
        layer_params = layer_params_local(model, plan.tp)
        # ZeRO-3 gathers a layer's linear weights in FP8 where they move in FP8
        layer_gather = fp8.gather_bytes_per_param(per, linear_params, layer_params, plan)
        buffers = buffer_bytes(cluster.accelerator.framework_overhead_bytes, layer_params, plan, layer_gather,
                               per.grad)
        layer_acts, bf16_acts = layer_activations(model, shard, plan, layer, head), None
    else:  # experts or MLA: two layer kinds (layermix.py), their activation bytes per attention band
        buffers, mixed_acts = base.buffer_bytes, {}
    if host_s > 0:
        head_t = hostbound.host_bound(head_t, head, host_s, split=schedule.split_backward)
        emb_t = hostbound.host_bound(emb_t, embedding_ops(model, shard), host_s, split=schedule.split_backward)
    hop = pp_hop_s(model, shard, g, cluster, plan.pp_scatter_gather)
    head_stage = schedule.head_stage(np.asarray(p))
    reps_of = stagesplit.representatives(model, plan, schedule, p)
    rep_of_stage = reps_of.rep_of_stage
    co_run = framework_ops.co_run_factor(cluster)
    total_rerun_layers = 0.0
    reps = []
    moe_layers = reps_of.moe_layers or [0] * len(reps_of.indices)
    sliding_layers = reps_of.sliding_layers or [None] * len(reps_of.indices)
    # a rank whose layers' mean attention band is not the model's runs layers of its own band
    # (a number per pipeline slot, or per plan of a batch of pipeline sizes: compiled once per
    # distinct value)
    mean_band = window_pair_fraction(model)
    mean_key = _band_key(mean_band)
    banded = {mean_key: base}
    # a plan's representatives that are one stage holding the same layers (p = 1 or 2: the
    # copies that count zero times) are compiled once; a batch's differ from plan to plan
    compiled = {}
    for stage, count, layers, n_moe, sliding in zip(reps_of.indices, reps_of.counts, reps_of.layers, moe_layers,
                                                    sliding_layers):
        band = mean_band if sliding is None else window_pair_fraction(model, np.maximum(layers, 1), sliding)
        key = _band_key(band)
        same = (key, *map(_band_key, (stage, layers, n_moe))) if np.ndim(p) == 0 else None
        if same in compiled:
            rep, rerun_layers = compiled[same]
            reps.append(replace(rep, count=count))
            total_rerun_layers = total_rerun_layers + count * rerun_layers
            continue
        rerun_layers = 0.0
        if key not in banded:
            banded[key] = layer_kinds(replace(shard, window_fraction=band))
        kind = banded[key]
        has_emb = stage == schedule.embedding_stage(p)
        has_head = stage == head_stage
        head_copy = has_head & (np.asarray(not model.tied_embeddings) | (head_stage != schedule.embedding_stage(p)))
        n16 = 0.0
        if bf16_plan is not None:  # the first and last layers sit with the embedding and the head
            if key not in bf16_banded:
                bf16_banded[key] = _dense_layer(model, cluster, bf16_plan, shard if key == mean_key else
                                                replace(shard, window_fraction=band), g, precision,
                                                schedule.split_backward)
            n16 = fp8.bf16_layers_on(plan, has_emb, has_head)
            share = n16 / np.maximum(layers, 1)
            kind = _mean_layer(kind, bf16_banded[key], share)
        if not mixed:
            params = stage_params(model, plan.tp, layers, has_emb, has_head, head_copy)
            states = model_states(params, plan, per, zero_group)
            linears = (layers - n16) * linear_params  # FP8 linears' weights
            states = fp8.with_weight_copies(states, linears, plan, per, cluster.accelerator)
            gather_per_param = fp8.gather_bytes_per_param(per, linears, params, plan)
            acts = stage_activations(layer_acts, plan, layers / v, has_emb, has_head)
            stage_layer_gather, stage_buffers = layer_gather, buffers
            if bf16_plan is not None:
                if bf16_acts is None:
                    bf16_acts = layer_activations(model, shard, bf16_plan, bf16_banded[mean_key].ops, head)
                acts = _mean_activations(acts, stage_activations(bf16_acts, bf16_plan, layers / v, has_emb, has_head),
                                         share)
                # a BF16 layer's weights are gathered in BF16: ZeRO-3's buffers hold the larger layer
                stage_layer_gather = np.where(n16 > 0, per.weight, layer_gather)
                stage_buffers = buffer_bytes(cluster.accelerator.framework_overhead_bytes, layer_params, plan,
                                             stage_layer_gather, per.grad)
            rerun_layers = v * chunk_checkpoint(plan, checkpoint, 0.0, layers / v).rerun_layers
            total_rerun_layers = total_rerun_layers + count * rerun_layers
            passes = pass_times(kind.t, layers, emb_t, head_t, has_emb, has_head, kind.tp_s, kind.cp_s, kind.rerun_s,
                                rerun_layers, kind.tp_rerun, checkpoint.cp_rerun)
            units = fsdp.units(layers, 1)  # the stage's FSDP units over all its chunks
            dp = dp_costs(plan.zero_stage, params, gather_per_param, per.grad, g.grad, cluster, g.replicate, units)
            if fsdp.keeps_gathered(plan):
                dp = fsdp.step_costs(params, gather_per_param, per.grad, g.grad, cluster, g.replicate, units)
                stage_buffers = stage_buffers + fsdp.gathered_extra_bytes(params, layer_params, gather_per_param,
                                                                          stage_layer_gather, per.grad)
            n_buckets, shard_group = buckets(params / v, grad_group_size(plan)), zero_group
        else:  # dense-MLP and MoE layers, MLA (layermix.py)
            if key not in mixed_acts:
                mixed_acts[key] = mix_activations(kind, model, shard, plan, head)
            x = mixed_stage(kind, model, cluster, plan, shard, g, per, zero_group, expert_zero_group_size(plan), layers,
                            n_moe, v, has_emb, has_head, head_copy, emb_t, head_t, mixed_acts[key])
            params, states, acts, passes, dp = x.params, x.states, x.activations, x.passes, x.dp
            n_buckets, shard_group, linears = x.buckets, x.shard_group, x.linears
            stage_buffers = buffers + x.gathered_bytes
        if plan.zero_stage >= 3:  # FSDP moves weights and gradients per unit, not in Megatron's buckets
            n_buckets = fsdp.units(layers, v)
            if plan.zero3_impl == "fsdp2" and not fsdp.keeps_gathered(plan):
                stage_buffers = stage_buffers + fsdp.root_held_bytes(model, plan.tp, has_emb, has_head, head_copy,
                                                                     per.weight)
        framework_s = framework_ops.microbatch_seconds(model, plan, cluster, shard, per, layers, has_emb, has_head,
                                                       head_copy, n_moe)
        passes = replace(passes, fwd_s=co_run * passes.fwd_s, bwd_input_s=co_run * passes.bwd_input_s,
                         bwd_weight_s=co_run * (passes.bwd_weight_s + framework_s),
                         recompute_s=co_run * passes.recompute_s)
        off = offload_costs(plan, cluster, params, states, per, acts.chunk_bytes, v, shard_group)
        muon_params, muon_s, workspace = 0.0, 0.0, 0.0
        if plan.optimizer == "muon":
            states, muon_params, muon_s, workspace = muon.with_muon(
                states, model, plan, g, cluster, layers - n_moe, n_moe, has_emb, has_head, zero_group,
                expert_zero_group_size(plan))
        if upcasts_gradients(per, plan):  # the optimizer's fp32 copies of the gradients, for its step
            workspace = workspace + FP32_BYTES * states.local_params
        optimizer_s = optimizer_step_s(states, per, plan, cluster.accelerator, muon_params) + muon_s
        weight_casts_s = memory_bound_time(fp8.weight_cast_bytes_per_step(plan, linears, cluster.accelerator),
                                           cluster.accelerator, fp8.cast_kernel(fp8.recipe(plan)))
        reps.append(StageLayout(
            stage=stage, count=count, layers=layers, has_embedding=has_emb, has_head=has_head, params=params,
            states=states, activations=acts, buffer_bytes=stage_buffers, passes=passes,
            sends=schedule.sends(p, v, stage),
            dp=dp, buckets=n_buckets, offload=off,
            optimizer_s=optimizer_s + weight_casts_s,
            framework_step_s=framework_ops.step_seconds(model, plan, cluster, per, params, shard_group, layers, has_emb,
                                                        has_head, head_copy, n_moe),
            optimizer_workspace_bytes=workspace))
        if same is not None:
            compiled[same] = reps[-1], rerun_layers
    model_flops = model_flops_per_sequence(model, plan.moe) * plan.global_batch
    if not mixed:
        one = Shard(micro_batch=1, seq_len=model.seq_len, flash_attention=plan.flash_attention)
        rerun_per_layer = rerun_flops(plan_checkpoint(model, one, plan, layer_ops(model, one)))
        hw_flops = (executed_flops_per_sequence(model, plan.flash_attention, "none", plan.moe, plan.loss)
                    + total_rerun_layers * rerun_per_layer) * plan.global_batch
    else:
        hw_flops = executed_flops_per_sequence(model, plan.flash_attention, plan.recompute, plan.moe,
                                               plan.loss, plan.recompute_modules,
                                               plan.recompute_early_stop) * plan.global_batch
        # every device of a stage pads each of its MoE layers' experts every micro-batch
        _, moe_layers = mtp.with_depths(model, 0, model.moe_layers, model.mtp_layers)
        hw_flops += padding_flops_per_micro_batch(base, model, shard, plan) * moe_layers * m * plan.tp * plan.cp * plan.dp
    return Layout(model=model, cluster=cluster, plan=plan, schedule=schedule, p=p, m=m, v=v, shard=shard, groups=g,
                  zero_group=zero_group, per_param=per, pp_hop_s=hop, stages=tuple(reps),
                  model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops, rep_of_stage=rep_of_stage,
                  pipe=pipebuffers.pipe_buffers(model, shard, plan))
