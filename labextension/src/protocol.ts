/**
 * The messages between the actormesh kernel and this panel, protocol version 3.
 *
 * Written down once in docs/panel-protocol.md; every message has a JSON fixture under
 * tests/fixtures/panel/ that both the Python and the TypeScript tests check. This module is
 * pure (no JupyterLab imports) so the tests can run it under plain node.
 *
 * Panel -> kernel: a control-channel request `actormesh_panel_request` (the control channel
 * is answered even while a cell runs), answered by `actormesh_panel_reply`.
 * Kernel -> panel: a comm with target `actormesh.panel` that the kernel opens on `subscribe`,
 * carrying `hello`, then `snapshot`, `series` (chart data), `stacks` and `result` messages
 * over iopub.
 */

/**
 * 2 added `series`: a version-1 panel would refuse it as an unknown type. 3 added a mesh's
 * `recovery` (a training run that lost a rank), a field a version-2 panel would not show.
 */
export const PROTOCOL_VERSION = 3;
export const COMM_TARGET = 'actormesh.panel';
export const REQUEST_TYPE = 'actormesh_panel_request';
export const REPLY_TYPE = 'actormesh_panel_reply';

export type Op =
  | 'subscribe'
  | 'interrupt'
  | 'stacks'
  | 'pause'
  | 'resume'
  | 'respawn'
  | 'stop';

export const OPS: readonly Op[] = [
  'subscribe',
  'interrupt',
  'stacks',
  'pause',
  'resume',
  'respawn',
  'stop'
];

export interface IRequest {
  protocol: number;
  request_id: string;
  op: Op;
  /** Which comm the kernel should open (subscribe only): the panel's own token. */
  client?: string;
  mesh_id?: string;
  /** Flat ranks within the mesh; null: the whole mesh. */
  ranks?: number[] | null;
}

export interface IReply {
  protocol: number;
  request_id: string;
  status: 'ok' | 'error';
  message: string;
}

export type RankState = 'starting' | 'idle' | 'busy' | 'paused' | 'dead';

export interface IBusy {
  /** 'cell': a %%mesh cell; 'endpoint': an actor endpoint. */
  kind: 'cell' | 'endpoint';
  /** The cell's label ("In [3]") or "actor.endpoint". */
  what: string;
  line: number | null;
}

export interface IPaused {
  file: string;
  line: number;
  function: string;
}

export interface IDeath {
  exitcode: number | null;
  signal: string | null;
  reason: string;
}

export interface IRank {
  rank: number;
  label: string;
  state: RankState;
  /** Unix time (seconds) the rank entered this state, when known. */
  since: number | null;
  pid: number | null;
  rss: number | null;
  gpu_mem: number | null;
  busy: IBusy | null;
  paused: IPaused | null;
  dead: IDeath | null;
}

export interface IHost {
  host_rank: number;
  hostname: string;
  ranks: IRank[];
}

export type RecoveryPhase = 'restoring' | 'restored' | 'resumed' | 'failed';
export type RecoveryKind = 'recover' | 'shrink' | 'grow';

/** The last recovery of a training run on a mesh (am.FaultTolerant), as it goes. */
export interface IRecovery {
  phase: RecoveryPhase;
  /** recover: the lost ranks respawned; shrink: training goes on without them; grow: they rejoin. */
  kind: RecoveryKind;
  /** The ranks lost (recover, shrink) or rejoining (grow), as "{dp=1}". */
  ranks: string[];
  /** The step being restored, then restored, then (resumed) the first completed after it. */
  step: number;
  /** Where the state came from: "replicas" or "checkpoint" (null while restoring). */
  source: string | null;
  /** The tensor mesh's sizes then. */
  extent: Record<string, number>;
  seconds: number | null;
  /** Unix time it began (kernel clock). */
  time: number;
  error: string | null;
}

