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

optimizer "muon": Megatron-Core's Muon (simulator/muon.py) on the blocks' weight matrices and
the position table, fused AdamW on the rest (MegatronMuon).
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


# Jordan et al. 2024's quintic Newton-Schulz coefficients (Emerging-Optimizers "quintic")
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class MegatronMuon:
    """Muon as Megatron-Core steps it, for the validation model: fused AdamW on `others`; on
    each of `matrices` (fp32, their .grad the fp32 main gradients) the momentum's lerp towards
    the gradient, decoupled weight decay, Newton-Schulz on the momentum (the fused QKV weight as
    its query, key and value blocks: --muon-split-qkv; this model's [q; k; v] rows need no copy
    to split, where Megatron's head-grouped layout copies each piece out), the spectral scale
    and the extra scale factor, and the update (NVIDIA-NeMo/Emerging-Optimizers@fd77292
    orthogonalized_optimizer.py step; muon_utils.py newton_schulz: transposed to its smaller
    side, Frobenius-normalised in fp32, `steps` quintic steps in bf16 as two addmm after the
    Gram GEMM, back to fp32; muon.py get_muon_scale_factor spectral: sqrt(max(1, rows/cols));
    Megatron-LM's defaults: momentum 0.9 without Nesterov, weight decay 0.01)."""

    def __init__(self, matrices: list, qkv: list, others: list, steps: int = 5, lr: float = 1e-4,
                 momentum: float = 0.9, weight_decay: float = 0.01):
        import torch

        self.adam = torch.optim.AdamW(others, lr=lr, fused=True)
        self.matrices, self.qkv = matrices, {id(p) for p in qkv}
        self.steps, self.lr, self.momentum, self.weight_decay = steps, lr, momentum, weight_decay
        self.muon_state = {p: {"momentum_buffer": torch.zeros_like(p)} for p in matrices}

    @property
    def state(self) -> dict:
        return {**self.adam.state, **self.muon_state}

    def _orthogonalised(self, g):
        import torch

        rows, cols = g.shape
        x = g.mT if rows > cols else g
        x = torch.nn.functional.normalize(x, p=2, dim=(-2, -1)).to(torch.bfloat16)
        a, b, c = NS_COEFFICIENTS
        for _ in range(self.steps):
            gram = x @ x.mT
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a, alpha=1.0)
        x = x.float()
        return (x.mT if rows > cols else x) * max(1.0, rows / cols) ** 0.5 * 1.0  # the extra scale factor

    def step(self) -> None:
        import torch

        self.adam.step()
        with torch.no_grad():
            for p in self.matrices:
                buf = self.muon_state[p]["momentum_buffer"]
                buf.lerp_(p.grad, 1 - self.momentum)
                p.mul_(1 - self.lr * self.weight_decay)
                if id(p) in self.qkv:
                    update = torch.cat([self._orthogonalised(x) for x in buf.chunk(3)])
                else:
                    update = self._orthogonalised(buf)
                p.add_(update, alpha=-self.lr)


def make_trainer(cfg: GPTConfig, recompute: str = "none", precision: str = "fp32", grad_accum: int = 1,
                 micro_batch: int = 1, device="cpu", rank: int = 0, world: int = 1,
                 optimizer: str = "adam") -> Trainer:
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
    else:
        master = [p.detach().float().requires_grad_() for p in params]
        for m, g in zip(master, grads):
            m.grad = g
    owned = params if master is None else master  # what the optimizer updates
    if optimizer == "muon":
        names = [name for name, _ in model.named_parameters()]
        is_matrix = [n.startswith("blocks.") and n.endswith(".weight") and p.dim() == 2 or n == "pos.weight"
                     for n, p in zip(names, owned)]
        opt = MegatronMuon([p for p, m in zip(owned, is_matrix) if m],
                           [p for n, p in zip(names, owned) if n.endswith(".qkv.weight")],
                           [p for p, m in zip(owned, is_matrix) if not m])
    else:
        opt = torch.optim.AdamW(owned, lr=1e-4, fused=True)
    gen = torch.Generator().manual_seed(1234 + rank)
    shape = (grad_accum, micro_batch, cfg.seq_len)
    x = torch.randint(0, cfg.vocab, shape, generator=gen).to(device)
    y = torch.randint(0, cfg.vocab, shape, generator=gen).to(device)
    return Trainer(model, params, flat, grads, master, opt, x, y, 1.0 / (grad_accum * world), world)
