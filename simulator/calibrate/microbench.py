"""Microbenchmarks with torch: GEMMs, attention (SDPA forward and backward), memory-bound ops, AdamW.

Each benchmark returns samples `{"op", "shape", "dtype", "pass", "work", "seconds"}` where
`work` is counted the way simulator/workload.py counts the same operator, so that a curve
fitted on these samples predicts the workload's operators without any conversion:

- matmul: 2·M·K·N FLOPs per GEMM; a linear layer on T tokens runs three of them (forward
  x·Wᵀ with bias, backward-input g·W, backward-weight gᵀ·x), each timed on its own.
- attention: causal scaled_dot_product_attention; executed FLOPs as workload.py's flash
  attention op: forward 2·core·0.5, backward 4·core·0.625, core = 2·b·heads·s²·d.
- memory: bytes per element as workload.py assigns them (fp32, a = 4): layernorm 4a
  forward, gelu 2a, residual add 3a, cross-entropy a+4+4 per logit; backward passes move
  twice their forward traffic; a plain copy moves 2a; fused AdamW 24 B per parameter
  (gradient, two fp32 states read and written, weight written: analytic.optimizer_step_time).
"""

from __future__ import annotations

from .timing import median_time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# Kernel class (compute.MEMORY_KERNELS) of each memory-bound microbenchmark; "copy" is the
# plain bandwidth-bound kernel that defines the generic `efficiency.memory` curve.
KERNEL_OF = {"copy": "copy", "residual_add": "residual", "layernorm": "norm", "gelu": "gelu",
             "cross_entropy": "cross_entropy", "embedding": "embedding", "adamw_fused": "optimizer"}


def _torch():
    import torch
    return torch


