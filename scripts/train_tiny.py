"""Train a bundled model: a tiny GPT-2-architecture decoder and its BPE tokenizer, or (--family llama) a tiny
Llama-family one (RMSNorm, rotary positions, SwiGLU, grouped-query heads) on the same tokenizer.

The training text is the Python standard library's own source (docstrings and comments supply the English), taken
from the interpreter that runs this script, so the corpus exists offline on every machine and may be redistributed.
The script trains a byte-level BPE tokenizer, then a GPT2LMHeadModel, and saves a folder that `transformers` loads
offline with `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` (weights in float16 safetensors,
plus a `train_log.json` describing the run). Training stops after --minutes of wall-clock time or --max-steps, whichever
comes first, with the learning rate's cosine decay stretched over that budget. The stdlib holds only ~2.7M tokens, so
five minutes on an H200 (~12k steps, ~150 passes over the data) would memorise it: dropout 0.2 slows that, and the
weights with the lowest validation loss (checked every 500 steps) are the ones saved, which makes the exact result
depend a little on the machine's speed.

Reproduce the bundled models (about five minutes of training each on one GPU):

    python scripts/train_tiny.py --out assets/tiny-gpt2
    python scripts/train_tiny.py --family llama --tokenizer assets/tiny-gpt2 --out assets/tiny-llama
"""

import argparse
import contextlib
import json
import math
import platform
import random
import sysconfig
import time
from pathlib import Path

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

EOS = "<|endoftext|>"
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
MAX_FILE_BYTES = 500_000  # a few huge generated tables would otherwise dominate the corpus
# Files the output folder may hold; anything else there means it is not ours to overwrite.
OUTPUT_JSON = ("config", "generation_config", "tokenizer", "tokenizer_config", "special_tokens_map", "train_log")
OUTPUT_FILES = {f"{name}.json" for name in OUTPUT_JSON} | {"model.safetensors"}
PROMPTS = ["def ", "The ", "import ", "class ", "# "]
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50}
ROUND_TRIP = [
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x ** 2  # square it\n\n\n",
    "  leading spaces, tabs\tand unicode: naïve café — ü ß 日本語 🙂\r\n",
]


