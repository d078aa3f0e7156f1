"""Task graph of one training step: tasks on per-device streams and their dependencies.

Symmetry: every data-parallel replica and every TP (and CP) rank of a pipeline stage runs
the same tasks at the same times, so the graph holds one device per pipeline stage, p in
all, whatever the device count; collectives over DP/TP/CP groups are tasks of that device
whose durations come from comm.py for the whole group. Graph size grows with
pp x micro-batches x chunks, never with the number of devices.

Tasks (durations from step.stage_cost, step.dp_costs, analytic.optimizer_step_time and
analytic.offload_parts; nothing is re-derived here):
- compute stream: F, B, W of each (chunk, micro-batch) in the schedule's order
  (schedules.py). TP and CP collectives inside a layer are folded into the pass that
  waits for them (exposed part only, as step.py computes it). R (recomputation) runs
  right before each B when the plan recomputes. The optimizer step ends the stream.
- p2p: the send of an activation (after F) or gradient (after B) to the neighbouring
  stage. Megatron-LM's p2p is blocking, so the sender's compute stream is held for the
  transfer and the receiving pass waits for its end; the graph keeps it as the task's
  `post` hold (an edge ~t means "after t's send") instead of a separate task, which
  halves the task count; the trace and `to_networkx` show it as a p2p task.
- dp stream: gradient reduce-scatter / all-reduce in buckets issued as the last
  backward pass of each chunk produces them (`plan.dp_overlap`; else after the backward
  passes), ZeRO-1/2 weight all-gather in buckets before the first forward pass of each
  chunk, ZeRO-2 per-micro-batch reduce-scatter, ZeRO-3/FSDP per-pass weight all-gather
  prefetched one pass ahead.
- host stream (PCIe) and cpu: offload transfers (activations out after F and back one
  pass ahead of B; ZeRO-Infinity weights one pass ahead) and the host Adam step.

The arrays are built directly (fast); `to_networkx` gives the networkx DiGraph on demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .analytic import offload_parts, optimizer_step_time
from .memory import backward_extra_bytes, microbatch_activation_bytes, shard_of
from .plan import Plan
from .scenario import Scenario
from .schedules import BWD, FWD, WGT, stage_ops

RECOMPUTE = "R"  # activation recomputation, run right before the backward pass that needs it
from .step import dp_costs, groups, stage_cost
from .workload import embedding_ops

STREAMS = ("compute", "p2p", "dp", "host", "cpu")
COMPUTE, P2P, DP, HOST, CPU = range(len(STREAMS))
NS = len(STREAMS)
DP_BUCKETS_PER_CHUNK = 4  # gradient / weight buckets per model chunk (Megatron-LM buckets ~40M params)


@dataclass
class TaskGraph:
    """Tasks as parallel lists (index = task id). `parts` maps a task to its breakdown
    categories (seconds); `alloc`/`free` are activation bytes taken at start / returned
    at end (the memory timeline)."""

    p: int
    microbatches: int
    name: list = field(default_factory=list)
    stage: list = field(default_factory=list)
    stream: list = field(default_factory=list)  # stage * len(STREAMS) + stream index
    dur: list = field(default_factory=list)
    post: list = field(default_factory=list)  # seconds the stream stays held after the task (blocking send)
    deps: list = field(default_factory=list)  # task id t: after t's end; ~t (negative): after t's send
    parts: list = field(default_factory=list)
    alloc: dict = field(default_factory=dict)
    free: dict = field(default_factory=dict)
    base_bytes: list = field(default_factory=list)  # per stage: activations held all step
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


def _split(parts: tuple, k: float) -> tuple:
    return tuple((c, v * k) for c, v in parts)


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
        self.sym.append(deps)
        if key is not None:
            self.key[key] = t
        return t

    def finish(self) -> TaskGraph:
        key = self.key
        self.g.deps = [[d if d.__class__ is int else key[d] for d in ds] if ds else [] for ds in self.sym]
        return self.g


def build(scenario: Scenario, microbatches: int | None = None, schedule_ops=None) -> TaskGraph:
    """The task graph of one step of `scenario` (with `microbatches` in place of the plan's
    count, for the periodic fast path)."""
    model, plan, cluster = scenario.model, scenario.plan, scenario.cluster
    p, v = plan.pp, plan.virtual_stages
    m = plan.microbatches if microbatches is None else microbatches
    if schedule_ops is None and plan.schedule_ops is not None and m == plan.microbatches:
        schedule_ops = plan.schedule_ops
    orders = stage_ops(plan.schedule, p, m, v, schedule_ops)
    g = groups(plan, cluster)
    kinds = sorted({0, p - 1, min(1, p - 1)})
    costs = {i: stage_cost(model, plan, cluster, i, g) for i in kinds}
    shard = shard_of(plan, model)
    chunk_act = float(microbatch_activation_bytes(model, plan)) / v
    emb_act = float(sum(op.saved_bytes for op in embedding_ops(model, shard)))
    extra = {last: float(backward_extra_bytes(model, plan, last)) for last in (False, True)}
    hop = float(costs[0].pp_comm) / v if p > 1 else 0.0
    per_kind = {i: _StageConst(plan, cluster, costs[i], g, chunk_act) for i in kinds}
    b = _Builder(p, m)
    b.g.send_nic = p > 1 and bool(g.pp_crosses_domain)
    dp_nic = bool(g.dp.domains > 1)
    for i in range(p):
        b.g.base_bytes.append(extra[i == p - 1])
        _stage(b, plan, i, per_kind[i if i in per_kind else 1], orders[i], hop, chunk_act,
               emb_act if i == 0 else 0.0)
    if dp_nic:  # DP collectives span scale-up domains: their inter-domain phase uses the NIC
        b.g.nic = {t for t, s in enumerate(b.g.stream) if s % NS == DP}
    return b.finish()


class _StageConst:
    """Durations and breakdown parts of one stage's passes, DP and offload costs."""

    def __init__(self, plan: Plan, cluster, c, g, chunk_act):
        v = plan.virtual_stages
        split_w = plan.schedule == "zb-h1"
        tp_b = c.tp_comm - c.tp_comm_fwd - c.tp_comm_recompute
        cp_b = c.cp_comm - c.cp_comm_fwd - c.cp_comm_recompute
        bw = 0.0 if split_w else c.bwd_weight
        f = (("compute", c.fwd / v), ("tp_comm", c.tp_comm_fwd / v), ("cp_comm", c.cp_comm_fwd / v))
        r = (("recompute", c.recompute / v), ("tp_comm", c.tp_comm_recompute / v),
             ("cp_comm", c.cp_comm_recompute / v))
        bb = (("compute", (c.bwd_input + bw) / v), ("tp_comm", tp_b / v), ("cp_comm", cp_b / v))
        w = (("compute", c.bwd_weight / v),)
        self.parts = {k: tuple((n, float(x)) for n, x in ps if x)
                      for k, ps in ((FWD, f), (RECOMPUTE, r), (BWD, bb), (WGT, w))}
        self.dur = {k: sum(x for _, x in ps) for k, ps in self.parts.items()}
        self.dp = {k: float(x) for k, x in dp_costs(plan, cluster, c.params, g).items()}
        self.off = {k: float(x) for k, x in offload_parts(plan, cluster, c.params, chunk_act * v).items()}
        self.optimizer_s = float(optimizer_step_time(plan, cluster, c.params))
        self.framework_s = float(c.framework_step)  # [issue 10] per-step framework operators, booked as other


