"""What a visitor sees when something goes wrong off the default path: tiles that cannot fit refused in the page's
words with the largest value that fits, a failed run said in the status line over the last good run's panels, the
table a job just made offered first for export, the CUDA graph box on a CPU."""

import asyncio

import gradio as gr
import pandas as pd
import pytest
import torch

from explorer.app import failed, handlers, jobs, lessons, models, settings, ui
from explorer.app.errors import UserError
from explorer.app.runner import InlineRunner
from kernels import TileConfig
from kernels.config import CPU_SHARED_MEMORY

NEVER = jobs.Control(lambda: False, float("inf"))
ITEMSIZE = {"float32": 4, "float16": 2}


def largest_fitting(choices, need) -> int:
    """The reference: the largest choice whose shared memory `need(choice)` fits the interpreter's limit."""
    return max(c for c in choices if need(c) <= CPU_SHARED_MEMORY)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's documented shared memory")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_decode_tiles_that_cannot_fit_name_the_controls_and_the_largest_value_that_fits(dtype):
    # The decode-shaped matmul's K loop holds one 16-row x tile and one block_k x block_n weight tile (one stage on
    # CPU): (16 + block_n) * block_k elements.
    size = ITEMSIZE[dtype]
    choices = settings.TILE_CHOICES["linear_decode"]
    block_k = largest_fitting(choices["block_k"], lambda k: (16 + 256) * k * size)
    block_n = largest_fitting(choices["block_n"], lambda n: (16 + n) * 256 * size)
    tiles = settings.Tiles(linear_decode=TileConfig(block_n=256, block_k=256))
    s = settings.RunSettings(new_tokens=2, dtype=dtype, tiles=tiles)
    with pytest.raises(UserError) as refused:
        list(jobs.JOBS["generate"]({"settings": s}, NEVER))
    message = str(refused.value)
    assert message.startswith("Tiles, linear decode: block_n 256 and block_k 256 need about ")
    assert f"{(16 + 256) * 256 * size // 1024} KiB of shared memory" in message
    assert f"The largest block_n that fits with block_k 256 is {block_n}" in message
    assert f"the largest block_k that fits with block_n 256 is {block_k}" in message
    assert "TileConfig" not in message and "linear:" not in message, "the kernel's own names are not the page's"
    # The values it names do run.
    for fits in (TileConfig(block_n=256, block_k=block_k), TileConfig(block_n=block_n, block_k=256)):
        s = settings.RunSettings(new_tokens=1, dtype=dtype, tiles=settings.Tiles(linear_decode=fits))
        assert list(jobs.JOBS["generate"]({"settings": s}, NEVER))[-1]["state"]["steps"] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's documented shared memory")
def test_attention_tiles_that_cannot_fit_name_one_field_when_one_was_chosen():
    # Decode attention holds block_n keys and values of head_dim (the bundled model's 64) in fp32, and a 16-row tile
    # of probabilities on its way to the product with V.
    head_dim = 64
    need = lambda n: (2 * n * head_dim + 16 * n) * 4  # noqa: E731
    block_n = largest_fitting(settings.TILE_CHOICES["decode_attention"]["block_n"], need)
    tiles = settings.Tiles(decode_attention=TileConfig(block_n=256))
    s = settings.RunSettings(new_tokens=2, dtype="float32", tiles=tiles)
    refusal = rf"^Tiles, decode attention: block_n 256 needs about {need(256) // 1024} KiB .* fits is {block_n}, or"
    with pytest.raises(UserError, match=refusal):
        list(jobs.JOBS["generate"]({"settings": s}, NEVER))


def test_compare_refuses_tiles_that_cannot_fit_before_its_first_run_in_the_same_words():
    tiles = settings.Tiles(linear_decode=TileConfig(block_n=256, block_k=256))
    s = settings.RunSettings(new_tokens=2, dtype="float32", tiles=tiles)
    updates = jobs.JOBS["compare"]({"settings": s, "lengths": [4, 9]}, NEVER)
    with pytest.raises(UserError, match=r"^Tiles, linear decode: block_n 256 and block_k 256 need about "):
        next(updates)  # not even the fusion chart: nothing ran


