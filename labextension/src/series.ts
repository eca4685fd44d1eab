/**
 * The panel's copy of each mesh's chart data, fed by the kernel's `series` messages (only the
 * points that are new), and the arithmetic the charts need: aligning per-rank lines on one x
 * axis, min/median/max bands for many ranks, and which rank strays from the others.
 *
 * Pure (no DOM, no uPlot) so that node runs its tests.
 */

import { IMeshSeries, ISeries } from './protocol';

/** Samples kept per rank: the kernel's 10 minutes at one a second. */
export const RESOURCE_KEEP = 600;
/** Points kept per metric and rank before the older ones are thinned (every other dropped). */
export const METRIC_KEEP = 2000;

export type Resource = 'cpu' | 'rss' | 'gpu_mem' | 'gpu_util';

export interface ILine {
  x: number[];
  y: (number | null)[];
}

export class RankResources {
  time: number[] = [];
  readonly values: Record<Resource, (number | null)[]> = {
    cpu: [],
    rss: [],
    gpu_mem: [],
    gpu_util: []
  };
  gpu = false;

  line(resource: Resource): ILine {
    return { x: this.time, y: this.values[resource] };
  }
}

export class MeshSeries {
  readonly resources = new Map<number, RankResources>();
  /** metric name -> rank -> its points (x: step). */
  readonly metrics = new Map<string, Map<number, ILine>>();
  /** Bumped on every change: the charts redraw only what moved. */
  resourcesVersion = 0;
  readonly metricVersions = new Map<string, number>();

  get gpu(): boolean {
    return [...this.resources.values()].some(r => r.gpu);
  }

  apply(update: IMeshSeries): void {
    for (const cols of update.resources) {
      let rr = this.resources.get(cols.rank);
      if (!rr) {
        rr = new RankResources();
        this.resources.set(cols.rank, rr);
      }
      const n = cols.time.length;
      rr.time.push(...cols.time);
      rr.values.cpu.push(...cols.cpu);
      rr.values.rss.push(...cols.rss);
      rr.values.gpu_mem.push(...(cols.gpu_mem ?? new Array<null>(n).fill(null)));
      rr.values.gpu_util.push(...(cols.gpu_util ?? new Array<null>(n).fill(null)));
      rr.gpu = rr.gpu || cols.gpu_mem !== null;
      const extra = rr.time.length - RESOURCE_KEEP;
      if (extra > 0) {
        rr.time.splice(0, extra);
        for (const key of Object.keys(rr.values) as Resource[]) {
          rr.values[key].splice(0, extra);
        }
      }
    }
    if (update.resources.length) {
      this.resourcesVersion += 1;
    }
    for (const metric of update.metrics) {
      let byRank = this.metrics.get(metric.name);
      if (!byRank) {
        byRank = new Map();
        this.metrics.set(metric.name, byRank);
      }
      for (const points of metric.ranks) {
        let line = byRank.get(points.rank);
        if (!line) {
          line = { x: [], y: [] };
          byRank.set(points.rank, line);
        }
        line.x.push(...points.step);
        line.y.push(...points.value);
        if (line.x.length > METRIC_KEEP) {
          thin(line);
        }
      }
      this.metricVersions.set(metric.name, (this.metricVersions.get(metric.name) ?? 0) + 1);
    }
  }
}

/** Drop every other point but the newest half: a long run keeps its whole shape, coarser. */
function thin(line: ILine): void {
  const half = Math.floor(line.x.length / 2);
  const x: number[] = [];
  const y: (number | null)[] = [];
  for (let i = 0; i < half; i += 2) {
    x.push(line.x[i]);
    y.push(line.y[i]);
  }
  line.x = x.concat(line.x.slice(half));
  line.y = y.concat(line.y.slice(half));
}

export class SeriesStore {
  readonly meshes = new Map<string, MeshSeries>();

  apply(message: ISeries): void {
    if (message.reset) {
      this.meshes.clear();
    }
    for (const update of message.meshes) {
      let mesh = this.meshes.get(update.mesh_id);
      if (!mesh) {
        mesh = new MeshSeries();
        this.meshes.set(update.mesh_id, mesh);
      }
      mesh.apply(update);
    }
  }

