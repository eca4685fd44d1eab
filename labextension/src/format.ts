/** Numbers as the panel shows them. */

/** 1.2 GiB, 340 MiB. */
export function formatBytes(n: number | null): string {
  if (n === null) {
    return '–';
  }
  const mib = n / 2 ** 20;
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${Math.round(mib)} MiB`;
}

const MIB = 2 ** 20;

/**
 * A memory axis that can be read: from a multiple of a power-of-two number of MiB below `min`
 * to one above `max`, in at most 3 steps, with a tick at each (164 MiB to 236 MiB by decimal
 * steps gave one tick, 191 MiB, on a chart of ranks at 229 MiB). At least two ticks, also for
 * a flat line.
 */
export function byteTicks(min: number, max: number): { range: [number, number]; ticks: number[] } {
  let step = MIB;
  while (Math.ceil(max / step) - Math.floor(min / step) > 3) {
    step *= 2;
  }
  const lo = Math.floor(min / step) * step;
  const hi = Math.max(Math.ceil(max / step) * step, lo + step);
  const ticks = [];
  for (let t = lo; t <= hi; t += step) {
    ticks.push(t);
  }
  return { range: [lo, hi], ticks };
}
