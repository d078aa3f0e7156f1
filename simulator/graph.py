"""Task graph of one training step, built from a Layout: tasks on per-device streams and
their dependencies.

Symmetry: every data-parallel replica and every TP (and CP) rank of a pipeline stage runs
the same tasks at the same times, so the graph holds one device per pipeline stage, p in
all, whatever the device count; collectives over DP/TP/CP groups are tasks of that device
whose durations the Layout gives for the whole group. Graph size grows with
pp x micro-batches x chunks, never with the number of devices.

Tasks (every duration from the Layout; nothing is re-derived here):
- compute stream: the passes of each (chunk, micro-batch) in the schedule's order: F, B
  (backward with weight gradient), I (input gradient) and W (weight gradient). TP and CP
  collectives inside a layer are folded into the pass that waits for them (their exposed
  part). R (recomputation) runs right before each B or I when the plan recomputes, as the
  first part of that pass's task (they run back to back on the stream and nothing else
  waits for R alone; one task instead of two makes the graph a third smaller). The
  optimizer step ends the stream.
- pipeline sends: the forward pass of virtual stage k waits for that of k-1, the backward
  of k for that of k+1 (schedule placement); across devices through a send. Megatron-LM's
  p2p is blocking, so the sender's compute stream is held for the transfer and the
  receiving pass waits for its end; the graph keeps it as the task's `post` hold (an edge
  ~t means "after t's send") instead of a separate task, which halves the task count; the
  trace and `to_networkx` show it as a p2p task.
- dp stream: the gradient reduction of the last micro-batch's backward of each chunk in
  Megatron-LM's buckets (dataparallel.py; k buckets are two tasks: the first k-1 issued
  after 1/k of the pass, its recomputation included pro rata as each checkpointed layer
  re-runs right before its backward, the last after the pass: the exact bucketed finish),
  or after the last pass without `plan.dp_overlap`; the ZeRO-1/2 weight gather running
  beside the first forward of each chunk, whose start it delays by the bucketed gather's
  exposed part (`plan.gathers_overlap`; else after the optimizer step); ZeRO-2
  per-micro-batch reduce-scatter; ZeRO-3/FSDP per-pass weight gathers prefetched one pass
  ahead.
- d2h and h2d streams (the host link, full duplex) and cpu: offload copies (offload.py):
  activations out after F and back one pass ahead of their backward, ZeRO-Infinity weights
  one pass ahead, ZeRO-Offload's gradients out, host Adam, weights back.

The arrays are built directly (fast); `to_networkx` gives the networkx DiGraph on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import pipebuffers
from .layout import Layout, StageLayout
from .schedules import BACKWARDS, BWD, BWD_INPUT, FWD, WGT, Explicit, Schedule, cached_orders, schedule_for

RECOMPUTE = "R"  # activation recomputation, run right before the backward pass that needs it
STREAMS = ("compute", "p2p", "dp", "d2h", "h2d", "cpu")
COMPUTE, P2P, DP, D2H, H2D, CPU = range(len(STREAMS))
NS = len(STREAMS)


@dataclass
class TaskGraph:
    """Tasks as parallel lists (index = task id). `parts` maps a task to its breakdown
    categories (seconds); `alloc`/`free` are activation bytes taken at start / returned
    at end (the memory timeline)."""

    p: int
    microbatches: int
    name: list = field(default_factory=list)
    stage: list = field(default_factory=list)
    stream: list = field(default_factory=list)  # stage * NS + stream index
    dur: list = field(default_factory=list)
    post: list = field(default_factory=list)  # seconds the stream stays held after the task (blocking send)
    deps: list = field(default_factory=list)  # task id t: after t's end; ~t (negative): after t's send
    parts: list = field(default_factory=list)
    alloc: dict = field(default_factory=dict)
    free: dict = field(default_factory=dict)
    base_bytes: list = field(default_factory=list)  # per stage: activations held all step
    recompute_parts: dict = field(default_factory=dict)  # backward pass -> count of its leading parts that recompute
    nic: set = field(default_factory=set)  # tasks whose transfer crosses the NIC (scale-out)
    send_nic: bool = False  # pipeline sends cross the NIC
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __len__(self):
        return len(self.dur)

    def to_networkx(self):
        """A networkx DiGraph: nodes are task ids with their attributes, plus a node
        ("send", t) for the blocking send after task t; edges are the dependencies and the
        order of tasks on each stream."""
        import networkx as nx

        g = nx.DiGraph()
        last = {}
        for t in range(len(self.dur)):
            g.add_node(t, name=task_name(self.name[t]), stage=self.stage[t],
                       stream=STREAMS[self.stream[t] % NS], duration_s=self.dur[t])
            if self.post[t] > 0:
                g.add_node(("send", t), name="send " + task_name(self.name[t]), stage=self.stage[t],
                           stream=STREAMS[P2P], duration_s=self.post[t])
                g.add_edge(t, ("send", t), kind="dependency")
            for d in self.deps[t]:
                g.add_edge(d if d >= 0 else ("send", ~d), t, kind="dependency")
            s = self.stream[t]
            if s in last:
                u = last[s]
                g.add_edge(("send", u) if self.post[u] > 0 else u, t, kind="stream")
            last[s] = t
        return g


def task_name(name) -> str:
    """Readable name of a task: compute passes are stored as (kind, chunk, mb) tuples, the
    transfers of one pass as (what, kind, chunk, mb); formatted only when asked for."""
    if isinstance(name, tuple):
        *what, kind, ch, j = name
        return " ".join(what + [f"{kind}{ch}.{j}"])
    return name


class _Builder:
    def __init__(self, p: int, m: int):
        self.g = TaskGraph(p=p, microbatches=m)
        self.key = {}
        self.sym = []  # symbolic deps per task, resolved at the end

    def add(self, name, stage, stream, dur, deps=(), parts=(), key=None):
        g = self.g
        t = len(g.dur)
        g.name.append(name)
        g.stage.append(stage)
        g.stream.append(stage * NS + stream)
        g.dur.append(dur)
        g.post.append(0.0)
        g.parts.append(parts)
        self.sym.append(list(deps))
        if key is not None:
            self.key[key] = t
        return t

    def finish(self) -> TaskGraph:
        key = self.key
        self.g.deps = [[d if d.__class__ is int else key[d] for d in ds] if ds else [] for ds in self.sym]
        return self.g


@dataclass(frozen=True)
class StageTasks:
    """Durations, breakdown parts and sizes of one stage's tasks (per chunk pass)."""

    parts: dict  # pass kind -> ((category, seconds), ...)
    hop_s: float  # one pipeline send
    buckets: int
    step_reduce_s: float  # per chunk
    step_gather_s: float
    mb_gather_s: float  # per chunk pass
    mb_reduce_s: float  # per chunk grad pass
    act_d2h_s: float = 0.0
    act_h2d_s: float = 0.0
    weights_h2d_s: float = 0.0
    gradients_d2h_s: float = 0.0
    host_adam_s: float = 0.0
    weights_back_h2d_s: float = 0.0
    optimizer_s: float = 0.0
    framework_s: float = 0.0  # per-step framework operators (framework_ops.py), run with the optimizer step
    chunk_bytes: float = 0.0
    embedding_bytes: float = 0.0
    extra_bytes: float = 0.0
    pipe: object = None  # pipebuffers.PipeBuffers of the torch pipeline, or None

    @property
    def dur(self) -> dict:
        return {k: sum(x for _, x in ps) for k, ps in self.parts.items()}