  /** Forget the meshes that left the snapshot. */
  retain(live: Set<string>): void {
    for (const id of [...this.meshes.keys()]) {
      if (!live.has(id)) {
        this.meshes.delete(id);
      }
    }
  }
}

/**
 * Lines on one sorted x axis (uPlot's data layout: [xs, ys0, ys1, ...]), null where a line has
 * no point; a line's last point stays its last (a dead rank's line ends where it died).
 */
export function align(lines: ILine[]): [number[], ...(number | null)[][]] {
  if (lines.length && sameAxis(lines)) {
    // The common case (every rank at the same steps, or sampled by one agent): no merge.
    return [lines[0].x.slice(), ...lines.map(l => l.y.slice())];
  }
  const seen = new Set<number>();
  for (const line of lines) {
    for (const x of line.x) {
      seen.add(x);
    }
  }
  const xs = Float64Array.from(seen).sort();
  const index = new Map<number, number>();
  xs.forEach((x, i) => index.set(x, i));
  const ys = lines.map(line => {
    const y = new Array<number | null>(xs.length).fill(null);
    for (let i = 0; i < line.x.length; i++) {
      y[index.get(line.x[i]) as number] = line.y[i];
    }
    return y;
  });
  return [Array.from(xs), ...ys];
}

/**
 * `align`, at most one point per pixel column of `width` (every k-th, the last one kept): more
 * cannot be seen, and bands and drawing cost grow with the points. On a common axis (the usual
 * case) only the kept points are copied.
 */
export function alignToWidth(lines: ILine[], width: number): [number[], ...(number | null)[][]] {
  if (lines.length && sameAxis(lines)) {
    const keep = keptIndices(lines[0].x.length, width);
    return [pick(lines[0].x, keep), ...lines.map(l => pick(l.y, keep))];
  }
  const aligned = align(lines);
  const keep = keptIndices(aligned[0].length, width);
  return aligned.map(col => pick(col, keep)) as [number[], ...(number | null)[][]];
}

function keptIndices(n: number, width: number): number[] {
  const k = Math.max(1, Math.ceil(n / Math.max(width, 50)));
  const keep: number[] = [];
  for (let i = (n - 1) % k; i < n; i += k) {
    keep.push(i);
  }
  return keep;
}

function pick<T>(col: T[], keep: number[]): T[] {
  if (keep.length === col.length) {
    return col.slice();
  }
  const out = new Array<T>(keep.length);
  for (let j = 0; j < keep.length; j++) {
    out[j] = col[keep[j]];
  }
  return out;
}

function sameAxis(lines: ILine[]): boolean {
  const x0 = lines[0].x;
  for (let i = 1; i < x0.length; i++) {
    if (!(x0[i] > x0[i - 1])) {
      return false;
    }
  }
  for (const line of lines) {
    const x = line.x;
    if (x.length !== x0.length) {
      return false;
    }
    for (let i = x.length - 1; i >= 0; i--) {
      if (x[i] !== x0[i]) {
        return false;
      }
    }
  }
  return true;
}

/** Per x: the min, median and max of the lines that have a value there. */
export function bands(ys: (number | null)[][]): [(number | null)[], (number | null)[], (number | null)[]] {
  const n = ys.length ? ys[0].length : 0;
  const out = new Bands(n, ys.length);
  for (let i = 0; i < n; i++) {
    let count = 0;
    for (let j = 0; j < ys.length; j++) {
      const v = ys[j][i];
      if (v !== null) {
        out.column[count++] = v;
      }
    }
    out.set(i, count);
  }
  return [out.lo, out.mid, out.hi];
}

/** A banded chart's data: the x axis, min/median/max per x, and the lines drawn on their own. */
export interface IBanded {
  x: number[];
  lo: (number | null)[];
  mid: (number | null)[];
  hi: (number | null)[];
  /** The lines of `apart`, in its order, at the same x. */
  apart: (number | null)[][];
}

/**
 * The bands of `lines` but those at the indices in `apart`, at most a point per pixel column
 * of `width` (as `alignToWidth`). On a common axis the values are read where they are: no
 * copy of every rank's line is made (64 of them, each redraw, were most of the garbage).
 */
