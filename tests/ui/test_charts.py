"""The sidebar's charts end to end: 4 ranks train in a ``%%mesh`` cell and log their loss; the
panel draws a chart for it with a line per rank, marks the rank that diverges and the rank that
holds far more memory, keeps the CPU sparklines of the rank rows moving, ends the line of a rank
that dies, fits narrow and wide sidebars; and 64 ranks with 10 metrics fed to the panel in the
page are drawn as bands with the straying ranks (a metric's, the memory's) apart. Both tests
print the browser main thread's time on updates (the issue's budget is 20 ms per second): a
figure to read, not to assert, since it moves with the machine's load (bench/RESULTS.md records
it).

Screenshots go to the test's tmp dir (and tests/ui/screenshots/): look at them."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect
from test_sidebar import (
    ROWS,
    SIDEBAR,
    SPAWN4,
    click_op,
    confirm,
    expect_live,
    expect_states,
    open_notebook,
    run_cell,
    wait_done,
)
from ui_support import SCREENSHOTS, Lab

pytestmark = pytest.mark.timeout(400)

# Rank 2's loss jumps after step 15 (it diverges); rank 3 kills itself at step 25; rank 1 holds
# 768 MiB more than the others (written, so that it is resident).
TRAIN = """%%mesh procs
import os, signal, time
import actormesh as am
ballast = b"x" * (768 << 20) if rank == 1 else b""
for step in range(1000):
    loss = 2.0 / (1 + 0.1 * step) + 0.01 * rank
    if rank == 2 and step > 15:
        loss += 3.0
    if rank == 3 and step == 25:
        os.kill(os.getpid(), signal.SIGKILL)
    am.log_metrics({"loss": loss}, step=step)
    time.sleep(0.1)"""

LOSS = f"{SIDEBAR} .jp-actormesh-chart[data-metric='loss']"


def last_steps(page: Any) -> dict[int, int]:
    """Each rank's last step in the loss chart, from the chart's data-last."""
    raw = page.locator(LOSS).get_attribute("data-last") or ""
    return {int(r): int(s) for r, s in (p.split(":") for p in raw.split(",") if p.split(":")[1])}


def wait_attr(page: Any, selector: str, attr: str, js_test: str) -> None:
    """Wait until ``js_test`` (an expression of ``v``, the attribute as a string) holds."""
    page.wait_for_function(
        f"""() => {{
          const el = document.querySelector({selector!r});
          const v = el ? el.getAttribute({attr!r}) : null;
          return v !== null && ({js_test});
        }}"""
    )


def cut_off(page: Any) -> list[str]:
    """Text in the sidebar that does not fit: past its right edge, or clipped by its box."""
    return list(
        page.evaluate(
            """() => {
              const side = document.querySelector('#actormesh-sidebar');
              const right = side.getBoundingClientRect().right;
              const bad = [];
              if (side.scrollWidth > side.clientWidth + 1) bad.push('sidebar scrolls sideways');
              for (const el of side.querySelectorAll('*')) {
                const text = [...el.childNodes].some(
                  n => n.nodeType === 3 && n.textContent.trim());
                if (el.tagName === 'PRE') {  // a stack: its lines wrap, none is cut
                  const r = el.getBoundingClientRect();
                  if (r.right > right + 1 || el.scrollWidth > el.clientWidth + 1)
                    bad.push(`stack text cut off: ${el.textContent.slice(0, 40)}`);
                  continue;
                }
                if (!text || el.closest('pre') || el.offsetParent === null) continue;
                const r = el.getBoundingClientRect();
                const clipped = el.scrollWidth > el.clientWidth + 1 &&
                  getComputedStyle(el).overflowX !== 'visible';
                if (r.right > right + 1 || clipped) bad.push(`${el.className}: ${el.textContent}`);
              }
              return bad;
            }"""
        )
    )


def layout_faults(page: Any) -> list[str]:
    """What the issue-45 review found hard to read, checked at the sidebar's current width: a
    rank's pid not shown (a column, or the second line when narrow), a toolbar row holding a
    lone button while another holds several ("Stop mesh" wrapped alone), legend swatches too
    small to tell colours apart."""
    return list(
        page.evaluate(
            r"""() => {
              const side = document.querySelector('#actormesh-sidebar');
              const bad = [];
              const shown = el => el && el.offsetParent !== null && el.getClientRects().length;
              for (const row of side.querySelectorAll('.jp-actormesh-rank')) {
                const pid = [...row.querySelectorAll('.jp-actormesh-pid, .jp-actormesh-pid-inline')]
                  .find(el => shown(el) && /\d/.test(el.textContent));
                if (!pid) bad.push(`rank ${row.dataset.rank}: no pid shown`);
              }
              for (const bar of side.querySelectorAll('.jp-actormesh-toolbar')) {
                const rows = new Map();
                for (const b of bar.querySelectorAll('button')) {
                  const top = Math.round(b.getBoundingClientRect().top);
                  rows.set(top, (rows.get(top) || 0) + 1);
                }
                const counts = [...rows.values()];
                if (counts.length > 1 && counts.includes(1))
                  bad.push(`toolbar rows of ${counts.join(', ')} buttons`);
              }
              for (const i of side.querySelectorAll('.jp-actormesh-chart-legend i')) {
                const r = i.getBoundingClientRect();
                if (r.width < 12 || r.height < 3) bad.push(`legend swatch ${r.width}x${r.height}`);
              }
              return bad;
            }"""
        )
    )


def set_sidebar_width(page: Any, width: int) -> None:
    """Drag the handle between the left panel and the notebook until the sidebar is ``width``."""
    side = page.locator(SIDEBAR)
    handle = page.locator(".lm-SplitPanel-handle:visible").first
    box = handle.bounding_box()
    current = side.bounding_box()
    assert box is not None and current is not None
    page.mouse.move(box["x"] + 2, box["y"] + 300)
    page.mouse.down()
    page.mouse.move(box["x"] + 2 + width - current["width"], box["y"] + 300, steps=5)
    page.mouse.up()
    page.wait_for_function(
        f"""() => Math.abs(document.querySelector('#actormesh-sidebar')
            .getBoundingClientRect().width - {width}) < 12"""
    )


def open_sidebar(page: Any, lab: Lab, width: int) -> None:
    """A fresh JupyterLab page with the sidebar open at ``width`` px (no kernel, no notebook)."""
    page.goto(f"{lab.url}/lab/workspaces/load?token={lab.token}")
    page.click(".jp-SideBar [data-id='actormesh-sidebar']")
    expect(page.locator(SIDEBAR)).to_be_visible()
    set_sidebar_width(page, width)


def save(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path))
    SCREENSHOTS.mkdir(exist_ok=True)
    shutil.copy(path, SCREENSHOTS / path.name)
    return path


def update_ms_per_s(page: Any, seconds: float) -> dict[str, float]:
    """The main-thread time the panel spent on updates during the next ``seconds``: the
    performance measures it records around every render (actormesh-render), every series
    message (actormesh-series) and every frame of chart redraws (actormesh-charts)."""
    return dict(
        page.evaluate(
            """async (seconds) => {
              const t0 = performance.now();
              await new Promise(r => setTimeout(r, seconds * 1000));
              const t1 = performance.now();
              const out = {};
              for (const e of performance.getEntriesByType('measure')) {
                if (!e.name.startsWith('actormesh-') || e.startTime < t0) continue;
                out[e.name] = (out[e.name] || 0) + e.duration;
                out.count = (out.count || 0) + 1;
              }
              out.total = ['actormesh-render', 'actormesh-series', 'actormesh-charts']
                .reduce((s, k) => s + (out[k] || 0), 0);
              out.seconds = (t1 - t0) / 1000;
              return out;
            }""",
            seconds,
        )
    )


def test_training_charts(page: Any, lab: Lab, tmp_path: Path) -> None:
    name = lab.notebook("train.ipynb", [SPAWN4, TRAIN])
    open_notebook(page, lab, name, "charts")
    expect_live(page)
    narrow = page.locator(SIDEBAR).bounding_box()  # JupyterLab's default width: the narrow case
    assert narrow is not None and narrow["width"] < 320, narrow
    wait_done(run_cell(page, 0))
    expect_states(page, "idle", "idle", "idle", "idle")

    # A CPU sparkline in every rank row, fed about once a second by the host agent.
    sparks = page.locator(f"{ROWS} .jp-actormesh-spark")
    expect(sparks).to_have_count(4)
    spark0 = f"{ROWS}[data-rank='0'] .jp-actormesh-spark"
    wait_attr(page, spark0, "data-points", "Number(v) >= 2")
    points_before = int(page.locator(spark0).get_attribute("data-points") or 0)
    cpu_chart = f"{SIDEBAR} .jp-actormesh-chart[data-resource='cpu']"
    expect(page.locator(cpu_chart)).to_have_attribute("data-lines", "4")
    expect(page.locator(f"{SIDEBAR} .jp-actormesh-chart[data-resource='rss']")).to_have_count(1)

    train = run_cell(page, 1)
    chart = page.locator(LOSS)
    expect(chart).to_have_attribute("data-lines", "4")
    expect(chart.locator("canvas")).to_have_count(1)
    # It grows while the cell runs.
    wait_attr(page, LOSS, "data-points", "Number(v) >= 5")
    first = int(chart.get_attribute("data-points") or 0)
    wait_attr(page, LOSS, "data-points", f"Number(v) >= {first + 5}")
    wait_attr(page, spark0, "data-points", f"Number(v) > {points_before}")

    # Rank 2 diverges: highlighted, and said in words.
    expect(chart).to_have_attribute("data-stray", "2")
    expect(chart.locator(".jp-actormesh-chart-stray")).to_have_text("rank 2 strays from the others")

    # Rank 1's memory strays from the others': marked in the memory chart. (Its CPU is not
    # checked here: writing the ballast is a short burst of it, which may be marked a while.)
    rss_chart = page.locator(f"{SIDEBAR} .jp-actormesh-chart[data-resource='rss']")
    expect(rss_chart).to_have_attribute("data-stray", "1")
    expect(rss_chart.locator(".jp-actormesh-chart-stray")).to_have_text(
        "rank 1 strays from the others"
    )

    # Hover: the nearest line's rank, step and value.
    plot = chart.locator(".u-over")
    box = plot.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] * 0.15)
    tip = chart.locator(".jp-actormesh-tooltip")
    expect(tip).to_be_visible()
    expect(tip).to_have_text(re.compile(r"^rank [0-3] · step \d+ · -?[\d.e+-]+$"))
    save(page, tmp_path, "charts-hover")
    page.mouse.move(5, 5)

    # Rank 3 died at step 25: its line ends there while the others go on.
    expect(page.locator(f"{ROWS}[data-rank='3']")).to_have_attribute("data-state", "dead")
    wait_attr(
        page,
        LOSS,
        "data-last",
        "v.split(',').filter(p => Number(p.split(':')[1]) >= 40).length === 3",
    )
    expect(chart.locator(".jp-actormesh-chart-legend")).to_contain_text("3 (dead)")  # dashed
    steps = last_steps(page)
    assert steps[3] <= 25 and min(steps[r] for r in (0, 1, 2)) >= 40, steps

    # The main thread's time on updates while 3 ranks train and log (budget: 20 ms/s), printed,
    # not asserted (it moves with the load): 3 s hold 30 steps of each rank, enough to see
    # redraws; bench/sidebar_ab.py is the measurement.
    spent = update_ms_per_s(page, 3.0)
    per_s = spent["total"] / spent["seconds"]
    print(f"\nmain-thread time on panel updates: {per_s:.2f} ms/s over {spent}")
    assert spent.get("actormesh-charts", 0) > 0, spent  # it did measure redraws

    # Narrow and wide: no text cut off, stacks included (they scroll sideways, in the panel).
    click_op(page, "stacks")
    stacks = page.locator(f"{SIDEBAR} .jp-actormesh-stacks")
    expect(stacks.locator("pre").first).to_contain_text("time.sleep(0.1)")
    # A re-render (here: selecting a rank) keeps the stacks as the user left them: a group
    # closed stays closed (the panel used to build them anew, open, at every state change).
    stacks.locator("details summary").first.click()
    expect(stacks.locator("details").first).to_have_js_property("open", False)
    rank0 = page.locator(f"{ROWS}[data-rank='0'] input[type='checkbox']")
    rank0.click()
    expect(page.locator(f"{SIDEBAR} .jp-actormesh-scope")).to_have_text("rank 0")
    expect(stacks.locator("details").first).to_have_js_property("open", False)
    rank0.click()
    stacks.locator("details summary").first.click()
    stacks.scroll_into_view_if_needed()
    # The sidebar whole, not the stacks element: live updates re-render that one, which
    # detached it mid-screenshot ("Element is not attached to the DOM") under load.
    page.locator(SIDEBAR).screenshot(path=str(tmp_path / "charts-narrow-stacks.png"))
    assert (bad := cut_off(page)) == [], bad
    assert (bad := layout_faults(page)) == [], bad
    page.locator(SIDEBAR).evaluate("el => el.scrollTo(0, 0)")
    save(page, tmp_path, "charts-narrow")
    for width in (400, 560):  # the toolbar in two rows of three, then in one
        set_sidebar_width(page, width)
        assert (bad := layout_faults(page)) == [], (width, bad)
    wait_attr(page, LOSS, "data-points", "true")
    page.wait_for_function(
        f"""() => document.querySelector("{LOSS} canvas").getBoundingClientRect().width > 450"""
    )
    save(page, tmp_path, "charts-wide")
    assert (bad := cut_off(page)) == [], bad
    assert steps[3] == last_steps(page)[3]  # still ended where it died

    click_op(page, "interrupt")
    confirm(page, accept=True)
    wait_done(train)


# The load: 64 ranks, 10 metrics. Fed to the panel's model in the page (no kernel could
# run 64 ranks on this machine): a snapshot of one 64-rank mesh, then what the kernel would send,
# the history first, then every half second a step of each metric on every rank and, every
# second, a sample of each rank. Rank 7's metrics and rank 9's memory stray from the others'.
FEED_64 = """async ([seconds, history]) => {
  const side = [...window.jupyterapp.shell.widgets('left')]
    .find(w => w.id === 'actormesh-sidebar');
  const model = side.model;
  const comm = { isDisposed: false, close() {} };
  const N = 64, METRICS = 10, P = 3, MiB = 2 ** 20;
  const ranks = Array.from({ length: N }, (_, r) => ({
    rank: r, label: `gpus=${r}`, state: 'busy', since: Date.now() / 1000, pid: 1000 + r,
    rss: 512 << 20, gpu_mem: null, busy: { kind: 'cell', what: 'In [3]', line: 4 },
    paused: null, dead: null }));
  const message = (type, body) => ({ protocol: P, type, ...body });
  model._comm = comm;
  model.connection = 'live';
  model._onMessage(comm, message('snapshot', { time: Date.now() / 1000, debugger: false,
    meshes: [{ mesh_id: 'mesh-64', names: ['procs'], extent: { hosts: 8, gpus: 8 },
      actors: [], hosts: [{ host_rank: 0, hostname: 'h', ranks }], recovery: null }] }));
  let step = 0, t = Date.now() / 1000 - history;
  const series = (steps, samples, reset) => {
    const stepList = Array.from({ length: steps }, (_, i) => step + i);
    const times = Array.from({ length: samples }, (_, i) => t + i);
    step += steps; t += samples;
    return message('series', { time: t, reset, meshes: [{ mesh_id: 'mesh-64',
      resources: samples ? ranks.map(r => ({ rank: r.rank, time: times,
        cpu: times.map(() => 90 + 10 * Math.random()),
        rss: times.map(() => 512 * MiB + r.rank * 4096 + (r.rank === 9 ? 1024 * MiB : 0)),
        gpu_mem: null, gpu_util: null }))
        : [],
      metrics: Array.from({ length: METRICS }, (_, m) => ({ name: `metric_${m}`,
        ranks: ranks.map(r => ({ rank: r.rank, step: stepList,
          value: stepList.map(s => 1 / (1 + s) + 0.01 * Math.random() + (r.rank === 7 ? 1 : 0))
        })) })) }] });
  };
  model._onMessage(comm, series(2 * history, history, true));
  // In sight: the metric charts (work for charts out of sight waits until they scroll in).
  document.querySelector('#actormesh-sidebar .jp-actormesh-metrics').scrollIntoView();
  await new Promise(r => setTimeout(r, 1500));  // the first drawing: not the steady state
  const t0 = performance.now();
  for (let i = 0; i < seconds * 2; i++) {
    const update = series(1, i % 2, false);  // made by the test: not the panel's time
    const s = performance.now();
    model._onMessage(comm, update);
    performance.measure('actormesh-feed', { start: s, end: performance.now() });
    await new Promise(r => setTimeout(r, 500));
  }
  const t1 = performance.now();
  const out = { seconds: (t1 - t0) / 1000 };
  for (const e of performance.getEntriesByType('measure')) {
    if (!e.name.startsWith('actormesh-') || e.startTime < t0) continue;
    out[e.name] = (out[e.name] || 0) + e.duration;
  }
  // The feed's measure contains the series one (parse + apply): count that once.
  out.total = (out['actormesh-feed'] || 0) + (out['actormesh-render'] || 0) +
    (out['actormesh-charts'] || 0);
  const side_ = document.querySelector('#actormesh-sidebar').getBoundingClientRect();
  out.in_sight = [...document.querySelectorAll('#actormesh-sidebar .jp-actormesh-chart')]
    .filter(c => { const r = c.getBoundingClientRect();
                   return r.bottom > side_.top && r.top < side_.bottom; }).length;
  out.charts = document.querySelectorAll('#actormesh-sidebar .jp-actormesh-chart').length;
  out.stray = document.querySelector(
    "#actormesh-sidebar .jp-actormesh-chart[data-metric='metric_0']").dataset.stray;
  const resource = name => document.querySelector(
    `#actormesh-sidebar .jp-actormesh-chart[data-resource='${name}']`).dataset;
  out.banded = resource('cpu').banded;
  out.cpu_stray = resource('cpu').stray ?? null;
  out.rss_stray = resource('rss').stray ?? null;
  return out;
}"""


def test_64_ranks_10_metrics_are_drawn_as_bands(page: Any, lab: Lab, tmp_path: Path) -> None:
    open_sidebar(page, lab, 420)
    # 3 s of updates after the history: the drawing, the bands and the strays checked below
    # (the figure printed is bench/sidebar_ab.py's to measure, over 10 s).
    spent = page.evaluate(FEED_64, [3, 300])
    per_s = spent["total"] / spent["seconds"]
    print(f"\n64 ranks, 10 metrics: {per_s:.2f} ms/s of main-thread time on updates: {spent}")
    save(page, tmp_path, "charts-64-ranks")
    assert spent["charts"] == 12 and spent["stray"] == "7" and spent["banded"] == "true", spent
    # Rank 9 holds a gigabyte more than the others: its memory line is drawn apart, in red.
    assert spent["rss_stray"] == "9" and spent["cpu_stray"] is None, spent


# A GPU machine's feed, as the kernel sends it there (a host agent with NVML puts each worker's
# GPU memory and utilisation into its samples: tests/kernel/test_gpu_status.py, run on an H100):
# 4 ranks, rank 2 holding 30 GiB more GPU memory than the others.
FEED_GPU = """async () => {
  const side = [...window.jupyterapp.shell.widgets('left')]
    .find(w => w.id === 'actormesh-sidebar');
  const model = side.model;
  const comm = { isDisposed: false, close() {} };
  const N = 4, P = 3, GiB = 2 ** 30;
  const ranks = Array.from({ length: N }, (_, r) => ({
    rank: r, label: `gpus=${r}`, state: 'idle', since: Date.now() / 1000, pid: 1000 + r,
    rss: GiB, gpu_mem: (r === 2 ? 40 : 10) * GiB, busy: null, paused: null, dead: null }));
  const message = (type, body) => ({ protocol: P, type, ...body });
  model._comm = comm;
  model.connection = 'live';
  model._onMessage(comm, message('snapshot', { time: Date.now() / 1000, debugger: false,
    meshes: [{ mesh_id: 'mesh-gpu', names: ['procs'], extent: { hosts: 1, gpus: N },
      actors: [], hosts: [{ host_rank: 0, hostname: 'h', ranks }], recovery: null }] }));
  const t = Date.now() / 1000 - 60;
  const times = Array.from({ length: 60 }, (_, i) => t + i);
  model._onMessage(comm, message('series', { time: t + 60, reset: true, meshes: [{
    mesh_id: 'mesh-gpu', metrics: [],
    resources: ranks.map(r => ({ rank: r.rank, time: times,
      cpu: times.map(() => 95), rss: times.map(() => GiB),
      gpu_mem: times.map(() => r.gpu_mem), gpu_util: times.map((_, i) => 80 + (i % 5)) })) }] }));
}"""


def test_gpu_series_are_drawn_as_charts(page: Any, lab: Lab, tmp_path: Path) -> None:
    open_sidebar(page, lab, 420)
    page.evaluate(FEED_GPU)
    memory = page.locator(f"{SIDEBAR} .jp-actormesh-chart[data-resource='gpu_mem']")
    use = page.locator(f"{SIDEBAR} .jp-actormesh-chart[data-resource='gpu_util']")
    memory.scroll_into_view_if_needed()
    for chart in (memory, use):
        expect(chart).to_have_attribute("data-lines", "4")
        expect(chart).to_have_attribute("data-points", "60")
        expect(chart.locator("canvas")).to_have_count(1)
    expect(memory.locator(".jp-actormesh-chart-title")).to_contain_text("GPU memory")
    expect(use.locator(".jp-actormesh-chart-title")).to_contain_text("GPU utilisation")
    # Rank 2's GPU memory strays from the others'; the utilisations are alike.
    expect(memory).to_have_attribute("data-stray", "2")
    expect(use).not_to_have_attribute("data-stray", "2")
    save(page, tmp_path, "charts-gpu")
