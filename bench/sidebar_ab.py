"""A/B of two builds of the sidebar: main-thread time on updates with 64 ranks and 10 metrics.

Each run starts a fresh JupyterLab (``tests/ui/ui_support.Lab``) serving one build and a fresh
headless Chromium, and feeds the panel the UI test's load (``FEED_64`` in
``tests/ui/test_charts.py``: a snapshot of 64 ranks, 300 s of history, then 10 s of updates);
the figure is the page's own performance measures (render, series message, chart redraws) per
second. Builds alternate A B B A A B ... so that the machine's drift falls on both.

A build is a copy of ``actormesh/labextension`` as ``jlpm build:prod`` leaves it, e.g.:
    (cd labextension && jlpm build:prod) && cp -r actormesh/labextension /tmp/ext-b
Run:  python bench/sidebar_ab.py /tmp/ext-a /tmp/ext-b [--runs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "ui"), str(REPO / "tests")]

import ui_support  # noqa: E402  # the UI tier's lab and browser, on the path just above
from playwright.sync_api import sync_playwright  # noqa: E402
from test_charts import FEED_64, set_sidebar_width  # noqa: E402

SECONDS, HISTORY = 10, 300


def one_run(build: str) -> dict[str, Any]:
    ui_support.BUILT = Path(build)  # what Lab.start links as the actormesh extension
    tmp = Path(tempfile.mkdtemp(prefix="am-sidebar-ab-"))
    lab = ui_support.Lab(tmp)
    lab.start()
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(tmp / "chromium"),
                executable_path=ui_support.CHROMIUM,
                headless=True,
                args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
                viewport={"width": 1500, "height": 900},
            )
            try:
                context.set_default_timeout(ui_support.WAIT_MS)
                page = context.new_page()
                page.goto(f"{lab.url}/lab/workspaces/load?token={lab.token}")
                page.click(".jp-SideBar [data-id='actormesh-sidebar']")
                page.wait_for_selector("#actormesh-sidebar")
                set_sidebar_width(page, 420)
                out: dict[str, Any] = page.evaluate(FEED_64, [SECONDS, HISTORY])
            finally:
                context.close()
    finally:
        lab.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["ms_per_s"] = out["total"] / out["seconds"]
    out["load_1min"] = os.getloadavg()[0]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--runs", type=int, default=4, help="runs of each build")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {args.a: [], args.b: []}
    for i in range(args.runs):
        for build in (args.a, args.b) if i % 2 == 0 else (args.b, args.a):
            out = one_run(build)
            figures[build].append(out["ms_per_s"])
            print(f"{build}: {out['ms_per_s']:.2f} ms/s  {json.dumps(out)}", flush=True)
    for build, values in figures.items():
        print(f"{build}: median {statistics.median(values):.2f} ms/s over {values}")


if __name__ == "__main__":
    main()