export function bandsToWidth(lines: ILine[], apart: number[], width: number): IBanded {
  const inBands = lines.filter((_, i) => !apart.includes(i));
  if (!lines.length || !sameAxis(lines)) {
    const [x, ...ys] = alignToWidth(lines, width);
    const [lo, mid, hi] = bands(ys.filter((_, i) => !apart.includes(i)));
    return { x, lo, mid, hi, apart: apart.map(i => ys[i]) };
  }
  const keep = keptIndices(lines[0].x.length, width);
  const out = new Bands(keep.length, inBands.length);
  for (let c = 0; c < keep.length; c++) {
    const i = keep[c];
    let count = 0;
    for (let j = 0; j < inBands.length; j++) {
      const v = inBands[j].y[i];
      if (v !== null) {
        out.column[count++] = v;
      }
    }
    out.set(c, count);
  }
  return {
    x: pick(lines[0].x, keep),
    lo: out.lo,
    mid: out.mid,
    hi: out.hi,
    apart: apart.map(i => pick(lines[i].y, keep))
  };
}

class Bands {
  readonly lo: (number | null)[];
  readonly mid: (number | null)[];
  readonly hi: (number | null)[];
  /** One x's values, filled by the caller before `set`. */
  readonly column: Float64Array;

  constructor(n: number, lines: number) {
    this.lo = new Array<number | null>(n);
    this.mid = new Array<number | null>(n);
    this.hi = new Array<number | null>(n);
    this.column = new Float64Array(lines);
  }

  /** The bands at `i` from the first `count` values of `column`. */
  set(i: number, count: number): void {
    if (!count) {
      this.lo[i] = this.mid[i] = this.hi[i] = null;
      return;
    }
    const a = this.column;
    let min = a[0];
    let max = a[0];
    for (let j = 1; j < count; j++) {
      const v = a[j];
      min = v < min ? v : min;
      max = v > max ? v : max;
    }
    this.lo[i] = min;
    this.hi[i] = max;
    this.mid[i] = medianInPlace(a, count);
  }
}

/**
 * The median of `a[0..count)`, reordering it: selection (Hoare's quickselect), linear on
 * average; sorting every column cost most of a banded chart's redraw with 64 ranks.
 */
function medianInPlace(a: Float64Array, count: number): number {
  const m = count >> 1;
  const upper = select(a, count, m);
  if (count % 2) {
    return upper;
  }
  // Even count: select left the m smallest in a[0..m); the lower middle is the largest of them.
  let lower = a[0];
  for (let i = 1; i < m; i++) {
    lower = a[i] > lower ? a[i] : lower;
  }
  return (lower + upper) / 2;
}

