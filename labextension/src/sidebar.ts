/**
 * The sidebar's view: every mesh of the current notebook's kernel, host by host and rank by
 * rank, with controls for a rank, a selection or a whole mesh. Plain DOM, rebuilt from the
 * model on each change (a few dozen rows); elapsed times tick once a second without a rebuild.
 * The charts (charts.ts) are not rebuilt: their nodes move into each new rendering, and they
 * redraw on `seriesChanged`, once per animation frame.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { MeshCharts, FrameBatch } from './charts';
import { el, PREFIX } from './dom';
import { formatBytes, recoveryText } from './format';
import { MeshModel } from './model';
import { IMesh, IRank, IStacks, Op, rankRanges, RankState } from './protocol';


interface IControl {
  op: Op;
  label: string;
  title: string;
  /** Asks for confirmation first. */
  destructive?: boolean;
  enabled: (mesh: IMesh, ranks: IRank[], debuggerOn: boolean) => boolean;
  disabledTitle?: string;
}

const CONTROLS: IControl[] = [
  {
    op: 'interrupt',
    label: 'Interrupt',
    title: 'Raise KeyboardInterrupt in what these ranks run',
    destructive: true,
    enabled: (_, ranks) => ranks.some(r => r.state === 'busy')
  },
  {
    op: 'stacks',
    label: 'Stacks',
    title: 'Dump the Python stacks of these ranks, grouped',
    enabled: (_, ranks) => ranks.length > 0
  },
  {
    op: 'pause',
    label: 'Pause',
    title: 'Pause these ranks in the debugger',
    enabled: (_, ranks, dbg) => dbg && ranks.some(r => r.state === 'busy' || r.state === 'idle'),
    disabledTitle: "Pause needs actormesh's debugger"
  },
  {
    op: 'resume',
    label: 'Continue',
    title: 'Continue the paused ranks',
    enabled: (_, ranks, dbg) => dbg && ranks.some(r => r.state === 'paused'),
    disabledTitle: "Continue needs actormesh's debugger"
  },
  {
    op: 'respawn',
    label: 'Respawn dead',
    title: 'Start the dead ranks of this mesh again and re-create their actors',
    enabled: mesh => allRanks(mesh).some(r => r.state === 'dead')
  },
  {
    op: 'stop',
    label: 'Stop mesh',
    title: 'Stop every process of this mesh',
    destructive: true,
    enabled: () => true
  }
];

function allRanks(mesh: IMesh): IRank[] {
  return ([] as IRank[]).concat(...mesh.hosts.map(h => h.ranks));
}

