// How the panel writes numbers (src/format.ts): memory axes with ticks that can be read.
const test = require('node:test');
const assert = require('node:assert');
const format = require('../build-test/format.js');

const MiB = 2 ** 20;

test('byteTicks: two to four ticks at round MiB, around every value', () => {
  const cases = [
    [191 * MiB, 229 * MiB],
    [166 * MiB, 168 * MiB],
    [166 * MiB, 166 * MiB],
    [0, 3 * 1024 * MiB],
    [900 * MiB, 5000 * MiB]
  ];
  for (const [min, max] of cases) {
    const { range, ticks } = format.byteTicks(min, max);
    assert.ok(range[0] <= min && range[1] >= max, `${range} around ${min}..${max}`);
    assert.ok(ticks.length >= 2 && ticks.length <= 4, `${ticks.length} ticks for ${min}..${max}`);
    assert.deepStrictEqual([ticks[0], ticks[ticks.length - 1]], range);
    const step = ticks[1] - ticks[0];
    assert.ok(step >= MiB && Number.isInteger(Math.log2(step / MiB)), `step ${step / MiB} MiB`);
    const labels = ticks.map(format.formatBytes);
    assert.strictEqual(new Set(labels).size, labels.length, `${labels}`);
  }
  // The chart: ranks at 191 and 229 MiB now get ticks on both sides of each.
  assert.deepStrictEqual(
    format.byteTicks(191 * MiB, 229 * MiB).ticks.map(format.formatBytes),
    ['160 MiB', '192 MiB', '224 MiB', '256 MiB']
  );
});

test('recoveryText: a rank lost, restored, resumed, with the step', () => {
  const base = {
    kind: 'recover', ranks: ['{dp=1}'], step: 40, source: null, extent: { dp: 4 },
    seconds: null, time: 1763770999.5, error: null
  };
  assert.strictEqual(
    format.recoveryText({ ...base, phase: 'restoring' }),
    'rank {dp=1} lost: restoring step 40…'
  );
  assert.strictEqual(
    format.recoveryText({ ...base, phase: 'restored', source: 'replicas', seconds: 1.84 }),
    'rank {dp=1} lost: step 40 restored from the replicas in 1.8 s'
  );
  assert.strictEqual(
    format.recoveryText({ ...base, phase: 'resumed', step: 41, source: 'replicas' }),
    'rank {dp=1} lost: training resumed, step 41 done'
  );
  const shrink = { ...base, kind: 'shrink', extent: { dp: 3 } };
  assert.strictEqual(
    format.recoveryText({ ...shrink, phase: 'restoring' }),
    'rank {dp=1} lost: going on without it from step 40…'
  );
  assert.strictEqual(
    format.recoveryText({ ...shrink, phase: 'restored', source: 'checkpoint', seconds: 3 }),
    'rank {dp=1} lost: step 40 restored from the last checkpoint in 3.0 s on dp 3'
  );
  const grow = { ...base, kind: 'grow', ranks: ['{dp=1}', '{dp=3}'], phase: 'restoring' };
  assert.strictEqual(format.recoveryText(grow), 'ranks {dp=1} and {dp=3} rejoining (dp 4): restoring step 40…');
  assert.strictEqual(
    format.recoveryText({ ...base, phase: 'failed', error: 'no checkpoint' }),
    'rank {dp=1} lost: recovery failed: no checkpoint'
  );
});