def _stage(b: _Builder, plan: Plan, i, sc: _StageConst, order, hop, chunk_act, emb_act):
    p, v = plan.pp, plan.virtual_stages
    gr = b.g
    d, off = sc.dp, sc.off
    overlap = plan.dp_overlap
    nb = DP_BUCKETS_PER_CHUNK
    grad_kind = WGT if plan.schedule == "zb-h1" else BWD
    last_bwd, first_fwd = {}, {}
    for k, (kind, ch, j) in enumerate(order):
        if kind == grad_kind:
            last_bwd[ch] = k
        if kind == FWD and ch not in first_fwd:
            first_fwd[ch] = k
    split_bwd = {k: ch for ch, k in last_bwd.items()} if d["step_reduce"] > 0 and overlap else {}
    split_fwd = {k: ch for ch, k in first_fwd.items()} if d["step_gather"] > 0 and overlap else {}

    # ZeRO-1/2 weight all-gather before each chunk's first forward (overlapped: in buckets)
    gather_ids = {}
    if split_fwd:
        x = d["step_gather"] / (v * nb)
        for ch in sorted(first_fwd):
            gather_ids[ch] = [b.add(f"dp all-gather chunk{ch}.{q}", i, DP, x, [], (("dp_comm", x),)) for q in range(nb)]
    blocking = []  # tasks the next compute pass waits for
    reduces = []
    cids = []  # compute task (last piece) of each op in order
    act_off = off["activations_mb"] > 0
    pre_ids = {}

    def pre(kk, after, dp: bool, host: bool):
        """Tasks op kk waits for that may run ahead of it: the ZeRO-3 weight gather (`dp`),
        weight and activation reads from the host (`host`); they wait for the end of
        compute op `after`."""
        kind, ch, j = order[kk]
        dep = [cids[after]] if after >= 0 else []
        ids = pre_ids.setdefault(kk, [])
        if not host:
            pass
        elif off["params_mb"] > 0:
            x = off["params_mb"] / (2 * v)
            ids.append(b.add(f"weights H2D {kind}{ch}.{j}", i, HOST, x, list(dep), (("offload", x),)))
        if host and act_off and kind == BWD and (ch, j) not in keep:
            x = off["activations_mb"] / (2 * v)
            h = b.add(f"activations H2D {kind}{ch}.{j}", i, HOST, x, dep + [("d2h", i, ch, j)], (("offload", x),))
            gr.alloc[h] = chunk_act + (emb_act if ch == 0 else 0.0)
            ids.append(h)
        if dp and d["mb_gather"] > 0:
            x = d["mb_gather"] / (2 * v)
            ids.append(b.add(f"dp all-gather {kind}{ch}.{j}", i, DP, x, dep, (("dp_comm", x),)))

    uses = [k for k, op in enumerate(order) if op[0] != WGT]
    nxt = dict(zip(uses, uses[1:]))
    # activations whose backward pass is the very next pass stay on the device
    at = {op: k for k, op in enumerate(order)}
    keep = {(ch, j) for (kind, ch, j), k in at.items() if kind == FWD and nxt.get(k) == at[(BWD, ch, j)]}
    ahead = d["mb_gather"] > 0 or off["params_mb"] > 0 or act_off
    key = b.key
    names, stages, streams, durs, posts, partss, syms = (gr.name, gr.stage, gr.stream, gr.dur, gr.post, gr.parts,
                                                        b.sym)
    cstream = i * NS + COMPUTE
    durs_k, parts_k = sc.dur, sc.parts
    alloc, free = gr.alloc, gr.free
    first_stage, last_stage = i == 0, i == p - 1
    split = set(split_fwd) | set(split_bwd)
    recompute = durs_k.get(RECOMPUTE, 0.0) > 0
    sends = p > 1
    with_send = {kk: ps + (("pp_comm", hop),) for kk, ps in parts_k.items()}
    for k, (kind, ch, j) in enumerate(order):
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
            deps += pre_ids[k]
        if kind == FWD:
            if not first_stage:
                deps.append(key[("sf", i - 1, ch, j)])
            elif ch > 0:
                deps.append(("sf", p - 1, ch - 1, j))
        elif kind == BWD:
            if not last_stage:
                deps.append(("sb", i + 1, ch, j))
            elif ch < v - 1:
                deps.append(key[("sb", 0, ch + 1, j)])
        if kind == BWD and recompute:  # the pass's recomputation takes the pass's dependencies
            t = b.add((RECOMPUTE, ch, j), i, COMPUTE, durs_k[RECOMPUTE], deps, parts_k[RECOMPUTE])
            deps = []
        snd = sends and ((kind == FWD and (not last_stage or ch < v - 1)) or
                         (kind == BWD and (not first_stage or ch > 0)))
        if k not in split:  # the common case, inlined for speed
            t = len(durs)
            names.append((kind, ch, j))
            stages.append(i)
            streams.append(cstream)
            durs.append(durs_k[kind])
            syms.append(deps)
            if snd:  # blocking send: the stream is held `hop` after the pass (see _send)
                posts.append(hop)
                partss.append(with_send[kind])
                key[("sf" if kind == FWD else "sb", i, ch, j)] = ~t
            else:
                posts.append(0.0)
                partss.append(parts_k[kind])
            first = t
        else:
            dur, parts = durs_k[kind] / nb, _split(parts_k[kind], 1 / nb)
            for q in range(nb):
                t = b.add((kind, ch, j), i, COMPUTE, dur, deps, parts)
                deps = []
                if q == 0:
                    first = t
                if k in split_fwd:
                    syms[t].append(gather_ids[split_fwd[k]][q])
                if k in split_bwd:
                    r = d["step_reduce"] / (v * nb)
                    reduces.append(b.add(f"dp reduce chunk{ch}.{q}", i, DP, r, [t], (("dp_comm", r),)))
            if snd:
                _send(b, t, hop, ("sf" if kind == FWD else "sb", i, ch, j))
        cids.append(t)
        if kind == FWD:
            nbytes = chunk_act + emb_act if ch == 0 else chunk_act
            alloc[first] = nbytes
            if act_off and (ch, j) not in keep:
                x = off["activations_mb"] / (2 * v)
                o = b.add(f"activations D2H {kind}{ch}.{j}", i, HOST, x, [t], (("offload", x),), key=("d2h", i, ch, j))
                free[o] = nbytes
        if kind == BWD:  # W keeps only a layer's inputs and output gradients: not tracked
            free[t] = chunk_act + emb_act if ch == 0 else chunk_act
        if kind == grad_kind:
            if d["mb_reduce"] > 0:
                r = d["mb_reduce"] / v
                red = b.add(f"dp reduce-scatter {kind}{ch}.{j}", i, DP, r, [t], (("dp_comm", r),))
                reduces.append(red)
                if not overlap:
                    blocking.append(red)
    last = cids[-1]
    if d["step_reduce"] > 0 and not overlap:
        r = d["step_reduce"] / (v * nb)
        reduces += [b.add(f"dp reduce bucket{q}", i, DP, r, [last] + blocking, (("dp_comm", r),)) for q in range(v * nb)]
    tail = reduces + blocking + [last]
    if off["optimizer_copy"] > 0 or off["host_adam"] > 0:
        x = b.add("optimizer D2H/H2D", i, HOST, off["optimizer_copy"], tail, (("offload", off["optimizer_copy"]),))
        y = b.add("host Adam", i, CPU, off["host_adam"] + off["nvme"], [x],
                  (("offload", off["host_adam"] + off["nvme"]),))
        tail = [y]
    opt = b.add("optimizer step", i, COMPUTE, sc.optimizer_s + sc.framework_s, tail,
                (("optimizer", sc.optimizer_s), ("other", sc.framework_s)))  # [issue 10] framework_s
    if d["step_gather"] > 0 and not overlap:
        b.add("dp all-gather weights", i, DP, d["step_gather"], [opt], (("dp_comm", d["step_gather"]),))