/** 5 s, 3 min 2 s, 1 h 4 min. */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ${s % 60} s`;
  }
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function stateDetail(rank: IRank): string {
  switch (rank.state) {
    case 'busy':
      if (!rank.busy) {
        return 'busy';
      }
      // One location form for busy and paused ranks: "In [2]:3".
      return rank.busy.line !== null
        ? `in ${rank.busy.what}:${rank.busy.line}`
        : `in ${rank.busy.what}`;
    case 'paused':
      return rank.paused ? `at ${rank.paused.file}:${rank.paused.line}` : '';
    case 'dead':
      if (!rank.dead) {
        return '';
      }
      return rank.dead.signal !== null
        ? `killed by ${rank.dead.signal}`
        : `exit code ${rank.dead.exitcode}`;
    default:
      return '';
  }
}

export { formatBytes };

export class MeshSidebar extends Widget {
  constructor(model: MeshModel) {
    super();
    this.model = model;
    this.id = 'actormesh-sidebar';
    this.addClass(`${PREFIX}-sidebar`);
    this.title.caption = 'actormesh: the live mesh';
    model.changed.connect(this._render, this);
    model.seriesChanged.connect(this._onSeries, this);
    this._ticker = window.setInterval(() => this._tick(), 1000);
    this._render();
  }

  readonly model: MeshModel;

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearInterval(this._ticker);
    this.model.changed.disconnect(this._render, this);
    this.model.seriesChanged.disconnect(this._onSeries, this);
    this._batch.dispose();
    for (const charts of this._charts.values()) {
      charts.dispose();
    }
    super.dispose();
  }

  private _chartsOf(meshId: string): MeshCharts {
    let charts = this._charts.get(meshId);
    if (!charts) {
      charts = new MeshCharts(this._batch);
      this._charts.set(meshId, charts);
    }
    return charts;
  }

  private _onSeries(): void {
    for (const [meshId, mesh] of this.model.series.meshes) {
      this._chartsOf(meshId).update(mesh);
    }
  }

  private _render(): void {
    const start = performance.now();
    this._renderAll();
    performance.measure('actormesh-render', { start, end: performance.now() });
  }

  private _renderAll(): void {
    const root = this.node;
    const scroll = root.scrollTop;
    root.textContent = '';
    const model = this.model;
    const header = el('div', 'header');
    header.appendChild(el('span', 'title', 'Mesh'));
    const status = el('span', 'connection', this._connectionText());
    status.dataset.connection = model.connection;
    header.appendChild(status);
    root.appendChild(header);
    if (model.notice) {
      const notice = el('div', `notice ${model.notice.ok ? 'ok' : 'error'}`, model.notice.text);
      root.appendChild(notice);
    }
    const snapshot = model.snapshot;
    if (model.connection !== 'live' || !snapshot) {
      root.appendChild(el('div', 'empty', this._hint()));
      return;
    }
    if (snapshot.meshes.length === 0) {
      const empty = el('div', 'empty');
      empty.appendChild(document.createTextNode('No mesh yet. Spawn one in a cell: '));
      empty.appendChild(el('code', null, 'am.this_host().spawn_procs()'));
      empty.title = 'procs = am.this_host().spawn_procs(per_host={"gpus": 4})';
      root.appendChild(empty);
    }
    const live = new Set(snapshot.meshes.map(m => m.mesh_id));
    for (const meshId of [...this._selected.keys()]) {
      if (!live.has(meshId)) {
        this._selected.delete(meshId);
      }
    }
    for (const meshId of [...this._stacks.keys()]) {
      if (!live.has(meshId)) {
        this._stacks.delete(meshId);
      }
    }
    for (const [meshId, charts] of [...this._charts]) {
      if (!live.has(meshId)) {
        charts.dispose();
        this._charts.delete(meshId);
      }
    }
    for (const mesh of snapshot.meshes) {
      root.appendChild(this._renderMesh(mesh, snapshot.debugger));
    }
    root.scrollTop = scroll;
    this._tick();
  }

  private _connectionText(): string {
    switch (this.model.connection) {
      case 'live':
        return 'live';
      case 'connecting':
        return 'connecting…';
      case 'restarting':
        return 'restarting…';
      case 'error':
        return 'error';
      default:
        return '';
    }
  }

  private _hint(): string {
    const model = this.model;
    switch (model.connection) {
      case 'no-notebook':
        return 'Open a notebook that runs the actormesh kernel to see its meshes here.';
      case 'no-kernel':
        return 'This notebook has no kernel. Pick the "actormesh" kernel to see its meshes.';
      case 'other-kernel':
        return `This notebook runs the "${model.detail}" kernel; the mesh view needs the "actormesh" kernel.`;
      case 'error':
        return `Cannot reach the kernel's mesh view: ${model.detail}`;
      default:
        return model.detail ? `${model.detail[0].toUpperCase()}${model.detail.slice(1)}…` : '';
    }
  }

  private _selection(mesh: IMesh): Set<number> {
    let set = this._selected.get(mesh.mesh_id);
    if (!set) {
      set = new Set();
      this._selected.set(mesh.mesh_id, set);
    }
    const valid = new Set(allRanks(mesh).map(r => r.rank));
    for (const r of [...set]) {
      if (!valid.has(r)) {
        set.delete(r);
      }
    }
    return set;
  }

  private _renderMesh(mesh: IMesh, debuggerOn: boolean): HTMLElement {
    const ranks = allRanks(mesh);
    const selected = this._selection(mesh);
    const charts = this._chartsOf(mesh.mesh_id);
    charts.setDead(new Set(ranks.filter(r => r.state === 'dead').map(r => r.rank)));
    const series = this.model.series.meshes.get(mesh.mesh_id);
    if (series) {
      charts.update(series);
    }
    const section = el('section', 'mesh');
    section.dataset.meshId = mesh.mesh_id;
    section.dataset.meshName = mesh.names[0] ?? '';

    const head = el('div', 'mesh-head');
    head.appendChild(el('span', 'mesh-name', mesh.names.length ? mesh.names.join(', ') : mesh.mesh_id));
    const extent = Object.entries(mesh.extent)
      .map(([k, v]) => `${k} ${v}`)
      .join(' × ');
    head.appendChild(el('span', 'mesh-extent', extent));
    section.appendChild(head);

    const counts = new Map<RankState, number>();
    for (const r of ranks) {
      counts.set(r.state, (counts.get(r.state) ?? 0) + 1);
    }
    const summary = el('div', 'summary');
    for (const state of ['busy', 'paused', 'dead', 'starting', 'idle'] as RankState[]) {
      const n = counts.get(state);
      if (n) {
        summary.appendChild(el('span', `pill state-${state}`, `${n} ${state}`));
      }
    }
    if (mesh.actors.length) {
      summary.appendChild(el('span', 'actors', `actors: ${mesh.actors.join(', ')}`));
    }
    section.appendChild(summary);

    // A training run on this mesh that lost a rank: where its recovery is (am.FaultTolerant).
    if (mesh.recovery) {
      const line = el('div', `recovery recovery-${mesh.recovery.phase}`, recoveryText(mesh.recovery));
      line.dataset.phase = mesh.recovery.phase;
      line.dataset.step = String(mesh.recovery.step);
      section.appendChild(line);
    }

    // Controls act on the selected ranks, or on the whole mesh when none is selected.
    const targets = selected.size ? ranks.filter(r => selected.has(r.rank)) : ranks;
    const toolbar = el('div', 'toolbar');
    const scope = el(
      'span',
      'scope',
      selected.size ? `rank${selected.size > 1 ? 's' : ''} ${rankRanges([...selected])}` : 'all ranks'
    );
    toolbar.appendChild(scope);
    for (const control of CONTROLS) {
      const button = el('button', `button op-${control.op}`, control.label);
      button.dataset.op = control.op;
      const enabled = control.enabled(mesh, targets, debuggerOn);
      button.disabled = !enabled;
      button.title =
        !enabled && control.disabledTitle && !debuggerOn ? control.disabledTitle : control.title;
      button.onclick = () =>
        void this._run(control, mesh, selected.size ? [...selected].sort((a, b) => a - b) : null);
      toolbar.appendChild(button);
    }
    section.appendChild(toolbar);

    for (const host of mesh.hosts) {
      const hostBlock = el('div', 'host');
      hostBlock.appendChild(el('div', 'host-head', `host ${host.host_rank} · ${host.hostname}`));
      const table = el('div', 'ranks');
      const headRow = el('div', 'rank-head');
      const allBox = el('input', null);
      allBox.type = 'checkbox';
      allBox.title = 'Select every rank of this host';
      allBox.checked = host.ranks.every(r => selected.has(r.rank));
      allBox.onchange = () => {
        for (const r of host.ranks) {
          if (allBox.checked) {
            selected.add(r.rank);
          } else {
            selected.delete(r.rank);
          }
        }
        this._render();
      };
      headRow.appendChild(allBox);
      for (const name of ['rank', 'state', 'pid', 'cpu', 'memory']) {
        headRow.appendChild(el('span', null, name));
      }
      table.appendChild(headRow);
      for (const rank of host.ranks) {
        table.appendChild(this._renderRank(rank, selected, charts));
      }
      hostBlock.appendChild(table);
      section.appendChild(hostBlock);
    }

    section.appendChild(charts.metricBlock);
    section.appendChild(charts.resourceBlock);
    const stacks = this.model.stacks.get(mesh.mesh_id);
    if (stacks) {
      section.appendChild(this._stacksBox(mesh.mesh_id, stacks));
    } else {
      this._stacks.delete(mesh.mesh_id);
    }
    return section;
  }

  /** One rank: a grid row (box, rank, state, pid, CPU sparkline, memory), the detail below. */
  private _renderRank(rank: IRank, selected: Set<number>, charts: MeshCharts): HTMLElement {
    const row = el('div', 'rank');
    row.dataset.rank = `${rank.rank}`;
    row.dataset.state = rank.state;
    if (selected.has(rank.rank)) {
      row.classList.add(`${PREFIX}-selected`);
    }
    const box = el('input', null);
    box.type = 'checkbox';
    box.checked = selected.has(rank.rank);
    box.title = `Select rank ${rank.rank}`;
    box.onchange = () => {
      if (box.checked) {
        selected.add(rank.rank);
      } else {
        selected.delete(rank.rank);
      }
      this._render();
    };
    row.appendChild(box);
    const label = el('span', 'rank-label', `${rank.rank}`);
    label.title = rank.pid !== null ? `${rank.label} · pid ${rank.pid}` : rank.label;
    row.appendChild(label);
    const state = el('span', 'state');
    state.appendChild(el('span', `badge state-${rank.state}`, rank.state));
    row.appendChild(state);
    row.appendChild(el('span', 'pid', rank.pid !== null ? `${rank.pid}` : '–'));
    row.appendChild(charts.sparkline(rank.rank));
    row.appendChild(el('span', 'memory', formatBytes(rank.rss)));
    // The second line: for how long, and where (the elapsed time no longer squeezes beside
    // the badge, where a narrow sidebar wrapped it).
    const info = el('span', 'info');
    if (rank.pid !== null) {
      // Shown only where the pid column is not (a narrow sidebar: base.css).
      info.appendChild(el('span', 'pid-inline', `pid ${rank.pid}`));
    }
    if (rank.since !== null && rank.state !== 'idle') {
      const elapsed = el('span', 'elapsed');
      elapsed.dataset.since = `${rank.since}`;
      info.appendChild(elapsed);
    }
    const detail = stateDetail(rank);
    if (detail) {
      const line = el('span', 'detail', detail);
      if (rank.dead && rank.dead.reason) {
        line.title = rank.dead.reason;
      }
      info.appendChild(line);
    }
    if (info.childNodes.length) {
      row.appendChild(info);
    }
    if (rank.gpu_mem !== null) {
      row.appendChild(el('span', 'gpu', `GPU ${formatBytes(rank.gpu_mem)}`));
    }
    return row;
  }

  /** The stacks' element, kept while the stacks are the same: a re-render (any rank's state
   *  change) moves it, so a group the user closed stays closed and its scroll stays put. */
  private _stacksBox(meshId: string, stacks: IStacks): HTMLElement {
    const kept = this._stacks.get(meshId);
    if (kept && kept.stacks === stacks) {
      return kept.box;
    }
    const box = this._renderStacks(stacks);
    this._stacks.set(meshId, { stacks, box });
    return box;
  }

  private _renderStacks(stacks: IStacks): HTMLElement {
    const box = el('div', 'stacks');
    const head = el('div', 'stacks-head');
    const n = stacks.groups.length;
    head.appendChild(el('span', null, `Stacks · ${n} group${n === 1 ? '' : 's'}`));
    const close = el('button', 'button close', '×');
    close.title = 'Close the stacks';
    close.onclick = () => this.model.closeStacks(stacks.mesh_id);
    head.appendChild(close);
    box.appendChild(head);
    for (const group of stacks.groups) {
      const details = el('details', 'stack-group');
      details.open = true;
      details.dataset.ranks = group.ranks.join(',');
      const count = group.ranks.length;
      details.appendChild(
        el('summary', null, `rank${count > 1 ? 's' : ''} ${rankRanges(group.ranks)} (${count})`)
      );
      details.appendChild(el('pre', 'stack-text', group.text));
      box.appendChild(details);
    }
    return box;
  }

  private async _run(control: IControl, mesh: IMesh, ranks: number[] | null): Promise<void> {
    const name = mesh.names[0] ?? mesh.mesh_id;
    const what = ranks ? `rank${ranks.length > 1 ? 's' : ''} ${rankRanges(ranks)} of ${name}` : name;
    if (control.destructive) {
      const body =
        control.op === 'stop'
          ? `Stop every process of ${name}? Its actors and their state are lost.`
          : `Interrupt what ${ranks ? what : `every rank of ${name}`} is running?`;
      const result = await showDialog({
        title: `${control.label}?`,
        body,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: control.label })]
      });
      if (!result.button.accept) {
        return;
      }
    }
    try {
      await this.model.request(control.op, mesh.mesh_id, ranks);
    } catch (err) {
      void showDialog({
        title: `${control.label} failed`,
        body: (err as Error).message,
        buttons: [Dialog.okButton()]
      });
    }
  }

  private _tick(): void {
    const snapshot = this.model.snapshot;
    if (!snapshot) {
      return;
    }
    // The kernel's clock may differ from ours: its time now is the snapshot's time plus what
    // our clock says has passed since the snapshot arrived.
    const kernelNow = snapshot.time + (Date.now() / 1000 - this.model.snapshotReceived);
    for (const node of Array.from(this.node.querySelectorAll<HTMLElement>(`.${PREFIX}-elapsed`))) {
      node.textContent = formatDuration(kernelNow - Number(node.dataset.since));
    }
  }

  private _selected = new Map<string, Set<number>>();
  private _stacks = new Map<string, { stacks: IStacks; box: HTMLElement }>();
  private _charts = new Map<string, MeshCharts>();
  private _batch = new FrameBatch();
  private _ticker: number;
}
