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
