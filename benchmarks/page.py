"""What a visitor waits for, timed as a client sees it: python benchmarks/page.py [--out page.json]

Starts `python app.py` as a user would (its log's warm-up stages shown), then drives it through
gradio_client, stamping every streamed update from the moment of submit: when the first generated text
arrives, when the text stops changing, when the job is done, how many updates came and how they were
spread (the longest gap between two). Rows: the first Generate after the start (default controls), the
same warm, Generate with GPT-2 small's shape (random weights, the bundled tokenizer) at 64 and 256 new
tokens, the bundled Llama's first Generate, the cache off at 256 tokens on both bundled models and on
SmolLM2-135M's shape (random weights, the bundled tokenizer), Compare, the ladder, a sweep, every lesson's
first run and one lesson again. "To the handler" and "to the job": from submit to the event's handler, and
to the job's start (the server's log says when). Beside each, the same job's own timeline run in this
process after the server is stopped (the handler's side: no server, no client), so the gap between the two
is the server's and the page's share; and the estimate the page showed before the job, next to its time. On
CPU the rows are the interpreter's, smaller, and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpt2_shaped(folder: Path) -> str:
    """Random weights of GPT-2 small's shape with the bundled tokenizer: GPT-2's bytes per step, offline."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=4096, bos_token_id=0, eos_token_id=0
    )
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "assets" / "tiny-gpt2" / name, folder / name)
    return str(folder)