class Bench:
    """Runs microbenchmarks on one device with a time budget per measurement."""

    def __init__(self, device: str = "cpu", quick: bool = False, clock: str = "wall"):
        torch = _torch()
        self.torch = torch
        self.device = torch.device(device)
        self.quick = quick
        self.min_time = 0.02 if quick else 0.15
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.samples: list[dict] = []
        self.clock = clock

    def _time(self, fn) -> float:
        return median_time(fn, min_time=self.min_time, min_reps=3, max_reps=8 if self.quick else 30, sync=self.sync,
                           clock=self.clock)

    def _add(self, op, kind, shape, dtype, pass_, work, seconds):
        row = {"op": op, "kind": kind, "shape": list(shape), "dtype": dtype, "pass": pass_,
               "work": float(work), "seconds": float(seconds)}
        if kind == "memory":
            row["kernel"] = KERNEL_OF.get(op, op)
        self.samples.append(row)

    # ------------------------------------------------------------------ GEMMs
    def gemm_shapes(self):
        if self.quick:
            return [(128, 128, 512), (512, 256, 1024), (256, 512, 512)]
        tokens = (128, 256, 512, 1024, 2048)
        widths = ((64, 256), (128, 384), (128, 512), (256, 768), (256, 1024), (512, 1536), (512, 2048),
                  (1024, 1024), (256, 4096))
        return [(t, a, b) for t in tokens for a, b in widths]

    def gemms(self, dtypes=("fp32",)):
        torch, dev = self.torch, self.device
        F = torch.nn.functional
        for dt in dtypes:
            dtype = getattr(torch, DTYPES[dt])
            for t, d_in, d_out in self.gemm_shapes():
                x = torch.randn(t, d_in, device=dev, dtype=dtype)
                w = torch.randn(d_out, d_in, device=dev, dtype=dtype)
                b = torch.randn(d_out, device=dev, dtype=dtype)
                g = torch.randn(t, d_out, device=dev, dtype=dtype)
                flops = 2 * t * d_in * d_out
                self._add("linear", "matmul", (t, d_in, d_out), dt, "fwd", flops, self._time(lambda: F.linear(x, w, b)))
                self._add("linear", "matmul", (t, d_in, d_out), dt, "bwd_input", flops, self._time(lambda: g @ w))
                self._add("linear", "matmul", (t, d_in, d_out), dt, "bwd_weight", flops,
                          self._time(lambda: g.t() @ x))
                if dt != "fp32" and self.quick:
                    break

    # ------------------------------------------------------------------ attention
    def attention_shapes(self):
        if self.quick:
            return [(1, 4, 128, 32), (2, 4, 256, 64)]
        return [(b, h, s, d) for b in (1, 4) for h, d in ((2, 32), (4, 32), (4, 64), (8, 64)) for s in (64, 128, 256, 512)]

    def attention(self, dt: str = "fp32"):
        torch, dev = self.torch, self.device
        F = torch.nn.functional
        dtype = getattr(torch, DTYPES[dt])
        for b, h, s, d in self.attention_shapes():
            # The layout a transformer layer hands the kernel (torch_model.py): Q, K and V are
            # (b, s, heads, d) slices of the fused QKV output seen as (b, heads, s, d), and the
            # gradient of the output arrives the same way. Strided inputs change the kernel's speed.
            qkv = torch.randn(b, s, 3 * h * d, device=dev, dtype=dtype, requires_grad=True)
            q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1))
            go = torch.randn(b, s, h, d, device=dev, dtype=dtype).transpose(1, 2)
            core = 2 * b * h * s * s * d

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (qkv,), go)

            tf = self._time(fwd)
            tfb = self._time(fwd_bwd)
            self._add("sdpa_causal", "attention", (b, h, s, d), dt, "fwd", 2 * core * 0.5, tf)
            self._add("sdpa_causal", "attention", (b, h, s, d), dt, "bwd", 4 * core * 0.625, max(tfb - tf, 1e-9))

    # ------------------------------------------------------------------ memory-bound
    def memory_sizes(self):
        if self.quick:
            return [(256, 256), (1024, 512)]
        # Working sets of the models validate --torch trains (<= 8 MiB a tensor): the curve has
        # no cache cliff, so sizes far beyond the last-level cache would bias it.
        return [(t, h) for t in (128, 512, 2048) for h in (128, 256, 512, 1024)]

    def memory(self, dt: str = "fp32"):
        torch, dev = self.torch, self.device
        F = torch.nn.functional
        dtype = getattr(torch, DTYPES[dt])
        a = torch.finfo(dtype).bits // 8
        for t, h in self.memory_sizes():
            n = t * h
            x = torch.randn(t, h, device=dev, dtype=dtype, requires_grad=True)
            y = torch.randn(t, h, device=dev, dtype=dtype)
            g = torch.randn(t, h, device=dev, dtype=dtype)
            ln = torch.nn.LayerNorm(h, device=dev, dtype=dtype)
            out = torch.empty_like(y)
            self._add("copy", "memory", (t, h), dt, "fwd", 2 * a * n, self._time(lambda: out.copy_(y)))
            self._add("residual_add", "memory", (t, h), dt, "fwd", 3 * a * n, self._time(lambda: torch.add(x, y)))
            for name, fn, per in (("layernorm", ln, 4 * a), ("gelu", F.gelu, 2 * a)):
                def fwd(fn=fn):
                    return fn(x)

                def fwd_bwd(fn=fn):
                    torch.autograd.grad(fn(x), (x,), g)

                tf = self._time(fwd)
                tfb = self._time(fwd_bwd)
                self._add(name, "memory", (t, h), dt, "fwd", per * n, tf)
                self._add(name, "memory", (t, h), dt, "bwd", 2 * per * n, max(tfb - tf, 1e-9))
        vocabs = (512, 2048) if self.quick else (512, 2048, 8192)
        tokens = (256,) if self.quick else (128, 256, 512, 1024)
        for t in tokens:
            for vsz in vocabs:
                logits = torch.randn(t, vsz, device=dev, dtype=torch.float32, requires_grad=True)
                tgt = torch.randint(0, vsz, (t,), device=dev)

                def ce_fwd():
                    return F.cross_entropy(logits, tgt)

                def ce_fb():
                    F.cross_entropy(logits, tgt).backward()

                tf = self._time(ce_fwd)
                tfb = self._time(ce_fb)
                per = a + 4 + 4
                self._add("cross_entropy", "memory", (t, vsz), dt, "fwd", per * t * vsz, tf)
                self._add("cross_entropy", "memory", (t, vsz), dt, "bwd", 2 * per * t * vsz, max(tfb - tf, 1e-9))

    def embedding(self, dt: str = "fp32"):
        """Token + learned position embedding (gather and add), forward and backward: 3a B/element forward."""
        torch, dev = self.torch, self.device
        dtype = getattr(torch, DTYPES[dt])
        a = torch.finfo(dtype).bits // 8
        shapes = [(256, 128, 2048)] if self.quick else [(t, h, 2048) for t in (256, 1024) for h in (128, 256, 512)]
        for t, h, vocab in shapes:
            tok = torch.nn.Embedding(vocab, h, device=dev, dtype=dtype)
            pos = torch.nn.Embedding(t, h, device=dev, dtype=dtype)
            idx = torch.randint(0, vocab, (t,), device=dev)
            ar = torch.arange(t, device=dev)
            g = torch.randn(t, h, device=dev, dtype=dtype)

            def fwd():
                return tok(idx) + pos(ar)

            def fwd_bwd():
                (tok(idx) + pos(ar)).backward(g)

            tf = self._time(fwd)
            tfb = self._time(fwd_bwd)
            n = t * h
            self._add("embedding", "memory", (t, h, vocab), dt, "fwd", 3 * a * n, tf)
            self._add("embedding", "memory", (t, h, vocab), dt, "bwd", 6 * a * n, max(tfb - tf, 1e-9))

    def adamw(self):
        """Fused AdamW step over one parameter tensor of P fp32 values: 24 B per parameter."""
        torch, dev = self.torch, self.device
        sizes = (2**16, 2**20) if self.quick else (2**14, 2**16, 2**18, 2**20, 2**22)
        for p in sizes:
            param = torch.nn.Parameter(torch.randn(p, device=dev))
            param.grad = torch.randn(p, device=dev)
            opt = torch.optim.AdamW([param], lr=1e-4, fused=True)
            self._add("adamw_fused", "memory", (p,), "fp32", "step", 24 * p, self._time(opt.step))

    def overhead(self):
        """Framework cost per operator and pass: forward + backward of a transformer at tiny sizes.

        At hidden 8, sequence 4, the kernels do almost no work, so the time is the framework's
        (Python modules, dispatcher, autograd, small glue ops). The difference between 3 and 1
        layers isolates one layer; divided by 2 passes x the operators workload.py counts in a
        layer it gives the cost per operator and pass (profile `op_overhead_us`).
        """
        torch, dev = self.torch, self.device
        from ..model import ModelSpec
        from ..workload import Shard, layer_ops
        from .torch_model import GPTConfig, build_model

        times = {}
        for layers in (1, 3):
            cfg = GPTConfig(layers=layers, hidden=8, heads=2, vocab=16, seq_len=4)
            model = build_model(cfg, "none", dev)
            x = torch.randint(0, 16, (1, 4), device=dev)

            def fwd_bwd():
                model(x, x).backward()

            times[layers] = self._time(fwd_bwd)
        spec = ModelSpec(**{k: v for k, v in GPTConfig(hidden=8, heads=2).model_fields().items()})
        ops = len(layer_ops(spec, Shard(micro_batch=1, seq_len=spec.seq_len)))
        per_layer = max(0.0, (times[3] - times[1]) / 2)
        self._add("framework_overhead", "overhead", (ops,), "fp32", "fwd+bwd", 2 * ops, per_layer)

    def copies(self):
        """Host<->device copies (CUDA only): pinned host buffer to device and back."""
        torch, dev = self.torch, self.device
        if dev.type != "cuda":
            return
        for n in ((2**20, 2**24) if self.quick else (2**18, 2**20, 2**22, 2**24, 2**26)):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            devbuf = torch.empty(n, dtype=torch.uint8, device=dev)
            self._add("h2d", "host_link", (n,), "u8", "h2d", n, self._time(lambda: devbuf.copy_(host, non_blocking=True)))
            self._add("d2h", "host_link", (n,), "u8", "d2h", n, self._time(lambda: host.copy_(devbuf, non_blocking=True)))

    def run_all(self, dtypes=("fp32",)) -> list[dict]:
        self.gemms(dtypes)
        self.attention("fp32")
        self.memory("fp32")
        self.embedding("fp32")
        self.adamw()
        self.overhead()
        self.copies()
        return self.samples
