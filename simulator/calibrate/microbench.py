"""Microbenchmarks with torch: GEMMs, attention, memory-bound kernels, framework operators, host overhead.

Each benchmark is a case `{"op", "kind", "shape", "dtype", "pass", "work", "kernel"}` with a
function to time; `Bench.measure()` times the pending cases interleaved (timing.interleaved:
rounds over all of them, lower quartile) and turns them into samples with `seconds` and `spread`.
`work` is counted the way simulator/workload.py and simulator/framework_ops.py count the same
operator, so a curve fitted on these samples predicts their operators without conversion
(a = bytes of an element of the case's dtype):

- matmul: 2·M·K·N FLOPs per GEMM; a linear layer on T tokens runs three of them (forward
  x·Wᵀ + b, backward-input g·W, backward-weight gᵀ·x), each timed on its own.
- attention: causal scaled_dot_product_attention with Q, K, V as views of a fused QKV
  output (the layout a layer hands it); executed FLOPs as workload.py's flash attention op:
  forward 2·core·0.5, backward 4·core·0.625, core = 2·b·heads·s²·d. On CUDA also SDPA
  restricted to its flash backend (FlashAttention-2, kind attention_flash2, bf16).
- memory: layernorm 4a forward, gelu 2a, residual add 3a, plain copy 2a, cross-entropy
  a + 4 + 4 per logit (fp32 upcast), token + position embedding 3a (the tokens' rows;
  the table's zero-fill is framework_ops' zero_fill); backward passes move twice their forward
  traffic; fused AdamW the bytes analytic.optimizer_step_time counts per parameter.
- framework (framework_ops.py): zero_fill a per element, grad_accumulate a + 2·4 (a new
  gradient added into an fp32 buffer), bias_grad a per element of the summed gradient,
  param_cast 4 + a (fp32 master weights into 16-bit ones).
- host overhead: whole training steps (trainer.py) of tiny models, whose kernels do almost
  no work: per operator, per micro-batch, per step and per parameter tensor (host_overhead).

Memory-bound kernels run on cold data (`Bench.cold`): each call takes the next of as many
copies of its tensors as fill COLD_POOL_BYTES, so no call finds its data in a cache, as
Triton's benchmark clears the cache with a 256 MB write before every call (triton-lang/triton
@3fb4e46 python/triton/testing.py do_bench). A training step runs them so: between two
uses of a tensor the GEMMs, attention and other layers move more data than the caches hold.
Timed hot, in a loop over one tensor, they ran at cache speed and the model under-predicted
them: on the Intel Xeon (2026-12-04, one thread) GELU on 512 x 1024 fp32 took 0.20 ms forward,
0.83 ms forward and backward timed hot, 0.40-0.44 and 1.16-1.21 ms cold (pools of 128 and 512
MB), and 0.49 and 1.24 ms inside l4-h256-s256-b2's step (torch profiler, self time); a 2 MiB
zero-fill 0.05 ms hot, 0.25 ms cold. GEMMs and attention, compute-bound, are timed as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .probe import GEMM
from .timing import interleaved

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
COLD_POOL_BYTES = 256 * 2**20  # the copies a memory-bound case cycles through (Bench.cold)
# Kernel class (compute.MEMORY_KERNELS, framework_ops.KERNELS) of each memory-bound
# microbenchmark; "copy" is the plain bandwidth-bound kernel of the generic `efficiency.memory`.
KERNEL_OF = {"copy": "copy", "residual_add": "residual", "layernorm": "norm", "gelu": "gelu",
             "cross_entropy": "cross_entropy", "embedding": "embedding", "adamw_fused": "optimizer"}


@dataclass
class Case:
    row: dict
    fn: object
    minus: list = field(default_factory=list)  # cases whose time is subtracted (a backward = fwd+bwd - fwd)


def _torch():
    import torch
    return torch


class Bench:
    """Runs microbenchmarks on one device; every group of cases is timed interleaved."""

    def __init__(self, device: str = "cpu", quick: bool = False, clock: str = "wall", rounds: int | None = None):
        torch = _torch()
        self.torch = torch
        self.device = torch.device(device)
        self.quick = quick
        self.rounds = rounds or (5 if quick else 9)
        self.min_batch_s = 0.002 if quick else 0.004
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.samples: list[dict] = []
        self.pending: list[Case] = []
        self.clock = clock
        self.probes = {}  # probe name (a precision, or its "-gemm") -> probe.make_probe(...): timed in every group
        # whether every `attention` sample ran SDPA's flash backend (the profile's
        # efficiency.attention_flash2: fused); set by attention()
        self.attention_is_flash2 = self.device.type == "cpu"
        # whether SDPA held to its flash backend is timed beside the default kernel (CUDA: the
        # default is another kernel, cuDNN's on Hopper since torch 2.9)
        self.times_flash2_beside = self.device.type == "cuda"

    def add(self, op, kind, shape, dtype, pass_, work, fn, kernel=None, minus=()) -> Case:
        row = {"op": op, "kind": kind, "shape": list(shape), "dtype": dtype, "pass": pass_, "work": float(work)}
        if kind == "memory":
            row["kernel"] = kernel or KERNEL_OF.get(op, op)
        case = Case(row, fn, list(minus))
        self.pending.append(case)
        return case

    def measure(self) -> dict:
        """Time the pending cases interleaved and add their samples (derived ones net of `minus`);
        returns each case's seconds by id(case). Every group also times the speed probes (probe.py)."""
        cases, self.pending = self.pending, []
        if not cases:
            return {}
        for dt, fn in self.probes.items():
            cases.append(Case({"op": "probe", "kind": "probe", "shape": [], "dtype": dt, "pass": "probe", "work": 0.0},
                              fn))
        timed = interleaved([c.fn for c in cases], self.rounds, self.min_batch_s, self.sync, self.clock)
        got = {id(c): t for c, t in zip(cases, timed)}
        group = {c.row["dtype"]: t.seconds for c, t in zip(cases, timed) if c.row["kind"] == "probe"}
        out = {}
        for c, t in zip(cases, timed):
            out[id(c)] = max(t.seconds - sum(got[id(m)].seconds for m in c.minus), 1e-9)
            if c.row["pass"] != "helper":
                self.samples.append({**c.row, "seconds": out[id(c)], "spread": t.spread, "group_probe": group})
        return out

    def at_reference_speed(self) -> dict:
        """Scale every sample to the machine speed of the median group (the probe's median time in
        the sample's precision, else fp32) and drop the per-group probe times; returns that
        reference probe time per precision (profile calibration.probe_s)."""
        import statistics

        ref = {p: statistics.median(s["seconds"] for s in self.samples if s["kind"] == "probe" and s["dtype"] == p)
               for p in self.probes}
        for s in self.samples:
            group = s.pop("group_probe", {})
            p = s["dtype"] if s["dtype"] in group else "fp32"
            if s["kind"] == "matmul" and p + GEMM in group:  # GEMMs follow the GEMM probe (probe.py)
                p = p + GEMM
            if p in group and s["kind"] != "probe":
                s["seconds"] *= ref[p] / group[p]
        return ref

    def cold(self, make, nbytes: float):
        """A function returning, call by call, the next of as many independent results of
        `make()` (a tuple of tensors of `nbytes` together) as fill COLD_POOL_BYTES, in turn:
        a case that takes its tensors from it finds none of them in a cache."""
        import itertools
        import math

        pool = [make() for _ in range(max(1, math.ceil(COLD_POOL_BYTES / max(nbytes, 1.0))))]
        return itertools.cycle(pool).__next__

    def _dtype(self, dt: str):
        return getattr(self.torch, DTYPES[dt])

    # ------------------------------------------------------------------ GEMMs
    def gemm_shapes(self):
        if self.device.type == "cuda":  # the layers of validate_torch.CUDA_GRID and larger
            if self.quick:
                return [(2048, 1024, 3072), (4096, 2048, 2048), (8192, 2048, 8192)]
            return [(t, a, b) for t in (1024, 4096, 16384) for a, b in
                    ((1024, 1024), (1024, 3072), (1024, 4096), (4096, 1024), (2048, 6144), (2048, 8192),
                     (8192, 2048), (4096, 12288), (4096, 16384))]
        if self.quick:  # the shapes of the quick validation grid's layers
            return [(256, 128, 128), (256, 128, 512), (256, 512, 128), (256, 256, 768), (512, 256, 1024)]
        tokens = (128, 256, 512, 1024, 2048)
        # a layer's GEMMs (h -> 3h, 4h; 4h -> h) and the lm_head's (h -> vocabulary)
        widths = ((64, 256), (128, 384), (128, 512), (256, 768), (256, 1024), (512, 1536), (512, 2048),
                  (1024, 1024), (256, 4096), (128, 2048), (256, 8192))
        return [(t, a, b) for t in tokens for a, b in widths]

    def gemms(self, dt: str = "fp32"):
        torch, dev, dtype = self.torch, self.device, self._dtype(dt)
        F = torch.nn.functional
        for t, d_in, d_out in self.gemm_shapes():
            x = torch.randn(t, d_in, device=dev, dtype=dtype)
            w = torch.randn(d_out, d_in, device=dev, dtype=dtype)
            b = torch.randn(d_out, device=dev, dtype=dtype)
            g = torch.randn(t, d_out, device=dev, dtype=dtype)
            flops = 2 * t * d_in * d_out
            self.add("linear", "matmul", (t, d_in, d_out), dt, "fwd", flops, lambda x=x, w=w, b=b: F.linear(x, w, b))
            self.add("linear", "matmul", (t, d_in, d_out), dt, "bwd_input", flops, lambda g=g, w=w: g @ w)
            self.add("linear", "matmul", (t, d_in, d_out), dt, "bwd_weight", flops, lambda g=g, x=x: g.t() @ x)
        self.measure()

    def fp8_gemms(self):
        """fp8 (e4m3) GEMMs with per-tensor scales (torch._scaled_mm, CUDA compute capability >= 8.9)."""
        torch, dev = self.torch, self.device
        shapes = [(1024, 1024, 1024), (4096, 4096, 4096)] if self.quick else \
            [(t, k, n) for t in (1024, 2048, 4096, 8192) for k, n in ((1024, 4096), (4096, 4096), (4096, 16384))]
        one = torch.ones((), device=dev)
        for t, k, n in shapes:
            a = torch.randn(t, k, device=dev).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants

            def fn(a=a, b=b):
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            self.add("linear", "matmul", (t, k, n), "fp8", "fwd", 2 * t * k * n, fn)
        self.measure()

    # ------------------------------------------------------------------ attention
    def attention_shapes(self):
        if self.quick:
            return [(2, 4, 128, 32), (2, 4, 128, 64), (2, 4, 256, 64), (1, 4, 512, 64)]
        if self.device.type == "cuda":
            return [(b, h, s, d) for b in (1, 4) for h, d in ((16, 64), (32, 128)) for s in (512, 1024, 2048, 4096)]
        # sequences of 128-512: a CPU's flash-attention backward has a fixed cost per (batch, head)
        # that a FLOP curve cannot carry, and at 64 tokens it dominates (bf16: 0.35 ms a head);
        # and one batch of 1,024 and 2,048, where PyTorch's kernel runs query blocks of 256 rows
        # that skip the key blocks after them (attentiontiles.py) and the cost per query row
        # thins out (calibration.fit_keys_half)
        heads = ((2, 32), (4, 32), (4, 64), (8, 64))
        return ([(b, h, s, d) for b in (1, 4) for h, d in heads for s in (128, 256, 512)]
                + [(1, h, s, d) for h, d in heads for s in (1024, 2048)])

    def attention(self, dt: str = "fp32"):
        torch, dev, dtype = self.torch, self.device, self._dtype(dt)
        F = torch.nn.functional
        flash_runs = self._flash_runs(dt)
        for b, h, s, d in self.attention_shapes():
            # The layout a transformer layer hands the kernel (torch_model.py): Q, K and V are
            # (b, s, heads, d) slices of the fused QKV output seen as (b, heads, s, d), and the
            # gradient of the output arrives the same way. Strided inputs change the kernel's speed.
            qkv = torch.randn(b, s, 3 * h * d, device=dev, dtype=dtype, requires_grad=True)
            q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
            go = torch.randn(b, s, h, d, device=dev, dtype=dtype).transpose(1, 2)
            core = 2 * b * h * s * s * d

            def fwd(q=q, k=k, v=v):
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd(q=q, k=k, v=v, qkv=qkv, go=go):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (qkv,), go)

            f = self.add("sdpa_causal", "attention", (b, h, s, d), dt, "fwd", 2 * core * 0.5, fwd)
            self.add("sdpa_causal", "attention", (b, h, s, d), dt, "bwd", 4 * core * 0.625, fwd_bwd, minus=[f])
            if self.times_flash2_beside and dt == "bf16" and flash_runs:  # for plans naming FlashAttention-2
                f = self.add("sdpa_flash_causal", "attention_flash2", (b, h, s, d), dt, "fwd", 2 * core * 0.5,
                             self._held_to_flash(fwd))
                self.add("sdpa_flash_causal", "attention_flash2", (b, h, s, d), dt, "bwd", 4 * core * 0.625,
                         self._held_to_flash(fwd_bwd), minus=[f])
        if self.device.type == "cpu" and flash_runs:
            # SDPA's CPU default is its flash kernel already (torch 2.13: the same times on the
            # Intel Xeon); restricting it to that backend makes `attention` FlashAttention by
            # construction. Once, around the group: entering the restriction costs ~10 us a call.
            with self._flash_only():
                self.measure()
        else:
            self.attention_is_flash2 = False
            self.measure()

    def _flash_only(self):
        """PyTorch's SDPA restricted to its flash backend (FlashAttention-2 on CUDA sm80+, the
        flash kernel on CPUs)."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def _held_to_flash(self, fn):
        """`fn` run with SDPA restricted to its flash backend."""
        def run():
            with self._flash_only():
                fn()
        return run

    def _flash_runs(self, dt: str) -> bool:
        """Whether SDPA's flash backend takes causal attention in `dt` here (not on pre-sm80
        GPUs, nor in fp32 on CUDA)."""
        import warnings

        q = self.torch.randn(1, 1, 64, 32, device=self.device, dtype=self._dtype(dt))
        try:
            with self._flash_only(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns why each backend declines before it raises
                self.torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        except RuntimeError:
            return False
        return True

    # ------------------------------------------------------------------ memory-bound
    def memory_sizes(self):
        if self.device.type == "cuda":
            return [(4096, 1024), (16384, 4096)] if self.quick else \
                [(t, h) for t in (2048, 8192, 32768) for h in (1024, 2048, 4096)]
        if self.quick:
            return [(256, 128), (256, 512), (1024, 512)]
        # Working sets of the models validate --torch trains (<= 8 MiB a tensor): the curve has
        # no cache cliff, so sizes far beyond the last-level cache would bias it.
        return [(t, h) for t in (128, 512, 2048) for h in (128, 256, 512, 1024)]

    def memory(self, dt: str = "fp32"):
        torch, dev, dtype = self.torch, self.device, self._dtype(dt)
        F = torch.nn.functional
        a = torch.finfo(dtype).bits // 8
        for t, h in self.memory_sizes():
            n = t * h
            data = self.cold(lambda: (torch.randn(t, h, device=dev, dtype=dtype, requires_grad=True),
                                      torch.randn(t, h, device=dev, dtype=dtype),
                                      torch.randn(t, h, device=dev, dtype=dtype),
                                      torch.empty(t, h, device=dev, dtype=dtype)), 4 * a * n)
            ln = torch.nn.LayerNorm(h, device=dev, dtype=dtype)

            def copy(data=data):
                _, y, _, out = data()
                out.copy_(y)

            def add(data=data):
                x, y, _, _ = data()
                torch.add(x, y)

            self.add("copy", "memory", (t, h), dt, "fwd", 2 * a * n, copy)
            self.add("residual_add", "memory", (t, h), dt, "fwd", 3 * a * n, add)
            for name, fn, per in (("layernorm", ln, 4 * a), ("gelu", F.gelu, 2 * a)):
                def fwd(fn=fn, data=data):
                    fn(data()[0])

                def fwd_bwd(fn=fn, data=data):
                    x, _, g, _ = data()
                    torch.autograd.grad(fn(x), (x,), g)

                f = self.add(name, "memory", (t, h), dt, "fwd", per * n, fwd)
                self.add(name, "memory", (t, h), dt, "bwd", 2 * per * n, fwd_bwd, minus=[f])
            self.measure()  # a shape's pool at a time
        vocabs = (512, 2048) if self.quick else (512, 2048, 8192)
        tokens = (256,) if self.quick else (128, 256, 512, 1024)
        if self.device.type == "cuda":
            vocabs, tokens = ((32768,), (4096,)) if self.quick else ((8192, 32768, 50304), (2048, 8192))
        for t in tokens:
            for vsz in vocabs:
                tgt = torch.randint(0, vsz, (t,), device=dev)
                logits = self.cold(lambda: (torch.randn(t, vsz, device=dev, dtype=dtype, requires_grad=True),),
                                   a * t * vsz)
                per = a + 4 + 4

                # as torch_model.GPT: the loss in fp32 (the upcast of 16-bit logits is part of it)
                def fwd(logits=logits, tgt=tgt):
                    F.cross_entropy(logits()[0].float(), tgt)

                def fwd_bwd(logits=logits, tgt=tgt):
                    lg, = logits()
                    torch.autograd.grad(F.cross_entropy(lg.float(), tgt), (lg,))

                f = self.add("cross_entropy", "memory", (t, vsz), dt, "fwd", per * t * vsz, fwd)
                self.add("cross_entropy", "memory", (t, vsz), dt, "bwd", 2 * per * t * vsz, fwd_bwd, minus=[f])
            self.measure()

    def embedding(self, dt: str = "fp32"):
        """Token + learned position embedding (gather and add): 3a B/element forward, 6a backward.

        The backward of a dense embedding zero-fills a gradient of the whole table before it
        adds the tokens' rows; that zero-fill is framework_ops' `zero_fill` of the table, timed
        here as a helper case and subtracted, so that the samples are the tokens' part only.
        """
        torch, dev, dtype = self.torch, self.device, self._dtype(dt)
        a = torch.finfo(dtype).bits // 8
        shapes = [(256, 128, 2048)] if self.quick else [(t, h, 2048) for t in (256, 1024) for h in (128, 256, 512)]
        if self.device.type == "cuda":
            shapes = [(t, h, 32768) for t in (4096, 16384) for h in (1024, 2048)][: 1 if self.quick else None]
        for t, h, vocab in shapes:
            idx = torch.randint(0, vocab, (t,), device=dev)
            ar = torch.arange(t, device=dev)
            n = t * h
            data = self.cold(lambda: (torch.nn.Embedding(vocab, h, device=dev, dtype=dtype),
                                      torch.nn.Embedding(t, h, device=dev, dtype=dtype),
                                      torch.randn(t, h, device=dev, dtype=dtype),
                                      torch.empty((vocab + t) * h, device=dev, dtype=dtype)),
                             a * (2 * (vocab + t) * h + n))

            def fwd(data=data, idx=idx, ar=ar):
                tok, pos, _, _ = data()
                tok(idx) + pos(ar)

            def fill(data=data):
                data()[3].zero_()

            def fwd_bwd(data=data, idx=idx, ar=ar):
                tok, pos, g, _ = data()
                torch.autograd.grad(tok(idx) + pos(ar), (tok.weight, pos.weight), g)

            f = self.add("embedding", "memory", (t, h, vocab), dt, "fwd", 3 * a * n, fwd)
            z = self.add("zero_fill", "memory", ((vocab + t) * h,), dt, "helper", 0.0, fill)
            self.add("embedding", "memory", (t, h, vocab), dt, "bwd", 6 * a * n, fwd_bwd, minus=[f, z])
            self.measure()

    # ------------------------------------------------------------------ framework operators
    def framework(self, dt: str = "fp32"):
        """framework_ops.py's kernels: zero-fill, gradient accumulation, bias gradient, master-weight cast."""
        torch, dev, dtype = self.torch, self.device, self._dtype(dt)
        a = torch.finfo(dtype).bits // 8
        # a gradient buffer, table or parameter from L1-sized to beyond the last-level cache share
        sizes = (2**16, 2**20) if self.quick else tuple(2**k for k in range(13, 25))
        if dev.type == "cuda":
            sizes = (2**20, 2**26) if self.quick else tuple(2**k for k in range(16, 29, 2))
        for n in sizes:
            # a 16-bit or fp32 buffer, an fp32 gradient buffer, a new gradient
            data = self.cold(lambda: (torch.empty(n, device=dev, dtype=dtype), torch.zeros(n, device=dev),
                                      torch.randn(n, device=dev, dtype=dtype)), (2 * a + 4) * n)

            def fill(data=data):
                data()[0].zero_()

            def accumulate(data=data):
                _, main, new = data()
                main.add_(new)

            def cast(data=data):
                buf, main, _ = data()
                buf.copy_(main)

            self.add("zero_fill", "memory", (n,), dt, "step", a * n, fill, kernel="zero_fill")
            self.add("grad_accumulate", "memory", (n,), dt, "bwd", (a + 8) * n, accumulate, kernel="grad_accumulate")
            if dt != "fp32":
                self.add("param_cast", "memory", (n,), dt, "step", (4 + a) * n, cast, kernel="param_cast")
            self.measure()
        shapes = [(256, 512), (1024, 1024)] if self.quick else [(t, d) for t in (256, 1024, 4096) for d in (128, 512, 2048)]
        if dev.type == "cuda":
            shapes = [(t * 16, d * 4) for t, d in shapes]
        for t, d in shapes:
            grads = self.cold(lambda: (torch.randn(t, d, device=dev, dtype=dtype),), a * t * d)
            self.add("bias_grad", "memory", (t, d), dt, "bwd", a * t * d, lambda grads=grads: grads()[0].sum(0),
                     kernel="bias_grad")
            self.measure()

    def adamw(self, dt: str = "fp32"):
        """Fused AdamW over fp32 parameters (the master weights under mixed precision).

        Work as analytic.optimizer_step_time counts it per parameter: the gradient (fp32),
        weights, momentum and variance read and written; under mixed precision the master
        weights are among the states and the 16-bit weight is written (by the separate
        master-weight copy, framework_ops' param_cast).
        """
        torch, dev = self.torch, self.device
        per = 24 if dt == "fp32" else 4 + 2 * 12 + torch.finfo(self._dtype(dt)).bits // 8
        sizes = (2**16, 2**20) if self.quick else (2**14, 2**16, 2**18, 2**20, 2**22)
        if dev.type == "cuda":
            sizes = tuple(n * 64 for n in sizes)
        def optimizer(p):
            param = torch.nn.Parameter(torch.randn(p, device=dev))
            param.grad = torch.randn(p, device=dev)
            opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
            opt.step()  # its states allocated now, not in a timed call
            return (opt,)

        for p in sizes:
            opts = self.cold(lambda p=p: optimizer(p), 16 * p)
            self.add("adamw_fused", "memory", (p,), dt, "step", per * p, lambda opts=opts: opts()[0].step())
            self.measure()

    # ------------------------------------------------------------------ host overhead
    def host_overhead(self) -> dict:
        """The framework's host cost: whole training steps (trainer.py) of tiny models.

        At hidden 8, sequence 4, vocabulary 16 the kernels do almost no work, so a step's time
        is the framework's: Python, dispatcher, autograd, optimizer loop, small glue operators.
        With L layers and G micro-batches a step takes s0 + s1·L + G·(m0 + m1·L); four steps
        (L = 1, 3; G = 1, 2) give the per-layer cost per micro-batch m1 (profile op_overhead_us
        = m1 / (2 passes x operators per layer in workload.py)), the fixed cost per micro-batch
        m0 (less the per-operator cost of the embedding and head operators, which compute.py
        already charges), and the per-step costs: s1 per layer is the optimizer's loop over the
        layer's parameter tensors, s0 the rest (less the embedding and head tensors' share).
        """
        from ..framework_ops import param_tensors
        from ..model import ModelSpec
        from ..workload import Shard, embedding_ops, head_ops, layer_ops
        from .torch_model import GPTConfig
        from .trainer import make_trainer

        cases = {}
        for layers in (1, 3):
            for ga in (1, 2):
                tr = make_trainer(GPTConfig(layers=layers, hidden=8, heads=2, vocab=16, seq_len=4), grad_accum=ga,
                                  device=self.device)
                cases[layers, ga] = self.add("train_step", "overhead", (layers, ga), "fp32", "step", 0.0, tr.step)
        # the per-layer and per-step costs are differences of these four times: more rounds, longer batches
        saved = self.rounds, self.min_batch_s
        self.rounds, self.min_batch_s = 3 * self.rounds, 0.01
        try:
            seconds = self.measure()
        finally:
            self.rounds, self.min_batch_s = saved
        t = {k: seconds[id(c)] for k, c in cases.items()}
        m1 = max(0.0, (t[3, 2] - t[1, 2] - t[3, 1] + t[1, 1]) / 2)
        s1 = max(0.0, (t[3, 1] - t[1, 1]) / 2 - m1)
        m0 = max(0.0, t[1, 2] - t[1, 1] - m1)
        s0 = max(0.0, t[1, 1] - m0 - m1 - s1)
        fields = GPTConfig(hidden=8, heads=2).model_fields()
        one, two = (ModelSpec(**{**fields, "layers": n}) for n in (1, 2))
        shard = Shard(micro_batch=1, seq_len=one.seq_len, act_bytes=4)
        per_op = m1 / (2 * len(layer_ops(one, shard)))
        around_ops = len(embedding_ops(one, shard)) + len(head_ops(one, shard))
        def tensors(m):
            return float(param_tensors(m, m.layers, True, True, not m.tied_embeddings))

        layer_tensors = tensors(two) - tensors(one)
        outer_tensors = tensors(one) - layer_tensors
        per_tensor = s1 / layer_tensors
        return {"op_s": per_op, "microbatch_s": max(0.0, m0 - 2 * around_ops * per_op),
                "step_s": max(0.0, s0 - per_tensor * outer_tensors), "param_tensor_s": per_tensor,
                "train_steps_s": {f"layers{k[0]}_microbatches{k[1]}": v for k, v in t.items()},
                "group_probe_s": self.samples[-1].get("group_probe", {}).get("fp32")}

    # ------------------------------------------------------------------ host <-> device
    def copies(self):
        """Host<->device copies (CUDA only): pinned host buffer to device and back."""
        torch, dev = self.torch, self.device
        if dev.type != "cuda":
            return
        for n in ((2**20, 2**24) if self.quick else (2**18, 2**20, 2**22, 2**24, 2**26)):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            devbuf = torch.empty(n, dtype=torch.uint8, device=dev)
            self.add("h2d", "host_link", (n,), "u8", "h2d", n, lambda d=devbuf, h=host: d.copy_(h, non_blocking=True))
            self.add("d2h", "host_link", (n,), "u8", "d2h", n, lambda d=devbuf, h=host: h.copy_(d, non_blocking=True))
        self.measure()

