/**
 * The sidebar's charts, drawn with uPlot: a CPU sparkline per rank row, a chart per resource
 * (a line per rank, or min/median/max bands above BAND_ABOVE ranks) and a chart per training
 * metric (a line per rank); in both, the rank that strays from the others is drawn in red.
 *
 * Why uPlot: it is built for live time series (a canvas per chart, ~50 KB, no dependencies,
 * setData of a few thousand points takes well under a millisecond) and is maintained. Chart.js
 * was the alternative weighed: several times larger, and its animation and per-point objects
 * cost main-thread time on every update, which a panel redrawing dozens of charts a second
 * cannot spend. Hand-drawn SVG would mean writing axes, scales, hover and bands ourselves.
 *
 * Charts live across the sidebar's re-renders (their nodes are moved, never rebuilt), and all
 * chart work waits for the next animation frame, batched (FrameBatch), measured with the
 * performance API as `actormesh-charts`, uPlot's drawing included (the UI test reads it). To
 * stay cheap with 64 ranks and 10 metrics (tests/ui/test_charts.py: under 20 ms of main thread
 * a second): a chart redraws at most once a second, not at all while scrolled out of sight,
 * with at most a point per pixel column, and above BAND_ABOVE ranks as bands plus the rank
 * that strays.
 */

import uPlot from 'uplot';

import { el } from './dom';
import { byteTicks, formatBytes } from './format';
import {
  alignToWidth,
  bandsToWidth,
  ILine,
  MeshSeries,
  Resource,
  resourceStraying,
  sameLines,
  straying
} from './series';

/** More ranks than this: a resource chart draws min/median/max, not a line per rank. */
export const BAND_ABOVE = 16;
const PALETTE = ['#2f74c0', '#3f9a55', '#8e5bb5', '#c27c1a', '#1a9a9a', '#b8467a', '#6b7a8f', '#7f9a1a'];
const STRAY = '#d32f2f';
const SPARK_SECONDS = 60;
const REDRAW_EVERY_MS = 1000;

/**
 * Runs the chart work queued during a frame once, at the next animation frame; work for a
 * chart scrolled out of sight waits until it scrolls in (64 rank rows push most charts out).
 */
export class FrameBatch {
  /** Keep track of whether `node` is in sight; its work waits while it is not. */
  watch(node: Element): void {
    this._io.observe(node);
  }

  /** Forget `node` (its chart is gone): its waiting work is dropped. */
  unwatch(node: Element): void {
    this._io.unobserve(node);
    this._pending.delete(node);
    this._later.delete(node);
    this._jobs.delete(node);
  }

  schedule(key: Element, job: () => void): void {
    if (this._visible.get(key) === false) {
      this._pending.set(key, job);
      return;
    }
    // At most one redraw a second per chart: the kernel sends news every 0.4 s.
    const wait = (this._ran.get(key) ?? -Infinity) + REDRAW_EVERY_MS - performance.now();
    if (wait > 0) {
      const first = !this._later.has(key);
      this._later.set(key, job);
      if (first) {
        setTimeout(() => {
          const later = this._later.get(key);
          this._later.delete(key);
          if (later) {
            this.schedule(key, later);
          }
        }, wait);
      }
      return;
    }
    this._jobs.set(key, job);
    if (!this._frame) {
      this._frame = requestAnimationFrame(() => this._run());
    }
  }

  dispose(): void {
    cancelAnimationFrame(this._frame);
    this._io.disconnect();
    this._jobs.clear();
    this._pending.clear();
    this._later.clear();
  }

  private _seen(entries: IntersectionObserverEntry[]): void {
    for (const entry of entries) {
      this._visible.set(entry.target, entry.isIntersecting);
      const job = this._pending.get(entry.target);
      if (entry.isIntersecting && job) {
        this._pending.delete(entry.target);
        this.schedule(entry.target, job);
      }
    }
  }

  private _run(): void {
    this._frame = 0;
    const jobs = [...this._jobs.values()];
    const start = performance.now();
    for (const key of this._jobs.keys()) {
      this._ran.set(key, start);
    }
    this._jobs.clear();
    for (const job of jobs) {
      try {
        job();
      } catch (err) {
        console.error('actormesh: a chart update failed', err);
      }
    }
    // uPlot draws in a microtask queued by setData: measure once those have run too.
    queueMicrotask(() => performance.measure('actormesh-charts', { start, end: performance.now() }));
  }

  private _jobs = new Map<Element, () => void>();
  private _pending = new Map<Element, () => void>();
  private _later = new Map<Element, () => void>();
  private _ran = new WeakMap<Element, number>();
  private _visible = new WeakMap<Element, boolean>();
  private _io = new IntersectionObserver(entries => this._seen(entries));
  private _frame = 0;
}

