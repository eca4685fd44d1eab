"""The sidebar end to end: JupyterLab in headless Chromium, a notebook on the actormesh kernel,
a 4-rank mesh, and the panel's states and controls as a user sees and clicks them.

Screenshots land in tests/ui/screenshots/ (look at them: the assertions cannot tell whether
the panel is readable)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from playwright.sync_api import expect
from ui_support import Lab, shot

pytestmark = pytest.mark.timeout(400)  # a lab, a browser, kernels and meshes on 2 cores

SIDEBAR = "#actormesh-sidebar"
ROWS = f"{SIDEBAR} .jp-actormesh-rank"
SPAWN4 = 'import actormesh as am\nprocs = am.this_host().spawn_procs(per_host={"gpus": 4})'


def open_notebook(page: Any, lab: Lab, name: str, workspace: str) -> None:
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{name}?token={lab.token}")
    page.wait_for_selector(".jp-NotebookPanel")
    page.click(".jp-SideBar [data-id='actormesh-sidebar']")
    expect(page.locator(SIDEBAR)).to_be_visible()


def notebook(page: Any) -> Any:
    return page.locator(".jp-NotebookPanel:visible")


def run_cell(page: Any, index: int) -> Any:
    """Run cell ``index`` of the visible notebook (Shift+Enter); returns the cell."""
    cell = notebook(page).locator(".jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    return cell


def wait_done(cell: Any) -> None:
    expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[\d+\]"))


def expect_live(page: Any) -> None:
    """The panel subscribed: the kernel runs and answers (only then may cells run)."""
    expect(page.locator(f"{SIDEBAR} [data-connection='live']")).to_have_count(1)


# The panel gives a subscribe request this long to be answered (labextension/src/model.ts).
SUBSCRIBE_TIMEOUT_S = 20.0


def record_connection_states(page: Any) -> None:
    """Keep every connection state the panel shows from now on (see ``connection_states``)."""
    page.evaluate(
        """() => {
          const sidebar = document.querySelector('#actormesh-sidebar');
          window.amConnectionStates = [];
          const note = () => {
            const el = sidebar.querySelector('[data-connection]');
            const states = window.amConnectionStates;
            const state = el ? el.dataset.connection : null;
            if (state !== states[states.length - 1]) states.push(state);
          };
          note();
          new MutationObserver(note).observe(sidebar, {
            subtree: true, childList: true, attributes: true
          });
        }"""
    )


def connection_states(page: Any) -> list[str | None]:
    return list(page.evaluate("() => window.amConnectionStates"))


def expect_states(page: Any, *states: str) -> None:
    rows = page.locator(ROWS)
    expect(rows).to_have_count(len(states))
    for i, state in enumerate(states):
        expect(rows.nth(i)).to_have_attribute("data-state", state)


def click_op(page: Any, op: str) -> None:
    page.locator(f"{SIDEBAR} .jp-actormesh-toolbar button[data-op='{op}']").click()


def confirm(page: Any, accept: bool) -> None:
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_be_visible()
    dialog.locator(".jp-mod-accept" if accept else ".jp-mod-reject").click()
    expect(dialog).to_have_count(0)


def test_live_states_and_controls(page: Any, lab: Lab) -> None:
    name = lab.notebook(
        "mesh.ipynb",
        [
            SPAWN4,
            "%%mesh procs\nimport time\nfor step in range(1200):\n    time.sleep(0.1)",
            "%%mesh procs --ranks 3\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
            "%%mesh procs\nrank",
        ],
    )
    open_notebook(page, lab, name, "controls")
    expect_live(page)
    record_connection_states(page)
    live_at = time.monotonic()
    empty = page.locator(f"{SIDEBAR} .jp-actormesh-empty")
    expect(empty).to_contain_text("No mesh yet")
    shot(page, "00-empty")

    wait_done(run_cell(page, 0))
    expect_states(page, "idle", "idle", "idle", "idle")
    mesh = page.locator(f"{SIDEBAR} section.jp-actormesh-mesh")
    expect(mesh).to_have_attribute("data-mesh-name", "procs")
    expect(page.locator(f"{ROWS} .jp-actormesh-pid").first).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator(f"{ROWS} .jp-actormesh-memory").first).to_have_text(re.compile("MiB"))
    shot(page, "01-idle")

    # A long %%mesh cell: every rank busy in it, the panel still live while the shell is busy.
    long_cell = run_cell(page, 1)
    expect_states(page, "busy", "busy", "busy", "busy")
    expect(page.locator(f"{ROWS} .jp-actormesh-detail").first).to_have_text(
        re.compile(r"^in In \[2\]:[34]$")
    )
    expect(page.locator(f"{ROWS} .jp-actormesh-elapsed").first).to_have_text(re.compile(r"\d+ s"))
    click_op(page, "stacks")
    stacks = page.locator(f"{SIDEBAR} .jp-actormesh-stacks")
    expect(stacks.locator("summary").first).to_have_text("ranks 0-3 (4)")
    expect(stacks.locator("pre").first).to_contain_text("time.sleep(0.1)")
    shot(page, "02-busy-with-stacks")
    # The panel's requests leave the notebook's busy indicator alone.
    indicator = notebook(page).locator(".jp-Notebook-ExecutionIndicator")
    expect(indicator).to_have_attribute("data-status", "busy")

    click_op(page, "interrupt")
    confirm(page, accept=True)
    wait_done(long_cell)
    expect_states(page, "idle", "idle", "idle", "idle")
    expect(long_cell.locator(".jp-OutputArea")).to_contain_text("4 interrupted")
    stacks.locator("button").click()  # close the stacks
    expect(stacks).to_have_count(0)

    # A rank killed from a cell shows dead, with its signal.
    wait_done(run_cell(page, 2))
    expect_states(page, "idle", "idle", "idle", "dead")
    expect(page.locator(f"{ROWS}[data-rank='3'] .jp-actormesh-detail")).to_have_text(
        "killed by SIGKILL"
    )
    shot(page, "03-dead-rank")

    click_op(page, "respawn")
    expect_states(page, "idle", "idle", "idle", "idle")
    expect(page.locator(f"{SIDEBAR} .jp-actormesh-notice")).to_contain_text("respawned rank 3")
    cell = run_cell(page, 3)
    wait_done(cell)
    expect(cell.locator(".jp-OutputArea-output").last).to_contain_text("gpus=33")

    # A selection: the controls act on it alone.
    page.locator(f"{ROWS}[data-rank='1'] input[type='checkbox']").check()
    expect(page.locator(f"{SIDEBAR} .jp-actormesh-scope")).to_have_text("rank 1")
    click_op(page, "stacks")
    expect(stacks.locator("summary")).to_have_text(["rank 1 (1)"])

    # Stop asks first; cancel keeps the mesh.
    click_op(page, "stop")
    confirm(page, accept=False)
    expect_states(page, "idle", "idle", "idle", "idle")
    click_op(page, "stop")
    confirm(page, accept=True)
    expect(page.locator(ROWS)).to_have_count(0)
    expect(empty).to_contain_text("No mesh yet")
    assert any("actormesh sidebar activated" in m for m in page.console_messages)

    # The subscription was answered: past the time the panel gives it, the panel is still live
    # and never showed "the kernel did not answer" (the kernel sends no idle status for panel
    # requests, which a wait for the request's whole exchange would need).
    left = live_at + SUBSCRIBE_TIMEOUT_S + 1.0 - time.monotonic()
    if left > 0:
        page.wait_for_timeout(left * 1000)  # what must not happen has had its time
    expect_live(page)
    assert connection_states(page) == ["live"]


def test_follows_notebook_switch_and_kernel_restart(page: Any, lab: Lab) -> None:
    spawn2 = SPAWN4.replace('"gpus": 4', '"gpus": 2')
    first = lab.notebook("first.ipynb", [spawn2])
    other = lab.notebook("plain.ipynb", ["1 + 1"], kernel="python3")
    open_notebook(page, lab, first, "switch")
    expect_live(page)
    wait_done(run_cell(page, 0))
    expect_states(page, "idle", "idle")

    page.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{other}'}})")
    hint = page.locator(f"{SIDEBAR} .jp-actormesh-empty")
    expect(hint).to_contain_text('needs the "actormesh" kernel')
    expect(page.locator(ROWS)).to_have_count(0)
    shot(page, "04-other-kernel")

    page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text=first).click()
    expect_states(page, "idle", "idle")

    # Not awaited: the command waits for the dialog we answer next.
    page.evaluate("() => { void window.jupyterapp.commands.execute('notebook:restart-kernel'); }")
    confirm(page, accept=True)
    expect_live(page)
    expect(hint).to_contain_text("No mesh yet")  # the restart stopped the mesh
    wait_done(run_cell(page, 0))
    expect_states(page, "idle", "idle")


def test_breakpoint_shows_paused_and_continue_resumes(page: Any, lab: Lab) -> None:
    name = lab.notebook(
        "debug.ipynb", [SPAWN4, "%%mesh procs --ranks 1\nx = 41\nbreakpoint()\ny = x + 1"]
    )
    open_notebook(page, lab, name, "debugger")
    expect_live(page)
    wait_done(run_cell(page, 0))
    expect_states(page, "idle", "idle", "idle", "idle")
    run_cell(page, 1)
    expect_states(page, "idle", "paused", "idle", "idle")
    detail = page.locator(f"{ROWS}[data-rank='1'] .jp-actormesh-detail")
    expect(detail).to_have_text(re.compile(r"at (In \[2\]|<cell 2>|<mesh-cell-2>):3$"))
    shot(page, "05-paused")
    page.locator(f"{ROWS}[data-rank='1'] input[type='checkbox']").check()
    click_op(page, "resume")
    expect(page.locator(f"{ROWS}[data-rank='1']")).not_to_have_attribute("data-state", "paused")


TRAINING = """import os, signal, torch
import actormesh as am
procs = am.this_host().spawn_procs(per_host={"dp": 4})
model = am.module_to_mesh(torch.nn.Linear(4, 1), procs)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ft = am.FaultTolerant({"model": model, "optim": opt})
x, y = torch.randn(8, 4), torch.randn(8, 1)
def step():
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return model.weight.sum().item()
for _ in range(3):
    step()
    ft.commit()"""
LOSE_A_RANK = """def pid(t):
    return os.getpid()
