"""Timelines of an executed step: Chrome trace JSON (opens in Perfetto) and a DataFrame.

Chrome trace event format (Google, "Trace Event Format"): one process per pipeline stage
(it stands for every DP replica and TP rank of that stage, which run alike), one thread
per stream (compute, p2p, dp, d2h, h2d, cpu) plus `tp`, `cp` and `ep` threads showing the
exposed TP and CP collectives and the MoE all-to-all folded into each pass (the pass's last part, after its
kernels); complete events ("ph": "X") with microsecond `ts` and `dur` and the task's
breakdown parts in `args`; a counter track ("ph": "C") of the stage's activation memory.
Open the file at https://ui.perfetto.dev (Open trace file) or chrome://tracing.
"""

from __future__ import annotations

import json
import math

from .engine import Execution, execute
from .errors import InputError
from .graph import NS, P2P, RECOMPUTE, STREAMS, task_name

US = 1e6
GIB = 2**30


def _category(parts) -> str:
    return max(parts, key=lambda kv: kv[1])[0] if parts else "other"


COLLECTIVE_ROWS = {"tp_comm": ("tp", "TP collectives"), "cp_comm": ("cp", "CP exchange"),
                   "ep_comm": ("ep", "all-to-all")}
THREADS = STREAMS + tuple(stream for stream, _ in COLLECTIVE_ROWS.values())


def timeline(ex: Execution):
    """pandas DataFrame, one row per task: task, name, stage, stream, start_s, end_s,
    duration_s, category (its largest breakdown part); blocking sends as p2p rows; the
    exposed TP/CP collectives and MoE all-to-all of a pass as rows of their own (streams tp, cp,
    ep) at its end."""
    import pandas as pd

    g = ex.graph
    rows = []
    for t in range(len(g.dur)):
        stream = STREAMS[g.stream[t] % NS]
        parts = [kv for kv in g.parts[t] if kv[0] != "pp_comm"]
        nominal = sum(x for _, x in parts)
        ran = ex.end_s[t] - ex.start_s[t]
        start = ex.start_s[t]
        for name, seg in _segments(g, t, parts):
            # a recomputation folded into its backward pass is drawn as the R it is
            d = ran * sum(x for _, x in seg) / nominal if nominal > 0 else ran
            rows.append((t, name, g.stage[t], stream, start, start + d, d, _category(seg)))
            end = start = start + d
            for cat, x in reversed(seg):
                if cat in COLLECTIVE_ROWS and x > 0 and nominal > 0:
                    thread, label = COLLECTIVE_ROWS[cat]
                    c = ran * x / nominal
                    rows.append((t, f"{label} {name}", g.stage[t], thread, end - c, end, c, cat))
                    end -= c
        if ex.post_s[t] > 0:
            rows.append((t, "send " + task_name(g.name[t]), g.stage[t], STREAMS[P2P], ex.end_s[t],
                         ex.end_s[t] + ex.post_s[t], ex.post_s[t], "pp_comm"))
    df = pd.DataFrame(rows, columns=["task", "name", "stage", "stream", "start_s", "end_s", "duration_s", "category"])
    return df.sort_values(["stage", "start_s", "task"], kind="stable").reset_index(drop=True)


def _segments(g, t: int, parts: list):
    """(name, parts) of what task t runs: a backward pass that starts with its recomputation
    (graph.py folds R into it) runs R, then the pass."""
    n = g.recompute_parts.get(t, 0)
    if not n:
        return ((task_name(g.name[t]), parts),)
    _, ch, j = g.name[t]
    return ((task_name((RECOMPUTE, ch, j)), parts[:n]), (task_name(g.name[t]), parts[n:]))


def chrome_trace(ex: Execution, title: str = "") -> dict:
    """The trace as a dict with `traceEvents` (ph/ts/dur/pid/tid)."""
    g = ex.graph
    events = []
    for i in range(g.p):
        events.append({"ph": "M", "name": "process_name", "pid": i, "tid": 0,
                       "args": {"name": f"pipeline stage {i}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": i, "tid": 0, "args": {"sort_index": i}})
        for k, s in enumerate(THREADS):
            events.append({"ph": "M", "name": "thread_name", "pid": i, "tid": k, "args": {"name": s}})
    df = timeline(ex)
    tid = {s: k for k, s in enumerate(THREADS)}
    for r in df.itertuples(index=False):
        if r.stream in STREAMS:  # a pass (or its R), else the task's send: all its parts
            segments = dict(_segments(g, r.task, list(g.parts[r.task])))
            parts = dict(segments.get(r.name, g.parts[r.task]))
        else:
            parts = {r.category: r.duration_s}
        events.append({"name": r.name, "cat": r.category, "ph": "X", "pid": int(r.stage), "tid": tid[r.stream],
                       "ts": r.start_s * US, "dur": r.duration_s * US,
                       "args": {"task": int(r.task), "parts_s": parts}})
    from .engine import memory_timeline

    for r in memory_timeline(ex).itertuples(index=False):
        events.append({"name": "activations", "ph": "C", "pid": int(r.stage), "tid": 0, "ts": r.time_s * US,
                       "args": {"GiB": r.activation_bytes / GIB}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": title, "step_time_s": ex.step_time_s,
                          "symmetry": "one process per pipeline stage stands for all its DP replicas and TP ranks"}}


def trace_timeline(trace: dict):
    """The timeline table (stage, stream, name, start_s, end_s, duration_s, category) of a
    Chrome trace written by `chrome_trace`: the inverse of its complete ("X") events."""
    import pandas as pd

    events = [_event(i, e) for i, e in enumerate(trace["traceEvents"])]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    rows = [(e["name"], e["pid"], threads.get((e["pid"], e["tid"]), str(e["tid"])), e["ts"] / US,
             (e["ts"] + e["dur"]) / US, e["dur"] / US, str(e.get("cat", ""))) for e in events
            if e.get("ph") == "X"]
    return pd.DataFrame(rows, columns=["name", "stage", "stream", "start_s", "end_s", "duration_s", "category"])


def _event(i: int, e) -> dict:
    """Trace event `i` if it holds what trace_timeline reads (a thread's name; a complete
    event's name, process, thread, start and duration in microseconds), else an InputError."""
    def refuse(what):
        raise InputError(f"traceEvents[{i}]", e, f"expected {what}")

    if not isinstance(e, dict):
        refuse("an event object")
    ph, name = e.get("ph"), e.get("name")
    if ph not in ("M", "X") or (ph == "M" and name != "thread_name"):
        return e
    ids = [e.get("pid"), e.get("tid")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ids):
        refuse("integer pid and tid")
    if ph == "M":
        if not isinstance(e.get("args"), dict) or not isinstance(e["args"].get("name"), str):
            refuse("args.name, the thread's name")
        return e
    times = [e.get("ts"), e.get("dur")]
    if not isinstance(name, str) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and math.isfinite(v) for v in times) or times[1] < 0:
        refuse("a complete event (ph X) with a name, ts and dur >= 0 in microseconds")
    return e


def write_trace(scenario, path: str) -> dict:
    """Execute the full step of `scenario` and write its Chrome trace JSON to `path`."""
    from .evaluate import compile_scenario

    trace = chrome_trace(execute(compile_scenario(scenario)), scenario.name)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(trace, fh)
    except OSError as exc:
        raise InputError("--trace", str(path), f"cannot write the trace file ({exc.strerror})") from None
    return trace
