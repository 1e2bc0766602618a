"""A real browser (Debian's chromium, driven by playwright) opens the app, clicks Generate and waits
for streamed tokens and a rendered chart, and runs lessons. The screenshots land in artifacts/."""

import os
import re
import shutil
from pathlib import Path

import pytest

from explorer.app import lessons
from explorer.measure.ladder import RUNGS
from tests.serve import running_app

pytestmark = pytest.mark.slow  # a server (and a browser) per test

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        if os.environ.get("EXPLORER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def url():
    """The app, started for each test: a job stopped or cut short in one test never holds the next."""
    with running_app() as address:
        yield address


@pytest.fixture(autouse=True)
def closed_after(browser):
    """Each test's pages close at its end, as a visitor's tab would: a job still running there is stopped."""
    yield
    for context in browser.contexts:
        context.close()


def test_generate_in_a_browser(browser, url):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    prompt = page.get_by_label("prompt", exact=True)
    prompt.fill("def greet(name):")
    page.get_by_role("button", name="Generate", exact=True).click()
    output = page.locator("#out textarea")
    # Tokens stream in: the output grows past the prompt while the run goes on.
    page.wait_for_function(
        "() => { const t = document.querySelector('#out textarea'); return t && t.value.length > 20; }",
        timeout=120_000,
    )
    # Plotly draws the charts into .js-plotly-plot elements with an SVG inside.
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=120_000)
    assert output.input_value().startswith("def greet(name):")
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / "generate.png"), full_page=True)
    assert (ARTIFACTS / "generate.png").stat().st_size > 10_000


WATCH_TEXT = """() => {
    window.textChanges = [];
    let last = null;
    setInterval(() => {
        const t = document.querySelector('#out textarea');
        if (t && t.value !== last) { last = t.value; window.textChanges.push([performance.now(), t.value]); }
    }, 20);
}"""


def test_the_text_streams_token_by_token_and_stop_stops_it(browser, url):
    """On CPU a token takes a good part of a second: a run of N tokens shows at least N/2 distinct texts as
    they are made, not all at the end; and Stop ends the run before its end, the summary saying so, and the text
    stays as it was when the page said so."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    tokens = page.get_by_label("number input for new tokens")
    tokens.fill("6")
    tokens.press("Enter")
    page.evaluate(WATCH_TEXT)
    page.get_by_role("button", name="Generate", exact=True).click()
    page.get_by_text("Done: 6 of 6 tokens.").wait_for(timeout=240_000)
    texts = [v for _, v in page.evaluate("window.textChanges") if v.startswith("def fibonacci(n):")]
    assert len(set(texts)) >= 6 / 2, texts
    # A longer run, stopped once its text is streaming (well inside the time budget, so that a busy
    # machine's slower first run cannot make its estimate a refusal).
    tokens.fill("60")
    tokens.press("Enter")
    page.evaluate("window.textChanges = []")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_function("() => window.textChanges.length >= 3", timeout=240_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    made = _stopped(page, 60)
    assert made < 60, "the run went on to its end"
    # Once the page says it stopped, its text stays as it is: no token made before the Stop lands after it.
    # (Checked by the text, not by a clock: on a busy machine a step in flight can take seconds.)
    shown = page.locator("#out textarea").input_value()
    page.wait_for_timeout(3000)
    assert page.locator("#out textarea").input_value() == shown, "the text changed after the page said it stopped"
    page.screenshot(path=str(ARTIFACTS / "stopped.png"), full_page=True)


def test_a_finished_run_and_the_memory_hierarchy_tab(browser, url):
    """A short run to its end: the summary names each clock, and the hierarchy tab shows both levels of
    traffic next to the hardware counters recorded on a GPU."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    page.get_by_label("prompt", exact=True).fill("def greet(name):")
    tokens = page.get_by_label("number input for new tokens")
    tokens.fill("3")
    tokens.press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    # The last update says where it timed the kernels: on CPU, in the run itself.
    page.get_by_text("reached max new tokens (3)").first.wait_for(timeout=240_000)
    page.get_by_role("cell", name="timed in the run itself, every step (CPU clock)").wait_for(timeout=240_000)
    page.wait_for_timeout(1000)
    body = page.inner_text("body")
    assert "tokens/s delivered (wall clock, first to last token)" in body
    assert "decode step p50 / p90 (CPU clock)" in body and "kernels are counted on a GPU" in body
    # Beside the interpreter's clock, the same job's GPU time: modeled here (this prompt was not recorded).
    assert "this CPU (interpreter)" in body and "NVIDIA H200 (modeled)" in body
    assert "Where a decode step goes (H200, modeled)" in body
    assert "KV cache growth" in body and "No GPU here" in body
    page.screenshot(path=str(ARTIFACTS / "generate-finished.png"), full_page=True)
    page.get_by_role("tab", name="Memory hierarchy").click()
    page.get_by_text("MB HBM (modeled)").wait_for(timeout=30_000)
    text = page.inner_text("body")
    assert "MB SM requests (tiles)" in text and "recorded on NVIDIA H200" in text
    assert "interpreter time" in text  # this CPU's own time per kernel, where it is labelled for what it is
    page.screenshot(path=str(ARTIFACTS / "hierarchy.png"), full_page=True)


