"""kernels.ops.decode_step: a whole decode step in one launch, GPT-2's and a Llama's, against transformers in float64
and against the decode rung's launches. In the interpreter the launch is one program running the task list in its
order; on a GPU one program per SM, the tasks waiting for each other at counters."""

import pytest
import torch

from explorer.model.cache import KVCache
from explorer.model.weights import config_from_hf, from_hf_state_dict
from kernels import arrival, config, decode_step
from kernels.config import GPUS, device_limits
from kernels.ops.decode_step import Shape, Step, check, counts, fits, head_needs, plan, shape_of
from tests.tolerances import assert_close

FAMILIES = ["gpt2", "llama"]
# (prompt lengths, cache positions, width, heads, key/value heads for a Llama): one sequence of one token whose two
# steps fill the cache to its last slot, 48 wide in 3 heads of 16 (a Llama's three sharing one key/value head, a
# group that is no power of two); unequal prompts of 17, 1 and 5 tokens, 4 heads over 2.
CASES = [([1], 3, 48, 3, 1), ([17, 1, 5], 20, 64, 4, 2)]


def _models(device, dtype, family, width, heads, kv_heads, layers=2, vocab=97, positions=32):
    """(transformers' model in float64, ours on the decode rung) with the same random weights."""
    import transformers as T

    torch.manual_seed(11)
    if family == "gpt2":
        cfg = T.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=positions, vocab_size=vocab)
        hf = T.GPT2LMHeadModel(cfg).eval()
    else:
        cfg = T.LlamaConfig(
            vocab_size=vocab,
            hidden_size=width,
            intermediate_size=72,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=positions,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        )
        hf = T.LlamaForCausalLM(cfg).eval()
        for p in hf.parameters():  # RMSNorm weights start at 1: random ones test that they are read
            if p.dim() == 1:
                p.data.uniform_(0.5, 1.5)
    ours = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device=device, dtype=dtype)
    return hf.double(), ours.with_fusion("decode")


def _shape(model) -> Shape:
    """The launch's Shape of one of _models' models, read as the launch reads it (decode_step.shape_of)."""
    cache = KVCache.for_model(model, 1, 1)
    return shape_of(model.step_parts(), (cache.k, cache.v))


def _prefilled(model, prompts, positions):
    """A cache holding the prompts, filled by the decode rung's prefill."""
    device = model.device
    ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p)
    cache = KVCache.for_model(model, len(prompts), positions)
    model.prefill(ids.to(device), cache, [len(p) for p in prompts])
    return cache


def _step(model, ids, cache, **kw):
    cache.begin_step()
    logits = decode_step(ids, model.step_parts(), (cache.k, cache.v, cache.lengths, cache.next_lengths), **kw)
    cache.end_step()
    return logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths,positions,width,heads,kv_heads", CASES)
def test_two_steps_match_transformers_in_float64(device, family, lengths, positions, width, heads, kv_heads):
    hf, model = _models(device, torch.float32, family, width, heads, kv_heads)
    _two_steps_against(hf, model, [torch.randint(0, 97, (n,)).tolist() for n in lengths], positions)


