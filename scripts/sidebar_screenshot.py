"""Take the README's picture of the sidebar beside a notebook: ``docs/sidebar.png``.

Runs JupyterLab in a temp dir (as tests/ui does), a notebook with a 4-rank mesh that trained a
few hundred steps logging its loss and learning rate (rank 1's loss drifts away, so its chart
marks it), then one rank was killed, one is paused at a breakpoint and two run a long cell.
Usage: ``python scripts/sidebar_screenshot.py [OUT.png [DEFAULT_WIDTH.png]]`` (needs the dev
extras and chromium): OUT.png with the sidebar widened, as in the README; DEFAULT_WIDTH.png, if
given, the sidebar alone at JupyterLab's default width, taken first (both are worth a look
after a change to the sidebar's layout).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "ui"), str(ROOT / "tests")]

from playwright.sync_api import expect, sync_playwright  # noqa: E402
from ui_support import CHROMIUM, WAIT_MS, Lab  # noqa: E402

CELLS = [
    'import actormesh as am\nprocs = am.this_host().spawn_procs(per_host={"gpus": 4})',
    "class Trainer(am.Actor):\n"
    "    @am.endpoint\n"
    "    def step(self, lr: float) -> float:\n"
    "        return lr * am.current_rank().rank\n\n"
    'trainers = procs.spawn("trainer", Trainer)\n'
    "trainers.step.call(0.1).get()",
    "%%mesh procs\n"
    "import math, random\n"
    "import actormesh as am\n"
    "for step in range(300):\n"
    "    loss = 2.4 * math.exp(-step / 80) + 0.08 * random.random()\n"
    "    if rank == 1 and step > 200:\n"
    "        loss += 0.01 * (step - 200)  # this rank drifts away\n"
    '    am.log_metrics({"loss": loss, "lr": 0.1 * 0.995**step}, step=step)',
    "%%mesh procs --ranks 3\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "%%mesh procs --ranks 2\nloss = 0.25\nbreakpoint()\nloss = loss / 2",
    "%%mesh procs --ranks 0:2\nimport time\n\nfor step in range(3000):\n    time.sleep(0.1)",
]


def main(out: Path, narrow: Path | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(Path(tmp))
        lab.start()
        try:
            name = lab.notebook("train.ipynb", CELLS)
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
                )
                page = browser.new_page(viewport={"width": 1360, "height": 1000})
                page.set_default_timeout(WAIT_MS)
                expect.set_options(timeout=WAIT_MS)
                page.goto(f"{lab.url}/lab/workspaces/shot/tree/{name}?token={lab.token}")
                page.wait_for_selector(".jp-NotebookPanel")
                page.click(".jp-SideBar [data-id='actormesh-sidebar']")
                expect(page.locator("#actormesh-sidebar [data-connection='live']")).to_have_count(1)
                cells = page.locator(".jp-NotebookPanel .jp-Cell")
                for i in range(len(CELLS)):
                    cells.nth(i).locator(".jp-InputArea-editor").click()
                    page.keyboard.press("Shift+Enter")
                    if i < len(CELLS) - 1:
                        prompt = cells.nth(i).locator(".jp-InputPrompt")
                        expect(prompt).to_have_text(re.compile(r"\[\d+\]"))
                rows = page.locator("#actormesh-sidebar .jp-actormesh-rank")
                busy = page.locator("#actormesh-sidebar .jp-actormesh-rank[data-state='busy']")
                expect(busy).to_have_count(2)
                paused = page.locator("#actormesh-sidebar .jp-actormesh-rank[data-state='paused']")
                expect(paused).to_have_count(1)
                loss = page.locator("#actormesh-sidebar .jp-actormesh-chart[data-metric='loss']")
                expect(loss).to_have_attribute("data-lines", "4")
                expect(loss).to_have_attribute("data-stray", "1")
                cpu = page.locator("#actormesh-sidebar .jp-actormesh-chart[data-resource='cpu']")
                # rank 3 may die before its agent's first sample: 3 lines then
                expect(cpu).to_have_attribute("data-lines", re.compile("^[34]$"))
                page.locator(".jp-NotebookPanel .jp-Cell").nth(5).click()
                page.locator(".jp-NotebookPanel .jp-Cell").nth(0).scroll_into_view_if_needed()
                elapsed = rows.first.locator(".jp-actormesh-elapsed")
                expect(elapsed).to_have_text(re.compile(r"^[4-9] s$"))
                if narrow is not None:
                    page.locator("#actormesh-sidebar").screenshot(path=str(narrow))
                chart = "#actormesh-sidebar .jp-actormesh-chart canvas"
                before = page.locator(chart).first.evaluate("c => c.clientWidth")
                # Widen the sidebar: drag the handle between it and the notebook.
                handle = page.locator(".lm-SplitPanel-handle:visible").first
                box = handle.bounding_box()
                assert box is not None
                page.mouse.move(box["x"] + 2, box["y"] + 300)
                page.mouse.down()
                page.mouse.move(box["x"] + 200, box["y"] + 300, steps=5)
                page.mouse.up()
                page.locator(".jp-NotebookPanel .jp-Cell").nth(0).scroll_into_view_if_needed()
                page.wait_for_function(  # the charts redrawn at the new width
                    f"document.querySelector({chart!r}).clientWidth > {before + 150}"
                )
                page.screenshot(path=str(out))
                browser.close()
        finally:
            lab.shutdown_kernels()
            lab.stop()
    print(f"wrote {out}")


if __name__ == "__main__":
    main(
        Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "sidebar.png",
        Path(sys.argv[2]) if len(sys.argv) > 2 else None,
    )
