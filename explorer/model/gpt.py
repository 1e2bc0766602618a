"""A GPT-2 decoder whose every LayerNorm, projection, FFN and attention runs on kernels/.

Names follow GPT-2's checkpoints (transformer.wte, h.N.attn.c_attn, mlp.c_fc, ln_f), so loading is a
key-for-key copy; only Conv1D weights are transposed into F.linear's (out, in). Each block is pre-LN:

    x = x + c_proj(attention(c_attn(ln_1(x))))      the residual add rides in c_proj's epilogue
    x = x + c_proj(gelu(c_fc(ln_2(x))))             GELU in c_fc's epilogue, the add in c_proj's

That is the "epilogue" rung of the fusion ladder (see ops.py); "none" launches the bias, GELU and add
apart, and "decode" folds each LayerNorm into the projection after it and the cache write into c_attn
for decode steps (Block.decode_fused); "persistent" runs each block of a decode step in one launch, and
"megakernel" the whole decode step. Ops.block
chooses which form a block runs in.

Three entry points share the blocks and differ only in how attention gets its keys:
- forward(ids): the whole sequence, no cache (the O(n^2)-per-token path when generating);
- prefill(ids, cache, lengths): right-padded prompts, K and V written to the cache;
- decode(ids, cache): one token per sequence at its own position, attending over its cache.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

import kernels

from .cache import KVCache
from .graphs import GraphPool
from .ops import DEFAULT_FUSION, Observer, Ops, Tiles, check_fusion


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_kv_head(self) -> int:
        """Heads of the KV cache: every query head has its own key/value head in GPT-2."""
        return self.n_head


class LayerNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(width), requires_grad=False)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)  # (out, in)
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_attn = Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Linear(cfg.n_embd, cfg.n_embd)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = Linear(4 * cfg.n_embd, cfg.n_embd)


class Block(nn.Module):
    """x = x + c_proj(attention(c_attn(ln_1(x)))); x = x + c_proj(gelu(c_fc(ln_2(x)))). The rung runs it as it
    chooses (Ops.block): this forward, decode_fused's five launches, or the whole block in one."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.ln_1 = LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    @property
    def eps(self) -> float:
        return self.cfg.layer_norm_epsilon

    def forward(self, x, ops: Ops, attend, positions):
        """positions: GPT-2 reads them once, in the embedding (wpe); the block takes them as Llama's does."""
        B, T, C = x.shape
        h = ops.layer_norm("ln_1", x, self.ln_1.weight, self.ln_1.bias, self.eps)
        qkv = ops.linear("attn.c_attn", h, self.attn.c_attn.weight, self.attn.c_attn.bias)  # (B, T, 3C)
        nh = attend.n_head
        q, k, v = (t.view(B, T, nh, C // nh).transpose(1, 2) for t in qkv.split(C, dim=-1))  # (B, nh, T, hs) views
        o = attend(q, k, v)  # (B, nh, T, hs)
        o = o.transpose(1, 2).reshape(B, T, C)  # a view when the kernel stored (B, T, nh, hs)
        x = ops.linear("attn.c_proj", o, self.attn.c_proj.weight, self.attn.c_proj.bias, residual=x)
        h = ops.layer_norm("ln_2", x, self.ln_2.weight, self.ln_2.bias, self.eps)
        h = ops.linear("mlp.c_fc", h, self.mlp.c_fc.weight, self.mlp.c_fc.bias, activation="gelu")  # (B, T, 4C)
        return ops.linear("mlp.c_proj", h, self.mlp.c_proj.weight, self.mlp.c_proj.bias, residual=x)

    def decode_fused(self, x, ops: Ops, attend, positions):
        """The decode rung's five launches: ln_1 + c_attn + the cache write, attention, c_proj + residual,
        ln_2 + c_fc + GELU, c_proj + residual."""
        B, _, C = x.shape
        cache, layer = attend.cache, attend.next_layer()
        k_cache, v_cache = cache.k[layer], cache.v[layer]
        a, m = self.attn, self.mlp
        qkv = ops.decode_linear(
            "ln_1+attn.c_attn+kv write",
            x,
            a.c_attn.weight,
            a.c_attn.bias,
            norm=(self.ln_1.weight, self.ln_1.bias, self.eps),
            kv=(k_cache, v_cache, cache.lengths),
            part="attn.c_attn",
        )
        nh = attend.n_head
        q = qkv[..., :C].view(B, 1, nh, C // nh).transpose(1, 2)  # (B, nh, 1, hs)
        o = ops.decode_attention("attn", q, k_cache, v_cache, cache.next_lengths)
        o = o.transpose(1, 2).reshape(B, 1, C)
        x = ops.decode_linear("attn.c_proj", o, a.c_proj.weight, a.c_proj.bias, residual=x)
        h = ops.decode_linear(
            "ln_2+mlp.c_fc",
            x,
            m.c_fc.weight,
            m.c_fc.bias,
            activation="gelu",
            norm=(self.ln_2.weight, self.ln_2.bias, self.eps),
            part="mlp.c_fc",
        )
        return ops.decode_linear("mlp.c_proj", h, m.c_proj.weight, m.c_proj.bias, residual=x)


class _Attend:
    """How one forward pass gets its keys; called once per layer in order."""

    def __init__(self, ops: Ops, n_head: int, cache: KVCache | None = None, mode: str = "full"):
        self.ops, self.n_head, self.cache, self.mode, self.layer = ops, n_head, cache, mode, 0

    def next_layer(self) -> int:
        layer, self.layer = self.layer, self.layer + 1
        return layer

    def __call__(self, q, k, v):
        layer = self.next_layer()
        if self.cache is None:
            return self.ops.attention("attn", q, k, v)
        self.ops.kv_write("kv write", self.cache, layer, k, v, decode=self.mode == "decode")
        if self.mode == "prefill":
            return self.ops.attention("attn", q, k, v)
        c = self.cache
        return self.ops.decode_attention("attn", q, c.k[layer], c.v[layer], c.next_lengths)


class GPT(nn.Module):
    family = "GPT-2"  # the block's family, as the app names it
    RUNS_AS: dict[str, str] = {}  # a rung this family's blocks run as another (the Llama family's persistent rung)

    def __init__(self, cfg, backend: str = "triton", fusion: str = DEFAULT_FUSION):
        super().__init__()
        check_fusion(fusion)
        self.config, self.backend, self.fusion = cfg, backend, fusion
        self.transformer = nn.ModuleDict(self.parts(cfg))
        self.requires_grad_(False)
        self.decode_graphs = GraphPool()  # shared by the shallow copies below: they share the weights too

    def parts(self, cfg: GPTConfig) -> dict:
        """The checkpoint's modules under transformer: token and position embeddings, the blocks, the last norm."""
        return dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer)),
            ln_f=LayerNorm(cfg.n_embd),
        )

    def with_backend(self, backend: str) -> GPT:
        """The same weights, another default backend (a shallow copy: nothing is duplicated)."""
        Ops(backend)  # validates the name
        other = copy.copy(self)
        other.backend = backend
        return other

    def with_fusion(self, fusion: str) -> GPT:
        """The same weights, another rung of the fusion ladder (a shallow copy)."""
        check_fusion(fusion)
        other = copy.copy(self)
        other.fusion = fusion
        return other

    def _ops(self, backend, tiles, observer) -> Ops:
        return Ops(backend or self.backend, tiles, observer, self.RUNS_AS.get(self.fusion, self.fusion))

    def _attend(self, ops: Ops, cache: KVCache | None = None, mode: str = "full") -> _Attend:
        """How this pass's attention gets its keys (the Llama family's groups its heads)."""
        return _Attend(ops, self.config.n_head, cache, mode)

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.wte.weight.dtype

    def _run(self, ids, positions, ops: Ops, attend: _Attend, logits_at=None):
        if attend.mode == "decode" and ops.runs_step_whole(ids.shape[0]):
            return ops.decode_step("step", self, ids[:, 0], attend.cache).unsqueeze(1)
        x = self.embed(ops, ids, positions)  # (B, T, C)
        positions = positions.expand(ids.shape)  # (T,) for a whole prompt, (B, 1) in a decode step
        for block in self.transformer.h:
            x = ops.block(block, x, attend, positions)
        if logits_at is not None:  # only the rows whose next token is wanted reach the LM head
            x = x[torch.arange(x.shape[0], device=x.device), logits_at].unsqueeze(1)  # (B, 1, C)
        return self.head(ops, x, attend)

    def step_parts(self) -> kernels.decode_step_parts:
        """The parameters as the one-launch decode step (the megakernel rung) takes them."""
        t = self.transformer
        layers = tuple(
            (
                (b.ln_1.weight, b.ln_1.bias),
                (b.attn.c_attn.weight, b.attn.c_attn.bias),
                (b.attn.c_proj.weight, b.attn.c_proj.bias),
                (b.ln_2.weight, b.ln_2.bias),
                (b.mlp.c_fc.weight, b.mlp.c_fc.bias),
                (b.mlp.c_proj.weight, b.mlp.c_proj.bias),
            )
            for b in t.h
        )
        ln_f = (t.ln_f.weight, t.ln_f.bias)
        return kernels.decode_step_parts(
            t.wte.weight, t.wpe.weight, layers, ln_f, t.wte.weight, self.config.layer_norm_epsilon
        )

    def embed(self, ops: Ops, ids, positions):
        t = self.transformer
        return ops.embedding("wte/wpe", t.wte, t.wpe, ids, positions)

    def head(self, ops: Ops, x, attend):
        """The last LayerNorm and the LM head, tied to the token embedding."""
        t, eps = self.transformer, self.config.layer_norm_epsilon
        if attend.mode == "decode" and ops.fuses_decode(x.shape[0]):
            norm = (t.ln_f.weight, t.ln_f.bias, eps)
            return ops.decode_linear("ln_f+lm_head", x, t.wte.weight, norm=norm, part="lm_head")
        x = ops.layer_norm("ln_f", x, t.ln_f.weight, t.ln_f.bias, eps)
        return ops.linear("lm_head", x, t.wte.weight)

    @torch.inference_mode()
    def forward(
        self, ids, *, tiles: Tiles | None = None, backend=None, observer: Observer | None = None, logits_at=None
    ):
        """ids (B, T) -> logits (B, T, vocab); with logits_at (B,), only those positions: (B, 1, vocab)."""
        self._check_length(ids.shape[1])
        ops = self._ops(backend, tiles, observer)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self._run(ids, positions, ops, self._attend(ops), logits_at)

    @torch.inference_mode()
    def prefill(self, ids, cache: KVCache, lengths: list[int], *, tiles=None, backend=None, observer=None):
        """Right-padded prompts ids (B, T) with true `lengths` -> next-token logits (B, vocab)."""
        self._check_length(ids.shape[1])
        ops = self._ops(backend, tiles, observer)
        positions = torch.arange(ids.shape[1], device=ids.device)
        last = torch.tensor([n - 1 for n in lengths], device=ids.device)
        logits = self._run(ids, positions, ops, self._attend(ops, cache, "prefill"), last)
        cache.set_lengths(lengths)
        return logits[:, 0]

    @torch.inference_mode()
    def decode(self, ids, cache: KVCache, *, tiles=None, backend=None, observer=None):
        """One new token per sequence, ids (B,) -> next-token logits (B, vocab)."""
        self._check_length(max(cache.host_lengths) + 1)
        ops = self._ops(backend, tiles, observer)
        cache.begin_step()
        positions = cache.lengths.unsqueeze(1)  # (B, 1): each sequence at its own position
        logits = self._run(ids.unsqueeze(1), positions, ops, self._attend(ops, cache, "decode"))
        cache.end_step()
        return logits[:, 0]

    def _check_length(self, length: int) -> None:
        if length > self.config.n_positions:
            raise ValueError(f"sequence of {length} tokens exceeds the model's {self.config.n_positions} positions")