def _pass_parts(fwd, bwd_in, bwd_w, rec, tp, cp, v, ep=(0.0, 0.0, 0.0)):
    """Breakdown parts of each pass kind, per chunk."""
    def clean(ps):
        return tuple((n, float(x) / v) for n, x in ps if x)

    return {FWD: clean((("compute", fwd), ("tp_comm", tp[0]), ("cp_comm", cp[0]), ("ep_comm", ep[0]))),
            RECOMPUTE: clean((("recompute", rec), ("tp_comm", tp[2]), ("cp_comm", cp[2]), ("ep_comm", ep[2]))),
            BWD: clean((("compute", bwd_in + bwd_w), ("tp_comm", tp[1]), ("cp_comm", cp[1]), ("ep_comm", ep[1]))),
            BWD_INPUT: clean((("compute", bwd_in), ("tp_comm", tp[1]), ("cp_comm", cp[1]), ("ep_comm", ep[1]))),
            WGT: clean((("compute", bwd_w),))}


def stage_tasks(layout: Layout, r: StageLayout) -> StageTasks:
    v, x, d, o = layout.v, r.passes, r.dp, r.offload
    parts = _pass_parts(x.fwd_s, x.bwd_input_s, x.bwd_weight_s, x.recompute_s,
                        (x.tp_fwd_s, x.tp_bwd_s, x.tp_recompute_s), (x.cp_fwd_s, x.cp_bwd_s, x.cp_recompute_s), v,
                        (x.ep_fwd_s, x.ep_bwd_s, x.ep_recompute_s))
    a = r.activations
    return StageTasks(
        parts=parts, hop_s=float(layout.pp_hop_s), buckets=int(r.buckets), step_reduce_s=float(d.step_reduce_s) / v,
        step_gather_s=float(d.step_gather_s) / v, mb_gather_s=float(d.mb_gather_s) / (2 * v),
        mb_reduce_s=float(d.mb_reduce_s) / v, act_d2h_s=float(o.activations_d2h_s),
        act_h2d_s=float(o.activations_h2d_s), weights_h2d_s=float(o.weights_h2d_s),
        gradients_d2h_s=float(o.gradients_d2h_s), host_adam_s=float(o.host_adam_s),
        weights_back_h2d_s=float(o.weights_back_h2d_s), optimizer_s=float(r.optimizer_s),
        framework_s=float(r.framework_step_s), chunk_bytes=float(a.chunk_bytes),
        embedding_bytes=float(a.embedding_bytes), extra_bytes=float(a.extra_bytes), pipe=layout.pipe)


