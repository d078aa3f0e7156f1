"""One training step of torch_model.GPT, as `llmsim validate --torch` runs it.

The host-overhead microbenchmark (microbench.Bench.host_overhead) times this same step on
tiny models, so that the framework cost it measures is the one the validated step pays.

fp32: parameters in fp32; their `.grad` are views of one flat fp32 buffer (as DDP's
gradient_as_bucket_view and Megatron-LM's main_grad buffer), so autograd's AccumulateGrad
adds each micro-batch's gradients into the buffer in place; fused AdamW on the parameters.

bf16 (mixed precision as Megatron-LM's Float16OptimizerWithFloat16Params): the model's
parameters and activations in bf16, fp32 main gradients in the flat buffer, fp32 master
weights owned by the optimizer. After each micro-batch's backward pass the bf16 gradients
are added into the fp32 buffer (one multi-tensor add) and dropped; after the fused AdamW
step the master weights are copied into the bf16 parameters (one multi-tensor copy). CPUs
have no bf16 GEMM with fp32 accumulation into an existing buffer, so the weight gradient
cannot be accumulated inside the GEMM (Megatron-LM's gradient_accumulation_fusion): the
simulator is told so (plan.grad_accumulation_fusion: false), for fp32 as well.

Each step: zero the gradient buffer, forward + backward of every micro-batch (loss scaled by
1 / (micro-batches x DP ranks)), all-reduce of the buffer over the DP ranks, optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

from .torch_model import GPTConfig, build_model

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class Trainer:
    model: object
    params: list
    flat: object  # fp32 gradient buffer
    grads: list  # views of `flat`, one per parameter
    master: list | None  # fp32 master weights (mixed precision), else None
    opt: object
    x: object  # (micro-batches, micro_batch, seq) token ids
    y: object
    scale: float
    world: int

    def step(self) -> None:
        import torch

        self.flat.zero_()
        for i in range(self.x.shape[0]):
            loss = self.model(self.x[i], self.y[i]) * self.scale
            loss.backward()
            if self.master is not None:
                torch._foreach_add_(self.grads, [p.grad for p in self.params])
                for p in self.params:
                    p.grad = None
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(self.flat)
        self.opt.step()
        if self.master is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)

    def live_tensors(self) -> list:
        """Tensors alive between steps: weights, gradient buffer, master weights, optimizer states, batch."""
        import torch

        states = [t for st in self.opt.state.values() for t in st.values() if torch.is_tensor(t)]
        return self.params + [self.flat, self.x, self.y] + (self.master or []) + states + list(self.model.buffers())


def make_trainer(cfg: GPTConfig, recompute: str = "none", precision: str = "fp32", grad_accum: int = 1,
                 micro_batch: int = 1, device="cpu", rank: int = 0, world: int = 1) -> Trainer:
    import torch

    model = build_model(cfg, recompute, device)
    if precision != "fp32":
        model = model.to(getattr(torch, DTYPES[precision]))
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params), device=device)
    grads, off = [], 0
    for p in params:
        grads.append(flat[off:off + p.numel()].view(p.shape))
        off += p.numel()
    if precision == "fp32":
        master = None
        for p, g in zip(params, grads):
            p.grad = g
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    else:
        master = [p.detach().float().requires_grad_() for p in params]
        for m, g in zip(master, grads):
            m.grad = g
        opt = torch.optim.AdamW(master, lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    shape = (grad_accum, micro_batch, cfg.seq_len)
    x = torch.randint(0, cfg.vocab, shape, generator=gen).to(device)
    y = torch.randint(0, cfg.vocab, shape, generator=gen).to(device)
    return Trainer(model, params, flat, grads, master, opt, x, y, 1.0 / (grad_accum * world), world)
