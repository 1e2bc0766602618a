"""Token-by-token generation: prefill, then one decode step per new token, one Step record each.

With the cache on, prefill writes the prompt's K and V once and each decode step feeds only the new
token. With it off, every step runs the whole sequence again (the O(n^2) path). Both give the same
greedy tokens. Latency is measured per step: CUDA events around the step on a GPU (one
synchronisation per step), perf_counter on CPU, where kernels run in Triton's interpreter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from kernels.config import Traffic

from .cache import KVCache
from .graphs import DecodeGraph
from .ops import Recorder, Tiles


@dataclass
class Step:
    index: int  # 0 is the prefill, which yields the first new token
    phase: str  # "prefill" | "decode"
    token_ids: list[int]  # one per sequence
    texts: list[str]  # the text each token adds, per sequence
    positions: list[int]  # position of each new token (its sequence's length before it)
    context_tokens: int  # tokens the model processed in this step, whole batch
    latency_ms: float
    timer: str  # what measured latency_ms
    kv_used_bytes: int
    kv_allocated_bytes: int
    traffic: dict[str, Traffic]  # modeled, per kernel kind
    kernel_ms: dict[str, float] = field(default_factory=dict)  # measured device time per kind, when profiling
    launch_ms: dict[str, float] = field(default_factory=dict)  # host time launching each kind, when profiling
    launches: int = 0  # operations (kernels and torch ops) in the step, launched one by one unless `graph`
    graph: bool = False  # the step was one CUDA graph replay
    memory_bytes: int | None = None  # torch.cuda.memory_allocated after the step (GPU only)
    warmup_ms: float = 0.0  # compile + first-run time before step 0; CUDA graph capture before step 1
    finished: list[bool] = field(default_factory=list)
    stop_reason: str | None = None  # set on the last step

    @property
    def token_id(self) -> int:
        return self.token_ids[0]

    @property
    def text(self) -> str:
        return self.texts[0]

    @property
    def position(self) -> int:
        return self.positions[0]


def as_batch(prompt_ids) -> list[list[int]]:
    """A list of ids, a list of lists (unequal lengths allowed) or a (B, T) / (T,) tensor."""
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.tolist()
    prompt_ids = list(prompt_ids)
    if not prompt_ids:
        raise ValueError("prompt is empty: at least one token is needed")
    batch = (
        [list(map(int, p)) for p in prompt_ids] if isinstance(prompt_ids[0], Sequence) else [list(map(int, prompt_ids))]
    )
    if any(len(p) == 0 for p in batch):
        raise ValueError("prompt is empty: at least one token is needed")
    return batch


def sample(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator | None) -> torch.Tensor:
    """logits (B, vocab) -> token ids (B,). temperature 0 is greedy."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


class _StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.label = "cuda events" if self.cuda else "cpu perf_counter (Triton interpreter on CPU, not GPU timings)"

    def start(self):
        if self.cuda:
            self.t0 = torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record()
            t1.synchronize()
            return self.t0.elapsed_time(t1)
        return (time.perf_counter() - self.t0) * 1e3


class _Texts:
    """Incremental detokenisation: decode the whole continuation and emit what is new, so characters
    that span several byte-level tokens come out whole."""

    def __init__(self, tokenizer, batch: int):
        self.tok, self.ids, self.done = tokenizer, [[] for _ in range(batch)], [""] * batch

    def add(self, b: int, token_id: int) -> str:
        if self.tok is None:
            return ""
        self.ids[b].append(token_id)
        text = self.tok.decode(self.ids[b])
        if text.endswith("\ufffd"):  # an incomplete character: wait for the next token
            return ""
        piece, self.done[b] = text[len(self.done[b]) :], text
        return piece


