/** Numbers (and a recovery's line) as the panel shows them. */

import type { IRecovery } from './protocol';

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

/** "{dp=1}", "{dp=1} and {dp=2}": the ranks a recovery names. */
function rankList(ranks: readonly string[]): string {
  if (ranks.length <= 1) {
    return ranks.join('');
  }
  return `${ranks.slice(0, -1).join(', ')} and ${ranks[ranks.length - 1]}`;
}

function sizes(extent: Record<string, number>): string {
  return Object.entries(extent)
    .map(([k, v]) => `${k} ${v}`)
    .join(' × ');
}

/**
 * A training run's last recovery in one line: which rank was lost (or rejoins), the step
 * restored and from where, and once a step completed after it, that training resumed.
 */
export function recoveryText(r: IRecovery): string {
  const who = rankList(r.ranks);
  const s = r.ranks.length > 1 ? 's' : '';
  const what =
    r.kind === 'grow'
      ? `rank${s} ${who} rejoining (${sizes(r.extent)})`
      : `rank${s} ${who} lost`;
  switch (r.phase) {
    case 'restoring':
      return r.kind === 'shrink'
        ? `${what}: going on without ${r.ranks.length > 1 ? 'them' : 'it'} from step ${r.step}…`
        : `${what}: restoring step ${r.step}…`;
    case 'restored': {
      const from = r.source === 'checkpoint' ? 'the last checkpoint' : 'the replicas';
      const took = r.seconds === null ? '' : ` in ${r.seconds.toFixed(1)} s`;
      const on = r.kind === 'recover' ? '' : ` on ${sizes(r.extent)}`;
      return `${what}: step ${r.step} restored from ${from}${took}${on}`;
    }
    case 'resumed':
      return `${what}: training resumed, step ${r.step} done`;
    case 'failed':
      return `${what}: recovery failed: ${r.error ?? ''}`;
  }
}
