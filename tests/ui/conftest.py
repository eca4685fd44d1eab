"""UI tier: a real JupyterLab server with the built sidebar, driven in headless Chromium.

The browser is Debian's ``chromium`` (``scripts/install-browser.sh``), driven by Python
Playwright without any download. The tests skip when it is missing, unless
``ACTORMESH_UI_TESTS=1`` (CI sets it), where a missing browser fails them.

One server per module; each test gets its own JupyterLab workspace and, at teardown, every
kernel the test started is shut down through the REST API and waited for, so the leak check of
the root conftest sees no process left. Screenshots go to ``tests/ui/screenshots/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ui_support import BUILT, CHROMIUM, SCREENSHOTS, WAIT_MS, Lab, running

pytest.importorskip("jupyterlab")
playwright_sync = pytest.importorskip("playwright.sync_api")


def _require_browser() -> None:
    if Path(CHROMIUM).exists():
        return
    message = f"no chromium at {CHROMIUM}: run scripts/install-browser.sh (or set CHROMIUM)"
    if os.environ.get("ACTORMESH_UI_TESTS") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(autouse=True)
def no_leaked_processes(lab: Lab) -> Iterator[None]:
    """The UI tier's leak check (it replaces the root one): the processes below the lab server
    (kernels, host agents, workers) must be gone when a test ends. Chromium's own helper
    processes come and go as it likes; the browser fixture closes them all at module end."""
    before = set(lab.kernel_tree())
    yield
    lab.shutdown_kernels()  # and waits until every process below the server has exited
    left = [pid for pid in lab.kernel_tree() if pid not in before and running(pid)]
    assert not left, f"processes left below the lab server: {left}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    _require_browser()
    if not (BUILT / "package.json").exists():
        pytest.fail(
            f"the sidebar is not built ({BUILT} is missing): run `pip install -e .` or "
            "`cd labextension && jlpm install && jlpm build:prod`"
        )
    server = Lab(tmp_path_factory.mktemp("lab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser_context(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    profile = tmp_path_factory.mktemp("chromium-profile")
    with playwright_sync.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                # No spare renderer started in the background: the leak check would see it.
                "--disable-features=SpareRendererForSitePerProcess",
            ],
            viewport={"width": 1500, "height": 900},
        )
        context.set_default_timeout(WAIT_MS)
        playwright_sync.expect.set_options(timeout=WAIT_MS)
        try:
            yield context
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def module_page(browser_context: Any) -> Iterator[Any]:
    """One page (one renderer process) for the module, made before any test's leak check."""
    page = browser_context.new_page()
    page.console_messages = []
    page.on("console", lambda msg: page.console_messages.append(f"{msg.type}: {msg.text}"))
    yield page
    page.close()


@pytest.fixture
def page(lab: Lab, module_page: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The module's page for this test; on failure a screenshot, the console and the server
    log are saved under tests/ui/screenshots/. Every kernel the test started is shut down."""
    module_page.console_messages.clear()
    try:
        yield module_page
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            SCREENSHOTS.mkdir(exist_ok=True)
            stem = SCREENSHOTS / f"FAILED-{request.node.name}"
            try:
                module_page.screenshot(path=f"{stem}.png")
            except Exception:
                pass
            Path(f"{stem}.console.txt").write_text("\n".join(module_page.console_messages))
            Path(f"{stem}.lab.log").write_text(lab.log())
            Path(f"{stem}.kernel-stacks.txt").write_text(lab.kernel_stacks())
        module_page.goto("about:blank")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