export interface IMesh {
  mesh_id: string;
  /** Names of the notebook variables holding this mesh (or its actor meshes). */
  names: string[];
  extent: Record<string, number>;
  actors: string[];
  hosts: IHost[];
  recovery: IRecovery | null;
}

export interface IHello {
  protocol: number;
  type: 'hello';
  client: string;
  debugger: boolean;
}

export interface ISnapshot {
  protocol: number;
  type: 'snapshot';
  /** Unix time of the snapshot (kernel clock). */
  time: number;
  debugger: boolean;
  meshes: IMesh[];
}

export interface IStackGroup {
  ranks: number[];
  labels: string[];
  text: string;
}

export interface IStacks {
  protocol: number;
  type: 'stacks';
  request_id: string;
  mesh_id: string;
  groups: IStackGroup[];
}

export interface IResult {
  protocol: number;
  type: 'result';
  request_id: string;
  op: Op;
  ok: boolean;
  message: string;
}

/** One rank's new resource samples, as columns of equal length. */
export interface IResourceColumns {
  rank: number;
  /** Unix time of each sample (the host agent's clock). */
  time: number[];
  /** % of one core. */
  cpu: number[];
  /** Resident memory, bytes. */
  rss: number[];
  /** GPU memory (bytes) and utilisation (%): null without NVML. */
  gpu_mem: (number | null)[] | null;
  gpu_util: (number | null)[] | null;
}

/** One metric's new points on one rank; a value is null where it was NaN or infinite. */
export interface IMetricPoints {
  rank: number;
  step: number[];
  value: (number | null)[];
}

export interface IMetricSeries {
  name: string;
  ranks: IMetricPoints[];
}

export interface IMeshSeries {
  mesh_id: string;
  resources: IResourceColumns[];
  metrics: IMetricSeries[];
}

/** The points new since the last `series` (all that the kernel keeps when `reset`). */
export interface ISeries {
  protocol: number;
  type: 'series';
  time: number;
  reset: boolean;
  meshes: IMeshSeries[];
}

export type KernelMessage = IHello | ISnapshot | ISeries | IStacks | IResult;

/** A message that does not follow the protocol (or speaks another version). */
export class ProtocolError extends Error {}

type Json = { [key: string]: unknown };

function obj(v: unknown, where: string): Json {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    throw new ProtocolError(`${where}: expected an object`);
  }
  return v as Json;
}

function str(o: Json, key: string, where: string): string {
  const v = o[key];
  if (typeof v !== 'string') {
    throw new ProtocolError(`${where}.${key}: expected a string`);
  }
  return v;
}

function num(o: Json, key: string, where: string): number {
  const v = o[key];
  if (typeof v !== 'number' || !isFinite(v)) {
    throw new ProtocolError(`${where}.${key}: expected a number`);
  }
  return v;
}

function optNum(o: Json, key: string, where: string): number | null {
  const v = o[key];
  if (v === null || v === undefined) {
    return null;
  }
  return num(o, key, where);
}

function bool(o: Json, key: string, where: string): boolean {
  const v = o[key];
  if (typeof v !== 'boolean') {
    throw new ProtocolError(`${where}.${key}: expected true or false`);
  }
  return v;
}

function arr(o: Json, key: string, where: string): unknown[] {
  const v = o[key];
  if (!Array.isArray(v)) {
    throw new ProtocolError(`${where}.${key}: expected a list`);
  }
  return v;
}

function strings(o: Json, key: string, where: string): string[] {
  return arr(o, key, where).map((v, i) => {
    if (typeof v !== 'string') {
      throw new ProtocolError(`${where}.${key}[${i}]: expected a string`);
    }
    return v;
  });
}

function ints(o: Json, key: string, where: string): number[] {
  return arr(o, key, where).map((v, i) => {
    if (typeof v !== 'number' || !Number.isInteger(v)) {
      throw new ProtocolError(`${where}.${key}[${i}]: expected an integer`);
    }
    return v;
  });
}

