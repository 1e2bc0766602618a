"""A Llama-family decoder (SmolLM2, TinyLlama, Llama 2 and 3 without rope scaling) on kernels/, beside GPT-2.

The same entry points as explorer.model.gpt.GPT (forward, prefill, decode), the same operation names where
the parts do the same job, and four differences in the block, each one kernel:

    GPT-2 (2019)                                       Llama
    h = layer_norm(x)                   ln_1           h = rms_norm(x)                 no mean, no bias
    q, k, v = c_attn(h), positions from wpe            q, k, v = c_attn(h); q, k turned by rotary positions
    attention over H key/value heads   attn            grouped heads: H_kv < H, the cache H / H_kv smaller
    x = x + c_proj(o)                                  x = x + c_proj(o)
    h = layer_norm(x)                   ln_2           h = rms_norm(x)
    x = x + c_proj(gelu(c_fc(h)))       mlp            x = x + c_proj(silu(gate(h)) * up(h))   SwiGLU

c_attn holds the checkpoint's q_proj, k_proj and v_proj stacked ((H + 2 H_kv) * D rows), c_fc its gate_proj
over its up_proj (kernels.swiglu runs both in one matmul, the gating in its epilogue). No biases.

Every rung of the fusion ladder runs it (Ops.block chooses a block's form): "none" launches each residual add
apart; on the decode rungs a decode step is four projections and attention, as GPT-2's (Block.decode_fused):
RMSNorm in the prologue of the projection after it, rotary positions and the cache write in c_attn's epilogue,
SwiGLU in c_fc's. The persistent rung's one-launch block is GPT-2's, so there a Llama decode step runs as
"overlap"; the megakernel rung runs a Llama's whole decode step in one launch, as GPT-2's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import kernels

from .cache import KVCache
from .gpt import GPT, Linear, _Attend
from .ops import DEFAULT_FUSION, Ops


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    n_positions: int  # max_position_embeddings
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    ffn: int  # intermediate_size
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        d, kv = cfg.head_dim, cfg.n_kv_head
        self.c_attn = Linear(cfg.n_embd, (cfg.n_head + 2 * kv) * d, bias=False)  # q, k, v stacked
        self.c_proj = Linear(cfg.n_head * d, cfg.n_embd, bias=False)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.c_fc = Linear(cfg.n_embd, 2 * cfg.ffn, bias=False)  # gate over up
        self.c_proj = Linear(cfg.ffn, cfg.n_embd, bias=False)


class Block(nn.Module):
    """x = x + c_proj(attention(rotary(c_attn(rms_norm(x))))); x = x + c_proj(swiglu(c_fc(rms_norm(x)))): GPT-2's
    block (explorer.model.gpt.Block) with the differences in the table above."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.ln_1 = RMSNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = RMSNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    @property
    def eps(self) -> float:
        return self.cfg.rms_norm_eps

    def forward(self, x, ops: Ops, attend: _GroupedAttend, positions):
        """positions (B, T): the rows' positions, which rotary reads."""
        B, T, _ = x.shape
        cfg = self.cfg
        h = ops.rms_norm("ln_1", x, self.ln_1.weight, self.eps)
        qkv = ops.linear("attn.c_attn", h, self.attn.c_attn.weight)  # (B, T, (H + 2 H_kv) D)
        d, turned = cfg.head_dim, cfg.n_head + cfg.n_kv_head  # q's heads and k's, side by side in qkv
        qk, v = (t.view(B, T, -1, d).transpose(1, 2) for t in qkv.split((turned * d, cfg.n_kv_head * d), dim=-1))
        qk = ops.rotary("attn.rope", qk, positions, cfg.rope_theta)  # (B, H + H_kv, T, D): one launch for both
        q, k = qk.split((cfg.n_head, cfg.n_kv_head), dim=1)
        o = attend(q, k, v).transpose(1, 2).reshape(B, T, cfg.n_head * d)
        x = ops.linear("attn.c_proj", o, self.attn.c_proj.weight, residual=x)
        h = ops.rms_norm("ln_2", x, self.ln_2.weight, self.eps)
        h = ops.swiglu("mlp.c_fc", h, self.mlp.c_fc.weight)  # (B, T, ffn)
        return ops.linear("mlp.c_proj", h, self.mlp.c_proj.weight, residual=x)

    def decode_fused(self, x, ops: Ops, attend: _GroupedAttend, positions):
        """The decode rung's five launches: ln_1 + c_attn + rotary + the cache write (the cache's length is each
        sequence's position), attention, c_proj + residual, ln_2 + c_fc + SwiGLU, c_proj + residual."""
        B = x.shape[0]
        cfg = self.cfg
        cache, layer = attend.cache, attend.next_layer()
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        a, m, d = self.attn, self.mlp, cfg.head_dim
        qkv = ops.decode_linear(
            "ln_1+attn.c_attn+rope+kv write",
            x,
            a.c_attn.weight,
            norm=(self.ln_1.weight, None, self.eps),
            kv=(k_cache, v_cache, cache.lengths),
            rope=cfg.rope_theta,
            part="attn.c_attn",
        )
        q = qkv[..., : cfg.n_head * d].view(B, 1, cfg.n_head, d).transpose(1, 2)  # (B, H, 1, D)
        o = ops.grouped_decode_attention("attn", q, k_cache, v_cache, cache.next_lengths)
        x = ops.decode_linear("attn.c_proj", o.transpose(1, 2).reshape(B, 1, -1), a.c_proj.weight, residual=x)
        norm = (self.ln_2.weight, None, self.eps)
        h = ops.decode_linear("ln_2+mlp.c_fc", x, m.c_fc.weight, activation="swiglu", norm=norm, part="mlp.c_fc")
        return ops.decode_linear("mlp.c_proj", h, m.c_proj.weight, residual=x)