def _two_steps_against(hf, model, prompts, positions, vocab=97):
    """Two steps over the prefilled prompts (the second reads the K and V rows the first wrote), each against
    transformers in float64; every counter back at zero after."""
    device = model.device
    cache = _prefilled(model, prompts, positions)
    for _ in range(2):
        new = torch.randint(0, vocab, (len(prompts),))
        got = _step(model, new.to(device), cache)
        check(device)
        prompts = [p + [int(t)] for p, t in zip(prompts, new, strict=True)]
        want = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
        # Every operation of the step, each an fp32 sum in another order: the looser linear tolerance.
        assert_close("linear", got, want, torch.float32)
    assert (arrival.task_counters(device, 10) == 0).all() and (arrival.head_counters(device, 8) == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_a_step_matches_the_decode_rungs_launches(device, family, dtype):
    _, model = _models(device, dtype, family, 64, 4, 2)
    prompts = [[3, 4, 5, 6, 7], [9] * 12, [1]]
    theirs, ours = _prefilled(model, prompts, 16), _prefilled(model, prompts, 16)
    new = torch.tensor([5, 50, 96], device=device)
    want = model.decode(new, theirs)
    got = _step(model, new, ours)
    again = _step(model, new, _prefilled(model, prompts, 16))
    # The same arithmetic at other tiles: fp32 sums in another order, each operation rounding as the decode
    # rung's launches round (attention's tolerance: its probabilities are rounded as well).
    assert_close("attention", got, want, dtype)
    assert_close("attention", ours.k, theirs.k, dtype)
    assert_close("attention", ours.v, theirs.v, dtype)
    assert torch.equal(got, again)  # a second launch finds its counters at zero and repeats bit for bit


def test_a_wait_past_its_bound_is_an_error_after_the_step_and_the_next_step_is_right(device):
    hf, model = _models(device, torch.float32, "gpt2", 48, 3, 3)
    prompts = [[4, 5, 6]]
    cache = _prefilled(model, prompts, 8)
    # Head 0's counter is made to need one arrival more than c_attn's tiles make: its attention items give up after
    # 2^14 polls (milliseconds on a GPU, where every other wait is met within microseconds).
    _step(model, torch.tensor([7], device=device), cache, limit=1 << 14, head_needs_extra=1)
    # On a GPU a program whose next task is downstream may start waiting first, and give up first: the message names
    # the first wait to give up, whichever it is (in the interpreter, the attention item's).
    with pytest.raises(RuntimeError, match=r"a task of (layer [01]|the LM head) waited for .+ past its bound"):
        check(device)
    check(device)  # read once: the record is cleared
    assert (arrival.task_counters(device, 10) == 0).all() and (arrival.head_counters(device, 6) == 0).all()
    cache = _prefilled(model, prompts, 8)
    got = _step(model, torch.tensor([7], device=device), cache)
    check(device)
    assert_close("linear", got, hf(torch.tensor([[4, 5, 6, 7]])).logits[:, -1], torch.float32)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths,positions,width,heads,kv_heads", CASES[1:])
def test_every_counter_ends_the_step_at_its_count(device, family, lengths, positions, width, heads, kv_heads):
    """Left as the step ends (not reset): each operation's counter holds its tasks, each key/value head's the runs of
    c_attn tiles over its columns, the last the programs: no arrival lost or counted twice."""
    _, model = _models(device, torch.float32, family, width, heads, kv_heads)
    cache = _prefilled(model, [[1] * n for n in lengths], positions)
    _step(model, torch.ones(len(lengths), dtype=torch.long, device=device), cache, keep=True)
    kv = kv_heads if family == "llama" else heads
    ffn = 72 if family == "llama" else 4 * width
    shape = Shape(width, heads, kv, ffn, 97, 2, llama=family == "llama")
    stages, head_counts = counts(len(lengths), shape, positions, torch.float32, device)
    task, head = arrival.task_counters(device, len(stages)), arrival.head_counters(device, len(head_counts))
    try:
        assert task[: len(stages)].tolist() == stages and head[: len(head_counts)].tolist() == head_counts
        assert task[len(stages) :].eq(0).all() and head[len(head_counts) :].eq(0).all()
    finally:
        task.zero_(), head.zero_()
    check(device)


@pytest.mark.parametrize("family", FAMILIES)
def test_narrow_tasks_split_heads_and_sections_and_still_match_transformers(device, family, monkeypatch, request):
    """In the interpreter an operation is one or two wide tasks; here tasks of 16 columns (a GPU's kind of tile), so
    a head's q, k and v columns span several c_attn tasks and the counters count runs: a step against
    transformers."""
    from kernels.ops.decode_step import tiles

    if device.type == "cpu":
        monkeypatch.setattr(tiles, "CPU_ELEMENTS", 16 * 64)
        tiles.plan.cache_clear()
        request.addfinalizer(tiles.plan.cache_clear)  # no plan of the narrow tasks outlives the test
    lengths, positions, width, heads, kv_heads = CASES[1]
    hf, model = _models(device, torch.float32, family, width, heads, kv_heads)
    prompts = [torch.randint(0, 97, (n,)).tolist() for n in lengths]
    cache = _prefilled(model, prompts, positions)
    new = torch.randint(0, 97, (len(prompts),))
    got = _step(model, new.to(device), cache)
    check(device)
    want = torch.stack([hf(torch.tensor([p + [int(t)]])).logits[0, -1] for p, t in zip(prompts, new, strict=True)])
    assert_close("linear", got, want, torch.float32)
    kv = kv_heads if family == "llama" else heads
    shape = Shape(width, heads, kv, 72 if family == "llama" else 4 * width, 97, 2, llama=family == "llama")
    assert plan(len(lengths), shape, positions, torch.float32, device).tiles["BN_A"] <= 16 or device.type != "cpu"


# (lengths before the step, cache positions, heads, head_dim): a sequence with an empty cache beside one whose 130
# keys loop over two key tiles in the interpreter (128 keys of 64 dims a tile there, one split of 256 keys, loaded
# after the wait); eight unequal sequences, whose heads of 24 are one tile loaded before it.
RANDOM_CACHES = [([129, 0, 5], 130, 2, 64), ([3, 0, 17, 1, 9, 12, 2, 6], 18, 2, 24)]


@pytest.mark.parametrize("lengths,t_max,heads,head_dim", RANDOM_CACHES)
def test_a_step_over_random_caches_matches_float64_pytorch_block_by_block(device, lengths, t_max, heads, head_dim):
    """Caches of random keys and values at unequal lengths (none, past one key tile), against the decode layer's
    float64 reference block by block: the embedding, each block writing its row into its (float64) caches, ln_f
    and the tied LM head."""
    from kernels import reference
    from tests.ops.test_decode_layer import _block, _reference

    batch, width, layers, vocab = len(lengths), heads * head_dim, 2, 53
    rand = lambda *shape, scale=1.0: torch.randn(*shape, device=device) * scale
    blocks = [_block(device, torch.float32, batch, width)[1:] for _ in range(layers)]
    wte, wpe = rand(vocab, width, scale=0.5), rand(t_max, width, scale=0.1)
    ln_f = (1 + rand(width, scale=0.1), rand(width))
    caches = torch.randn(2, layers, batch, heads, t_max, head_dim, device=device)
    lens = torch.tensor(lengths, device=device, dtype=torch.int32)
    ids = torch.randint(0, vocab, (batch,), device=device)
    want_caches = caches.double().cpu()
    x = (wte[ids] + wpe[lens.long()]).double().cpu()[:, None]
    f64 = lambda t: t.double().cpu()
    for layer, block in enumerate(blocks):
        params = [tuple(f64(t) for t in p) for p in block]
        x = _reference(x, *params, want_caches[0, layer], want_caches[1, layer], lens.cpu().long(), 1e-5)
    want = reference.linear(reference.layer_norm(x, f64(ln_f[0]), f64(ln_f[1]), 1e-5), f64(wte))[:, 0]

    got = decode_step(ids, Step(wte, wpe, tuple(blocks), ln_f, wte, 1e-5), (caches[0], caches[1], lens, lens + 1))
    check(device)

    assert_close("linear", got, want, torch.float32)
    assert_close("linear", caches, want_caches, torch.float32)


def _overlaps(shape: Shape, block_n: int) -> list[int]:
    """Each key/value head's count, counted another way: the tiles of c_attn overlapping the q columns of its group
    of query heads, its k columns and its v columns."""
    d, group, kv = shape.head_dim, shape.heads // shape.kv_heads, shape.kv_heads
    needs = []
    for g in range(kv):
        ranges = [(g * group * d, (g + 1) * group * d)]
        ranges += [(shape.heads * d + (s * kv + g) * d, shape.heads * d + (s * kv + g + 1) * d) for s in (0, 1)]
        tiles = range(-(-shape.qkv // block_n))
        needs.append(sum(1 for lo, hi in ranges for t in tiles if t * block_n < hi and lo < (t + 1) * block_n))
    return needs


@pytest.mark.parametrize(
    "width,heads,kv_heads",
    [(768, 12, 12), (48, 3, 3), (576, 9, 3), (40, 5, 5), (80, 5, 5), (96, 6, 2), (48, 3, 1), (64, 4, 2)],
)
@pytest.mark.parametrize("block_n", [8, 16, 32, 128])
def test_each_heads_count_is_the_c_attn_tiles_holding_its_columns(width, heads, kv_heads, block_n):
    shape = Shape(width, heads, kv_heads, 4 * width, 97, 2, llama=kv_heads != heads)
    assert head_needs(shape, block_n) == _overlaps(shape, block_n)


@pytest.mark.parametrize("arch", [80, 90, 120])
@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize(
    "shape", [Shape(768, 12, 12, 3072, 50257, 12), Shape(576, 9, 3, 1536, 49152, 30, llama=True)], ids=FAMILIES
)
def test_a_gpu_launch_starts_at_most_one_program_per_sm(arch, rows, shape):
    gpu = GPUS[arch]
    p = plan(rows, shape, 1024, torch.bfloat16, gpu)
    assert p.programs == gpu.num_sms  # at most one per SM; every operation has a task for each SM somewhere
    assert p.splits * rows * shape.kv_heads <= 4 * gpu.num_sms  # attention's items: about one per program


def test_more_attention_items_a_program_split_the_keys_further(request):
    """GPT-2 small's shape at batch 8 on an H200: the default split gives each of the 96 (sequence, head) pairs one
    item, fewer than the programs; asking for four a program splits the keys further, into more items than programs
    and at most four a program. (A Llama's grouped split stops at 2 here either way: past it, grouped attention's
    plan merges its splits apart, which one launch cannot.)"""
    from kernels.ops.decode_step import Variant, tiles, varied

    request.addfinalizer(tiles.plan.cache_clear)
    shape = Shape(768, 12, 12, 3072, 50257, 12)
    gpu, pairs = GPUS[90], 8 * shape.kv_heads
    one = plan(8, shape, 1024, torch.bfloat16, gpu)
    with varied(Variant(items=4)):
        four = plan(8, shape, 1024, torch.bfloat16, gpu)
        stages, _ = counts(8, shape, 1024, torch.bfloat16, gpu)
    assert one.splits * pairs <= gpu.num_sms < four.splits * pairs <= 4 * gpu.num_sms
    assert stages[1] == four.splits * pairs  # layer 0's attention counter counts the items of that plan
    assert four.programs == one.programs == gpu.num_sms
    with varied(Variant(items=64)):  # more splits than attention allows (256): as many as it allows, no refusal
        assert plan(3, Shape(64, 4, 4, 256, 97, 2), 64, torch.float32, gpu).splits > 1


@pytest.mark.parametrize("shape", [Shape(768, 12, 12, 3072, 50257, 12), Shape(576, 9, 3, 1536, 49152, 30, llama=True)])
def test_narrow_tasks_hold_fewer_weights_in_more_tasks(shape, request):
    """one_launch_sweep's variant of a quarter of the weights a task, at batch 8 on an H200: every projection's
    tiles at most as wide as the default's and none holding more than its share (or 8 columns, the narrowest),
    and the stage counters count the extra tasks."""
    from kernels.ops.decode_step import Variant, tiles, varied

    request.addfinalizer(tiles.plan.cache_clear)
    gpu = GPUS[90]
    wide = plan(8, shape, 1024, torch.bfloat16, gpu)
    with varied(Variant(narrow=4)):
        narrow = plan(8, shape, 1024, torch.bfloat16, gpu)
        stages, _ = counts(8, shape, 1024, torch.bfloat16, gpu)
    inputs = {"BN_A": shape.width, "BN_O": shape.width, "BN_F": shape.width, "BN_P": shape.ffn, "BN_H": shape.width}
    for name, k in inputs.items():
        assert narrow.tiles[name] <= wide.tiles[name]
        assert narrow.tiles[name] * k <= tiles.ELEMENTS // 4 or narrow.tiles[name] <= (16 if shape.llama else 8)
    assert narrow.tiles["BN_H"] < wide.tiles["BN_H"]  # the LM head's, in both families
    assert stages[2] == -(-shape.width // narrow.tiles["BN_O"])  # layer 0's c_proj tasks
    assert narrow.programs == wide.programs == gpu.num_sms


def test_more_programs_than_the_sms_hold_are_refused():
    fits(132, 1, 132)
    fits(264, 2, 132)
    with pytest.raises(RuntimeError, match="133 programs, but the compiled kernel fits 1 per SM on 132 SMs"):
        fits(133, 1, 132)


def test_bad_steps_are_refused_with_the_reason(device):
    _, model = _models(device, torch.float32, "gpt2", 48, 3, 3)
    cache = _prefilled(model, [[1, 2]], 8)
    parts = model.step_parts()
    kv = (cache.k, cache.v, cache.lengths, cache.lengths + 1)
    ids = torch.tensor([3], device=device)
    with pytest.raises(ValueError, match=r"ids must be a \(B,\) int32 or int64 tensor"):
        decode_step(ids[None], parts, kv)
    with pytest.raises(ValueError, match="one layer per block"):
        decode_step(ids, parts, (cache.k[:1], cache.v[:1], *kv[2:]))
    with pytest.raises(ValueError, match="kv must be"):
        decode_step(ids, parts, kv[:3])
    with pytest.raises(ValueError, match="lengths must be"):
        decode_step(ids, parts, (*kv[:3], kv[3].float()))
    with pytest.raises(ValueError, match="1 to 16 sequences"):
        decode_step(torch.zeros(17, dtype=torch.long, device=device), parts, kv)
    with pytest.raises(ValueError, match="six parts of 2 tensor"):
        decode_step(ids, parts._replace(layers=tuple(layer[:5] for layer in parts.layers)), kv)
    with pytest.raises(ValueError, match="rotary theta"):
        decode_step(ids, parts._replace(wpe=None, layers=tuple(tuple(p[:1] for p in lay) for lay in parts.layers)), kv)
    if device.type == "cpu":
        with pytest.raises(ValueError, match="global timer: there is none in the interpreter"):
            decode_step(ids, parts, kv, trace=torch.zeros(1000, dtype=torch.int64))
    else:
        with pytest.raises(ValueError, match="3 stamps for each of the step's"):
            decode_step(ids, parts, kv, trace=torch.zeros(3, dtype=torch.int64, device=device))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lengths,positions,width,heads,kv_heads", CASES)
def test_the_task_list_counts_what_the_counters_count(family, lengths, positions, width, heads, kv_heads):
    """tiles.tasks (the trace's numbering) against tiles.counts (what the counters hold after a step, checked on the
    kernel above): every operation but c_attn arrives at a stage counter, c_attn's tiles at the heads'."""
    from kernels.ops.decode_step import tasks

    kv = kv_heads if family == "llama" else heads
    shape = Shape(width, heads, kv, 72 if family == "llama" else 4 * width, 97, 3, llama=family == "llama")
    runs = tasks(len(lengths), shape, positions, torch.float32, "cpu")
    stages, _ = counts(len(lengths), shape, positions, torch.float32, "cpu")
    assert [name for name, _, _ in runs[1:6]] == ["c_attn", "attention", "c_proj", "c_fc", "mlp.c_proj"]
    assert [layer for _, layer, _ in runs] == [-1, *(layer for layer in range(3) for _ in range(5)), -1]
    assert [n for name, _, n in runs[:-1] if name != "c_attn"] == stages[:-1]
    assert runs[-1][0] == "lm_head" and all(n >= 1 for _, _, n in runs)


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_a_traced_step_stamps_every_task_in_order_and_computes_the_same(device, family):
    """A trace changes no result, and every task stamps its start, its inputs ready and its arrival in that order,
    each program's tasks one after another; a task of an operation that waits for the whole operation before it finds
    its inputs no sooner than the last of those arrived (within the stamps' own order: the arrival's stamp follows
    its atomic)."""
    from kernels.ops.decode_step import tasks

    _, model = _models(device, torch.bfloat16, family, 64, 4, 2, layers=3)
    prompts = [[3, 4, 5, 6, 7], [9] * 12]
    new = torch.tensor([5, 50], device=device)
    want = _step(model, new, _prefilled(model, prompts, 16))
    cache = _prefilled(model, prompts, 16)
    shape = shape_of(model.step_parts(), (cache.k, cache.v))
    runs = tasks(2, shape, 16, torch.bfloat16, device)
    trace = torch.zeros(3 * sum(n for _, _, n in runs), dtype=torch.int64, device=device)
    got = _step(model, new, cache, trace=trace)
    check(device)
    assert torch.equal(got, want)
    at = trace.view(-1, 3).cpu()
    assert (at > 0).all() and (at[:, 1] >= at[:, 0]).all() and (at[:, 2] >= at[:, 1]).all()
    programs = plan(2, shape, 16, torch.bfloat16, device).programs
    for p in range(programs):
        mine = at[p::programs]
        assert (mine[1:, 0] >= mine[:-1, 2]).all()
    slack_ns = 2000  # a waiter may see the count before the last arriver has read the timer after its atomic
    g, before = 0, None
    for name, _, n in runs:
        if before is not None and name != "attention":  # attention waits for its own head's tiles only
            assert at[g : g + n, 1].min() >= before - slack_ns, name
        before = at[g : g + n, 2].max()
        g += n


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_two_programs_an_sm_with_narrow_tasks_still_match_transformers(device, family, monkeypatch, request):
    """Two programs an SM of 4 warps each (one_launch_sweep's variant) and tasks of 8 columns: every operation has
    fewer tasks than programs, so the next operation's tasks run on other programs, loading their weights while this
    one's still wait. Two steps against transformers in float64, every counter back at zero."""
    from kernels.ops.decode_step import Variant, tiles, varied

    monkeypatch.setattr(tiles, "ELEMENTS", 16 * 64)  # 8 columns of 64 inputs a task at 4 warps
    request.addfinalizer(tiles.plan.cache_clear)
    hf, model = _models(device, torch.float32, family, 64, 4, 2, vocab=3000)
    shape = _shape(model)
    with varied(Variant(per_sm=2, warps=4)):
        assert plan(3, shape, 20, torch.float32, device).programs > device_limits(device).num_sms
        _two_steps_against(hf, model, [torch.randint(0, 3000, (n,)).tolist() for n in (17, 1, 5)], 20, vocab=3000)


@pytest.mark.gpu
def test_keys_split_for_more_items_than_programs_still_match_transformers(device, request):
    """one_launch_sweep's variant of about four attention items a program (GPT-2's: a Llama's grouped split stays as
    it was): a sequence's keys split further, several items on each program, the last split of each pair merging.
    Two steps against transformers in float64."""
    from kernels.ops.decode_step import Variant, tiles, varied

    request.addfinalizer(tiles.plan.cache_clear)
    hf, model = _models(device, torch.float32, "gpt2", 64, 4, 4, vocab=3000, positions=320)
    shape = _shape(model)
    before = plan(3, shape, 300, torch.float32, device)
    with varied(Variant(items=4)):
        p = plan(3, shape, 300, torch.float32, device)
        assert p.splits > before.splits and p.splits * 3 * 4 > p.programs
        prompts = [torch.randint(0, 3000, (n,)).tolist() for n in (170, 1, 250)]
        _two_steps_against(hf, model, prompts, 300, vocab=3000)


@pytest.mark.parametrize("family,batch", [("gpt2", 9), ("llama", 5)])
def test_rows_in_one_dot_still_match_transformers(device, family, batch, request):
    """one_launch_sweep's variant that multiplies a projection's rows in one tl.dot of 16 rows (16 of them, or 8
    and the tile's first half kept) where a part of its weight slice spans 16 or more inputs, the row loop
    elsewhere (a Llama's 72-wide hidden layer ends in 8). Two steps against transformers in float64."""
    from kernels.ops.decode_step import Variant, tiles, varied

    request.addfinalizer(tiles.plan.cache_clear)
    hf, model = _models(device, torch.float32, family, 64, 4, 2)
    shape = _shape(model)
    with varied(Variant(dot=True)):
        assert plan(batch, shape, 24, torch.float32, device).constexprs["TILES"][-1]
        prompts = [torch.randint(0, 97, (n,)).tolist() for n in (1, 17, 5, 9, 2, 11, 3, 7, 4)[:batch]]
        _two_steps_against(hf, model, prompts, 24)


@pytest.mark.parametrize("family,positions", [("gpt2", 64), ("llama", 200)])
def test_keys_split_and_merged_in_one_launch_match_transformers(device, family, positions, request):
    """Attention's keys split (about 64 items a program asked for: in the interpreter's one program too), each pair's
    last split merging the others' partials inside the launch, as a GPU's launch does at batch 1. Two steps against
    transformers in float64, every counter back at zero."""
    from kernels.ops.decode_step import Variant, tiles, varied

    request.addfinalizer(tiles.plan.cache_clear)
    hf, model = _models(device, torch.float32, family, 64, 4, 2, positions=positions)
    shape = _shape(model)
    with varied(Variant(items=64)):
        assert plan(3, shape, positions, torch.float32, device).splits > 1
        prompts = [torch.randint(0, 97, (n,)).tolist() for n in (positions - 3, 1, positions // 2)]
        _two_steps_against(hf, model, prompts, positions)


def test_counters_first_asked_for_in_inference_mode_can_be_zeroed_outside_it(device, monkeypatch):
    """A model's decode runs in inference mode, where a new tensor is an inference tensor that refuses in-place
    writes outside it; the counters and the status word are zeroed by the host after (check, a test's reset)."""
    for name in ("_tasks", "_heads", "_statuses"):
        monkeypatch.setattr(arrival, name, {})  # as on a fresh process: the first ask makes the buffer
    with torch.inference_mode():
        made = arrival.task_counters(device, 4), arrival.head_counters(device, 4), arrival.status_word(device)
    for buf in made:
        assert not buf.is_inference()
        buf.add_(1).zero_()
        assert not buf.any()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_layers_scratch_region_starts_a_line_of_its_own(device, family, monkeypatch):
    """A program may hold in its L1 a line it read in one layer's task; if that line also held the start of the next
    layer's rows, a later task would read them there as they were before they were written (a Llama's hidden width
    of 72 in fp16 made 432-byte layers, and one sequence's logits NaN on the GPU). Every buffer of per-layer regions
    the launch allocates starts each region on a line, and the step is still the decode rung's."""
    from kernels.ops.decode_step import kernel

    made = []
    monkeypatch.setattr(kernel, "new_output", lambda *a, **k: made.append(config.new_output(*a, **k)) or made[-1])
    _, model = _models(device, torch.float16, family, 64, 4, 2)
    prompts = [[3, 4, 5, 6, 7], [9] * 12, [1]]
    theirs, ours = _prefilled(model, prompts, 16), _prefilled(model, prompts, 16)
    new = torch.tensor([5, 50, 96], device=device)
    got = _step(model, new, ours)
    check(device)
    regions = [t for t in made if t is not got]  # (layers [+ 1], a region's elements) each
    assert len(regions) == 5 and all(t.shape[1] * t.element_size() % kernel.LINE == 0 for t in regions)
    assert any(t.shape[1] > 3 * 72 for t in regions)  # the hidden rows, padded to a line
    assert_close("attention", got, model.decode(new, theirs), torch.float16)
