"""The baseline a PyTorch user would write for fast greedy decoding: GPT-2 in plain PyTorch ops, a
static KV cache, one decode step captured in a CUDA graph (argmax and the position update inside
it), replayed once per token, with a single synchronisation at the end.

It shares nothing with explorer/: the weights come straight from a transformers GPT2LMHeadModel.
"""

import torch
import torch.nn.functional as F


class TorchGraphLoop:
    def __init__(self, hf, max_len: int, dtype=torch.bfloat16, device="cuda"):
        cfg = hf.config
        self.C, self.H, self.eps = cfg.n_embd, cfg.n_head, cfg.layer_norm_epsilon
        sd = {k: v.to(device, dtype) for k, v in hf.state_dict().items()}
        self.wte, self.wpe = sd["transformer.wte.weight"], sd["transformer.wpe.weight"]
        self.ln_f = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
        names = (
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        )
        self.layers = [[sd[f"transformer.h.{i}.{n}"] for n in names] for i in range(cfg.n_layer)]
        self._buffers(cfg.n_layer, self.H, self.C // self.H, max_len, dtype, device)

    def _buffers(self, layers: int, kv_heads: int, head_dim: int, max_len: int, dtype, device):
        """The static cache (layers, 1, kv_heads, max_len, head_dim), the step's token and position, the tokens
        out, and no graph yet."""
        self.k = torch.zeros(layers, 1, kv_heads, max_len, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.slots = torch.arange(max_len, device=device)
        self.ids = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.out = torch.zeros(max_len, dtype=torch.long, device=device)
        self.graph = None

    def _step(self):
        C, H = self.C, self.H
        x = self.wte[self.ids] + self.wpe[self.pos]  # (1, C)
        mask = (self.slots <= self.pos)[None, None, None, :]  # (1, 1, 1, T)
        for i, (l1w, l1b, aw, ab, pw, pb, l2w, l2b, fw, fb, mw, mb) in enumerate(self.layers):
            h = F.layer_norm(x, (C,), l1w, l1b, self.eps)
            q, k, v = (t.view(1, H, 1, C // H) for t in torch.addmm(ab, h, aw).split(C, dim=-1))  # Conv1D: (in, out)
            self.k[i].index_copy_(2, self.pos, k)
            self.v[i].index_copy_(2, self.pos, v)
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask).view(1, C)
            x = x + torch.addmm(pb, o, pw)
            h = F.layer_norm(x, (C,), l2w, l2b, self.eps)
            x = x + torch.addmm(mb, F.gelu(torch.addmm(fb, h, fw), approximate="tanh"), mw)
        x = F.layer_norm(x, (C,), *self.ln_f, self.eps)
        nxt = (x @ self.wte.T).argmax(dim=-1)
        self.out.index_copy_(0, self.pos, nxt)  # the token that follows position pos
        self.ids.copy_(nxt)
        self.pos.add_(1)

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy: the prompt fed one token a step, then n new tokens; one sync at the end."""
        if self.graph is None:
            self._capture()
        self.pos.zero_()
        self.ids.fill_(prompt[0])
        for t in prompt[1:]:
            self.graph.replay()
            self.ids.fill_(t)
        for _ in range(n):
            self.graph.replay()
        return self.out[len(prompt) - 1 : len(prompt) - 1 + n].tolist()

    def _capture(self):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self._step()
        torch.cuda.synchronize()


class LlamaGraphLoop(TorchGraphLoop):
    """The same loop for a Llama-family model (transformers' LlamaForCausalLM): F.rms_norm, rotary positions
    from precomputed cos/sin rows, SDPA over the grouped key/value heads (enable_gqa), SiLU(gate) * up. The
    cache holds the key/value heads only."""

    def __init__(self, hf, max_len: int, dtype=torch.bfloat16, device="cuda"):
        cfg = hf.config
        self.C, self.H, self.H_kv, self.eps = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.rms_norm_eps,
        )
        self.D = self.C // self.H
        sd = {k: v.to(device, dtype) for k, v in hf.state_dict().items()}
        self.embed = sd["model.embed_tokens.weight"]
        self.head = sd.get("lm_head.weight", self.embed)
        self.norm = sd["model.norm.weight"]
        names = ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
        names += ("post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        self.layers = [[sd[f"model.layers.{i}.{n}.weight"] for n in names] for i in range(cfg.num_hidden_layers)]
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        inv = 1.0 / theta ** (torch.arange(0, self.D, 2, device=device, dtype=torch.float32) / self.D)
        angles = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv  # (T, D/2)
        self.cos, self.sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))
        self._buffers(cfg.num_hidden_layers, self.H_kv, self.D, max_len, dtype, device)

    def _rotate(self, t, cos, sin):
        half = self.D // 2
        return t * cos + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * sin

    def _step(self):
        C, H, H_kv, D = self.C, self.H, self.H_kv, self.D
        x = self.embed[self.ids]  # (1, C)
        mask = (self.slots <= self.pos)[None, None, None, :]
        cos, sin = self.cos[self.pos], self.sin[self.pos]  # (1, D)
        for i, (n1, wq, wk, wv, wo, n2, wg, wu, wd) in enumerate(self.layers):
            h = F.rms_norm(x, (C,), n1, self.eps)
            q = self._rotate((h @ wq.T).view(1, H, 1, D), cos, sin)
            k = self._rotate((h @ wk.T).view(1, H_kv, 1, D), cos, sin)
            self.k[i].index_copy_(2, self.pos, k)
            self.v[i].index_copy_(2, self.pos, (h @ wv.T).view(1, H_kv, 1, D))
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask, enable_gqa=True).view(1, C)
            x = x + o @ wo.T
            h = F.rms_norm(x, (C,), n2, self.eps)
            x = x + (F.silu(h @ wg.T) * (h @ wu.T)) @ wd.T
        x = F.rms_norm(x, (C,), self.norm, self.eps)
        nxt = (x @ self.head.T).argmax(dim=-1)
        self.out.index_copy_(0, self.pos, nxt)
        self.ids.copy_(nxt)
        self.pos.add_(1)