function op(o: Json, where: string): Op {
  const v = str(o, 'op', where);
  if (!(OPS as readonly string[]).includes(v)) {
    throw new ProtocolError(`${where}.op: unknown operation ${JSON.stringify(v)}`);
  }
  return v as Op;
}

function checkVersion(o: Json, where: string): number {
  const v = num(o, 'protocol', where);
  if (v !== PROTOCOL_VERSION) {
    throw new ProtocolError(
      `the kernel speaks panel protocol ${v}, this panel speaks ${PROTOCOL_VERSION}: ` +
        'install the same actormesh version in JupyterLab and in the kernel'
    );
  }
  return v;
}

function numbers(
  o: Json,
  key: string,
  where: string,
  nullable: boolean,
  integer = false
): (number | null)[] {
  return arr(o, key, where).map((v, i) => {
    if (v === null && nullable) {
      return null;
    }
    if (typeof v !== 'number' || !isFinite(v) || (integer && !Number.isInteger(v))) {
      throw new ProtocolError(`${where}.${key}[${i}]: expected ${integer ? 'an integer' : 'a number'}`);
    }
    return v;
  });
}

function sameLengths(o: Record<string, unknown>, where: string): void {
  const lengths = Object.values(o)
    .filter(Array.isArray)
    .map(v => (v as unknown[]).length);
  if (lengths.some(n => n !== lengths[0])) {
    throw new ProtocolError(`${where}: columns of different lengths`);
  }
}

function parseResources(v: unknown, where: string): IResourceColumns {
  const o = obj(v, where);
  const gpu = (key: string) =>
    o[key] === null ? null : numbers(o, key, where, true, true);
  const columns: IResourceColumns = {
    rank: num(o, 'rank', where),
    time: numbers(o, 'time', where, false) as number[],
    cpu: numbers(o, 'cpu', where, false) as number[],
    rss: numbers(o, 'rss', where, false, true) as number[],
    gpu_mem: gpu('gpu_mem'),
    gpu_util: gpu('gpu_util')
  };
  sameLengths(columns as unknown as Record<string, unknown>, where);
  return columns;
}

function parseMeshSeries(v: unknown, where: string): IMeshSeries {
  const o = obj(v, where);
  return {
    mesh_id: str(o, 'mesh_id', where),
    resources: arr(o, 'resources', where).map((r, i) =>
      parseResources(r, `${where}.resources[${i}]`)
    ),
    metrics: arr(o, 'metrics', where).map((m, i) => {
      const mw = `${where}.metrics[${i}]`;
      const mo = obj(m, mw);
      return {
        name: str(mo, 'name', mw),
        ranks: arr(mo, 'ranks', mw).map((p, j) => {
          const pw = `${mw}.ranks[${j}]`;
          const po = obj(p, pw);
          const points: IMetricPoints = {
            rank: num(po, 'rank', pw),
            step: numbers(po, 'step', pw, false, true) as number[],
            value: numbers(po, 'value', pw, true)
          };
          sameLengths(points as unknown as Record<string, unknown>, pw);
          return points;
        })
      };
    })
  };
}

const STATES: readonly RankState[] = ['starting', 'idle', 'busy', 'paused', 'dead'];

