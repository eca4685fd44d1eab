/**
 * The panel's state: which kernel it follows, the last snapshot, stacks, and requests.
 *
 * The model follows one notebook's session at a time. For an actormesh kernel it sends a
 * `subscribe` request on the control channel; the kernel answers by opening a comm (target
 * `actormesh.panel`) that carries every later snapshot. Control requests and iopub comm
 * messages both flow while the kernel's shell runs a cell. On restart the comm is gone; the
 * model subscribes again when the new kernel reports idle or busy. Chart data (`series`
 * messages) goes to `series` and signals `seriesChanged` alone: the charts redraw, the rest
 * of the panel stays as it is.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import {
  COMM_TARGET,
  IReply,
  IResult,
  ISnapshot,
  IStacks,
  KernelMessage as PanelMessage,
  makeRequest,
  Op,
  parseKernelMessage,
  parseReply,
  REQUEST_TYPE
} from './protocol';
import { SeriesStore } from './series';

export const KERNEL_NAME = 'actormesh';
const SUBSCRIBE_TIMEOUT_MS = 20000;
const RETRY_MS = 3000;

/** What the panel can say about its connection. */
export type Connection =
  | 'no-notebook'
  | 'other-kernel'
  | 'no-kernel'
  | 'connecting'
  | 'live'
  | 'restarting'
  | 'error';

export interface INotice {
  ok: boolean;
  text: string;
}

export class MeshModel {
  readonly client = `panel-${Math.random().toString(36).slice(2, 10)}`;
  connection: Connection = 'no-notebook';
  /** A line about the connection, e.g. the kernel's name or an error. */
  detail = '';
  snapshot: ISnapshot | null = null;
  /** Our clock (seconds) when the snapshot arrived: elapsed times count on from there. */
  snapshotReceived = 0;
  /** The last stacks of each mesh, until closed. */
  readonly stacks = new Map<string, IStacks>();
  notice: INotice | null = null;
  /** Each mesh's chart data, as the `series` messages brought it. */
  readonly series = new SeriesStore();

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get seriesChanged(): ISignal<this, void> {
    return this._seriesChanged;
  }

  /** Follow this notebook's session (null: no notebook open). */
  follow(session: ISessionContext | null): void {
    if (session === this._session) {
      return;
    }
    if (this._session) {
      this._session.kernelChanged.disconnect(this._onKernelChanged, this);
      this._session.statusChanged.disconnect(this._onStatus, this);
    }
    this._session = session;
    if (session) {
      session.kernelChanged.connect(this._onKernelChanged, this);
      session.statusChanged.connect(this._onStatus, this);
      void session.ready.then(() => {
        if (this._session === session) {
          this._attach(session.session?.kernel ?? null);
        }
      });
    }
    this._attach(session?.session?.kernel ?? null);
  }

  /** Ask the kernel to do `op` on `ranks` of a mesh (null: every rank). */
  async request(op: Op, meshId: string, ranks: number[] | null): Promise<IReply> {
    const kernel = this._kernel;
    if (!kernel || this.connection !== 'live') {
      throw new Error('the panel is not connected to an actormesh kernel');
    }
    const reply = await this._send(kernel, makeRequest(op, { mesh_id: meshId, ranks }));
    if (reply.status === 'error') {
      this._notify(false, reply.message);
    }
    return reply;
  }

  closeStacks(meshId: string): void {
    if (this.stacks.delete(meshId)) {
      this._changed.emit();
    }
  }

  dispose(): void {
    this.follow(null);
    Signal.clearData(this);
  }

  // -- kernel -------------------------------------------------------------------------------------

  private _onKernelChanged(
    _: ISessionContext,
    change: { newValue: Kernel.IKernelConnection | null }
  ): void {
    this._attach(change.newValue);
  }

  private _onStatus(session: ISessionContext, status: Kernel.Status): void {
    if (!this._kernel || this._kernel.name !== KERNEL_NAME) {
      return; // not an actormesh kernel: nothing to follow
    }
    if (status === 'restarting' || status === 'autorestarting' || status === 'starting') {
      this._reset('restarting', 'the kernel is restarting');
      return;
    }
    if (status === 'dead') {
      this._reset('error', 'the kernel is dead; restart it');
      return;
    }
    if ((status === 'idle' || status === 'busy') && !this._comm) {
      this._subscribe(this._kernel);
    }
  }

  private _attach(kernel: Kernel.IKernelConnection | null): void {
    if (kernel === this._kernel && (this._comm || this._subscribing)) {
      return;
    }
    this._dropComm();
    this._kernel = kernel;
    this.snapshot = null;
    this.stacks.clear();
    this.series.meshes.clear();
    this.notice = null;
    if (!this._session) {
      this._set('no-notebook', '');
      return;
    }
    if (!kernel) {
      this._set('no-kernel', 'this notebook has no kernel');
      return;
    }
    if (kernel.name !== KERNEL_NAME) {
      this._set('other-kernel', kernel.name);
      return;
    }
    if (!this._targets.has(kernel)) {
      this._targets.add(kernel);
      kernel.registerCommTarget(COMM_TARGET, (comm, msg) => this._onCommOpen(kernel, comm, msg));
    }
    this._subscribe(kernel);
  }