/** Reorder `a[0..count)` so that a[k] holds the k-th smallest, smaller ones before it. */
function select(a: Float64Array, count: number, k: number): number {
  let left = 0;
  let right = count - 1;
  while (left < right) {
    const pivot = a[(left + right) >> 1];
    let i = left;
    let j = right;
    while (i <= j) {
      while (a[i] < pivot) {
        i++;
      }
      while (a[j] > pivot) {
        j--;
      }
      if (i <= j) {
        const t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (k <= j) {
      right = j;
    } else if (k >= i) {
      left = i;
    } else {
      break;
    }
  }
  return a[k];
}

function median(sorted: ArrayLike<number>): number {
  const m = sorted.length >> 1;
  return sorted.length % 2 ? sorted[m] : (sorted[m - 1] + sorted[m]) / 2;
}

/** How many of a line's last values make its level (a single noisy step is no divergence). */
const RECENT = 5;

/**
 * The rank whose recent level strays farthest from the others', when it strays clearly:
 * farther from the median of the ranks' levels than 3 robust standard deviations (1.4826 ×
 * the median absolute deviation), than 5 % of that median and than `floor`. Needs 3 ranks or
 * more.
 *
 * Levels are compared on data every rank has: metrics (`aligned`, x a step) on the last RECENT
 * steps with a value on every rank; resources (x a time) on each rank's last RECENT values up
 * to the latest time every rank has reached. A rank whose latest batch is late (its line ends
 * earlier) is not compared with the others' later steps: a falling learning rate made such a
 * rank look high.
 */
export function straying(lines: Map<number, ILine>, floor = 0, aligned = false): number | null {
  const live = [...lines].filter(([, line]) => line.x.length > 0);
  if (live.length < 3) {
    return null;
  }
  const cutoff = Math.min(...live.map(([, line]) => line.x[line.x.length - 1]));
  const levels = aligned ? commonLevels(live, cutoff) : levelsUpTo(live, cutoff);
  if (levels.length < 3) {
    return null;
  }
  const m = median(levels.map(l => l[1]).sort((a, b) => a - b));
  const devs = levels.map(([rank, v]) => [rank, Math.abs(v - m)] as [number, number]);
  const mad = median(devs.map(d => d[1]).sort((a, b) => a - b));
  const [rank, dev] = devs.reduce((a, b) => (b[1] > a[1] ? b : a));
  const threshold = Math.max(3 * 1.4826 * mad, 0.05 * Math.abs(m), floor, 1e-12);
  return dev > threshold ? rank : null;
}

/** Each rank's mean of its last RECENT values at x <= cutoff. */
function levelsUpTo(live: [number, ILine][], cutoff: number): [number, number][] {
  const levels: [number, number][] = [];
  for (const [rank, line] of live) {
    let sum = 0;
    let count = 0;
    for (let i = line.x.length - 1; i >= 0 && count < RECENT; i--) {
      const v = line.y[i];
      if (line.x[i] <= cutoff && v !== null && v !== undefined) {
        sum += v;
        count += 1;
      }
    }
    if (count) {
      levels.push([rank, sum / count]);
    }
  }
  return levels;
}

/** Each rank's mean over the last RECENT steps (<= cutoff) that have a value on every rank;
 * none if there are no such steps. */
function commonLevels(live: [number, ILine][], cutoff: number): [number, number][] {
  // Each rank's recent values by step (a window wider than RECENT: ranks log different steps).
  const byRank = live.map(([rank, line]) => {
    const values = new Map<number, number>();
    for (let i = line.x.length - 1; i >= 0 && values.size < RECENT * 8; i--) {
      const v = line.y[i];
      if (line.x[i] <= cutoff && v !== null && v !== undefined) {
        values.set(line.x[i], v);
      }
    }
    return [rank, values] as [number, Map<number, number>];
  });
  const steps = [...byRank[0][1].keys()]
    .filter(step => byRank.every(([, values]) => values.has(step)))
    .sort((a, b) => b - a)
    .slice(0, RECENT);
  if (!steps.length) {
    return [];
  }
  return byRank.map(([rank, values]) => [
    rank,
    steps.reduce((sum, step) => sum + values.get(step)!, 0) / steps.length
  ]);
}

/**
 * How far a rank's resource must be from the others' before it is said to stray, on top of the
 * metrics' rule: ranks doing the same work differ by a few points of CPU and some megabytes
 * (rank 0 often holds a little more), which is no news; a rank using a core more or gigabytes
 * more is.
 */
export const RESOURCE_STRAY_FLOOR: Record<Resource, number> = {
  cpu: 25, // % of a core
  gpu_util: 25, // %
  rss: 256 * 2 ** 20,
  gpu_mem: 512 * 2 ** 20
};

/**
 * The rank whose `resource` strays from the other live ranks' (the metrics' rule, with
 * RESOURCE_STRAY_FLOOR); a dead rank's last samples are no level to compare with.
 */
export function resourceStraying(
  resources: Map<number, RankResources>,
  resource: Resource,
  dead: ReadonlySet<number>
): number | null {
  const lines = new Map<number, ILine>();
  for (const [rank, rr] of resources) {
    if (!dead.has(rank)) {
      lines.set(rank, rr.line(resource));
    }
  }
  return straying(lines, RESOURCE_STRAY_FLOOR[resource]);
}

/**
 * Indices of `lines` grouped where the lines are the same (same points): drawn on top of each
 * other, only the last of a group shows, so the legend says which ranks it stands for. Groups
 * in order of their first line.
 */
export function sameLines(lines: ILine[]): number[][] {
  const groups: number[][] = [];
  for (let i = 0; i < lines.length; i++) {
    const group = groups.find(g => equalLines(lines[g[0]], lines[i]));
    if (group) {
      group.push(i);
    } else {
      groups.push([i]);
    }
  }
  return groups;
}

function equalLines(a: ILine, b: ILine): boolean {
  if (a.x.length !== b.x.length) {
    return false;
  }
  for (let i = 0; i < a.x.length; i++) {
    if (a.x[i] !== b.x[i] || a.y[i] !== b.y[i]) {
      return false;
    }
  }
  return true;
}
