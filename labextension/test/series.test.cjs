// The panel's chart data (src/series.ts): applying series messages, aligning lines, bands and
// the straying rank.
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const protocol = require('../build-test/protocol.js');
const series = require('../build-test/series.js');

const fixture = name =>
  JSON.parse(
    fs.readFileSync(path.join(__dirname, '..', '..', 'tests', 'fixtures', 'panel', `${name}.json`), 'utf8')
  );

const metric = (rank, steps, values) => ({ rank, step: steps, value: values });
const message = (reset, metrics, resources = []) => ({
  protocol: protocol.PROTOCOL_VERSION,
  type: 'series',
  time: 1,
  reset,
  meshes: [{ mesh_id: 'm', resources, metrics }]
});

test('messages append; a reset starts over', () => {
  const store = new series.SeriesStore();
  store.apply(protocol.parseKernelMessage(fixture('series')));
  const mesh = store.meshes.get('mesh-3f2a');
  assert.deepStrictEqual(mesh.metrics.get('loss').get(0).x, [0, 1, 2]);
  assert.deepStrictEqual(mesh.resources.get(0).values.cpu, [98.5, 101.2]);
  assert.deepStrictEqual(mesh.resources.get(0).values.gpu_mem, [null, null]);
  assert.ok(mesh.gpu); // rank 1 has NVML readings
  const v = mesh.metricVersions.get('loss');
  store.apply(message(false, []));
  store.apply({ ...message(false, [{ name: 'loss', ranks: [metric(0, [3], [1.5])] }]), meshes: [{ mesh_id: 'mesh-3f2a', resources: [], metrics: [{ name: 'loss', ranks: [metric(0, [3], [1.5])] }] }] });
  assert.deepStrictEqual(mesh.metrics.get('loss').get(0).y, [2.31, 1.97, 1.62, 1.5]);
  assert.strictEqual(mesh.metricVersions.get('loss'), v + 1);
  store.apply(message(true, []));
  assert.deepStrictEqual([...store.meshes.keys()], ['m']);
});

test('bounded: resources drop the oldest, metrics thin the older half', () => {
  const mesh = new series.MeshSeries();
  const n = series.RESOURCE_KEEP + 10;
  const times = Array.from({ length: n }, (_, i) => i);
  mesh.apply({ mesh_id: 'm', metrics: [], resources: [{ rank: 0, time: times, cpu: times, rss: times, gpu_mem: null, gpu_util: null }] });
  assert.strictEqual(mesh.resources.get(0).time.length, series.RESOURCE_KEEP);
  assert.strictEqual(mesh.resources.get(0).time[0], 10);
  const steps = Array.from({ length: series.METRIC_KEEP + 2 }, (_, i) => i);
  mesh.apply({ mesh_id: 'm', resources: [], metrics: [{ name: 'loss', ranks: [metric(0, steps, steps)] }] });
  const line = mesh.metrics.get('loss').get(0);
  assert.ok(line.x.length < series.METRIC_KEEP * 0.8, `${line.x.length}`);
  assert.strictEqual(line.x[0], 0);
  assert.strictEqual(line.x[line.x.length - 1], series.METRIC_KEEP + 1);
  assert.deepStrictEqual(line.x, line.y);
});

test('align: one sorted x axis, null where a line has no point', () => {
  const data = series.align([
    { x: [0, 1, 2], y: [10, 11, 12] },
    { x: [1, 3], y: [21, 23] }
  ]);
  assert.deepStrictEqual(data, [
    [0, 1, 2, 3],
    [10, 11, 12, null],
    [null, 21, null, 23]
  ]);
});

test('align: lines on the same axis are copied, not merged', () => {
  const lines = [
    { x: [0, 1, 2], y: [1, 2, 3] },
    { x: [0, 1, 2], y: [4, null, 6] }
  ];
  const data = series.align(lines);
  assert.deepStrictEqual(data, [[0, 1, 2], [1, 2, 3], [4, null, 6]]);
  assert.notStrictEqual(data[1], lines[0].y);
  // steps that go back (a loop started again) are merged into one sorted axis
  assert.deepStrictEqual(series.align([{ x: [5, 0], y: [1, 2] }]), [[0, 5], [2, 1]]);
});