def build(layout: Layout, microbatches: int | None = None) -> TaskGraph:
    """The task graph of one step (with `microbatches` in place of the plan's count, for the
    periodic fast path; the schedule's order for that count)."""
    plan = layout.plan
    p, v = int(layout.p), int(layout.v)
    m = int(layout.m) if microbatches is None else microbatches
    schedule = layout.schedule
    orders = schedule.orders(p, m, v) if isinstance(schedule, Explicit) else cached_orders(schedule.name, p, m, v)
    kinds = {id(r): stage_tasks(layout, r) for r in layout.stages}
    b = _Builder(p, m)
    g = layout.groups
    b.g.send_nic = p > 1 and bool(g.pp_crosses_domain)
    for i in range(p):
        st = kinds[id(layout.representative(i))]
        b.g.base_bytes.append(st.extra_bytes)
        _stage(b, schedule, plan, p, v, i, st, orders[i])
    if g.dp_crosses_domain:  # DP collectives span scale-up domains: their inter-domain phase uses the NIC
        b.g.nic = {t for t, s in enumerate(b.g.stream) if s % NS == DP}
    return b.finish()


def uniform_graph(schedule: str, p: int, m: int, v: int = 1, fwd_s: float = 1.0, bwd_s: float = 2.0,
                  wgt_s: float = 0.0, schedule_ops=None) -> TaskGraph:
    """The graph of a communication-free pipeline whose stages all take `fwd_s`, `bwd_s`
    (input gradient) and `wgt_s` (weight gradient) per micro-batch, split over the v chunks:
    the setting of the textbook bubble formulas."""
    ops = None if schedule_ops is None else tuple(tuple(stage) for stage in schedule_ops)
    sched = schedule_for(schedule, p, m, v, ops)
    chunks = sched.chunks(v)
    parts = _pass_parts(fwd_s, bwd_s, wgt_s, 0.0, (0, 0, 0), (0, 0, 0), chunks)
    st = StageTasks(parts=parts, hop_s=0.0, buckets=1, step_reduce_s=0.0, step_gather_s=0.0, mb_gather_s=0.0,
                    mb_reduce_s=0.0, chunk_bytes=1.0)
    plan = _UniformPlan()
    b = _Builder(p, m)
    for i, order in enumerate(sched.orders(p, m, chunks)):
        b.g.base_bytes.append(0.0)
        _stage(b, sched, plan, p, chunks, i, st, order)
    return b.finish()


@dataclass(frozen=True)
class _Offload:
    optimizer: str = "none"
    params: str = "none"
    activations: str = "none"


@dataclass(frozen=True)
class _UniformPlan:
    dp_overlap: bool = True
    gathers_overlap: bool = True
    offload: _Offload = _Offload()