function parseRank(v: unknown, where: string): IRank {
  const o = obj(v, where);
  const state = str(o, 'state', where);
  if (!(STATES as readonly string[]).includes(state)) {
    throw new ProtocolError(`${where}.state: unknown state ${JSON.stringify(state)}`);
  }
  let busy: IBusy | null = null;
  if (o.busy !== null && o.busy !== undefined) {
    const b = obj(o.busy, `${where}.busy`);
    const kind = str(b, 'kind', `${where}.busy`);
    if (kind !== 'cell' && kind !== 'endpoint') {
      throw new ProtocolError(`${where}.busy.kind: expected "cell" or "endpoint"`);
    }
    busy = { kind, what: str(b, 'what', `${where}.busy`), line: optNum(b, 'line', `${where}.busy`) };
  }
  let paused: IPaused | null = null;
  if (o.paused !== null && o.paused !== undefined) {
    const p = obj(o.paused, `${where}.paused`);
    paused = {
      file: str(p, 'file', `${where}.paused`),
      line: num(p, 'line', `${where}.paused`),
      function: str(p, 'function', `${where}.paused`)
    };
  }
  let dead: IDeath | null = null;
  if (o.dead !== null && o.dead !== undefined) {
    const d = obj(o.dead, `${where}.dead`);
    const signal = d.signal;
    if (signal !== null && typeof signal !== 'string') {
      throw new ProtocolError(`${where}.dead.signal: expected a string or null`);
    }
    dead = {
      exitcode: optNum(d, 'exitcode', `${where}.dead`),
      signal,
      reason: str(d, 'reason', `${where}.dead`)
    };
  }
  return {
    rank: num(o, 'rank', where),
    label: str(o, 'label', where),
    state: state as RankState,
    since: optNum(o, 'since', where),
    pid: optNum(o, 'pid', where),
    rss: optNum(o, 'rss', where),
    gpu_mem: optNum(o, 'gpu_mem', where),
    busy,
    paused,
    dead
  };
}

function parseExtent(v: unknown, where: string): Record<string, number> {
  const o = obj(v, where);
  const extent: Record<string, number> = {};
  for (const key of Object.keys(o)) {
    extent[key] = num(o, key, where);
  }
  return extent;
}

const PHASES: readonly RecoveryPhase[] = ['restoring', 'restored', 'resumed', 'failed'];
const KINDS: readonly RecoveryKind[] = ['recover', 'shrink', 'grow'];

function oneOf<T extends string>(o: Json, key: string, where: string, options: readonly T[]): T {
  const v = str(o, key, where);
  if (!(options as readonly string[]).includes(v)) {
    throw new ProtocolError(`${where}.${key}: unknown ${key} ${JSON.stringify(v)}`);
  }
  return v as T;
}

function optStr(o: Json, key: string, where: string): string | null {
  return o[key] === null || o[key] === undefined ? null : str(o, key, where);
}

function parseRecovery(v: unknown, where: string): IRecovery | null {
  if (v === null || v === undefined) {
    return null;
  }
  const o = obj(v, where);
  const step = num(o, 'step', where);
  if (!Number.isInteger(step)) {
    throw new ProtocolError(`${where}.step: expected an integer`);
  }
  return {
    phase: oneOf(o, 'phase', where, PHASES),
    kind: oneOf(o, 'kind', where, KINDS),
    ranks: strings(o, 'ranks', where),
    step,
    source: optStr(o, 'source', where),
    extent: parseExtent(o.extent, `${where}.extent`),
    seconds: optNum(o, 'seconds', where),
    time: num(o, 'time', where),
    error: optStr(o, 'error', where)
  };
}

function parseMesh(v: unknown, where: string): IMesh {
  const o = obj(v, where);
  const extent = parseExtent(o.extent, `${where}.extent`);
  return {
    mesh_id: str(o, 'mesh_id', where),
    names: strings(o, 'names', where),
    extent,
    actors: strings(o, 'actors', where),
    hosts: arr(o, 'hosts', where).map((h, i) => {
      const hw = `${where}.hosts[${i}]`;
      const ho = obj(h, hw);
      return {
        host_rank: num(ho, 'host_rank', hw),
        hostname: str(ho, 'hostname', hw),
        ranks: arr(ho, 'ranks', hw).map((r, j) => parseRank(r, `${hw}.ranks[${j}]`))
      };
    }),
    recovery: parseRecovery(o.recovery, `${where}.recovery`)
  };
}

