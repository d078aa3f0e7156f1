"""A small GPT written in torch with the structure workload.py models, op for op.

Per layer: LayerNorm -> fused QKV linear -> causal scaled_dot_product_attention (the
flash kernel on CPU and CUDA; over each packed document with document_tokens, or on the
chunked layers over each chunk of sliding_window tokens, as Megatron-Bridge's Llama 4
attention cuts the sequence: window_kind chunked, every layer or all but each
sliding_window_skip_freq-th) -> output
linear -> residual add -> LayerNorm -> linear (4h) -> GELU -> linear -> residual add. With
qk_norm a LayerNorm over each query and key head before the attention (Qwen3's and Gemma 3's
q_norm, k_norm), or with qk_norm_scope "full" over the whole query and key projections (OLMo
2's); with post_norms a LayerNorm on the attention's and the MLP's outputs before each
residual add (Gemma's and OLMo 2's post_attention_ and post_feedforward_layernorm); without
pre_norms no LayerNorm before the attention and the MLP (OLMo 2); with parallel_block the
attention and the MLP both read the layer input, through their own LayerNorms or one shared
(shared_norm), and x + attn + mlp is the layer's output (GPT-NeoX, GPT-J). With experts the MLP
is Megatron-Core 0.9's MoE layer on one device (megatron/core/transformer/moe: router.py,
moe_utils.py, token_dispatcher.py, experts.py SequentialMLP): a router linear (with its bias,
as every linear here), top-k over its logits and a softmax over the k (fp32), the auxiliary
load-balancing loss from an fp32 softmax over all experts (attached to the output as
Megatron's MoEAuxLossAutoScaler attaches it); the rows copied out expert by expert
(index_select), sorted into chunks of local experts (a copy at one device), each expert's
linear -> GELU -> linear in turn, the outputs joined (torch.cat) and unsorted (a copy), then
weighted by their gate and added back to their tokens (scatter_add). With moe_layer
"torchtitan" the MLP is torchtitan v0.2.2's MoE layer on one device as llmsim models it
(titanmoe.py; written here from its op sequence): a gate without bias, softmax scores in fp32
with the expert bias added for the choice, the chosen scores normalised; the routed rows
gathered in expert order, each expert's SwiGLU (w1, w3, w2 without biases) in turn on its
rows (the for-loop experts: use_grouped_mm false), the outputs joined and stacked, written
into a zeroed buffer in token order and summed with their scores in an fp32 bmm; the
attention's q, k and v are separate linears and no linear has a bias, as torchtitan's.
Around the layers: token + learned position embedding, final LayerNorm, lm_head tied to the
token embedding, fp32 cross-entropy. No dropout. Initialised as GPT-2 and Megatron-LM
initialise (N(0, 0.02)). Full recomputation wraps each layer in torch.utils.checkpoint
(non-reentrant): only each layer's input is kept.

`model_fields()` gives the simulator's model section for the same network.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    vocab: int = 2048
    seq_len: int = 128
    document_tokens: int = 0  # packed documents of this many tokens, attention inside each (0: causal)
    sliding_window: int = 0  # the chunk of a chunked layer (window_kind chunked only: no sliding band on CPU)
    sliding_window_skip_freq: int = 0
    window_kind: str = "sliding"
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    pre_norms: bool = True
    post_norms: bool = False
    parallel_block: bool = False
    shared_norm: bool = False
    experts: int = 0  # an MoE MLP of this many experts, each 4h wide, top_k of them per token (0: dense)
    top_k: int = 2
    moe_layer: str = "megatron-core"  # or torchtitan (plan.moe.framework)
    # Megatron-Core 0.13 on: the probabilities scale the GELU's output, the un-permutation only
    # sums (plan.moe.probs_in_experts); before, it weights the expert outputs
    probs_in_experts: bool = False

    def model_fields(self) -> dict:
        """The scenario `model` section describing this network to the simulator."""
        fields = {"name": "torch-gpt", **asdict(self), "kv_heads": self.heads, "ffn_hidden": 4 * self.hidden,
                  "activation": "gelu", "norm": "layernorm", "position_embedding": "learned", "bias": True,
                  "tied_embeddings": True, "dropout": False}
        del fields["moe_layer"], fields["probs_in_experts"]
        if self.experts:
            fields["expert_ffn_hidden"] = 4 * self.hidden
            if self.moe_layer == "torchtitan":  # SwiGLU experts (every layer's MLP is MoE), no biases
                fields.update(activation="swiglu", bias=False)
        else:
            del fields["experts"], fields["top_k"]
        return fields


def build_model(cfg: GPTConfig, recompute: str = "none", device="cpu"):
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    if cfg.sliding_window and cfg.window_kind != "chunked":
        raise ValueError("the torch model attends in chunks (window_kind chunked), not in a sliding band")

    class AttachAuxLoss(torch.autograd.Function):
        """The output unchanged, the auxiliary loss's gradient (1) added in the backward pass."""

        @staticmethod
        def forward(ctx, output, aux_loss):
            ctx.save_for_backward(aux_loss)
            return output

        @staticmethod
        def backward(ctx, grad):
            (aux_loss,) = ctx.saved_tensors
            return grad, torch.ones_like(aux_loss)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            h, e = cfg.hidden, cfg.experts
            self.router = nn.Linear(h, e)
            self.up = nn.ModuleList(nn.Linear(h, 4 * h) for _ in range(e))
            self.down = nn.ModuleList(nn.Linear(4 * h, h) for _ in range(e))

        def forward(self, x):
            b, s, h = x.shape
            e, k = cfg.experts, cfg.top_k
            t = x.reshape(b * s, h)
            logits = self.router(t)
            top_logits, top_experts = torch.topk(logits, k, dim=-1)
            gates = torch.softmax(top_logits.float(), dim=-1).to(t.dtype)
            # rows expert-major, tokens in order within an expert (moe_utils.permute's order)
            order = torch.argsort(top_experts.flatten(), stable=True)
            tokens = order // k
            counts = torch.bincount(top_experts.flatten(), minlength=e)
            # Switch load-balancing loss (coefficient 0.01) over the fp32 softmax of every expert
            scores = torch.softmax(logits.float(), dim=-1)
            aux = (scores.sum(0) * counts).sum() * (e * 0.01 / (b * s * b * s * k))
            split = counts.tolist()
            rows = torch.cat(t.index_select(0, tokens).split(split))
            probs = gates.flatten()[order].unsqueeze(-1)  # each row's probability, in the rows' order
            if cfg.probs_in_experts:  # the activation scaled (experts.py bias_act_func, mlp.py per_token_scale)
                out = torch.cat([down(F.gelu(up(r)) * p) for up, down, r, p in
                                 zip(self.up, self.down, rows.split(split), probs.split(split))])
            else:
                out = torch.cat([down(F.gelu(up(r))) for up, down, r in zip(self.up, self.down, rows.split(split))])
            out = torch.cat(out.split(split))
            # scatter_add as moe_utils.unpermute runs it: its backward keeps the (expanded) index,
            # where index_add's would keep the weighted rows
            y = torch.zeros_like(t).scatter_add(0, tokens.unsqueeze(1).expand(-1, h),
                                                out if cfg.probs_in_experts else out * probs)
            return AttachAuxLoss.apply(y.reshape(b, s, h), aux)

    titan = bool(cfg.experts) and cfg.moe_layer == "torchtitan"

    class TitanMoE(nn.Module):
        def __init__(self):
            super().__init__()
            h, e = cfg.hidden, cfg.experts
            self.gate = nn.Linear(h, e, bias=False)
            self.w1, self.w3 = (nn.Parameter(torch.empty(e, 4 * h, h)) for _ in range(2))
            self.w2 = nn.Parameter(torch.empty(e, h, 4 * h))
            self.register_buffer("expert_bias", torch.zeros(e))
            self.register_buffer("tokens_per_expert", torch.zeros(e))

        def forward(self, x):
            b, s, h = x.shape
            e, k = cfg.experts, cfg.top_k
            t = x.reshape(b * s, h)
            scores = torch.softmax(self.gate(t).float(), dim=1)
            _, chosen = torch.topk(scores + self.expert_bias, k, dim=-1, sorted=False)
            top = scores.gather(1, chosen)
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
            counts = torch.bincount(chosen.flatten(), minlength=e)
            with torch.no_grad():
                self.tokens_per_expert.add_(counts)
            order = torch.argsort(chosen.flatten(), stable=True)
            rows = t[order // k]
            split = counts.tolist()
            out = torch.cat([(F.silu(r @ w1.t()) * (r @ w3.t())) @ w2.t()
                             for r, w1, w3, w2 in zip(rows.split(split), self.w1, self.w3, self.w2)])
            out = torch.vstack((out, out.new_zeros((0, h))))
            unsorted = torch.zeros((b * s * k, h), dtype=out.dtype, device=out.device)
            unsorted[order] = out
            y = torch.bmm(top.reshape(-1, 1, k), unsorted.reshape(-1, k, h).float()).to(t.dtype)
            return y.reshape(b, s, h)

    class Block(nn.Module):
        def __init__(self, index: int):
            super().__init__()
            skip = cfg.sliding_window_skip_freq
            self.chunk = cfg.sliding_window if cfg.sliding_window and (not skip or (index + 1) % skip) else 0
            h = cfg.hidden
            norm_bias = not titan
            self.ln1, self.ln2 = (nn.LayerNorm(h, bias=norm_bias), nn.LayerNorm(h, bias=norm_bias)) \
                if cfg.pre_norms else (nn.Identity(),) * 2
            if cfg.shared_norm:
                self.ln2 = None
            self.titan = titan
            if self.titan:  # torchtitan's wq, wk, wv and wo, without biases
                self.q, self.k, self.v = (nn.Linear(h, h, bias=False) for _ in range(3))
            else:
                self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h, bias=not self.titan)
            if cfg.experts:
                self.moe = TitanMoE() if self.titan else MoE()
            else:
                self.up = nn.Linear(h, 4 * h)
                self.down = nn.Linear(4 * h, h)
            if cfg.qk_norm:
                width = h if cfg.qk_norm_scope == "full" else h // cfg.heads
                self.q_norm, self.k_norm = nn.LayerNorm(width), nn.LayerNorm(width)
            if cfg.post_norms:
                self.attn_post, self.mlp_post = nn.LayerNorm(h), nn.LayerNorm(h)

        def mlp(self, x):
            return self.moe(x) if cfg.experts else self.down(F.gelu(self.up(x)))

        def forward(self, x):
            b, s, h = x.shape
            nh = cfg.heads
            # packed documents of d tokens attend inside themselves: b·s/d causal sequences of d,
            # the same views and kernels as the whole sequence (varlen attention of equal lengths)
            d = cfg.document_tokens if 0 < cfg.document_tokens < s else self.chunk if 0 < self.chunk < s else s
            # split (backward: one cat) rather than unbind of a permuted view (backward: a strided stack)
            normed_input = self.ln1(x)
            if self.titan:
                q, k, v = self.q(normed_input), self.k(normed_input), self.v(normed_input)
            else:
                q, k, v = self.qkv(normed_input).split(h, dim=-1)
            if cfg.qk_norm and cfg.qk_norm_scope == "full":
                q, k = self.q_norm(q), self.k_norm(k)
            q, k, v = (t.reshape(b * s // d, d, nh, h // nh).transpose(1, 2) for t in (q, k, v))
            if cfg.qk_norm and cfg.qk_norm_scope == "head":
                q, k = self.q_norm(q), self.k_norm(k)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            attn = self.proj(a.transpose(1, 2).reshape(b, s, h))
            if cfg.parallel_block:
                normed = normed_input if cfg.shared_norm else self.ln2(x)
                return x + attn + self.mlp(normed)
            x = x + (self.attn_post(attn) if cfg.post_norms else attn)
            mlp = self.mlp(self.ln2(x))
            return x + (self.mlp_post(mlp) if cfg.post_norms else mlp)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
            self.blocks = nn.ModuleList(Block(i) for i in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.hidden, bias=not titan)
            self.recompute = recompute

        def forward(self, idx, targets):
            s = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
            for blk in self.blocks:
                if self.recompute == "full" and torch.is_grad_enabled():
                    x = checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
            logits = F.linear(self.ln_f(x), self.tok.weight)  # tied lm_head
            # the loss in fp32 (a no-op for fp32 logits), as Megatron-LM's vocab-parallel cross-entropy
            return F.cross_entropy(logits.float().view(-1, cfg.vocab), targets.view(-1))

    torch.manual_seed(0)
    model = GPT()
    _init_like_megatron(model, cfg.layers)
    return model.to(device)


def _init_like_megatron(model, layers: int) -> None:
    """Weights and embeddings N(0, 0.02), the two output projections of each layer
    N(0, 0.02/sqrt(2·layers)), biases 0, norms 1 (GPT-2; Megatron-LM init_method_normal and
    scaled_init_method_normal, megatron/core/utils.py).

    torch's defaults are not what LLM training runs and change the step's speed on some CPUs:
    nn.Embedding draws N(0, 1), and with the tied lm_head that gives logits of standard
    deviation sqrt(hidden), softmax probabilities below the smallest normal float and, in the
    lm_head's backward GEMMs, subnormal operands that Intel cores process ~50x slower
    (docs/calibration.md).
    """
    import math

    import torch

    out_std = 0.02 / math.sqrt(2 * layers)
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            out = name.endswith(("proj.weight", "down.weight")) or ".down." in name and name.endswith("weight")
            torch.nn.init.normal_(p, 0.0, out_std if out else 0.02)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)
        else:
            torch.nn.init.ones_(p)


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
