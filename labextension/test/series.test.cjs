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

test('straying: a diverging rank, and none among noisy equals', () => {
  const lines = levels => new Map(levels.map((v, rank) => [rank, { x: [0, 1], y: [v, v] }]));
  assert.strictEqual(series.straying(lines([1.0, 1.1, 0.9, 5.0])), 3);
  assert.strictEqual(series.straying(lines([0.9, 1.0, 1.1, 1.2])), null);
  assert.strictEqual(series.straying(lines([1, 1, 1, 1])), null);
  assert.strictEqual(series.straying(lines([1, 9])), null); // two ranks: which one strays?
  const withNull = lines([1, 1, 1, 1]);
  withNull.get(2).y.push(null, 40);
  assert.strictEqual(series.straying(withNull), 2);
});
