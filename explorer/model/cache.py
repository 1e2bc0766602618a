"""A static KV cache: buffers allocated once for the whole run, written by index.

Shapes never change between decode steps (what makes CUDA graphs possible), so what grows is only
`lengths`, the number of valid positions per sequence, kept both on the device (read by the decode
kernel with no host synchronisation) and on the host (for the bookkeeping the charts show).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer, batch, n_head, max_len, head_dim, *, dtype, device):
        shape = (n_layer, batch, n_head, max_len, head_dim)
        # Zeros, not empty: the torch backend's masked attention multiplies unused slots by 0, and
        # 0 * NaN from uninitialised memory would be NaN.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.host_lengths = [0] * batch
        self._rows = torch.arange(batch, device=device)
        self.next_lengths = self.lengths

    @classmethod
    def for_model(cls, model, batch: int, max_len: int) -> KVCache:
        cfg = model.config
        return cls(cfg.n_layer, batch, cfg.n_kv_head, max_len, cfg.head_dim, dtype=model.dtype, device=model.device)

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def bytes_per_token(self) -> int:
        """K and V for one position of one sequence: 2 x layers x heads x head_dim x dtype size."""
        n_layer, _, n_head, _, head_dim = self.k.shape
        return 2 * n_layer * n_head * head_dim * self.k.element_size()

    @property
    def allocated_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def used_bytes(self) -> int:
        return self.bytes_per_token * sum(self.host_lengths)

    def set_lengths(self, lengths: list[int]) -> None:
        if max(lengths) > self.max_len:
            raise ValueError(f"a prompt of {max(lengths)} tokens does not fit the cache of {self.max_len} positions")
        self.host_lengths = list(lengths)
        self.lengths.copy_(torch.tensor(lengths, dtype=torch.int32))
        self.next_lengths = self.lengths

    def check_room(self) -> None:
        """Raise before a decode step that would write past the last position."""
        if max(self.host_lengths) >= self.max_len:
            raise ValueError(f"the KV cache is full ({self.max_len} positions)")

    def begin_step(self) -> None:
        """A decode step writes at position lengths[b] and then attends over lengths[b] + 1 keys."""
        self.check_room()
        self.next_lengths = self.lengths + 1

    def end_step(self) -> None:
        self.lengths.copy_(self.next_lengths)  # in place: the tensor the decode kernel reads stays the same
        self.advance_host()
        self.next_lengths = self.lengths

    def advance_host(self) -> None:
        """The host's copy of the lengths after a decode step (a replayed graph advances only the device's)."""
        self.host_lengths = [n + 1 for n in self.host_lengths]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, *, decode: bool, writer=None) -> None:
        """Store K and V (B, H, T, D) of one layer: at [0, T) for a prefill, at lengths[b] for a decode step,
        there by `writer(k, v, k_cache, v_cache, lengths)` when given (the Triton kernel), else by indexing."""
        if decode and writer is not None:
            writer(k, v, self.k[layer], self.v[layer], self.lengths)
        elif decode:
            pos = self.lengths.long()
            self.k[layer, self._rows, :, pos] = k[:, :, 0]  # (B, H, D) at each sequence's own position
            self.v[layer, self._rows, :, pos] = v[:, :, 0]
        else:
            self.k[layer, :, :, : k.shape[2]] = k
            self.v[layer, :, :, : v.shape[2]] = v