def collect(agen) -> list:
    async def go():
        return [x async for x in agen]

    return asyncio.run(go())


def test_a_failure_on_the_page_is_one_status_line_over_the_last_good_runs_panels():
    async def refused(*_):
        yield gr.skip(), gr.skip(), "Starting the job worker…", gr.skip()  # a status only: no panel filled yet
        raise gr.Error("Tiles, linear decode: too large.")

    async def broke(*_):
        yield "def f(", gr.skip(), "1 of 10 tokens", {"steps": 1}  # the text panel filled by this run
        raise gr.Error("The run failed: boom")

    *_, last = collect(failed.on_page(refused, 4, 2, [0, 1])())
    assert last[2] == "**Failed:** Tiles, linear decode: too large. " + failed.KEPT
    assert [last[i] for i in (0, 1, 3)] == [gr.skip()] * 3, "the panels and the state stay as they were"
    *_, last = collect(failed.on_page(broke, 4, 2, [0, 1])())
    assert last[2].startswith("**Failed:** The run failed: boom") and failed.CLEARED in last[2]
    assert last[:2] == (None, None) and last[3] == gr.skip(), "a half-shown run is cleared, the state kept"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's documented shared memory")
def test_a_generate_refused_in_the_job_says_so_in_its_status_and_keeps_the_panels():
    ctx = handlers.Context(InlineRunner(), device=models.device().type)
    generate = handlers.make(ctx)["generate"]
    d = settings.defaults(ctx.device, {"dtype": models.default_dtype()})
    values = {n: d[n] for n in [*settings.RUN, "overlay", *settings.TILES]}
    values |= dict(new_tokens=2, linear_decode_block_n="256", linear_decode_block_k="256")
    names = [*handlers.GENERATE_OUT, "state"]
    page = failed.on_page(generate, len(names), names.index("status"), list(range(len(names) - 2)))
    *_, last = collect(page(values, handlers.NEW_STATE))
    shown = dict(zip(names, last, strict=True))
    assert shown["status"].startswith("**Failed:** Tiles, linear decode: block_n 256 and block_k 256 need about")
    assert shown["status"].endswith(failed.KEPT)
    assert all(v == gr.skip() for n, v in shown.items() if n != "status")
    with pytest.raises(gr.Error, match="Tiles, linear decode"):  # the API's endpoint: the handler, an error
        collect(generate(values, handlers.NEW_STATE))


def test_export_offers_the_table_the_last_job_made():
    offer = ui._offer("compare")
    assert offer({"compare": pd.DataFrame({"x": [1]})}) == gr.update(value="compare")
    assert offer(handlers.NEW_STATE) == gr.skip(), "a job that made no table leaves the choice as it was"
    export = handlers.make(handlers.Context(InlineRunner()))["export"]
    made = dict(handlers.NEW_STATE, ladder=pd.DataFrame({"rung": ["none"], "ms": [1.0]}))
    with pytest.raises(gr.Error, match="Nothing to export yet as last run: steps: run it first, or export fusion"):
        export({"which": "last run: steps", "fmt": "csv"}, made)
    assert pd.read_csv(export({"which": "fusion ladder", "fmt": "csv"}, made)).rung.tolist() == ["none"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a page without a GPU shows")
def test_the_cuda_graph_box_is_unticked_and_disabled_on_a_cpu_and_says_why():
    with ui.build(handlers.Context(InlineRunner(), device="cpu")) as demo:
        pass
    (box,) = [b for b in demo.blocks.values() if getattr(b, "label", None) == "CUDA graph"]
    assert box.value is False and box.interactive is False and "need a GPU" in box.info
    # What a lesson sets it to on this device: unticked too (lessons on a CPU run without graphs).
    for name in lessons.names():
        chosen = lessons.LESSONS[name]
        assert not chosen.controls(chosen.settings(lessons.size())).get("cuda_graph", False)