def smollm2_shaped(folder: Path) -> str:
    """Random weights of SmolLM2-135M's shape with the bundled tokenizer (its vocabulary cut to the tokenizer's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=4096,
        max_position_embeddings=2048,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "assets" / "tiny-gpt2" / name, folder / name)
    return str(folder)


def stamps(job, t0: float, text_at: int | None, prompt: str = "") -> dict:
    """Watch a submitted job, stamping each update as gradio_client receives it: the first generated text
    (the text output, at `text_at`, longer than the prompt), its last change, done, count, and the longest
    gap between two updates. Polled from job.outputs(), which holds the client's lock only to copy: its own
    iterator (gradio_client 2.7, Job.__next__) sleeps while holding that lock, so its receiving thread can
    wait, and a loop over `for out in job` sees in bursts what the server sent spread out."""
    times, texts, seen = [], [], 0
    while True:
        done = job.done()
        outs = job.outputs()
        now = time.monotonic() - t0
        for out in outs[seen:]:
            times.append(now)
            if text_at is not None:
                texts.append(out[text_at] if isinstance(out[text_at], str) else None)
        seen = len(outs)
        if done:
            break
        time.sleep(0.005)
    job.result()  # raises what the job raised
    finished = time.monotonic() - t0
    gap = max(b - a for a, b in zip([0.0, *times], times, strict=False)) if times else finished
    row = dict(done_s=finished, updates=len(times), longest_gap_s=gap, stamps=[round(t, 3) for t in times])
    if text_at is not None:
        generated = [(t, x) for t, x in zip(times, texts, strict=True) if x is not None and len(x) > len(prompt)]
        last_change = max(
            (t for (t, x), (_, y) in zip(generated[1:], generated[:-1], strict=True) if x != y), default=None
        )
        first = generated[0][0] if generated else None
        row |= dict(first_text_s=first, all_text_s=last_change if last_change is not None else first)
    return row


def through_server(port: int, gpt2: str, smollm2: str, device: str, only: str = "") -> tuple[list[dict], str]:
    from gradio_client import Client

    offered = f"distilgpt2,gpt2,{gpt2},{smollm2}"
    env = dict(os.environ, PORT=str(port), EXPLORER_MODELS=offered, GRADIO_ANALYTICS_ENABLED="False")
    t0 = time.monotonic()
    server = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log = []
    try:
        serving = threading.Event()

        def read():  # the warm-up, stage by stage, then whatever the server says while it serves
            for line in server.stdout:
                log.append(f"{time.monotonic() - t0:7.1f} s  {line.rstrip()}")
                if "Running on local URL" in line:
                    serving.set()

        threading.Thread(target=read, daemon=True).start()
        if not serving.wait(900):
            raise RuntimeError("the app did not start serving:\n" + "\n".join(log))
        started = time.monotonic() - t0
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        # The client reads the app's API description once, at its first call by parameter names (about a second
        # on the H200 host, before the job is even submitted): read it here, outside every row's clock.
        client.view_api(print_info=False)
        # A browser's first event is the page's own load event (the lesson link), queued before any click: one
        # refused request stands for it, so that the first row is a visitor's first click, not the connection's
        # first event.
        try:
            client.predict(prompt="x", new_tokens=0, api_name="/generate")
        except Exception as e:  # the refusal expected: new tokens must be at least 1
            log.append(f"the connection's first event, refused as expected: {str(e)[:80]}")
        rows = []
        gpu = device == "cuda"
        generate = dict(prompt="def fibonacci(n):", cache=True)
        tokens = (64, 256) if gpu else (8, 16)
        sweep = dict(kernel="layer_norm", shape="M=4096,C=768" if gpu else "M=64,C=256", x="block_m", y="num_warps")
        first_sweep = tab_sweep(device)  # a visitor's first sweep: the tab's kernel, shape and axes
        jobs = [
            ("Generate, first after start (default controls)", "/generate", dict(generate), 0),
            ("Generate, warm (default controls)", "/generate", dict(generate), 0),
            (f"Generate, bundled, {tokens[1]} tokens", "/generate", generate | dict(new_tokens=tokens[1]), 0),
        ]
        for n in (tokens[0], tokens[1], tokens[1]):
            jobs.append(
                (f"Generate, GPT-2 small shape, {n} tokens", "/generate", generate | dict(model=gpt2, new_tokens=n), 0)
            )
        # Off the default path: the Llama family (a new model's first Generate), and the cache off, whose every
        # step is a prefill of a longer prefix.
        off = generate | dict(cache=False, new_tokens=tokens[1])
        jobs += [
            ("Generate, bundled Llama, first", "/generate", generate | dict(model="bundled-llama"), 0),
            (f"Generate, bundled, cache off, {tokens[1]} tokens", "/generate", off, 0),
            (
                f"Generate, bundled Llama, cache off, {tokens[1]} tokens",
                "/generate",
                off | dict(model="bundled-llama"),
                0,
            ),
            (f"Generate, SmolLM2-135M shape, {tokens[0]} tokens", "/generate", generate | dict(model=smollm2), 0),
            (f"Generate, SmolLM2-135M shape, cache off, {tokens[1]} tokens", "/generate", off | dict(model=smollm2), 0),
        ]
        jobs += [
            ("Compare (default controls)", "/compare", dict(), None),
            ("the ladder (bundled)", "/ladder", dict(model="bundled"), None),
            ("a sweep (the tab's defaults)", "/sweep", first_sweep, None),
            ("a sweep (layer_norm)", "/sweep", sweep, None),
        ]
        # Every lesson's first run in this server (its own kernels compiled on a GPU), then one again, warm.
        jobs += [(f"a lesson ({name}), first", "/lesson", dict(lesson=name), None) for name in lesson_names()]
        jobs.append(("a lesson (kv-cache), again", "/lesson", dict(lesson="kv-cache"), None))
        picked = [j for j in jobs if any(word.lower() in j[0].lower() for word in only.split(","))]
        for name, endpoint, params, text_at in picked:
            t1, submitted = time.monotonic(), time.time()
            seen = len([line for line in log if " job " in line])
            row = stamps(client.submit(**params, api_name=endpoint), t1, text_at, params.get("prompt", ""))
            time.sleep(0.2)  # the server logs the job's timeline as it ends
            logged = [line.split(" s  ", 1)[1] for line in log if " job " in line][seen:]
            rows.append(dict(job=name, endpoint=endpoint, params=params, server=logged, submitted=submitted) | row)
            print(f"{name}: {dict((k, v) for k, v in row.items() if k != 'stamps')}", flush=True)
        log.append(f"served after {started:.1f} s")
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
    return rows, "\n".join(log)


def in_process(rows: list[dict], device: str) -> None:
    """The same jobs run directly (explorer.app.jobs), each timed from its start: the handler's own side."""
    if device != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from explorer.app import estimate, jobs, models, settings, validate

    never = jobs.Control(lambda: False, float("inf"))
    d = settings.defaults(device, {"dtype": models.default_dtype()})
    for row in rows:
        p = row["params"]
        if row["endpoint"] == "/generate":
            s = settings.RunSettings(**{k: p.get(k, d[k]) for k in settings.RUN if k != "tiles"})
            payload, text_at = {"settings": s}, "text"
        elif row["endpoint"] == "/compare":
            s = settings.RunSettings(**{k: d[k] for k in settings.RUN if k != "tiles"})
            payload, text_at = {"settings": s, "lengths": settings.check("lengths", d["lengths"])}, None
        elif row["endpoint"] == "/lesson":
            payload, text_at = dict(lesson=p["lesson"]), None
        elif row["endpoint"] == "/ladder":
            payload, text_at = {"settings": settings.RunSettings(model=p["model"], dtype=d["dtype"])}, None
        else:
            shape = validate.shape("shape", p["shape"], estimate.sweep_keys(p["kernel"]))
            payload = dict(p, shape=shape, dtype=d["dtype"], value="ms")
            text_at = None
        t0 = time.monotonic()
        first = last = None
        previous = None
        for update in jobs.JOBS[row["endpoint"][1:]](payload, never):
            if text_at in update and update[text_at] != previous:
                now = time.monotonic() - t0
                if previous is not None:
                    first = first or now
                last, previous = now, update[text_at]
        row |= dict(handler_done_s=time.monotonic() - t0, handler_first_text_s=first, handler_all_text_s=last)