class _Uniform:
    """Stage constants of a communication-free pipeline (see uniform_graph)."""

    def __init__(self, v, fwd_s, bwd_s, wgt_s, split_w):
        b = bwd_s if split_w else bwd_s + wgt_s
        self.parts = {FWD: (("compute", fwd_s / v),), BWD: (("compute", b / v),), WGT: (("compute", wgt_s / v),),
                      RECOMPUTE: ()}
        self.dur = {k: sum(x for _, x in ps) for k, ps in self.parts.items()}
        self.dp = dict(step_reduce=0.0, step_gather=0.0, mb_gather=0.0, mb_reduce=0.0)
        self.off = dict(optimizer_copy=0.0, host_adam=0.0, nvme=0.0, params_mb=0.0, activations_mb=0.0)
        self.optimizer_s = self.framework_s = 0.0


def uniform_graph(schedule: str, p: int, m: int, v: int = 1, fwd_s: float = 1.0, bwd_s: float = 2.0,
                  wgt_s: float = 0.0, schedule_ops=None) -> TaskGraph:
    """The graph of a communication-free pipeline whose stages all take `fwd_s`, `bwd_s` (input
    gradient; the weight gradient `wgt_s` is added to it unless the schedule splits it off)
    per micro-batch, split over v chunks: the setting of the textbook bubble formulas."""
    plan = Plan(pp=p, vpp=v, schedule=schedule)
    sc = _Uniform(plan.virtual_stages, fwd_s, bwd_s, wgt_s, schedule == "zb-h1")
    b = _Builder(p, m)
    for i, order in enumerate(stage_ops(schedule, p, m, plan.virtual_stages, schedule_ops)):
        b.g.base_bytes.append(0.0)
        _stage(b, plan, i, sc, order, 0.0, 1.0, 0.0)
    return b.finish()


def task_name(name) -> str:
    """Readable name of a task: compute passes are stored as (kind, chunk, mb) tuples."""
    if isinstance(name, tuple):
        kind, ch, j = name
        return f"{kind}{ch}.{j}"
    return name


def _send(b: _Builder, t: int, hop: float, key) -> None:
    """A blocking send after task t (Megatron-LM's p2p): the sender's compute stream is held
    for `hop` seconds and the receiver waits for the end of the send; kept on the task as
    `post` (the trace shows it on the p2p stream) rather than as a task of its own."""
    g = b.g
    g.post[t] = hop
    g.parts[t] = g.parts[t] + (("pp_comm", hop),)
    b.key[key] = ~t
