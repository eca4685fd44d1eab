// The JSON fixtures of docs/panel-protocol.md, checked with the panel's own parser
// (tests/kernel/test_panel_protocol.py checks the same files on the Python side).
const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const protocol = require('../build-test/protocol.js');

const dir = path.join(__dirname, '..', '..', 'tests', 'fixtures', 'panel');
const fixture = name => JSON.parse(fs.readFileSync(path.join(dir, `${name}.json`), 'utf8'));

test('every fixture has a parser that accepts it unchanged', () => {
  const names = fs.readdirSync(dir).filter(f => f.endsWith('.json')).map(f => f.slice(0, -5));
  assert.ok(names.length >= 10, `only ${names.length} fixtures`);
  for (const name of names) {
    const data = fixture(name);
    let parsed;
    if (name.startsWith('request_')) {
      parsed = protocol.parseRequest(data);
    } else if (name.startsWith('reply_')) {
      parsed = protocol.parseReply(data);
    } else {
      parsed = protocol.parseKernelMessage(data);
    }
    assert.deepStrictEqual(parsed, data, name);
  }
});

test('the snapshot fixture carries every rank state', () => {
  const snap = protocol.parseKernelMessage(fixture('snapshot'));
  const states = snap.meshes[0].hosts[0].ranks.map(r => r.state);
  assert.deepStrictEqual(states, ['idle', 'paused', 'busy', 'dead']);
  assert.strictEqual(snap.meshes[0].hosts[0].ranks[1].paused.line, 4);
  assert.strictEqual(snap.meshes[0].hosts[0].ranks[3].dead.signal, 'SIGKILL');
});

test('the snapshot fixture carries a recovery, and a mesh without one has null', () => {
  const snap = protocol.parseKernelMessage(fixture('snapshot'));
  const r = snap.meshes[0].recovery;
  assert.deepStrictEqual([r.phase, r.kind, r.ranks, r.step, r.source], ['restored', 'shrink', ['{gpus=3}'], 40, 'replicas']);
  const bad = fixture('snapshot');
  bad.meshes[0].recovery.phase = 'sleeping';
  assert.throws(() => protocol.parseKernelMessage(bad), /recovery\.phase: unknown phase "sleeping"/);
  const none = fixture('snapshot');
  none.meshes[0].recovery = null;
  assert.strictEqual(protocol.parseKernelMessage(none).meshes[0].recovery, null);
});

test('another protocol version is refused with a hint', () => {
  const data = { ...fixture('snapshot_empty'), protocol: 2 };
  assert.throws(() => protocol.parseKernelMessage(data), /protocol 2.*install the same actormesh/);
});

test('bad messages say what is wrong', () => {
  const snap = fixture('snapshot');
  snap.meshes[0].hosts[0].ranks[2].state = 'sleeping';
  assert.throws(() => protocol.parseKernelMessage(snap), /ranks\[2\]\.state: unknown state "sleeping"/);
  assert.throws(() => protocol.parseKernelMessage({ protocol: protocol.PROTOCOL_VERSION, type: 'gossip' }), /unknown type/);
  const req = { ...fixture('request_interrupt'), op: 'reboot' };
  assert.throws(() => protocol.parseRequest(req), /unknown operation "reboot"/);
  const reply = { ...fixture('reply_ok'), status: 'maybe' };
  assert.throws(() => protocol.parseReply(reply), /reply\.status/);
});

test('series: columns are checked', () => {
  const series = protocol.parseKernelMessage(fixture('series'));
  assert.strictEqual(series.meshes[0].metrics[0].ranks[1].value[1], null);
  assert.strictEqual(series.meshes[0].resources[1].gpu_util[0], 87);
  const uneven = fixture('series');
  uneven.meshes[0].resources[0].cpu.push(1);
  assert.throws(() => protocol.parseKernelMessage(uneven), /resources\[0\]: columns of different lengths/);
  const badStep = fixture('series');
  badStep.meshes[0].metrics[0].ranks[0].step[1] = 1.5;
  assert.throws(() => protocol.parseKernelMessage(badStep), /step\[1\]: expected an integer/);
});

test('requests made by the panel match the fixtures', () => {
  const req = protocol.makeRequest('interrupt', { mesh_id: 'mesh-3f2a', ranks: [1, 2] });
  const want = fixture('request_interrupt');
  assert.deepStrictEqual({ ...req, request_id: want.request_id }, want);
  const whole = protocol.makeRequest('stacks', { mesh_id: 'mesh-3f2a' });
  assert.deepStrictEqual({ ...whole, request_id: 'm1x2-3' }, fixture('request_stacks'));
  const sub = protocol.makeRequest('subscribe', { client: 'panel-5f3a9c' });
  assert.deepStrictEqual({ ...sub, request_id: 'm1x2-1' }, fixture('request_subscribe'));
  assert.notStrictEqual(req.request_id, whole.request_id);
});

test('rank ranges', () => {
  assert.strictEqual(protocol.rankRanges([5, 0, 1, 2, 3]), '0-3, 5');
  assert.strictEqual(protocol.rankRanges([]), '');
});