def collect_corpus(max_files=None):
    """Return (train_texts, val_texts, info) from the stdlib sources, sorted so the corpus is deterministic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in root.rglob("*.py")
        if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1]) and p.stat().st_size <= MAX_FILE_BYTES
    )
    if max_files:
        files = files[:max_files]
    texts = [p.read_text(encoding="utf-8", errors="ignore") for p in files]
    # Every 100th file is held out, so validation covers modules spread across the alphabet.
    train = [t for i, t in enumerate(texts) if i % 100 != 0]
    val = [t for i, t in enumerate(texts) if i % 100 == 0]
    info = {"stdlib": str(root), "files": len(files), "val_files": len(val), "chars": sum(map(len, texts))}
    return train, val, info


def train_tokenizer(texts, vocab_size):
    """Train a GPT-2-style byte-level BPE and wrap it so AutoTokenizer can load it."""
    tok = Tokenizer(models.BPE())
    # No prefix space: decode(encode(s)) must give back s exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        # Seeding all 256 byte symbols means any input string can be encoded, so no unknown tokens ever occur.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,  # the default clean-up would remove spaces before punctuation
    )
    check_round_trip(wrapped)
    return wrapped


def check_round_trip(tok):
    for s in ROUND_TRIP:
        out = tok.decode(tok.encode(s))
        if out != s:
            raise SystemExit(f"tokenizer round trip failed:\n  in:  {s!r}\n  out: {out!r}")
    print(f"tokenizer round trip ok on {len(ROUND_TRIP)} samples", flush=True)


def encode(tok, texts, device):
    """Tokenize the texts into one flat tensor, each text followed by the end-of-text token."""
    encodings = tok.backend_tokenizer.encode_batch(texts)  # the Rust tokenizer encodes in parallel
    ids = [i for enc in encodings for i in (*enc.ids, tok.eos_token_id)]
    return torch.tensor(ids, dtype=torch.int32, device=device)  # int32 indexes fine on CPU and CUDA


def build_model(args, tok):
    if args.family == "llama":
        return build_llama(args, tok)
    config = GPT2Config(
        vocab_size=len(tok),
        n_positions=1024,
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_head=args.n_head,
        activation_function="gelu_new",
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = tok.eos_token_id  # GPT-2 has no pad token; silences generate()
    return model


def build_llama(args, tok):
    """A Llama-family decoder as SmolLM2 builds one (tied embeddings, no biases, RMSNorm eps 1e-5), sized by the
    same arguments; its key/value heads are --n-kv-head, its feed-forward width --ffn. Llama has no residual or
    embedding dropout: --dropout applies to the attention probabilities only."""
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=args.n_embd,
        intermediate_size=args.ffn,
        num_hidden_layers=args.n_layer,
        num_attention_heads=args.n_head,
        num_key_value_heads=args.n_kv_head,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        attention_dropout=args.dropout,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.eos_token_id
    return model


def get_batch(data, batch, context, gen):
    # Offsets are drawn on the device itself, so no host-to-device copy interrupts the queued GPU work.
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=gen, device=data.device)
    rows = data[starts[:, None] + torch.arange(context + 1, device=data.device)].long()
    return rows[:, :-1], rows[:, 1:]


@torch.no_grad()
def evaluate(model, val, context, batch, autocast, max_windows=256):
    """Mean loss over consecutive windows of the held-out tokens (the same windows every time)."""
    model.eval()
    context = min(context, len(val) - 1)
    n = min((len(val) - 1) // context, max_windows)
    total = 0.0
    for i in range(0, n, batch):
        starts = torch.arange(i, min(i + batch, n), device=val.device) * context
        rows = val[starts[:, None] + torch.arange(context + 1, device=val.device)].long()
        with autocast():
            logits = model(input_ids=rows[:, :-1]).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").item()
    model.train()
    return total / (n * context)


def train(model, data, val, args, device):
    is_cuda = device.type == "cuda"
    decay = [p for p in model.parameters() if p.dim() >= 2]  # weight matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases and LayerNorm gains
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=is_cuda)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if is_cuda else contextlib.nullcontext
    gen = torch.Generator(device=device).manual_seed(args.seed)
    warmup = min(200, max(args.max_steps // 10, 1))
    eval_every = max(1, min(500, args.max_steps // 4))
    step, t0, best = 0, time.time(), (float("inf"), 0, None)  # (val loss, step, weights)
    running, since_log, last_train = torch.zeros((), device=device), 0, float("nan")
    model.train()
    while True:
        # Progress is whichever budget runs out first, so the cosine decay ends when training does, even when the
        # number of steps that fit in the time budget is unknown in advance.
        progress = max(step / args.max_steps, (time.time() - t0) / (args.minutes * 60))
        if progress >= 1.0:
            break
        scale = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = args.lr * scale
        x, y = get_batch(data, args.batch, args.context, gen)
        with autocast():
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += loss.detach()  # stays on the device: no sync every step
        step, since_log = step + 1, since_log + 1
        if step % 100 == 0:
            elapsed = time.time() - t0
            last_train, since_log = running.item() / since_log, 0
            running.zero_()
            rate = step * args.batch * args.context / elapsed
            lr = args.lr * scale
            print(
                f"step {step:6d}  train loss {last_train:.4f}  lr {lr:.2e}  {elapsed:6.1f}s  {rate:,.0f} tok/s",
                flush=True,
            )
        if step % eval_every == 0:
            val_loss = evaluate(model, val, args.context, args.batch, autocast)
            print(f"step {step:6d}  val loss {val_loss:.4f}", flush=True)
            if val_loss < best[0]:
                best = (val_loss, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
    wall = time.time() - t0
    if since_log:  # the mean over the last partial stretch of steps, not a single noisy batch
        last_train = running.item() / since_log
    val_loss = evaluate(model, val, args.context, args.batch, autocast)
    print(f"done: {step} steps in {wall:.1f}s, train loss {last_train:.4f}, val loss {val_loss:.4f}", flush=True)
    # The stdlib is only a few million tokens, so a long run can pass through it a hundred times and start to
    # memorise it; keep whichever weights generalised best.
    kept = (val_loss, step)
    if best[0] < val_loss:
        kept = best[:2]
        model.load_state_dict(best[2])
        print(f"kept the weights from step {kept[1]}, which had the lowest val loss {kept[0]:.4f}", flush=True)
    return {
        "steps": step,
        "tokens_seen": step * args.batch * args.context,
        "wall_seconds": round(wall, 1),
        "final_train_loss": round(last_train, 4),
        "final_val_loss": round(val_loss, 4),
        "kept_step": kept[1],
        "kept_val_loss": round(kept[0], 4),
    }


@torch.no_grad()
def sample(model, tok, seed, max_new_tokens=40):
    """Greedy and sampled continuations of fixed prompts, for a quick look at what the model learned."""
    device = next(model.parameters()).device
    out = []
    for prompt in PROMPTS:
        enc = tok(prompt, return_tensors="pt").to(device)
        row = {"prompt": prompt}
        for name, kwargs in [("greedy", {"do_sample": False}), ("sampled", SAMPLING)]:
            torch.manual_seed(seed)
            ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tok.eos_token_id, **kwargs)
            row[name] = tok.decode(ids[0], skip_special_tokens=False)
            print(f"--- {name} {prompt!r}\n{row[name]}", flush=True)
        out.append(row)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="assets/tiny-gpt2")
    p.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--tokenizer", default=None, help="a saved tokenizer's folder to reuse instead of training one")
    p.add_argument("--minutes", type=float, default=5.0, help="wall-clock training budget")
    p.add_argument("--max-steps", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--n-layer", type=int, default=6)
    p.add_argument("--n-head", type=int, default=None, help="default: 4 (gpt2), 6 (llama)")
    p.add_argument("--n-embd", type=int, default=None, help="default: 256 (gpt2), 192 (llama)")
    p.add_argument("--n-kv-head", type=int, default=None, help="llama: key/value heads (default: a third of --n-head)")
    p.add_argument("--ffn", type=int, default=None, help="llama: feed-forward width (default: 8/3 of --n-embd, to 64)")
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N stdlib files (for quick tests)")
    args = p.parse_args()
    if args.context > 1024:
        p.error("--context must be at most n_positions (1024)")
    # The bundled Llama: SmolLM2's three query heads per key/value head, at about the GPT-2 one's bytes (6.6 MB).
    llama = args.family == "llama"
    args.n_embd = args.n_embd or (192 if llama else 256)
    args.n_head = args.n_head or (6 if llama else 4)
    args.n_kv_head = args.n_kv_head or (max(1, args.n_head // 3) if llama else args.n_head)
    args.ffn = args.ffn or -(-args.n_embd * 8 // 3 // 64) * 64
    if args.n_head % args.n_kv_head:
        p.error(f"--n-head ({args.n_head}) must be a multiple of --n-kv-head ({args.n_kv_head})")

    out = Path(args.out)
    # Refuse early, before any training time is spent, rather than mix our files with someone else's.
    strays = sorted(f.name for f in out.iterdir() if f.name not in OUTPUT_FILES) if out.is_dir() else []
    if strays:
        raise SystemExit(f"{out} holds files this script does not write: {strays}; choose an empty or new folder")

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_float32_matmul_precision("high")  # TF32 for the fp32 matmuls that autocast leaves alone
    transformers.utils.logging.disable_progress_bar()  # keep the log readable: no shard-writing progress bars

    train_texts, val_texts, corpus = collect_corpus(args.max_files)
    t = time.time()
    tok = (
        AutoTokenizer.from_pretrained(args.tokenizer)
        if args.tokenizer
        else train_tokenizer(train_texts, args.vocab_size)
    )
    data, val = encode(tok, train_texts, device), encode(tok, val_texts, device)
    corpus.update(train_tokens=len(data), val_tokens=len(val))
    print(f"tokenizer: {len(tok)} tokens in {time.time() - t:.1f}s; corpus: {corpus}", flush=True)

    model = build_model(args, tok).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters (~{n_params * 2 / 1e6:.1f} MB in fp16) on {device}", flush=True)
    stats = train(model, data, val, args, device)

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)

    # Reload from disk, the way the app will, so a folder that does not load fails here and not later.
    tok = AutoTokenizer.from_pretrained(out)
    check_round_trip(tok)
    model = AutoModelForCausalLM.from_pretrained(out).float().to(device).eval()
    samples = sample(model, tok, args.seed)

    versions = {m.__name__: m.__version__ for m in (torch, transformers, tokenizers)}
    log = {
        "corpus": corpus,
        "versions": {"python": platform.python_version(), **versions},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "args": vars(args),
        "parameters": n_params,
        **stats,
        "samples": samples,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2, ensure_ascii=False) + "\n")
    files = sorted(f.name for f in out.iterdir())
    if len(files) > 7:
        raise SystemExit(f"{out} holds {len(files)} files, more than the 7 allowed: {files}")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"saved {out}: {files}, {size / 1e6:.1f} MB", flush=True)


if __name__ == "__main__":
    main()