test('bands: min, median and max of the lines present', () => {
  const [lo, mid, hi] = series.bands([
    [1, null, 5],
    [3, null, 1],
    [2, null, null]
  ]);
  assert.deepStrictEqual(lo, [1, null, 1]);
  assert.deepStrictEqual(mid, [2, null, 3]);
  assert.deepStrictEqual(hi, [3, null, 5]);
});

test('bands: the median by selection agrees with sorting, odd and even counts, ties', () => {
  let seed = 7;
  const random = () => ((seed = (seed * 16807) % 2147483647) / 2147483647);
  for (let trial = 0; trial < 300; trial++) {
    const lines = 1 + (trial % 70);
    const ys = Array.from({ length: lines }, () => [
      trial % 3 ? random() : Math.round(random() * 4), // every third trial: many ties
      random() < 0.3 ? null : random() - 0.5
    ]);
    const [lo, mid, hi] = series.bands(ys);
    for (let i = 0; i < 2; i++) {
      const col = ys.map(y => y[i]).filter(v => v !== null).sort((a, b) => a - b);
      if (!col.length) {
        assert.deepStrictEqual([lo[i], mid[i], hi[i]], [null, null, null]);
        continue;
      }
      const m = col.length >> 1;
      const median = col.length % 2 ? col[m] : (col[m - 1] + col[m]) / 2;
      assert.deepStrictEqual([lo[i], mid[i], hi[i]], [col[0], median, col[col.length - 1]], `trial ${trial}`);
    }
  }
});

test('alignToWidth: at most a point per column of the width, the last kept', () => {
  const x = Array.from({ length: 1000 }, (_, i) => i);
  const same = [0, 1].map(r => ({ x, y: x.map(v => v + r) }));
  const [xs, y0, y1] = series.alignToWidth(same, 200);
  assert.strictEqual(xs.length, 200);
  assert.strictEqual(xs[xs.length - 1], 999);
  assert.deepStrictEqual(y1, xs.map(v => v + 1));
  assert.deepStrictEqual(y0, xs);
  // Few points: all of them, copies (the chart may keep them while the lines grow).
  const short = [{ x: [1, 2, 3], y: [4, 5, 6] }];
  const data = series.alignToWidth(short, 200);
  assert.deepStrictEqual(data, [[1, 2, 3], [4, 5, 6]]);
  assert.notStrictEqual(data[1], short[0].y);
  // Lines on different steps are merged first, then thinned.
  const merged = series.alignToWidth(
    [
      { x: x.filter(v => v % 2 === 0), y: x.filter(v => v % 2 === 0) },
      { x: x.filter(v => v % 2 === 1), y: x.filter(v => v % 2 === 1) }
    ],
    100
  );
  assert.strictEqual(merged[0].length, 100);
  assert.strictEqual(merged[0][99], 999);
  assert.strictEqual(merged[2][99], 999);
});

test('bandsToWidth: the bands of the others at the thinned x, the apart lines beside', () => {
  const x = Array.from({ length: 700 }, (_, i) => i);
  const same = Array.from({ length: 20 }, (_, r) => ({ x, y: x.map(v => (r === 5 ? null : v * r)) }));
  same[3] = { x, y: x.map(v => (v % 7 ? v * 3 : null)) }; // gaps
  const ragged = same.map((l, r) => (r === 2 ? { x: x.slice(0, 650), y: l.y.slice(0, 650) } : l));
  for (const lines of [same, ragged]) {
    const got = series.bandsToWidth(lines, [4], 300);
    const [xs, ...ys] = series.alignToWidth(lines, 300);
    const [lo, mid, hi] = series.bands(ys.filter((_, i) => i !== 4));
    assert.deepStrictEqual(got, { x: xs, lo, mid, hi, apart: [ys[4]] });
    assert.ok(got.x.length <= 300 && got.x[got.x.length - 1] === 699);
  }
});