def _scaled(parts: tuple, k: float) -> tuple:
    return tuple((c, x * k) for c, x in parts)


def _stage(b: _Builder, schedule: Schedule, plan, p: int, v: int, i: int, st: StageTasks, order):
    """Add the tasks of pipeline stage i, each after the tasks of the stage it waits for (the
    engine walks a stage's tasks in this order)."""
    gr = b.g
    overlap = plan.dp_overlap
    dur, parts = st.dur, st.parts
    hop = st.hop_s
    n_virtual = p * v
    virtual = {}
    for k in range(n_virtual):
        stage, chunk = schedule.stage_chunk(k, p)
        if stage == i:
            virtual[chunk] = k
    where = {k: schedule.stage_chunk(k, p)[0] for k in range(n_virtual)}
    emb_chunk = next((c for c, k in virtual.items() if k == 0), None)

    # the last pass producing each chunk's gradients, the first forward of each chunk
    last_grad, first_fwd = {}, {}
    for k, (kind, ch, j) in enumerate(order):
        if kind in (BWD, WGT):
            last_grad[ch] = k
        if kind == FWD and ch not in first_fwd:
            first_fwd[ch] = k
    k_buckets = max(1, st.buckets)

    def gather(x, names, deps):
        """A weight gather of x seconds arriving in k_buckets pieces: the first piece's task,
        then the rest's (the pass that needs it runs in pieces: below)."""
        x1 = x / k_buckets
        ids = [b.add(names[0], i, DP, x1, deps, (("dp_comm", x1),))]
        if k_buckets > 1:
            ids.append(b.add(names[1], i, DP, x - x1, deps, (("dp_comm", x - x1),)))
        return ids

    # pass index -> the gradient reduction it ends with, in buckets (its seconds)
    reduce_at = dict.fromkeys(last_grad.values(), st.step_reduce_s) if st.step_reduce_s > 0 and overlap else {}
    # pass index -> the gather tasks it waits for. ZeRO-1/2 weight gathers of every chunk issued
    # at the step's start, chunk by chunk (Megatron-LM dispatches the first chunks' before the
    # warm-up and each later one ahead of its chunk: megatron/core/pipeline_parallel/
    # schedules.py@d98e8a6, param_sync_func): the first bucket, then the rest
    gather_at = {}
    if st.step_gather_s > 0 and plan.gathers_overlap:
        for ch, k in sorted(first_fwd.items()):
            gather_at[k] = gather(st.step_gather_s, (f"dp all-gather chunk{ch} bucket 1",
                                                     f"dp all-gather chunk{ch} buckets 2-{k_buckets}"), [])

    act_off = st.act_d2h_s > 0
    ahead = st.mb_gather_s > 0 or st.weights_h2d_s > 0 or act_off
    keep, nxt, uses = set(), {}, []
    # ZeRO-3/FSDP by units (fsdp.units): the step's first pass waits for its first unit's gather
    # only, and each chunk's last reduce-scatter leaves only its last unit's after the pass
    fsdp_units = overlap and k_buckets > 1 and st.mb_gather_s > 0
    if fsdp_units:
        reduce_at.update({k: st.mb_reduce_s for k in last_grad.values()})
    if ahead:
        uses = [k for k, op in enumerate(order) if op[0] != WGT]
        if fsdp_units:
            gather_at[uses[0]] = None  # its gathers are added with the pass's other reads (pre)
        nxt = dict(zip(uses, uses[1:]))
        at = {op: k for k, op in enumerate(order)}
        # a chunk whose backward is the stage's very next pass stays on the device
        for (kind, ch, j), k in at.items():
            if kind == FWD and nxt.get(k) == at.get((BWD, ch, j), at.get((BWD_INPUT, ch, j))):
                keep.add((ch, j))
    pre_ids = {}
    cids = []
    key = b.key
    names, stages, streams, durs, posts, partss, syms = gr.name, gr.stage, gr.stream, gr.dur, gr.post, gr.parts, b.sym
    cstream = i * NS + COMPUTE
    alloc, free = gr.alloc, gr.free
    recompute = dur.get(RECOMPUTE, 0.0) > 0
    blocking = []
    reduces = []
    mb_reduce = st.mb_reduce_s > 0

    # everything about a pass that depends only on its kind and chunk
    template = {}
    for ch, vk in virtual.items():
        chunk_bytes = st.chunk_bytes + (st.embedding_bytes if ch == emb_chunk else 0.0)
        freed = chunk_bytes
        if st.pipe is not None:  # the torch pipeline's buffers (pipebuffers.py)
            held, taken, left = pipebuffers.chunk_events(st.pipe, gr.microbatches, vk == 0, vk == n_virtual - 1,
                                                         vk > 0 and where[vk - 1] == i,
                                                         vk < n_virtual - 1 and where[vk + 1] == i)
            gr.base_bytes[i] += float(held)
            chunk_bytes += float(taken)
            freed = chunk_bytes - float(left)
        for kind in (FWD, BWD, BWD_INPUT, WGT):
            if kind == FWD:
                dep = None if vk == 0 else (("sf" if where[vk - 1] != i else "F"), vk - 1)
                sends = vk < n_virtual - 1 and where[vk + 1] != i
            elif kind == WGT:
                dep, sends = None, False
            else:
                dep = None if vk == n_virtual - 1 else (("sb" if where[vk + 1] != i else "B"), vk + 1)
                sends = vk > 0 and where[vk - 1] != i
            own = "F" if kind == FWD else "W" if kind == WGT else "B"
            rd, rps = (dur[RECOMPUTE], parts[RECOMPUTE]) if recompute and kind in BACKWARDS else (0.0, ())
            own_parts = parts[kind] + (("pp_comm", hop),) if sends else parts[kind]
            template[(kind, ch)] = (vk, dep, sends, own, ("sf" if kind == FWD else "sb"), dur[kind], parts[kind],
                                    chunk_bytes if kind == FWD else freed, rd, rps, rd + dur[kind],
                                    rps + own_parts, hop if sends else 0.0)

    # the per-pass transfers' breakdown parts, shared by all their tasks
    h2d_w_parts, h2d_a_parts = (("offload", st.weights_h2d_s),), (("offload", st.act_h2d_s),)
    gather_parts, scatter_parts = (("dp_comm", st.mb_gather_s),), (("dp_comm", st.mb_reduce_s),)
    d2h_parts = (("offload", st.act_d2h_s),)

    def pre(kk, after, dp: bool, host: bool):
        """Tasks op kk waits for that may run ahead of it, after compute op `after` ends: the
        ZeRO-3 weight gather (`dp`), weight and activation reads from the host (`host`)."""
        kind, ch, j = order[kk]
        dep = [cids[after]] if after >= 0 else []
        ids = pre_ids.setdefault(kk, [])
        if host and st.weights_h2d_s > 0:
            x = st.weights_h2d_s
            ids.append(b.add(("weights H2D", kind, ch, j), i, H2D, x, dep, h2d_w_parts))
        if host and act_off and kind in BACKWARDS and (ch, j) not in keep:
            x = st.act_h2d_s
            h = b.add(("activations H2D", kind, ch, j), i, H2D, x, dep + [("d2h", i, ch, j)], h2d_a_parts)
            alloc[h] = template[(kind, ch)][7]
            ids.append(h)
        if dp and st.mb_gather_s > 0:
            x = st.mb_gather_s
            if kk in gather_at:
                gather_at[kk] = gather(x, (("dp all-gather unit 1", kind, ch, j),
                                           (f"dp all-gather units 2-{k_buckets}", kind, ch, j)), dep)
            else:
                ids.append(b.add(("dp all-gather", kind, ch, j), i, DP, x, dep, gather_parts))

    special = set(gather_at) | set(reduce_at)
    for k, op in enumerate(order):
        kind, ch, j = op
        vk, dep, sends, own, send_key, d, ps, nbytes, rd, rps, task_s, task_parts, post_s = template[(kind, ch)]
        deps = blocking
        blocking = []
        if ahead and kind != WGT:
            # host reads always run one pass ahead; ZeRO-3 gathers only with plan.dp_overlap
            if k == uses[0]:
                pre(k, -1, True, True)
            elif not overlap:
                pre(k, k - 1, True, False)
            if k in nxt:
                pre(nxt[k], k - 1, overlap, True)
            deps = deps + pre_ids.get(k, [])
        if dep is not None:
            deps.append((dep[0], dep[1], j))
        t = first = len(durs)
        if k in special:
            kb = k_buckets
            if k in gather_at and kb > 1:
                # the chunk's buckets arrive one by one: its first bucket's layers wait for the
                # first gather, its last bucket's for the rest; the pass runs in three pieces
                c1, c2 = gather_at[k]
                b.add(op, i, COMPUTE, d / kb, deps + [c1], _scaled(ps, 1 / kb))
                if kb > 2:
                    b.add(op, i, COMPUTE, d * (kb - 2) / kb, [], _scaled(ps, (kb - 2) / kb))
                d, ps, deps = d / kb, _scaled(ps, 1 / kb), [c2]
            elif k in gather_at:
                deps = deps + gather_at[k][:1]
            if k in reduce_at and kb > 1:
                # the first 1/k of the last grad pass issues k-1 buckets; its recomputation is
                # spread alike, each checkpointed layer re-running right before its backward
                b.add(op, i, COMPUTE, (rd + d) / kb, deps, _scaled(rps, 1 / kb) + _scaled(ps, 1 / kb))
                if rps:
                    gr.recompute_parts[first] = len(rps)
                rd, rps = rd * (kb - 1) / kb, _scaled(rps, (kb - 1) / kb)
                r1 = reduce_at[k] * (kb - 1) / kb
                reduces.append(b.add(f"dp reduce chunk{ch} buckets 1-{kb - 1}", i, DP, r1, [first],
                                     (("dp_comm", r1),)))
                d, ps, deps = d - d / kb, _scaled(ps, (kb - 1) / kb), []
            t = len(durs)
            task_s, task_parts = rd + d, rps + (ps + (("pp_comm", hop),) if sends else ps)
        names.append(op)
        stages.append(i)
        streams.append(cstream)
        durs.append(task_s)
        syms.append(deps)
        posts.append(post_s)
        partss.append(task_parts)
        if sends:
            key[(send_key, vk, j)] = ~t
        if rps:
            gr.recompute_parts[t] = len(rps)
        key[(own, vk, j)] = t
        if k in reduce_at:
            split = k_buckets > 1
            r = reduce_at[k] / (k_buckets if split else 1)
            reduces.append(b.add(f"dp reduce chunk{ch}" + (f" bucket {k_buckets}" if split else ""), i, DP, r,
                                 [t], (("dp_comm", r),)))
        cids.append(t)
        if kind == FWD:
            alloc[first] = nbytes
            if act_off and (ch, j) not in keep:
                x = st.act_d2h_s
                o = b.add(("activations D2H", "", ch, j), i, D2H, x, [t], d2h_parts, key=("d2h", i, ch, j))
                free[o] = nbytes
        elif kind != WGT:  # W keeps only a layer's inputs and output gradients: not tracked
            free[t] = nbytes
        if mb_reduce and (kind == BWD or kind == WGT) and k not in reduce_at:
            x = st.mb_reduce_s
            red = b.add(("dp reduce-scatter", kind, ch, j), i, DP, x, [t], scatter_parts)
            reduces.append(red)
            if not overlap:
                blocking.append(red)
    last = cids[-1]
    if st.step_reduce_s > 0 and not overlap:
        r = st.step_reduce_s * v
        reduces.append(b.add("dp reduce", i, DP, r, [last] + blocking, (("dp_comm", r),)))
    tail = reduces + blocking + [last]
    if st.gradients_d2h_s > 0 or st.host_adam_s > 0:
        x = b.add("gradients D2H", i, D2H, st.gradients_d2h_s, tail, (("offload", st.gradients_d2h_s),))
        y = b.add("host Adam", i, CPU, st.host_adam_s, [x], (("offload", st.host_adam_s),))
        tail = [b.add("weights H2D", i, H2D, st.weights_back_h2d_s, [y], (("offload", st.weights_back_h2d_s),))]
    opt = b.add("optimizer step", i, COMPUTE, st.optimizer_s + st.framework_s, tail,
                (("optimizer", st.optimizer_s), ("other", st.framework_s)))
    if st.step_gather_s > 0 and not plan.gathers_overlap:
        x = st.step_gather_s * v
        b.add("dp all-gather weights", i, DP, x, [opt], (("dp_comm", x),))