def generate(model, prompt_ids, *, max_new_tokens: int, cache: bool = True, tiles: Tiles | None = None,
             backend: str | None = None, temperature: float = 0.0, top_k: int = 0, seed: int = 0,
             tokenizer=None, eos_token_id: int | None = None, profile: bool = False,
             warmup: bool = True, graph: bool | None = None) -> Iterator[Step]:  # fmt: skip
    """Yield one Step per generated token (per batch step). Stops at max_new_tokens, at end-of-text
    (every sequence), or at the model's position limit; the last Step says which.

    profile=True makes a profiling pass: each Step also carries the device time per kernel kind
    (kernel_ms) and the host time spent launching it (launch_ms). The GPU spin that keeps launches
    out of those times inflates latency_ms, so step latency is read from a run without profiling.

    graph=True replays every decode step from a CUDA graph captured once (see explorer.graphs): it
    needs a CUDA device and the cache on, and is not used in a profiling pass. None (the default)
    uses it wherever it can be."""
    batch = as_batch(prompt_ids)
    n_pos = model.config.n_positions
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    if max(map(len, batch)) > n_pos:
        raise ValueError(f"prompt of {max(map(len, batch))} tokens exceeds the model's {n_pos} positions")
    if eos_token_id is None:
        eos_token_id = model.config.eos_token_id
    device = model.device
    graph = _use_graph(graph, device, cache, profile)
    warmup_ms = _warm_up(model, batch, cache, tiles, backend) if warmup else 0.0
    run = _Run(model, batch, max_new_tokens, cache, tiles, backend, graph)
    generator = torch.Generator(device=device).manual_seed(seed) if temperature > 0 else None
    texts = _Texts(tokenizer, len(batch))
    finished = [False] * len(batch)
    clock = _StepClock(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    for index in range(max_new_tokens):
        recorder = Recorder(timed=profile)
        capture_ms = run.prepare(index)
        clock.start()
        logits = run.step(index, recorder)
        next_ids = sample(logits, temperature, top_k, generator)
        latency = clock.stop()
        ids = next_ids.tolist()
        positions = list(run.lengths)
        was_finished = list(finished)
        for b, t in enumerate(ids):
            finished[b] = finished[b] or (eos_token_id is not None and t == eos_token_id)
        stop = None
        if all(finished):
            stop = "end of text"
        elif index + 1 == max_new_tokens:
            stop = f"reached max new tokens ({max_new_tokens})"
        elif max(run.lengths) >= n_pos:
            stop = f"reached the model's position limit ({n_pos} positions)"
        step = Step(
            index=index,
            phase="prefill" if index == 0 else "decode",
            token_ids=ids,
            texts=["" if was_finished[b] or finished[b] else texts.add(b, t) for b, t in enumerate(ids)],
            positions=positions,
            context_tokens=run.context_tokens,
            latency_ms=latency,
            timer=clock.label,
            kv_used_bytes=run.kv.used_bytes if run.kv else 0,
            kv_allocated_bytes=run.kv.allocated_bytes if run.kv else 0,
            traffic=dict(recorder.traffic),
            kernel_ms=recorder.times_ms() if profile else {},
            launch_ms=recorder.launch_ms() if profile else {},
            launches=sum(recorder.launches.values()),
            graph=run.replayed,
            memory_bytes=torch.cuda.memory_allocated(device) if device.type == "cuda" else None,
            warmup_ms=warmup_ms if index == 0 else capture_ms,
            finished=list(finished),
            stop_reason=stop,
        )
        yield step
        if stop:
            return
        run.append(next_ids)


class _Run:
    """The state of one generation: the cache (or the growing token buffer when it is off)."""

    def __init__(self, model, batch, max_new_tokens, cache, tiles, backend, graph):
        self.model, self.tiles, self.backend, self.use_graph = model, tiles, backend, graph
        self.graph, self.replayed = None, False
        self.lengths = [len(p) for p in batch]
        total = min(max(self.lengths) + max_new_tokens, model.config.n_positions)
        device = model.device
        self.tokens = torch.zeros(len(batch), total, dtype=torch.long, device=device)  # right-padded
        for b, p in enumerate(batch):
            self.tokens[b, : len(p)] = torch.tensor(p)
        self.kv = KVCache.for_model(model, len(batch), total) if cache else None
        self.next_ids = None
        self.context_tokens = 0

    def prepare(self, index: int) -> float:
        """Capture the decode graph before the first decode step is timed; returns the ms it took."""
        if self.use_graph and index == 1 and self.graph is None:
            self.graph = DecodeGraph(self.model, self.kv, tiles=self.tiles, backend=self.backend)
            return self.graph.capture_ms
        return 0.0

    def step(self, index: int, recorder: Recorder) -> torch.Tensor:
        kw = dict(tiles=self.tiles, backend=self.backend, recorder=recorder)
        m = self.model
        self.replayed = False
        if self.kv is not None and index > 0:
            self.context_tokens = len(self.lengths)
            if self.graph is not None:
                self.replayed = True
                return self.graph.step(self.next_ids, recorder)
            return m.decode(self.next_ids, self.kv, **kw)
        width = max(self.lengths)
        self.context_tokens = len(self.lengths) * width
        if self.kv is not None:
            return m.prefill(self.tokens[:, :width], self.kv, self.lengths, **kw)
        last = torch.tensor([n - 1 for n in self.lengths], device=self.tokens.device)
        return m(self.tokens[:, :width], logits_at=last, **kw)[:, 0]

    def append(self, next_ids: torch.Tensor) -> None:
        rows = torch.arange(len(self.lengths), device=next_ids.device)
        self.tokens[rows, torch.tensor(self.lengths, device=next_ids.device)] = next_ids
        self.lengths = [n + 1 for n in self.lengths]
        self.next_ids = next_ids


def _use_graph(graph: bool | None, device: torch.device, cache: bool, profile: bool) -> bool:
    if graph is None:
        return device.type == "cuda" and cache and not profile
    if graph and not cache:
        raise ValueError("CUDA graphs need the KV cache on: without it every step has a new shape")
    if graph and profile:
        raise ValueError("a profiling pass times each kernel as it is launched, so it cannot replay a CUDA graph")
    if graph and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA GPU; this model runs on {device.type}")
    return bool(graph)


def _warm_up(model, batch, cache, tiles, backend) -> float:
    """Run the first two steps once, untimed and unrecorded, so Triton's compilation (and autotuning)
    is spent here and reported apart; returns its wall time in ms."""
    t0 = time.perf_counter()
    steps = generate(model, batch, max_new_tokens=2, cache=cache, tiles=tiles, backend=backend, warmup=False,
                     graph=False)  # fmt: skip
    for _ in steps:
        pass
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return (time.perf_counter() - t0) * 1e3