class _GroupedAttend(_Attend):
    """_Attend with grouped-query heads: the cache holds the key/value heads, which attention shares among
    their groups."""

    def __call__(self, q, k, v):
        layer = self.next_layer()
        if self.cache is None:
            return self.ops.grouped_attention("attn", q, k, v)
        self.ops.kv_write("kv write", self.cache, layer, k, v, decode=self.mode == "decode")
        if self.mode == "prefill":
            return self.ops.grouped_attention("attn", q, k, v)
        c = self.cache
        return self.ops.grouped_decode_attention("attn", q, c.k[layer], c.v[layer], c.next_lengths)


class Llama(GPT):
    family = "Llama"
    RUNS_AS = {"persistent": "overlap"}  # the persistent rung's one-launch block is GPT-2's

    def __init__(self, cfg: LlamaConfig, backend: str = "triton", fusion: str = DEFAULT_FUSION):
        super().__init__(cfg, backend, fusion)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.requires_grad_(False)

    def parts(self, cfg: LlamaConfig) -> dict:
        """No position embeddings: rotary turns q and k by their positions inside each block."""
        return dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=RMSNorm(cfg.n_embd),
        )

    def _attend(self, ops: Ops, cache: KVCache | None = None, mode: str = "full") -> _GroupedAttend:
        return _GroupedAttend(ops, self.config.n_head, cache, mode)

    def embed(self, ops: Ops, ids, positions):
        return ops.token_embedding("wte", self.transformer.wte, ids)

    def step_parts(self) -> kernels.decode_step_parts:
        """The parameters as the one-launch decode step (the megakernel rung) takes them: no biases, no table of
        positions, the rotary theta."""
        t, cfg = self.transformer, self.config
        layers = tuple(
            (
                (b.ln_1.weight,),
                (b.attn.c_attn.weight,),
                (b.attn.c_proj.weight,),
                (b.ln_2.weight,),
                (b.mlp.c_fc.weight,),
                (b.mlp.c_proj.weight,),
            )
            for b in t.h
        )
        head = t.wte.weight if self.lm_head is None else self.lm_head.weight
        step = kernels.decode_step_parts(t.wte.weight, None, layers, (t.ln_f.weight,), head, cfg.rms_norm_eps)
        return step._replace(rope=cfg.rope_theta)

    def head(self, ops: Ops, x, attend):
        """The last RMSNorm and the LM head: tied to the token embedding, or the checkpoint's own."""
        t, eps = self.transformer, self.config.rms_norm_eps
        head = t.wte.weight if self.lm_head is None else self.lm_head.weight
        if attend.mode == "decode" and ops.fuses_decode(x.shape[0]):
            return ops.decode_linear("ln_f+lm_head", x, head, norm=(t.ln_f.weight, None, eps), part="lm_head")
        x = ops.rms_norm("ln_f", x, t.ln_f.weight, eps)
        return ops.linear("lm_head", x, head)