/** Check a comm message from the kernel; throws ProtocolError saying what is wrong. */
export function parseKernelMessage(data: unknown): KernelMessage {
  const o = obj(data, 'message');
  const protocol = checkVersion(o, 'message');
  const type = str(o, 'type', 'message');
  switch (type) {
    case 'hello':
      return {
        protocol,
        type,
        client: str(o, 'client', 'hello'),
        debugger: bool(o, 'debugger', 'hello')
      };
    case 'snapshot':
      return {
        protocol,
        type,
        time: num(o, 'time', 'snapshot'),
        debugger: bool(o, 'debugger', 'snapshot'),
        meshes: arr(o, 'meshes', 'snapshot').map((m, i) => parseMesh(m, `snapshot.meshes[${i}]`))
      };
    case 'series':
      return {
        protocol,
        type,
        time: num(o, 'time', 'series'),
        reset: bool(o, 'reset', 'series'),
        meshes: arr(o, 'meshes', 'series').map((m, i) => parseMeshSeries(m, `series.meshes[${i}]`))
      };
    case 'stacks':
      return {
        protocol,
        type,
        request_id: str(o, 'request_id', 'stacks'),
        mesh_id: str(o, 'mesh_id', 'stacks'),
        groups: arr(o, 'groups', 'stacks').map((g, i) => {
          const gw = `stacks.groups[${i}]`;
          const go = obj(g, gw);
          return {
            ranks: ints(go, 'ranks', gw),
            labels: strings(go, 'labels', gw),
            text: str(go, 'text', gw)
          };
        })
      };
    case 'result':
      return {
        protocol,
        type,
        request_id: str(o, 'request_id', 'result'),
        op: op(o, 'result'),
        ok: bool(o, 'ok', 'result'),
        message: str(o, 'message', 'result')
      };
    default:
      throw new ProtocolError(`message.type: unknown type ${JSON.stringify(type)}`);
  }
}

/** Check the kernel's reply to a request. */
export function parseReply(data: unknown): IReply {
  const o = obj(data, 'reply');
  const protocol = checkVersion(o, 'reply');
  const status = str(o, 'status', 'reply');
  if (status !== 'ok' && status !== 'error') {
    throw new ProtocolError('reply.status: expected "ok" or "error"');
  }
  return {
    protocol,
    request_id: str(o, 'request_id', 'reply'),
    status,
    message: str(o, 'message', 'reply')
  };
}

let counter = 0;

/** A request for the kernel; `ranks` null means the whole mesh. */
export function makeRequest(
  requestOp: Op,
  target: { mesh_id?: string; ranks?: number[] | null; client?: string } = {}
): IRequest {
  counter += 1;
  const request: IRequest = {
    protocol: PROTOCOL_VERSION,
    request_id: `${Date.now().toString(36)}-${counter}`,
    op: requestOp
  };
  if (target.client !== undefined) {
    request.client = target.client;
  }
  if (target.mesh_id !== undefined) {
    request.mesh_id = target.mesh_id;
    request.ranks = target.ranks ?? null;
  }
  return request;
}

/** Check a request the way the kernel will (the tests run the fixtures through this). */
export function parseRequest(data: unknown): IRequest {
  const o = obj(data, 'request');
  const protocol = checkVersion(o, 'request');
  const requestOp = op(o, 'request');
  const request: IRequest = { protocol, request_id: str(o, 'request_id', 'request'), op: requestOp };
  if (requestOp === 'subscribe') {
    request.client = str(o, 'client', 'request');
    return request;
  }
  request.mesh_id = str(o, 'mesh_id', 'request');
  request.ranks = o.ranks === null || o.ranks === undefined ? null : ints(o, 'ranks', 'request');
  return request;
}

/** "0-3, 5" for [0, 1, 2, 3, 5]. */
export function rankRanges(ranks: readonly number[]): string {
  const sorted = [...ranks].sort((a, b) => a - b);
  const parts: string[] = [];
  let i = 0;
  while (i < sorted.length) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j] + 1) {
      j += 1;
    }
    parts.push(i === j ? `${sorted[i]}` : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return parts.join(', ');
}