def test_stop_says_so_and_the_sweep_table_starts_with_its_own_columns(browser, url):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    # The tile controls: each kernel's name on a line of its own, above controls wide enough to read.
    page.get_by_text("tiles (default").click()
    heading = page.get_by_text("decode attention", exact=True)
    heading.wait_for(timeout=10_000)
    assert heading.bounding_box()["width"] > 60  # not squeezed into a narrow column beside its controls
    page.screenshot(path=str(ARTIFACTS / "tiles.png"), full_page=True)
    tokens = page.get_by_label("number input for new tokens")
    tokens.fill("60")  # well inside the budget, so that a busy machine's estimate is not a refusal
    tokens.press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.get_by_role("cell", name="running").wait_for(timeout=120_000)
    page.get_by_role("button", name="Stop", exact=True).click()
    _stopped(page, 60)
    page.get_by_role("tab", name="Tile sweep").click()
    table = page.get_by_label("every config, impossible ones with the reason")
    page.get_by_text("why not").first.wait_for(timeout=30_000)
    headers = page.locator("th").all_inner_texts()
    assert any("why not" in h for h in headers) and not any(h.strip() in ("1", "2", "3") for h in headers)
    assert table is not None
    page.screenshot(path=str(ARTIFACTS / "stopped-and-sweep.png"), full_page=True)


def _stopped(page, tokens: int) -> int:
    """After Stop: the summary's row and the status line say the visitor stopped the run, and how far it got
    (on failure, what they said instead). Returns the tokens the status line says were made."""
    said = re.compile(rf"Stopped by you after (\d+) of {tokens} tokens\.")
    try:
        page.get_by_role("cell", name="by you, before the end").wait_for(timeout=30_000)
        page.get_by_text(said).wait_for(timeout=10_000)
    except Exception as e:
        status, summary = page.inner_text("#generate-status"), page.inner_text("#summary")
        pytest.fail(f"{type(e).__name__} after Stop; the status said {status!r}, the summary {summary!r}")
    return int(said.search(page.inner_text("#generate-status"))[1])


def _lesson_done(page, name: str, timeout_ms: int = 180_000):
    """Wait for the lesson's own measured explanation and its chart; return the explanation's text."""
    title = lessons.LESSONS[name].title
    page.locator("#lesson-live").get_by_text(f"{title}, measured just now").wait_for(timeout=timeout_ms)
    page.wait_for_selector("#lesson-plot .js-plotly-plot .main-svg", timeout=30_000)
    page.wait_for_timeout(1000)  # plotly's layout settles
    return page.locator("#lesson-live").inner_text()


def _measured_and_labelled(page, text: str):
    assert re.search(r"\d(\.\d+)? (ms|MB|µs)", text), text  # numbers with units, from the run
    assert "What to try next:" in text
    # Readable from the back of a room: the chart's title and tick labels in large type.
    assert float(page.locator("#lesson-plot .gtitle").first.evaluate("e => getComputedStyle(e).fontSize")[:-2]) >= 24
    assert (
        float(page.locator("#lesson-plot .ytick text").first.evaluate("e => getComputedStyle(e).fontSize")[:-2]) >= 18
    )
    recorded = page.locator("#lesson-recorded").inner_text()
    # Beside it, the lesson as recorded on the H200 (assets/recorded/lessons_h200.json), labelled with the
    # GPU and the date, its own chart drawn too.
    assert re.search(r"recorded on NVIDIA H200, \d{4}-\d\d-\d\d", recorded), recorded
    assert re.search(r"\d(\.\d+)? (ms|MB|µs)", recorded), recorded
    page.wait_for_selector("#lesson-recorded-plot .js-plotly-plot .main-svg", timeout=30_000)