  private _subscribe(kernel: Kernel.IKernelConnection): void {
    if (this._subscribing || kernel !== this._kernel || kernel.name !== KERNEL_NAME) {
      return;
    }
    if (kernel.status !== 'idle' && kernel.status !== 'busy') {
      this._set('connecting', 'waiting for the kernel to start');
      return; // _onStatus subscribes once the kernel runs
    }
    this._subscribing = true;
    this._set('connecting', 'connecting to the kernel');
    const request = makeRequest('subscribe', { client: this.client });
    const timeout = new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error('the kernel did not answer')), SUBSCRIBE_TIMEOUT_MS)
    );
    Promise.race([this._send(kernel, request), timeout])
      .then(reply => {
        if (reply.status === 'error') {
          throw new Error(reply.message);
        }
      })
      .catch((err: Error) => {
        if (kernel !== this._kernel) {
          return;
        }
        this._set('error', err.message);
        setTimeout(() => {
          if (kernel === this._kernel && !this._comm && !kernel.isDisposed) {
            this._subscribe(kernel);
          }
        }, RETRY_MS);
      })
      .finally(() => {
        this._subscribing = false;
      });
  }

  private async _send(
    kernel: Kernel.IKernelConnection,
    request: ReturnType<typeof makeRequest>
  ): Promise<IReply> {
    // A custom control message: JupyterLab's types list only the standard control messages.
    const msg = KernelMessage.createMessage({
      channel: 'control',
      msgType: REQUEST_TYPE as 'debug_request',
      session: kernel.clientId,
      username: kernel.username,
      content: request as unknown as KernelMessage.IDebugRequestMsg['content']
    });
    // The kernel answers these requests without busy/idle status messages (they would show a
    // running notebook idle), and a future is only done at both its reply and an idle status:
    // wait for the reply alone, then let the future go. `done` still fails the wait if the
    // kernel connection goes away first.
    const future = kernel.sendControlMessage(msg, true, false);
    try {
      const replied = new Promise<KernelMessage.IControlMessage>(resolve => {
        future.onReply = resolve;
      });
      const reply = await Promise.race([replied, future.done]);
      return parseReply(reply?.content);
    } finally {
      future.dispose();
    }
  }

  private _onCommOpen(
    kernel: Kernel.IKernelConnection,
    comm: Kernel.IComm,
    msg: KernelMessage.ICommOpenMsg
  ): void {
    let hello: PanelMessage;
    try {
      hello = parseKernelMessage(msg.content.data);
    } catch (err) {
      if (kernel === this._kernel) {
        this._set('error', (err as Error).message);
      }
      return;
    }
    if (hello.type !== 'hello' || hello.client !== this.client || kernel !== this._kernel) {
      return; // another panel's comm (every client sees the kernel's comm_open)
    }
    this._dropComm();
    this._comm = comm;
    comm.onMsg = m => this._onMessage(comm, m.content.data);
    comm.onClose = () => {
      if (this._comm === comm) {
        this._comm = null;
        this._set('connecting', 'the kernel closed the connection');
      }
    };
    this._set('live', '');
  }

  private _onMessage(comm: Kernel.IComm, data: unknown): void {
    if (comm !== this._comm) {
      return;
    }
    let message: PanelMessage;
    try {
      message = parseKernelMessage(data);
    } catch (err) {
      this._set('error', (err as Error).message);
      return;
    }
    switch (message.type) {
      case 'snapshot':
        this.snapshot = message;
        this.snapshotReceived = Date.now() / 1000;
        for (const meshId of [...this.stacks.keys()]) {
          if (!message.meshes.some(m => m.mesh_id === meshId)) {
            this.stacks.delete(meshId);
          }
        }
        this.series.retain(new Set(message.meshes.map(m => m.mesh_id)));
        break;
      case 'series': {
        const start = performance.now();
        this.series.apply(message);
        performance.measure('actormesh-series', { start, end: performance.now() });
        this._seriesChanged.emit();
        return;
      }
      case 'stacks':
        this.stacks.set(message.mesh_id, message);
        break;
      case 'result':
        this._onResult(message);
        return;
      default:
        return;
    }
    this._changed.emit();
  }

  private _onResult(result: IResult): void {
    this._notify(result.ok, result.message);
  }

  private _notify(ok: boolean, text: string): void {
    this.notice = { ok, text };
    this._changed.emit();
  }

  private _dropComm(): void {
    const comm = this._comm;
    this._comm = null;
    if (comm && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel is gone already
      }
    }
  }

  private _reset(connection: Connection, detail: string): void {
    this._comm = null; // the kernel that had it is gone
    this.snapshot = null;
    this.stacks.clear();
    this.series.meshes.clear();
    this.notice = null;
    this._set(connection, detail);
  }

  private _set(connection: Connection, detail: string): void {
    this.connection = connection;
    this.detail = detail;
    this._changed.emit();
  }

  private _session: ISessionContext | null = null;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _subscribing = false;
  private _targets = new WeakSet<Kernel.IKernelConnection>();
  private _changed = new Signal<this, void>(this);
  private _seriesChanged = new Signal<this, void>(this);
}