test('straying: a diverging rank, and none among noisy equals', () => {
  const lines = levels => new Map(levels.map((v, rank) => [rank, { x: [0, 1], y: [v, v] }]));
  assert.strictEqual(series.straying(lines([1.0, 1.1, 0.9, 5.0])), 3);
  assert.strictEqual(series.straying(lines([0.9, 1.0, 1.1, 1.2])), null);
  assert.strictEqual(series.straying(lines([1, 1, 1, 1])), null);
  assert.strictEqual(series.straying(lines([1, 9])), null); // two ranks: which one strays?
  const withNull = new Map([0, 1, 2, 3].map(rank => [rank, { x: [0, 1, 2, 3], y: [1, 1, 1, 1] }]));
  withNull.get(2).y = [1, 1, null, 40];
  assert.strictEqual(series.straying(withNull, 0, true), 2);
});

test('straying compares levels on data every rank has (a late batch is no divergence)', () => {
  // Equal learning rates on 4 ranks; rank 3's last 20 steps have not arrived yet.
  const lr = step => 0.1 * 0.995 ** step;
  const steps = n => Array.from({ length: n }, (_, i) => i);
  const line = n => ({ x: steps(n), y: steps(n).map(lr) });
  const late = new Map([[0, line(300)], [1, line(300)], [2, line(300)], [3, line(280)]]);
  assert.strictEqual(series.straying(late, 0, true), null);
  assert.strictEqual(series.straying(late), null); // the same cutoff when x is a time
  // A rank that really strays is still seen, late or not.
  const off = { x: steps(280), y: steps(280).map(s => lr(s) * 3) };
  assert.strictEqual(series.straying(new Map([...late, [3, off]]), 0, true), 3);
  // Steps no rank has in common yet: nothing to compare, no flag.
  const apart = new Map([0, 1, 2].map(r => [r, { x: [r * 10 + 1], y: [r] }]));
  assert.strictEqual(series.straying(apart, 0, true), null);
});

test('resourceStraying: a rank using much more memory or CPU, not a few percent more', () => {
  const MiB = 2 ** 20;
  const mesh = (cpu, rss) => {
    const store = new series.SeriesStore();
    const resources = cpu.map((c, rank) => ({
      rank,
      time: [1, 2, 3],
      cpu: [c, c, c],
      rss: [rss[rank], rss[rank], rss[rank]],
      gpu_mem: null,
      gpu_util: null
    }));
    store.apply(message(false, [], resources));
    return store.meshes.get('m').resources;
  };
  const none = new Set();
  // Equals with a little noise, rank 0 busier and holding somewhat more: nobody strays (the
  // metrics' rule alone would mark rank 0 in both).
  const calm = mesh([6, 1, 2, 1], [440 * MiB, 400 * MiB, 401 * MiB, 399 * MiB]);
  assert.strictEqual(series.resourceStraying(calm, 'cpu', none), null);
  assert.strictEqual(series.resourceStraying(calm, 'rss', none), null);
  // Rank 2 holds a gigabyte more, rank 1 spins a core.
  const odd = mesh([2, 100, 1, 3], [400 * MiB, 401 * MiB, 1400 * MiB, 399 * MiB]);
  assert.strictEqual(series.resourceStraying(odd, 'rss', none), 2);
  assert.strictEqual(series.resourceStraying(odd, 'cpu', none), 1);
  // A dead rank's last samples are not compared.
  assert.strictEqual(series.resourceStraying(odd, 'rss', new Set([2])), null);
  // Without a GPU there is nothing to say.
  assert.strictEqual(series.resourceStraying(odd, 'gpu_mem', none), null);
});

test('sameLines: ranks whose lines coincide are grouped, in order', () => {
  const l = ys => ({ x: ys.map((_, i) => i), y: ys });
  assert.deepStrictEqual(series.sameLines([l([1, 2]), l([1, 3]), l([1, 2]), l([1, 2, 3])]), [[0, 2], [1], [3]]);
  assert.deepStrictEqual(series.sameLines([l([1, null]), l([1, null])]), [[0, 1]]);
  assert.deepStrictEqual(series.sameLines([]), []);
});