def tab_sweep(device: str) -> dict:
    from explorer.app import estimate, settings

    kernel, _ = settings.default_sweep(device)
    axes = estimate.sweep_axes(kernel)
    return dict(kernel=kernel, shape=settings.shape_text(kernel, device), x=axes[0], y=axes[1])


def lesson_names() -> list[str]:
    from explorer.app import lessons

    return lessons.names()


def logged_at(logged: list[str], what: str) -> float | None:
    """When the server's handler was asked for the job ("asked") or began it ("began"), epoch seconds, from
    its line for the job ("... (asked at 1764585123.401, began at 1764585123.456)")."""
    for line in logged:
        if f"{what} at " in line:
            return float(line.split(f"{what} at ", 1)[1].split(")", 1)[0].split(",", 1)[0])
    return None


def estimated(logged: list[str]) -> float | None:
    """The estimate the page showed for the job, from the server's line for it ("job generate (estimated
    2.10 s): ...")."""
    for line in logged:
        if "(estimated " in line:
            return float(line.split("(estimated ", 1)[1].split(" s)", 1)[0])
    return None


def shown_holds(guess: float, done: float) -> bool:
    """Whether the job's time fits the estimate as the page showed it (estimate.shown), within 1.5x: "under a
    second" is a bound (done within 1.5 s), "about 7 s" a value (done within 4.7-10.5 s)."""
    from explorer.app.estimate import shown

    said = shown(guess)
    if said == "under a second":
        return done <= 1.5
    number, unit = said.split()
    value = float(number) * (60 if unit == "min" else 1)
    return value / 1.5 <= done <= 1.5 * value