function div(cls: string, text?: string): HTMLDivElement {
  return el('div', cls, text);
}

function themeColor(name: string, fallback: string): string {
  return getComputedStyle(document.body).getPropertyValue(name).trim() || fallback;
}

export type Format = (v: number) => string;

export const formats: Record<Resource, Format> = {
  cpu: v => `${Math.round(v)} %`,
  rss: v => formatBytes(v),
  gpu_mem: v => formatBytes(v),
  gpu_util: v => `${Math.round(v)} %`
};

/** Axis labels: `format`, unless that gives two ticks the same label (166 MiB, 166 MiB). */
export function axisLabels(splits: number[], format: Format): string[] {
  const labels = splits.map(v => format(v));
  if (new Set(labels).size === labels.length) {
    return labels;
  }
  const step = Math.abs(splits[1] - splits[0]) || 1;
  const mib = 2 ** 20;
  return splits.map(v =>
    format === formats.rss || format === formats.gpu_mem
      ? `${(v / mib).toFixed(step >= mib ? 0 : step >= mib / 10 ? 1 : 2)} MiB`
      : formatValue(v)
  );
}

export function formatValue(v: number): string {
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) {
    return v.toExponential(2);
  }
  return `${Number(v.toPrecision(4))}`;
}

function clock(t: number): string {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

interface ILabeled {
  rank: number;
  line: ILine;
}

/** A chart with a line per rank (or bands), a title and a hover readout. */
export class LineChart {
  readonly node = div('chart');

  constructor(
    readonly title: string,
    readonly format: Format,
    /** x is Unix time (resources) or a step (metrics). */
    readonly time: boolean,
    private readonly _bandAbove = Infinity
  ) {
    this.node.appendChild(div('chart-title', title));
    this._legend = div('chart-legend');
    this.node.appendChild(this._legend);
    this._stray = div('chart-stray');
    this.node.appendChild(this._stray);
    this.node.appendChild(this._plot);
    // The width is read here, where the layout is fresh, and kept: reading clientWidth in
    // update() forced a layout after each chart's DOM writes (a tenth of the panel's time with
    // 64 ranks).
    this._resize = new ResizeObserver(() => {
      this._nodeWidth = null;
      const width = this._width();
      if (this._u && width && Math.abs(width - this._u.width) > 1) {
        this._u.setSize({ width, height: this._u.height });
      }
    });
    this._resize.observe(this.node);
  }

  /** Redraw; the ranks in `dead` are drawn dashed (their lines end where they died). */
  update(lines: ILabeled[], stray: number | null, dead: ReadonlySet<number> = new Set()): void {
    const banded = lines.length > this._bandAbove;
    const width = this._width() || 240;
    let data: uPlot.AlignedData;
    let labels: string[];
    if (banded) {
      // The bands of the others: the straying rank is drawn on its own, in red.
      const strayAt = lines.findIndex(l => l.rank === stray);
      const apart = strayAt < 0 ? [] : [strayAt];
      const b = bandsToWidth(lines.map(l => l.line), apart, width);
      data = [b.x, b.hi, b.mid, b.lo, ...b.apart] as uPlot.AlignedData;
      labels = ['max', 'median', 'min', ...apart.map(i => `rank ${lines[i].rank}`)];
    } else {
      data = alignToWidth(lines.map(l => l.line), width) as uPlot.AlignedData;
      labels = lines.map(l => `rank ${l.rank}`);
    }
    const deadShown = lines.filter(l => dead.has(l.rank)).map(l => l.rank);
    // Lines that coincide (a learning rate every rank shares): one legend entry for them all.
    const same = banded ? [] : sameLines(lines.map(l => l.line)).filter(g => g.length > 1);
    const sameKey = same.map(g => g.join('=')).join(',');
    const key = `${banded}|${labels.join(',')}|${stray}|${deadShown}|${sameKey}`;
    if (key !== this._key || !this._u) {
      this._key = key;
      this._build(data, lines, banded, stray, dead, same);
    } else {
      this._u.setData(data);
    }
    this._labels = labels;
    // What the page can read (the UI test, and anyone inspecting the panel); written only when
    // it changed, since every write makes the browser restyle the panel.
    this._show('lines', `${lines.length}`);
    this._show('banded', `${banded}`);
    this._show('points', `${Math.max(0, ...lines.map(l => l.line.x.length))}`);
    this._show(
      'last',
      lines.map(l => `${l.rank}:${l.line.x.length ? l.line.x[l.line.x.length - 1] : ''}`).join(',')
    );
    this._show('stray', stray === null ? null : `${stray}`);
    const words = stray === null ? '' : `rank ${stray} strays from the others`;
    if (this._stray.textContent !== words) {
      this._stray.textContent = words;
    }
  }

  private _show(key: string, value: string | null): void {
    const data = this.node.dataset;
    if (value === null) {
      delete data[key];
    } else if (data[key] !== value) {
      data[key] = value;
    }
  }

  dispose(): void {
    this._resize.disconnect();
    this._u?.destroy();
    this._u = null;
  }

  private _width(): number {
    // Measured when the chart is made and on each resize report; 0 while out of the page.
    if (this._nodeWidth === null) {
      const width = Math.floor(this.node.clientWidth);
      if (!width) {
        return 0;
      }
      this._nodeWidth = width;
    }
    return this._nodeWidth;
  }

  private _build(
    data: uPlot.AlignedData,
    lines: ILabeled[],
    banded: boolean,
    stray: number | null,
    dead: ReadonlySet<number>,
    same: number[][] = []
  ): void {
    this._u?.destroy();
    const text = themeColor('--jp-ui-font-color2', '#666');
    const grid = themeColor('--jp-border-color2', '#ddd');
    const series: uPlot.Series[] = [{}];
    const line = (label: string, stroke: string, width: number, dash?: number[]): uPlot.Series => ({
      label,
      stroke,
      width,
      dash,
      spanGaps: true,
      points: { show: false }
    });
    if (banded) {
      series.push(line('max', '#8aa9cc', 1), line('median', '#2f74c0', 1.5), line('min', '#8aa9cc', 1));
      for (const l of lines.filter(l => l.rank === stray)) {
        series.push(line(`rank ${l.rank}`, STRAY, 2));
      }
    } else {
      lines.forEach((l, i) => {
        const strays = l.rank === stray;
        const color = strays ? STRAY : PALETTE[i % PALETTE.length];
        const dash = dead.has(l.rank) ? [3, 2] : undefined;
        series.push(line(`rank ${l.rank}`, color, strays ? 2.25 : 1.25, dash));
      });
    }
    // A canvas font cannot hold var(): such a string is refused, and parsed anew each time
    // uPlot sets it (a tenth of a redraw's time), so the theme's family is looked up here.
    const font = `10px ${themeColor('--jp-ui-font-family', 'sans-serif')}`;
    const axis = { stroke: text, font, grid: { stroke: grid, width: 1 }, ticks: { show: false } };
    const format = this.format;
    // A memory axis by power-of-two MiB steps (byteTicks): uPlot's decimal steps on bytes left
    // one tick, or ticks that fall between the lines.
    const bytes = format === formats.rss || format === formats.gpu_mem;
    const yScale: uPlot.Scale = bytes
      ? { range: (_u, min, max) => (min === null || max === null ? [0, 2 ** 20] : byteTicks(min, max).range) }
      : {};
    const byteSplits = bytes
      ? { splits: (u: uPlot) => byteTicks(u.scales.y.min ?? 0, u.scales.y.max ?? 0).ticks }
      : {};
    const opts: uPlot.Options = {
      width: this._width() || 240,
      height: 110,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      select: { show: false, left: 0, top: 0, width: 0, height: 0 },
      scales: { x: { time: this.time }, y: yScale },
      series,
      bands: banded ? [{ series: [1, 3], fill: 'rgba(47,116,192,0.15)' }] : [],
      axes: [
        { ...axis, size: 20, space: 50 },
        {
          ...axis,
          // Wide enough for the longest label (10px font: about 6px a character).
          size: (_u: uPlot, values: string[]) =>
            values ? Math.max(30, 10 + 6 * Math.max(...values.map(v => v.length))) : 30,
          values: (_u: uPlot, splits: number[]) => axisLabels(splits, format),
          ...byteSplits
        }
      ],
      hooks: { setCursor: [u => this._hover(u)] }
    };
    this._u = new uPlot(opts, data, this._plot);
    // Which colour is which rank (the hover says it too, for one point at a time). Ranks whose
    // lines coincide share one entry, "0=1=2", in the colour drawn last, the one that shows.
    this._legend.textContent = '';
    const drawn = series.slice(1);
    const entries: number[][] = [];
    for (let i = 0; i < drawn.length; i++) {
      const group = same.find(g => g.includes(i));
      if (!group) {
        entries.push([i]);
      } else if (group[0] === i) {
        entries.push(group);
      }
    }
    for (const entry of entries) {
      const shown = drawn[entry[entry.length - 1]];
      const item = document.createElement('span');
      const swatch = document.createElement('i');
      swatch.style.borderTopColor = `${shown.stroke}`;
      swatch.style.borderTopStyle = shown.dash ? 'dashed' : 'solid';
      item.appendChild(swatch);
      const ranks = entry.map(i => `${drawn[i].label}`.replace('rank ', ''));
      const gone = ranks.filter(r => dead.has(Number(r)));
      const note = !gone.length ? '' : gone.length === ranks.length ? ' (dead)' : ` (${gone.join(',')} dead)`;
      item.appendChild(document.createTextNode(ranks.join('=') + note));
      if (entry.length > 1) {
        item.title = `ranks ${ranks.join(', ')} draw the same line`;
      }
      this._legend.appendChild(item);
    }
    this._tip = div('tooltip');
    this._tip.style.display = 'none';
    this._u.over.appendChild(this._tip);
  }

  /** Show the line nearest to the pointer: its rank, x and value. */
  private _hover(u: uPlot): void {
    const tip = this._tip;
    const idx = u.cursor.idx;
    const top = u.cursor.top ?? -1;
    if (!tip || idx === null || idx === undefined || top < 0) {
      if (tip) {
        tip.style.display = 'none';
      }
      return;
    }
    let best = -1;
    let bestDist = Infinity;
    for (let i = 1; i < u.data.length; i++) {
      const v = u.data[i][idx];
      if (v === null || v === undefined) {
        continue;
      }
      const dist = Math.abs(u.valToPos(v, 'y') - top);
      if (dist < bestDist) {
        bestDist = dist;
        best = i;
      }
    }
    if (best < 0) {
      tip.style.display = 'none';
      return;
    }
    const x = u.data[0][idx];
    const where = this.time ? clock(x) : `step ${x}`;
    tip.textContent = `${this._labels[best - 1]} · ${where} · ${this.format(u.data[best][idx] as number)}`;
    tip.style.display = 'block';
    const left = u.cursor.left ?? 0;
    const flip = left > u.over.clientWidth / 2;
    tip.style.left = flip ? '' : `${left + 8}px`;
    tip.style.right = flip ? `${u.over.clientWidth - left + 8}px` : '';
    tip.style.top = `${Math.max(0, top - 24)}px`;
  }

  private _plot = div('plot');
  private _stray: HTMLDivElement;
  private _legend: HTMLDivElement;
  private _u: uPlot | null = null;
  private _tip: HTMLDivElement | null = null;
  private _key = '';
  private _labels: string[] = [];
  private _resize: ResizeObserver;
  private _nodeWidth: number | null = null;
}

/** A rank's CPU over the last minute, in its row: no axes, no hover. */
export class Sparkline {
  readonly node = div('spark');

  update(line: ILine): void {
    let start = line.x.length;
    const from = line.x.length ? line.x[line.x.length - 1] - SPARK_SECONDS : 0;
    while (start > 0 && line.x[start - 1] >= from) {
      start -= 1;
    }
    const data: uPlot.AlignedData = [line.x.slice(start), line.y.slice(start)];
    if (!this._u) {
      this._u = new uPlot(
        {
          width: 42,
          height: 16,
          pxAlign: false,
          legend: { show: false },
          cursor: { show: false },
          select: { show: false, left: 0, top: 0, width: 0, height: 0 },
          scales: { x: { time: false }, y: { range: (_u, _min, max) => [0, Math.max(100, max)] } },
          axes: [{ show: false }, { show: false }],
          series: [{}, { stroke: '#2f74c0', fill: 'rgba(47,116,192,0.18)', width: 1, spanGaps: true, points: { show: false } }]
        },
        data,
        this.node
      );
    } else {
      this._u.setData(data);
    }
    const last = line.y[line.y.length - 1];
    this.node.dataset.points = `${line.x.length}`;
    this.node.dataset.last = last === null || last === undefined ? '' : `${last}`;
    this.node.title = `CPU, last minute: ${last === null || last === undefined ? '–' : formats.cpu(last)} now`;
  }

  dispose(): void {
    this._u?.destroy();
    this._u = null;
  }

  private _u: uPlot | null = null;
}

const RESOURCES: [Resource, string][] = [
  ['cpu', 'CPU (% of a core)'],
  ['rss', 'Memory (RSS)'],
  ['gpu_mem', 'GPU memory'],
  ['gpu_util', 'GPU utilisation']
];

/** Every chart of one mesh; their nodes outlive the sidebar's re-renders. */
export class MeshCharts {
  readonly metricBlock = div('charts metrics');
  readonly resourceBlock = div('charts resources');

  constructor(private readonly _batch: FrameBatch) {
    this.metricBlock.appendChild(div('charts-head', 'Metrics'));
    this.resourceBlock.appendChild(div('charts-head', 'Resources'));
    this.metricBlock.hidden = true;
    this.resourceBlock.hidden = true;
  }

  sparkline(rank: number): HTMLElement {
    let spark = this._sparks.get(rank);
    if (!spark) {
      spark = new Sparkline();
      this._sparks.set(rank, spark);
      this._batch.watch(spark.node);
      const rr = this._mesh?.resources.get(rank);
      if (rr) {
        const s = spark;
        this._batch.schedule(s.node, () => s.update(rr.line('cpu')));
      }
    }
    return spark.node;
  }

  /** The ranks now dead (from the snapshot): their lines are drawn dashed. */
  setDead(dead: Set<number>): void {
    const key = [...dead].sort((a, b) => a - b).join(',');
    if (key === this._deadKey) {
      return;
    }
    this._deadKey = key;
    this._dead = dead;
    this._seenResources = -1;
    this._seenMetrics.clear();
    if (this._mesh) {
      this.update(this._mesh);
    }
  }

  /** Redraw, at the next frame, what changed in `mesh` since the last call. */
  update(mesh: MeshSeries): void {
    if (mesh !== this._mesh) {
      this._mesh = mesh;
      this._seenResources = -1;
      this._seenMetrics.clear();
    }
    if (mesh.resourcesVersion !== this._seenResources) {
      this._seenResources = mesh.resourcesVersion;
      this._scheduleResources(mesh);
    }
    for (const [name, version] of mesh.metricVersions) {
      if (this._seenMetrics.get(name) !== version) {
        this._seenMetrics.set(name, version);
        this._batch.schedule(this._metric(name).node, () => this._drawMetric(mesh, name));
      }
    }
  }

  dispose(): void {
    for (const chart of [...this._resources.values(), ...this._metrics.values()]) {
      this._batch.unwatch(chart.node);
      chart.dispose();
    }
    for (const spark of this._sparks.values()) {
      this._batch.unwatch(spark.node);
      spark.dispose();
    }
  }

  private _metric(name: string): LineChart {
    let chart = this._metrics.get(name);
    if (!chart) {
      chart = new LineChart(name, formatValue, false, BAND_ABOVE);
      chart.node.dataset.metric = name;
      this._metrics.set(name, chart);
      this._batch.watch(chart.node);
      // Metric charts in name order.
      const after = [...this._metrics.keys()].sort().find(other => other > name);
      this.metricBlock.insertBefore(chart.node, after ? this._metrics.get(after)!.node : null);
      this.metricBlock.hidden = false;
    }
    return chart;
  }

  private _drawMetric(mesh: MeshSeries, name: string): void {
    const byRank = mesh.metrics.get(name);
    if (!byRank) {
      return;
    }
    const lines = [...byRank.entries()].sort((a, b) => a[0] - b[0]).map(([rank, line]) => ({ rank, line }));
    this._metric(name).update(lines, straying(byRank, 0, true), this._dead);
  }

  private _scheduleResources(mesh: MeshSeries): void {
    const ranks = [...mesh.resources.entries()].sort((a, b) => a[0] - b[0]);
    if (!ranks.length) {
      return;
    }
    this.resourceBlock.hidden = false;
    for (const [resource, title] of RESOURCES) {
      if (resource.startsWith('gpu') && !mesh.gpu) {
        continue;
      }
      let chart = this._resources.get(resource);
      if (!chart) {
        chart = new LineChart(title, formats[resource], true, BAND_ABOVE);
        chart.node.dataset.resource = resource;
        this._resources.set(resource, chart);
        this.resourceBlock.appendChild(chart.node);
        this._batch.watch(chart.node);
      }
      const c = chart;
      this._batch.schedule(c.node, () =>
        c.update(
          ranks.map(([rank, rr]) => ({ rank, line: rr.line(resource) })),
          resourceStraying(mesh.resources, resource, this._dead),
          this._dead
        )
      );
    }
    for (const [rank, rr] of ranks) {
      const spark = this._sparks.get(rank);
      if (spark) {
        this._batch.schedule(spark.node, () => spark.update(rr.line('cpu')));
      }
    }
  }

  private _mesh: MeshSeries | null = null;
  private _dead = new Set<number>();
  private _deadKey = '';
  private _seenResources = -1;
  private _seenMetrics = new Map<string, number>();
  private _metrics = new Map<string, LineChart>();
  private _resources = new Map<Resource, LineChart>();
  private _sparks = new Map<number, Sparkline>();
}
