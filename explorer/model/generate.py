"""Token-by-token generation: prefill, then one decode step per new token, one Step record each.

With the cache on, prefill writes the prompt's K and V once and each decode step feeds only the new
token. With it off, every step runs the whole sequence again (the O(n^2) path). Both give the same
greedy tokens.

On a GPU the loop keeps the device busy: the next step is queued (its input is the sampled token, which
never leaves the device, and so are the tokens a repetition penalty looks back on: see
explorer.model.sampling) before the host reads the tokens of the step before it, so the host's work on
one token (copying it back, detokenising, building the Step) overlaps the device's work on the next.
On CPU, and under an observer, steps run one after another, each yielded as soon as it is done.

The decoder keeps no time of its own. A caller that wants one passes a clock (explorer.measure.clock):
generate() marks it where each step starts and ends on the device's stream, and around what ran before
the first steps (the warm-up, a CUDA graph's capture), and hands the marks over in the Step; the clock
reads them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .cache import KVCache
from .graphs import DecodeGraph
from .ops import Observer, Op, Tiles, Trace
from .sampling import Sampler, check


@dataclass
class Step:
    index: int  # 0 is the prefill, which yields the first new token
    phase: str  # "prefill" | "decode"
    token_ids: list[int]  # one per sequence
    texts: list[str]  # the text each token adds, per sequence
    positions: list[int]  # position of each new token (its sequence's length before it)
    context_tokens: int  # tokens the model processed in this step, whole batch
    kv_used_bytes: int
    kv_allocated_bytes: int
    ops: tuple[Op, ...] = ()  # the named operations the step ran, in order
    graph: bool = False  # the step was one CUDA graph replay
    finished: list[bool] = field(default_factory=list)
    stop_reason: str | None = None  # set on the last step
    # The clock's marks (none without a clock): where the step started and ended, and around what ran before
    # it (the warm-up before step 0, the graph's capture before step 1).
    marks: tuple = ()
    setup_marks: tuple = ()

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


class _Texts:
    """Incremental detokenisation: each sequence's text is decoded over a short window of its last
    tokens (never the whole continuation, which would grow with every step), and a piece is emitted
    once it no longer ends in an incomplete character."""

    def __init__(self, tokenizer, batch: int):
        self.tok = tokenizer
        self.ids = [[] for _ in range(batch)]
        self.start = [0] * batch  # where the window begins
        self.read = [0] * batch  # tokens already turned into text

    def add(self, b: int, token_id: int) -> str:
        if self.tok is None:
            return ""
        ids = self.ids[b]
        ids.append(token_id)
        start, read = self.start[b], self.read[b]
        done = self.tok.decode(ids[start:read]) if read > start else ""
        text = self.tok.decode(ids[start:])
        if text.endswith("\ufffd") or len(text) <= len(done):  # an incomplete character: wait for more
            return ""
        self.start[b], self.read[b] = read, len(ids)
        return text[len(done) :]


def generate(
    model,
    prompt_ids,
    *,
    max_new_tokens: int,
    cache: bool = True,
    tiles: Tiles | None = None,
    backend: str | None = None,
    prefill_backend: str | None = None,
    fusion: str | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    seed: int = 0,
    tokenizer=None,
    eos_token_id: int | None = None,
    observer: Observer | None = None,
    warmup: bool | None = None,
    graph: bool | None = None,
    clock=None,
    positions: int | None = None,
) -> Iterator[Step]:
    """Yield one Step per generated token (per batch step). Stops at max_new_tokens, at end-of-text
    (every sequence), or at the model's position limit; the last Step says which.

    observer: called around every operation of every step (see explorer.model.ops), e.g. by the
    measure layer's profiler; its own work (a GPU spin before each kernel) shows in the step's time.

    graph=True replays every decode step from a CUDA graph captured once (see explorer.model.graphs):
    it needs a CUDA device and the cache on, and no observer (a replay launches nothing one by one).
    None (the default) uses it wherever it can be. The captured graph and its cache are kept on the
    model (model.decode_graphs, explorer.model.graphs.GraphPool) for the next generation of the same
    batch, length, rung, tiles and sampling mode, which replays it without capturing again.

    fusion: a rung of the fusion ladder (explorer.model.ops.FUSIONS); None keeps the model's.

    prefill_backend: the backend of the prefill with the cache on, where it differs from the decode steps'
    (None: backend). A profiling pass rebuilds a cache with the torch backend's prefill, which compiles nothing,
    to time one of our decode steps on it.

    positions: the cache's positions, where more than the longest prompt and max_new_tokens need (at most the
    model's): a step rebuilt from a longer run (a profiling pass) then runs on a cache of that run's size, so the
    kernels compiled for the run serve it (Triton specialises a kernel on its sizes) and its graph is reused.

    clock: marked around each step and what ran before it (see the module's text): `mark()` where a span
    starts or ends, `begin()` once the warm-up is done and the timed run starts.

    temperature 0 is greedy; above it, tokens are drawn (seeded by seed) from the top_k most likely (0: all)
    and the nucleus of probability top_p (1: all). repetition_penalty above 1 lowers the logits of tokens
    the sequence already holds, prompt included (explorer.model.sampling; SUGGESTED there reads well)."""
    if fusion is not None:
        model = model.with_fusion(fusion)
    batch = _checked(model, prompt_ids, max_new_tokens, top_p, repetition_penalty)
    if eos_token_id is None:
        eos_token_id = model.config.eos_token_id
    device = model.device
    graph = _use_graph(graph, device, cache, observer)
    if warmup is None:  # the interpreter compiles nothing: a warm-up there only doubles the first step
        warmup = device.type == "cuda"
    positions = max(max(map(len, batch)) + max_new_tokens, positions or 0)  # the cache's, before the model's limit
    before = clock.mark() if clock and warmup else None
    if warmup:
        _warm_up(model, batch, cache, tiles, backend, positions)
    started = clock.begin() if clock else None
    setup = (before, started) if before else ()
    sampler = Sampler(
        batch,
        model.config.vocab_size,
        device,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        penalty=repetition_penalty,
        seed=seed,
    )
    run = _Run(
        model, batch, max_new_tokens, cache, tiles, backend, graph, observer, sampler.greedy, clock, prefill_backend,
        positions,
    )  # fmt: skip
    # Under an observer each step runs alone, so what it saw belongs to the Step yielded next.
    ahead = observer is None and run.cuda
    yield from _loop(run, sampler, _Texts(tokenizer, len(batch)), max_new_tokens, eos_token_id, setup, ahead)


def _checked(model, prompt_ids, max_new_tokens: int, top_p: float, repetition_penalty: float) -> list[list[int]]:
    """The prompts as a batch, once the request is one the model can serve."""
    batch = as_batch(prompt_ids)
    n_pos = model.config.n_positions
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    check(top_p, repetition_penalty)
    if max(map(len, batch)) > n_pos:
        raise ValueError(f"prompt of {max(map(len, batch))} tokens exceeds the model's {n_pos} positions")
    return batch


def _loop(run: _Run, sampler, texts: _Texts, max_new_tokens: int, eos_token_id, setup: tuple, ahead: bool):
    """The prefill, then one decode step a token: each launched (with `ahead`, the next queued before this one's
    tokens are read), its tokens read, its Step yielded, until a stop."""
    finished = [False] * len(run.lengths)
    steps = run.n_steps
    try:  # finally: also when the caller stops early, the captured graph goes back to the model's pool
        pending = run.launch(0, sampler)
        for index in range(steps):
            launched = pending
            if ahead and index + 1 < steps:  # queue the next step before reading this one's tokens
                pending = run.launch(index + 1, sampler, after=launched)
            ids = launched.tokens()
            was_finished = list(finished)
            for b, t in enumerate(ids):
                finished[b] = finished[b] or (eos_token_id is not None and t == eos_token_id)
            stop = None
            if all(finished):
                stop = "end of text"
            elif index + 1 == max_new_tokens:
                stop = f"reached max new tokens ({max_new_tokens})"
            elif index + 1 == steps:
                stop = f"reached the model's position limit ({run.model.config.n_positions} positions)"
            added = ["" if was_finished[b] or finished[b] else texts.add(b, t) for b, t in enumerate(ids)]
            yield run.step(index, launched, ids, added, finished, stop, setup)
            if stop:
                return
            if not ahead:
                pending = run.launch(index + 1, sampler, after=launched)
    finally:
        run.release()


class _Slot:
    """What one queued step needs on a GPU and the host allocates once per run, not per token: the pinned
    buffer its tokens are copied into, and the event that says they arrived. The loop keeps at most two
    steps in flight, and reads each one's tokens before its slot comes round again (a ring of SLOTS)."""

    def __init__(self, batch: int):
        self.host = torch.empty(batch, dtype=torch.long, pin_memory=True)
        self.ready = torch.cuda.Event()


SLOTS = 3


class _Launched:
    """One step queued on the device: its sampled tokens on their way to the host, the clock's marks."""

    def __init__(self, next_ids, positions, context_tokens, ops, graph, marks, setup_marks, slot=None):
        self.next_ids, self.positions, self.context_tokens = next_ids, positions, context_tokens
        self.ops, self.graph, self.marks, self.setup_marks = ops, graph, marks, setup_marks
        if slot is not None:
            self.host, self.ready = slot.host, slot.ready
            self.host.copy_(next_ids, non_blocking=True)
            self.ready.record()
        else:
            self.host, self.ready = next_ids, None

    def tokens(self) -> list[int]:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class _Run:
    """The state of one generation: the cache (or the growing token buffer when it is off)."""

    def __init__(
        self, model, batch, max_new_tokens, cache, tiles, backend, graph, observer, greedy, clock, prefill_backend,
        positions,
    ):  # fmt: skip
        self.model, self.tiles, self.backend, self.use_graph, self.greedy = model, tiles, backend, graph, greedy
        self.prefill_backend = prefill_backend or backend  # the cached prefill's alone (profiling rebuilds cheaply)
        self.observer, self.clock = observer, clock
        self.graph = None
        self.lengths = [len(p) for p in batch]
        n_pos = model.config.n_positions
        # Steps the run can take: each feeds the token before it, and the last token may sit at n_pos.
        self.n_steps = min(max_new_tokens, n_pos - max(self.lengths) + 1)
        total = min(positions, n_pos)
        device = model.device
        self.tokens = torch.zeros(len(batch), total, dtype=torch.long, device=device)  # right-padded
        for b, p in enumerate(batch):
            self.tokens[b, : len(p)] = torch.tensor(p)
        self.pool_key = (len(batch), total, tiles, backend or model.backend, model.fusion, greedy) if graph else None
        self.pool = model.decode_graphs if graph else None
        kept = self.pool.take(self.pool_key) if self.pool is not None else None
        if kept is not None:  # a graph captured for this shape before: its cache, cleared as a new one would be
            self.kv, self.graph = kept
            self.kv.k.zero_()
            self.kv.v.zero_()
        else:
            self.kv = KVCache.for_model(model, len(batch), total) if cache else None
        self.cuda = device.type == "cuda"
        self.slots = [_Slot(len(batch)) for _ in range(SLOTS)] if self.cuda else None

    def launch(self, index: int, sampler, after: _Launched | None = None) -> _Launched:
        """Queue step `index`: its forward pass and the sampling of its tokens, all on the device."""
        if after is not None:
            self._append(after.next_ids)
        mark = self.clock.mark if self.clock else lambda: None
        setup = ()
        if self.use_graph and index == 1 and self.graph is None:  # captured before the first decode step
            before = mark()
            self.graph = DecodeGraph(self.model, self.kv, tiles=self.tiles, backend=self.backend, greedy=self.greedy)
            setup = (before, mark()) if self.clock else ()
        positions, context = list(self.lengths), self._context(index)
        slot = self.slots[index % SLOTS] if self.cuda else None
        start = mark()
        if self.graph is not None and index > 0:
            logits, ops, replayed = self.graph.step(self.next_ids), self.graph.ops, True
            # A greedy graph picked the token itself, into the input of its next replay.
            next_ids = self.graph.sampled if self.graph.greedy else sampler(logits)
        else:
            trace = Trace(self.observer)
            logits = self._forward(index, trace)
            ops, replayed = tuple(trace.ops), False
            next_ids = sampler(logits)
        marks = (start, mark()) if self.clock else ()
        return _Launched(next_ids, positions, context, ops, replayed, marks, setup, slot)

    def step(self, index: int, launched: _Launched, ids, texts, finished, stop, setup) -> Step:
        """The Step record of a launched step whose tokens `ids` (and their `texts`) have been read."""
        return Step(
            index=index,
            phase="prefill" if index == 0 else "decode",
            token_ids=ids,
            texts=texts,
            positions=launched.positions,
            context_tokens=launched.context_tokens,
            kv_used_bytes=self.kv.bytes_per_token * sum(launched.positions) if self.kv else 0,
            kv_allocated_bytes=self.kv.allocated_bytes if self.kv else 0,
            ops=launched.ops,
            graph=launched.graph,
            finished=list(finished),
            stop_reason=stop,
            marks=launched.marks,
            setup_marks=setup if index == 0 else launched.setup_marks,
        )

    def release(self) -> None:
        if self.pool is not None and self.graph is not None:
            self.pool.give(self.pool_key, (self.kv, self.graph))
            self.graph = None

    def _context(self, index: int) -> int:
        if self.kv is not None and index > 0:
            return len(self.lengths)
        return len(self.lengths) * max(self.lengths)

    def _forward(self, index: int, trace: Trace) -> torch.Tensor:
        kw = dict(tiles=self.tiles, backend=self.backend, observer=trace)
        m = self.model
        if self.kv is not None and index > 0:
            return m.decode(self.next_ids, self.kv, **kw)
        width = max(self.lengths)
        if self.kv is not None:
            kw["backend"] = self.prefill_backend
            return m.prefill(self.tokens[:, :width], self.kv, self.lengths, **kw)
        last = torch.tensor([n - 1 for n in self.lengths], device=self.tokens.device)
        return m(self.tokens[:, :width], logits_at=last, **kw)[:, 0]

    def _append(self, next_ids: torch.Tensor) -> None:
        if self.kv is None:  # only the cache-off path reads the whole sequence again
            rows = torch.arange(len(self.lengths), device=next_ids.device)
            self.tokens[rows, torch.tensor(self.lengths, device=next_ids.device)] = next_ids
        self.lengths = [n + 1 for n in self.lengths]
        self.next_ids = next_ids


def _use_graph(graph: bool | None, device: torch.device, cache: bool, observer) -> bool:
    if graph is None:
        return device.type == "cuda" and cache and observer is None
    if graph and not cache:
        raise ValueError("CUDA graphs need the KV cache on: without it every step has a new shape")
    if graph and observer is not None:
        raise ValueError("an observer sees each operation as it is launched, so it cannot watch a CUDA graph replay")
    if graph and device.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA GPU; this model runs on {device.type}")
    return bool(graph)


def _warm_up(model, batch, cache, tiles, backend, positions) -> None:
    """Run the first two steps once, unobserved, on a cache of the run's positions (the kernels are specialised
    on its size), so Triton's compilation (and autotuning) is spent here, apart from the steps (a clock marks it
    as the setup of step 0), and wait for the device to finish them."""
    steps = generate(
        model, batch, max_new_tokens=2, cache=cache, tiles=tiles, backend=backend, warmup=False, graph=False,
        positions=positions,
    )  # fmt: skip
    for _ in steps:
        pass
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