# The lessons clicked in turn below. Every lesson's page is drawn the same way (its explanation and its chart), and
# each one's run and text are tested at the handler (test_lessons); here, the kinds of chart no other browser test
# draws: a tile heatmap and the two blocks side by side. The memory lesson's bandwidth curve is drawn in talk mode,
# the ladder's bars on the Compare tab, and the KV-cache lesson runs by its link and after the decode-step one
# (test_the_rough_edges_a_newcomer_found).
CLICKED = ("tiling", "blocks")


def test_lessons_in_a_browser(browser, url):
    """One click on a lesson runs it, and the next click the next; the explanation quotes the run; the
    screenshots land in artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Lessons").click()
    labels = dict((n, label) for label, n in lessons.choices())
    assert set(CLICKED) <= set(lessons.LESSONS)
    for name in CLICKED:
        page.get_by_text(labels[name], exact=True).click()
        text = _lesson_done(page, name)
        _measured_and_labelled(page, text)
        page.screenshot(path=str(ARTIFACTS / f"lesson-{name}.png"), full_page=True)


def test_a_lesson_link_opens_and_runs_it_and_sets_the_controls(browser, url):
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url + "?lesson=kv-cache", wait_until="load")
    text = _lesson_done(page, "kv-cache")
    _measured_and_labelled(page, text)
    assert page.get_by_role("tab", name="Lessons").get_attribute("aria-selected") == "true"
    assert page.get_by_label("3. The KV cache on and off").is_checked()
    page.screenshot(path=str(ARTIFACTS / "lesson-link.png"), full_page=True)
    # The Generate tab now holds the lesson's job: cache off, its token counts.
    page.get_by_role("tab", name="Generate").click()
    s = lessons.LESSONS["kv-cache"].settings(lessons.size())
    assert not page.get_by_label("KV cache", exact=True).is_checked()
    assert page.get_by_label("number input for new tokens").input_value() == str(s["new_tokens"])
    assert "Estimate: " in page.inner_text("body")  # the note under Generate follows the controls
    # A link to a lesson that does not exist says so and runs nothing.
    page.goto(url + "?lesson=nope", wait_until="load")
    page.get_by_text("There is no lesson 'nope'").wait_for(timeout=30_000)
    assert page.get_by_role("tab", name="Lessons").get_attribute("aria-selected") == "true"


def test_compare_the_ladder_and_export_in_a_browser(browser, url):
    """Compare at its CPU default prompt length with 2 new tokens (the default's own time is benchmarks/page.py's
    to measure), the fusion ladder under it, then the compare table exported."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    tokens = page.get_by_label("number input for new tokens")
    tokens.fill("2")
    tokens.press("Enter")
    page.get_by_role("tab", name="Compare").click()
    page.get_by_role("button", name="Compare cache on/off, backends and launches").click()
    page.get_by_text("all 4 runs").first.wait_for(timeout=240_000)  # both backends, cache on and off
    page.get_by_role("button", name="Climb the fusion ladder (one decode step per rung)").click()
    page.get_by_text(f"all {len(RUNGS)} rungs").first.wait_for(timeout=240_000)
    page.wait_for_timeout(1500)  # plotly's layout settles
    body = page.inner_text("body")
    assert "The fusion ladder: one decode step at context 16" in body
    assert "launches per step (modeled: no GPU)" in body
    assert re.search(r"\b(µs|ms|s) per step \(interpreter, CPU\)", body)  # the unit follows the times
    table = page.locator("#ladder-table").inner_text()
    rungs = ("none", "epilogue", "decode", "overlap", "torch")
    assert "× torch" in table and all(rung in table for rung in rungs), table
    # The latency chart: runs named short, on a log axis where the torch lines would sit at zero.
    assert page.locator(".js-plotly-plot .ytick text").count() > 0
    page.screenshot(path=str(ARTIFACTS / "compare.png"), full_page=True)
    page.get_by_role("tab", name="Export").click()
    page.get_by_label("compare", exact=True).check()
    page.get_by_role("button", name="Export", exact=True).click()
    link = page.locator("a[download]")  # the file's download link, named after its table
    link.wait_for(timeout=30_000)
    assert link.get_attribute("download") == "compare.csv" and "KB" in link.inner_text()
    page.screenshot(path=str(ARTIFACTS / "export.png"), full_page=True)