os.kill(am.call_on_shard_and_fetch(pid, model.weight, dp=1).get(), signal.SIGKILL)
try:
    step()
except am.SupervisionError:
    ft.shrink()"""


def test_a_training_run_that_loses_a_rank_shows_its_recovery(page: Any, lab: Lab) -> None:
    name = lab.notebook("recovery.ipynb", [TRAINING, LOSE_A_RANK, "step()\nft.commit()"])
    open_notebook(page, lab, name, "recovery")
    expect_live(page)
    wait_done(run_cell(page, 0))
    line = page.locator(f"{SIDEBAR} .jp-actormesh-recovery")
    expect(line).to_have_count(0)  # no recovery yet
    wait_done(run_cell(page, 1))
    expect(line).to_have_attribute("data-phase", "restored")
    expect(line).to_have_text(
        re.compile(r"^rank \{dp=1\} lost: step 3 restored from the replicas in [\d.]+ s on dp 3$")
    )
    shot(page, "08-recovery-restored")
    wait_done(run_cell(page, 2))
    expect(line).to_have_attribute("data-phase", "resumed")
    expect(line).to_have_text("rank {dp=1} lost: training resumed, step 4 done")
    expect(page.locator(f"{ROWS}[data-rank='1']")).to_have_attribute("data-state", "dead")
