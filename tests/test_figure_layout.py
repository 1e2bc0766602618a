"""The figures drawn by plotly.js in a real browser (Debian's chromium, driven by playwright) at the width the
app gives them: nothing is cut off at the edges, and a legend leaves the plot room to be read.

The Generate tab sets two charts side by side in two thirds of the page: about 380 px each on a laptop.
"""

import math
import os
import shutil
from pathlib import Path

import pandas as pd
import plotly
import pytest

from explorer.app import plots

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
NARROW = 380
# What every figure's parts measured in the page: the SVG, its title, the plot area, the legend, x-axis title.
MEASURE = """() => {
    const box = (sel) => { const e = document.querySelector(sel); if (!e) return null;
        const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom,
        height: r.height, width: r.width}; };
    const svg = box('.main-svg');
    const plot = box('.nsewdrag') || box('.pielayer .trace');
    return {svg, title: box('.g-gtitle'), plot, legend: box('.legend'), xtitle: box('.g-xtitle')};
}"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    playwright = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        if os.environ.get("EXPLORER_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing; .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    folder = tmp_path_factory.mktemp("figures")
    shutil.copy(PLOTLY_JS, folder / "plotly.min.js")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        tab = browser.new_page(viewport={"width": 1300, "height": 1000})

        def draw(fig, width=NARROW):
            """Lay the figure out at `width` px, as the app's column would, and measure its parts."""
            fig = plots.go.Figure(fig).update_layout(width=width)
            path = folder / "figure.html"
            fig.write_html(path, include_plotlyjs="directory")
            tab.goto(path.as_uri())
            tab.wait_for_selector(".main-svg")
            return tab.evaluate(MEASURE)

        yield draw
        browser.close()


def _kernels(kinds: list[str], steps: int = 8, ms: float = 700.0) -> pd.DataFrame:
    """One row per (step, kind), with interpreter-sized times: hundreds of ms per operation."""
    rows = [
        dict(
            step=s,
            phase="prefill" if s == 0 else "decode",
            kind=k,
            hbm_mb=5.0 + i,
            modeled_mb=7.0 + i,
            floor_mb=4.0 + i,
            gflop=0.01,
            kernel_ms=ms + i,
            launch_ms=math.nan,
            profiled_step=s,
        )
        for s in range(steps)
        for i, k in enumerate(kinds)
    ]
    return pd.DataFrame(rows)


def _inside(part, svg, slack=1.0):
    return part["left"] >= svg["left"] - slack and part["right"] <= svg["right"] + slack


@pytest.mark.parametrize(
    "note",
    [
        "CPU timings (Triton interpreter); timed at decode positions 9, 11, 12; other steps use the nearest",
        # the GPU's answer beside a CPU run: three lines under the title
        "NVIDIA H200, modeled: each kernel's HBM bytes at its measured 4,187 GB/s (a floor). This CPU's time per "
        "kernel is in the Memory hierarchy tab.",
    ],
)
def test_the_decode_step_pie_shows_its_whole_subtitle(page, note):
    m = page(plots.kernel_share_figure(_kernels(list(plots.KIND_COLORS)), note, "CPU time"))
    assert _inside(m["title"], m["svg"]) and m["title"]["top"] >= m["svg"]["top"]
    assert m["title"]["bottom"] <= m["plot"]["top"]  # above the pie, not over it
    assert m["plot"]["height"] >= 180  # the pie itself, with nine kinds in its legend


def test_the_traffic_legend_leaves_the_plot_readable_whatever_the_number_of_kinds(page):
    for kinds in (["ffn"], list(plots.KIND_COLORS)):
        fig = plots.traffic_figure(_kernels(kinds), "bytes from each kernel's traffic model at the chosen tiles")
        for width in (NARROW, 800):
            m = page(fig, width)
            assert m["plot"]["height"] >= 240, (len(kinds), width, m["plot"])
            assert _inside(m["title"], m["svg"]) and _inside(m["legend"], m["svg"])
            assert m["legend"]["top"] >= m["xtitle"]["bottom"]  # below the axis title, not over it
            assert m["legend"]["bottom"] <= m["svg"]["bottom"]


@pytest.mark.parametrize(
    "name", ["memory", "decode-step", "kv-cache", "tiling", "cuda-graphs", "prefill-decode", "fusion"]
)
def test_a_lessons_chart_keeps_its_legend_and_title_clear_of_the_plot(page, name):
    from explorer.app import lessons, recordings
    from explorer.app.lessons import recorded

    r = recorded.load(recordings.FOLDER / "lessons_h200.json").results[name]
    m = page(lessons.LESSONS[name].figure(r), 620)  # beside the GPU recording, half the page
    assert _inside(m["title"], m["svg"]) and m["title"]["bottom"] <= m["plot"]["top"]
    assert m["plot"]["height"] >= 200, m["plot"]  # the top one of two, in the tiling lesson
    if m["legend"] and m["legend"]["top"] > m["plot"]["bottom"]:  # a legend under the plot
        assert m["xtitle"] is None or m["legend"]["top"] >= m["xtitle"]["bottom"], (m["legend"], m["xtitle"])
        assert m["legend"]["bottom"] <= m["svg"]["bottom"]
