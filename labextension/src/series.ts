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
  const lo: (number | null)[] = [];
  const mid: (number | null)[] = [];
  const hi: (number | null)[] = [];
  const buffer = new Float64Array(ys.length); // a typed array sorts numbers natively, fast
  for (let i = 0; i < n; i++) {
    let count = 0;
    for (const y of ys) {
      const v = y[i];
      if (v !== null) {
        buffer[count++] = v;
      }
    }
    if (!count) {
      lo.push(null);
      mid.push(null);
      hi.push(null);
      continue;
    }
    const col = buffer.subarray(0, count).sort();
    lo.push(col[0]);
    mid.push(median(col));
    hi.push(col[count - 1]);
  }
  return [lo, mid, hi];
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
 * the median absolute deviation) and than 5 % of that median. Needs 3 ranks or more.
 */
export function straying(lines: Map<number, ILine>): number | null {
  const levels: [number, number][] = [];
  for (const [rank, line] of lines) {
    let sum = 0;
    let count = 0;
    for (let i = line.y.length - 1; i >= 0 && count < RECENT; i--) {
      const v = line.y[i];
      if (v !== null) {
        sum += v;
        count += 1;
      }
    }
    if (count) {
      levels.push([rank, sum / count]);
    }
  }
  if (levels.length < 3) {
    return null;
  }
  const m = median(levels.map(l => l[1]).sort((a, b) => a - b));
  const devs = levels.map(([rank, v]) => [rank, Math.abs(v - m)] as [number, number]);
  const mad = median(devs.map(d => d[1]).sort((a, b) => a - b));
  const [rank, dev] = devs.reduce((a, b) => (b[1] > a[1] ? b : a));
  const threshold = Math.max(3 * 1.4826 * mad, 0.05 * Math.abs(m), 1e-12);
  return dev > threshold ? rank : null;
}
