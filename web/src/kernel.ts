// One kernel websocket: /api/kernels/{id}/channels with the legacy framing
// (no subprotocol; JSON text frames, and the legacy binary framing when the
// server sends buffers). It reconnects on its own with the same session_id,
// so the server can replay what the kernel produced meanwhile.

import { Api, HttpError } from "./api";
import { uuid } from "./dom";

export interface Header {
  msg_id: string;
  msg_type: string;
  session: string;
  username: string;
  date: string;
  version: string;
}

export interface Message {
  header: Header;
  parent_header: Partial<Header>;
  metadata: Record<string, unknown>;
  // Content shapes differ per msg_type; readers check what they use.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  content: any;
  buffers?: unknown[];
  channel: string;
}

/**
 * connecting: first connection or a reconnect under way;
 * connected: the websocket is open;
 * disconnected: lost, will retry;
 * gone: the kernel no longer exists on the server;
 * closed: closed by this page.
 */
export type ConnState = "connecting" | "connected" | "disconnected" | "gone" | "closed";

const PROTOCOL_VERSION = "5.3";
const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];

/** The websocket session id per kernel, kept for the tab so a reload still gets the replay. */
function sessionIdFor(kernelId: string): string {
  const key = `kernelgate.session.${kernelId}`;
  let id = sessionStorage.getItem(key);
  if (!id) {
    id = uuid();
    sessionStorage.setItem(key, id);
  }
  return id;
}

export function parseBinaryFrame(buf: ArrayBuffer): Message {
  // Legacy binary framing: u32be nbufs, nbufs × u32be offsets; offsets[0]
  // starts the JSON message, the others start each raw buffer.
  const view = new DataView(buf);
  const n = view.getUint32(0, false);
  if (n < 1 || 4 * (n + 1) > buf.byteLength) throw new Error("malformed binary frame");
  const offsets: number[] = [];
  for (let i = 0; i < n; i++) offsets.push(view.getUint32(4 * (i + 1), false));
  const end = (i: number) => (i + 1 < n ? offsets[i + 1] : buf.byteLength);
  const json = new TextDecoder().decode(new Uint8Array(buf, offsets[0], end(0) - offsets[0]));
  const msg = JSON.parse(json) as Message;
  msg.buffers = [];
  for (let i = 1; i < n; i++) msg.buffers.push(new DataView(buf, offsets[i], end(i) - offsets[i]));
  return msg;
}

export class KernelConnection {
  readonly sessionId: string;
  state: ConnState = "connecting";
  onMessage: (m: Message) => void = () => {};
  onState: (s: ConnState, detail?: string) => void = () => {};
  /** Called after every (re)connect, when the socket is open. */
  onOpen: (reconnected: boolean) => void = () => {};

  private ws: WebSocket | null = null;
  private attempt = 0;
  private timer: number | undefined;
  private everOpened = false;
  private quiet = false; // the next open is a renewal, not a recovery
  private outbox: string[] = [];
  private readonly onOnline = () => this.retryNow();

  constructor(
    private readonly api: Api,
    readonly kernelId: string,
  ) {
    this.sessionId = sessionIdFor(kernelId);
    window.addEventListener("online", this.onOnline);
  }

  connect(): void {
    if (this.state === "closed" || this.state === "gone") return;
    clearTimeout(this.timer);
    this.setState("connecting");
    const url = this.api.wsUrl(`api/kernels/${encodeURIComponent(this.kernelId)}/channels`, {
      session_id: this.sessionId,
    });
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      const reconnected = this.everOpened && !this.quiet;
      this.everOpened = true;
      this.quiet = false;
      this.attempt = 0;
      this.setState("connected");
      const queued = this.outbox.splice(0);
      for (const f of queued) ws.send(f);
      this.onOpen(reconnected);
    };
    ws.onmessage = (ev) => {
      if (this.ws !== ws) return;
      let msg: Message;
      try {
        msg = typeof ev.data === "string" ? JSON.parse(ev.data) : parseBinaryFrame(ev.data as ArrayBuffer);
      } catch (e) {
        console.warn("kernelgate: dropped an unreadable frame", e);
        return;
      }
      this.onMessage(msg);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.state === "closed" || this.state === "gone") return;
      this.setState("disconnected");
      this.scheduleRetry();
    };
  }

  /** Sends a message; while disconnected it waits in an outbox for the reconnect. */
  send(channel: "shell" | "control" | "stdin", msgType: string, content: unknown, parent?: Partial<Header>): Header {
    const header: Header = {
      msg_id: uuid(),
      msg_type: msgType,
      session: this.sessionId,
      username: "kernelgate-web",
      date: new Date().toISOString(),
      version: PROTOCOL_VERSION,
    };
    const frame = JSON.stringify({
      header,
      parent_header: parent ?? {},
      metadata: {},
      content,
      buffers: [],
      channel,
    });
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(frame);
    else this.outbox.push(frame);
    return header;
  }

  /** Closes for good (the page is done with this kernel). */
  close(): void {
    this.setState("closed");
    clearTimeout(this.timer);
    window.removeEventListener("online", this.onOnline);
    this.ws?.close(1000);
    this.ws = null;
  }

  /**
   * Drops the socket as a network failure would (the page then reconnects).
   * Used by the end-to-end test to prove output survives a drop.
   */
  drop(): void {
    this.ws?.close(4000, "dropped by client");
  }

  /**
   * Replaces the socket with a fresh one at once (same session id). Done
   * after a restart, as JupyterLab does: Jupyter Server's streams for an
   * existing socket may not follow the restarted kernel.
   */
  renew(): void {
    if (this.state === "closed" || this.state === "gone") return;
    const old = this.ws;
    this.ws = null;
    this.quiet = true;
    old?.close(1000);
    this.connect();
  }

  /** Reconnects now (after a new token was entered, or the browser came back online). */
  retryNow(): void {
    if (this.state === "disconnected") {
      this.attempt = 0;
      void this.reconnect();
    }
  }

  private scheduleRetry(): void {
    const delay = BACKOFF_MS[Math.min(this.attempt, BACKOFF_MS.length - 1)];
    this.attempt++;
    clearTimeout(this.timer);
    this.timer = window.setTimeout(() => void this.reconnect(), delay);
  }

  private async reconnect(): Promise<void> {
    clearTimeout(this.timer);
    if (this.state !== "disconnected") return;
    // Ask over REST first: a kernel that is gone (404) is not retried,
    // and a refused token brings up the token prompt.
    try {
      await this.api.kernel(this.kernelId);
    } catch (e) {
      if (this.state !== "disconnected") return;
      if (e instanceof HttpError && e.status === 404) {
        this.setState("gone", "the kernel no longer exists on the server");
        return;
      }
      this.scheduleRetry();
      return;
    }
    if (this.state === "disconnected") this.connect();
  }

  private setState(s: ConnState, detail?: string): void {
    if (this.state === s && !detail) return;
    this.state = s;
    this.onState(s, detail);
  }
}