def test_the_rough_edges_a_newcomer_found(browser, url):
    """Examples show their line breaks and fill the prompt with them; Compare's and the ladder's tables start
    with their own columns; "Run the lesson again" with none picked says what to do; a lesson picked while
    another runs stops that one and runs, its own chart replacing the other's."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(url, wait_until="load")
    example = page.get_by_text("import os ⏎ import sys ⏎ ⏎ ⏎ def main(")
    example.click()
    page.wait_for_function(
        "() => document.querySelector('textarea').value.startsWith('import os\\nimport sys\\n\\n\\ndef main(')",
        timeout=10_000,
    )
    page.get_by_role("tab", name="Compare").click()
    page.get_by_text("per run").first.wait_for(timeout=10_000)
    headers = [h.strip() for h in page.locator("th").all_inner_texts() if h.strip()]
    assert "prompt_tokens" in headers and "rung" in headers and not {"1", "2", "3"} & set(headers), headers
    page.get_by_role("tab", name="Lessons").click()
    page.get_by_role("button", name="Run the lesson again").click()
    page.get_by_text("Pick a lesson above first").wait_for(timeout=30_000)
    assert page.locator(".toast-body").count() == 0  # no red error
    labels = dict((n, label) for label, n in lessons.choices())
    page.get_by_text(labels["decode-step"], exact=True).click()
    page.get_by_text("Running the decoder block: where").wait_for(timeout=30_000)
    page.get_by_text(labels["kv-cache"], exact=True).click()
    try:
        text = _lesson_done(page, "kv-cache", timeout_ms=60_000)
    finally:
        page.screenshot(path=str(ARTIFACTS / "rough-edges.png"), full_page=True)
    assert "The KV cache on and off, measured just now" in text
    page.wait_for_timeout(3000)  # the decode-step lesson, stopped, must not come back over it
    assert "The KV cache on and off, measured just now" in page.locator("#lesson-live").inner_text()
    page.screenshot(path=str(ARTIFACTS / "rough-edges.png"), full_page=True)


TALK = {"width": 1280, "height": 720}  # a projector


def _on_screen(page, selector: str) -> dict:
    """The element's box, asserted to lie within the viewport (scrolled to the top of the page)."""
    box = page.locator(selector).bounding_box()
    assert box is not None, f"{selector} is not drawn"
    inside = box["x"] >= 0 and box["y"] >= 0
    inside = inside and box["x"] + box["width"] <= TALK["width"] + 1 and box["y"] + box["height"] <= TALK["height"] + 1
    assert inside, f"{selector} at {box} is not within the {TALK['width']}x{TALK['height']} screen"
    return box


def test_talk_mode_fits_generate_and_a_lesson_on_one_projector_screen(browser, url):
    """/?talk=1 at 1280x720: after Generate, the summary and the latency chart on the first screen, in larger type;
    after a lesson, its chart and its explanation. The screenshots land in artifacts/ (talk-*.png)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport=TALK)
    page.goto(url + "?talk=1", wait_until="load")
    page.wait_for_function("() => document.body.classList.contains('talk')", timeout=30_000)
    tokens = page.get_by_label("number input for new tokens")
    tokens.fill("4")
    tokens.press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.get_by_text(re.compile(r"Done: \d+ of \d+ tokens")).wait_for(timeout=240_000)
    page.wait_for_selector("#latency-plot .js-plotly-plot .main-svg", timeout=60_000)
    page.wait_for_timeout(1000)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "talk-generate.png"))
    for selector in ("#summary", "#latency-plot", "#generate-status", "#out"):
        _on_screen(page, selector)
    assert page.locator("#summary").get_by_text("tokens/s").first.is_visible()
    size = page.locator("#out textarea").evaluate("e => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 18, size
    page.get_by_role("tab", name="Lessons").click()
    labels = dict((n, label) for label, n in lessons.choices())
    page.get_by_text(labels["memory"], exact=True).click()
    _lesson_done(page, "memory")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "talk-lesson.png"))
    for selector in ("#lesson-plot", "#lesson-live"):
        _on_screen(page, selector)