def table(rows: list[dict]) -> str:
    from explorer.app.estimate import shown

    def s(x):
        return "" if x is None else f"{x:.2f}"

    heads = ["job", "estimate", "to the handler", "to the job", "first text", "all text", "done"]
    heads += ["done / estimate", "shown", "updates", "longest gap"]
    heads += ["handler: first text", "all text", "done", "gap at done"]
    lines = ["| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]
    guesses = []  # (estimate, done) of each row with an estimate
    for r in rows:
        gap = r["done_s"] - r["handler_done_s"] if "handler_done_s" in r else None
        guess = estimated(r.get("server") or [])
        guesses += [(guess, r["done_s"])] if guess else []
        ratio = r["done_s"] / guess if guess else None
        said = f"{shown(guess)} {'(holds)' if shown_holds(guess, r['done_s']) else '(off)'}" if guess else ""
        asked, began = (logged_at(r.get("server") or [], what) for what in ("asked", "began"))
        reach = asked - r["submitted"] if asked and "submitted" in r else None
        wait = began - r["submitted"] if began and "submitted" in r else None
        lines.append(
            f"| {r['job']} | {s(guess)} | {s(reach)} | {s(wait)} | {s(r.get('first_text_s'))} "
            f"| {s(r.get('all_text_s'))} | {s(r['done_s'])} "
            f"| {s(ratio)} | {said} | {r['updates']} "
            f"| {s(r['longest_gap_s'])} | {s(r.get('handler_first_text_s'))} | {s(r.get('handler_all_text_s'))} "
            f"| {s(r.get('handler_done_s'))} | {s(gap)} |"
        )
    near = sum(1 / 1.5 <= d / g <= 1.5 for g, d in guesses)
    held = sum(shown_holds(g, d) for g, d in guesses)
    lines.append(f"\nwithin 1.5x of the estimate: {near} of {len(guesses)}; of the estimate as shown: {held}")
    lines.append(click_verdict(rows))
    return "\n".join(lines)


# every click done within this many seconds of submit once the app is ready, unless its own work is longer
CLICK_S = 3.0
STALL_S = 1.0  # a click slower than its handler's run by more than this waited on compilation


def click_verdict(rows: list[dict]) -> str:
    """Which clicks were done within CLICK_S of submit, which took longer on their own work (the same job run again
    in this process, its kernels read from Triton's cache, took longer too), and which waited on compilation."""
    quick = [r for r in rows if r["done_s"] <= CLICK_S]
    slow = [r for r in rows if r["done_s"] > CLICK_S]
    stalled = [r for r in slow if "handler_done_s" in r and r["done_s"] - r["handler_done_s"] > STALL_S]
    own = [r for r in slow if r not in stalled]

    def said(group, stall):
        return ", ".join(
            f"{r['job']} {r['done_s']:.1f} s"
            + (f" ({r['done_s'] - r['handler_done_s']:.1f} over its run again)" if stall else "")
            + ("" if stall or "handler_done_s" in r else " (not run again)")
            for r in group
        )

    out = f"done within {CLICK_S:.0f} s of submit: {len(quick)} of {len(rows)}"
    out += f"; longer, their own work: {said(own, False) or 'none'}"
    return out + f"; longer, waiting on compilation: {said(stalled, True) or 'none'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the rows and the server's log as JSON")
    parser.add_argument("--no-handler", action="store_true", help="skip the in-process timelines")
    parser.add_argument("--only", default="", help="rows whose name holds one of these words (warm,ladder)")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported (the lessons' names)
    folder = Path(tempfile.mkdtemp(prefix="gpt2-shaped-"))
    gpt2 = gpt2_shaped(folder)
    smollm2 = smollm2_shaped(Path(tempfile.mkdtemp(prefix="smollm2-shaped-")))
    rows, log = through_server(free_port(), gpt2, smollm2, device, args.only)
    if not args.no_handler:
        in_process(rows, device)
    print(log)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    print(f"\n{where}, torch {torch.__version__}; seconds from submit (through the server) or from the job's start")
    print(table(rows))
    print("\nThe server's own timeline of each job (its log):")
    for r in rows:
        print(f"- {r['job']}: {'; '.join(r.get('server') or ['(none logged)'])}")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=where, rows=rows, log=log), indent=1, default=str))


if __name__ == "__main__":
    main()
