// A notebook on one kernel: editable cells run over the kernel websocket,
// plus read-only cells for runs made by other clients (an agent using
// /api/execute, another tab), so a person can watch and take over.

import type { Api, KernelModel } from "./api";
import { ago, h, icon, replace, shortId } from "./dom";
import { CellEditor, fromCodePoints, toCodePoints, type Completion } from "./editor";
import { KernelConnection, type ConnState, type Message } from "./kernel";
import { Displays, OutputArea } from "./output";

export interface NotebookHost {
  api: Api;
  displayName(kernelName: string): string;
  language(kernelName: string): string;
  logo(kernelName: string): Promise<string | null>;
  contextsOf(kernelId: string): string[];
  toast(message: string, kind?: "error" | "info"): void;
  /** The kernel was shut down from this page or is gone from the server. */
  closed(nb: Notebook): void;
  changed(nb: Notebook): void;
}

/** What the status pill shows. */
export type KernelState = "starting" | "idle" | "busy" | "restarting" | "dead" | "connecting" | "disconnected" | "unknown";

const OUTPUT_TYPES = new Set(["stream", "display_data", "execute_result", "error", "clear_output", "execute_input"]);

let cellSeq = 0;

/** How long a cell waits for its execute_reply after the kernel went idle. */
const REPLY_GRACE_MS = 3000;

class Cell {
  readonly el: HTMLElement;
  readonly editor: CellEditor;
  readonly outputs: OutputArea;
  private readonly prompt: HTMLElement;
  msgId: string | null = null;
  count: number | null = null;
  private replied = false;
  private idle = false;
  private replyTimer: number | undefined;

  constructor(
    private readonly nb: Notebook,
    code: string,
  ) {
    this.outputs = new OutputArea(nb.displays);
    this.prompt = h("div", { class: "prompt", testid: "cell-prompt" }, "[ ]:");
    const editorHost = h("div", { class: "editor" });
    const runBtn = h(
      "button",
      { class: "icon-btn run", title: "Run (Shift+Enter)", "aria-label": "Run cell", testid: "cell-run" },
      icon("play"),
    );
    const delBtn = h("button", { class: "icon-btn", title: "Delete cell", "aria-label": "Delete cell", testid: "cell-delete" }, icon("x"));
    runBtn.addEventListener("click", () => this.run());
    delBtn.addEventListener("click", () => nb.removeCell(this));
    this.el = h(
      "div",
      { class: "cell", testid: "cell", "data-cell": String(++cellSeq), "data-state": "idle", "data-fresh": "true" },
      h("div", { class: "cell-in" }, this.prompt, editorHost, h("div", { class: "cell-tools" }, runBtn, delBtn)),
      this.outputs.el,
    );
    this.editor = new CellEditor(editorHost, code, nb.language, {
      run: (mode) => {
        this.run();
        nb.afterRun(this, mode);
      },
      complete: (text, pos) => nb.complete(text, pos),
      focusMove: (dir) => nb.focusNeighbour(this, dir),
    });
    this.el.addEventListener("focusin", () => nb.setFocused(this));
  }

  run(): void {
    const code = this.editor.code;
    delete this.el.dataset.fresh;
    if (this.msgId) this.nb.retire(this.msgId);
    this.outputs.clear();
    this.msgId = null;
    if (!code.trim()) {
      this.setState("idle", "[ ]:");
      return;
    }
    if (this.nb.isGone) {
      this.outputs.note("The kernel is gone; start or open another kernel.", "warn");
      return;
    }
    this.replied = this.idle = false;
    this.el.dataset.runs = String(Number(this.el.dataset.runs ?? 0) + 1);
    delete this.el.dataset.replied;
    clearTimeout(this.replyTimer);
    this.count = null;
    this.setState("running", "[*]:");
    this.msgId = this.nb.execute(code, this);
  }

  onInput(count: number): void {
    this.count = count;
  }

  onReply(content: Record<string, any>): void {
    this.replied = true;
    this.el.dataset.replied = "true";
    clearTimeout(this.replyTimer);
    if (typeof content.execution_count === "number") this.count = content.execution_count;
    if (content.status === "aborted") {
      this.outputs.note("Not run: an earlier cell failed.", "warn");
      this.finish("idle");
      return;
    }
    this.outputs.closeInputs();
    if (this.idle || content.status !== "ok") this.finish(content.status === "ok" ? "done" : "error");
    else this.finishSoon(content.status === "ok" ? "done" : "error");
  }

  onIdle(): void {
    this.idle = true;
    if (this.replied && this.el.dataset.state === "running") {
      this.finish(this.el.dataset.pending === "error" ? "error" : "done");
      return;
    }
    // The kernel is done with the request. Its execute_reply normally
    // follows on shell; if it never comes (lost across a reconnect), the
    // cell still ends, from what iopub said.
    clearTimeout(this.replyTimer);
    this.replyTimer = window.setTimeout(() => {
      if (this.replied || this.el.dataset.state !== "running") return;
      const failed = this.outputs.el.querySelector('[data-testid="output-error"]') !== null;
      this.outputs.closeInputs();
      this.finish(failed ? "error" : "done");
    }, REPLY_GRACE_MS);
  }

  /** The request will never be answered (restart, kernel death). */
  abandon(why: string): void {
    if (this.el.dataset.state !== "running") return;
    this.outputs.closeInputs();
    this.outputs.note(why, "warn");
    this.finish("idle");
    if (this.msgId) this.nb.retire(this.msgId);
  }

  get running(): boolean {
    return this.el.dataset.state === "running";
  }

  private finishSoon(state: "done" | "error"): void {
    // execute_reply came before status: idle; outputs may still arrive on
    // iopub, so the cell stays "running" until idle.
    this.el.dataset.pending = state;
  }

  private finish(state: "done" | "error" | "idle"): void {
    this.outputs.flush();
    delete this.el.dataset.pending;
    this.setState(state, this.count === null ? "[ ]:" : `[${this.count}]:`);
  }

  private setState(state: string, prompt: string): void {
    this.el.dataset.state = state;
    this.prompt.textContent = prompt;
  }

  destroy(): void {
    this.editor.destroy();
    this.el.remove();
  }
}

/** A run started by another client, shown read-only as it happens. */
class ExternalCell {
  readonly el: HTMLElement;
  readonly outputs: OutputArea;
  private readonly prompt: HTMLElement;
  private readonly input: HTMLElement;
  private readonly meta: HTMLElement;
  private editor: CellEditor | null = null;

  constructor(
    private readonly nb: Notebook,
    readonly parentId: string,
    parent: Message["parent_header"],
  ) {
    this.outputs = new OutputArea(nb.displays, "external-output");
    this.prompt = h("div", { class: "prompt" }, "[*]:");
    this.input = h("div", { class: "editor readonly" });
    const who = parent.username && parent.username !== "username" ? parent.username : "another client";
    const when = parent.date ? new Date(parent.date) : new Date();
    this.meta = h(
      "div",
      { class: "external-meta", title: `request ${parentId} from session ${parent.session ?? "?"}` },
      h("span", { class: "badge" }, parentId ? "external run" : "kernel output"),
      ` ${who} · ${isNaN(when.getTime()) ? "" : when.toLocaleTimeString()}`,
    );
    this.el = h(
      "div",
      { class: "cell external", testid: "external-cell", "data-parent": parentId, "data-state": "running" },
      this.meta,
      h("div", { class: "cell-in" }, this.prompt, this.input),
      this.outputs.el,
    );
  }

  setInput(code: string, count: unknown): void {
    this.prompt.textContent = typeof count === "number" ? `[${count}]:` : "[ ]:";
    if (!this.editor) {
      this.editor = new CellEditor(this.input, code, this.nb.language, {
        run: () => {},
        complete: async () => null,
        focusMove: () => false,
      }, true);
    } else this.editor.code = code;
    const take = h("button", { class: "link-btn", title: "Copy this code into a new cell of your own" }, "copy to new cell");
    take.addEventListener("click", () => this.nb.addCell(code, true));
    this.meta.querySelector(".link-btn")?.remove();
    this.meta.append(" · ", take);
  }

  onIdle(): void {
    this.outputs.flush();
    this.el.dataset.state = "done";
    if (this.prompt.textContent === "[*]:") this.prompt.textContent = "[ ]:";
  }

  destroy(): void {
    this.editor?.destroy();
    this.el.remove();
  }
}

export class Notebook {
  readonly el: HTMLElement;
  readonly conn: KernelConnection;
  readonly displays = new Displays();
  readonly kernelId: string;
  readonly kernelName: string;
  language: string;
  state: KernelState = "connecting";
  lastActivity: string | undefined;
  isGone = false;

  private cells: Cell[] = [];
  private focused: Cell | null = null;
  private readonly own = new Map<string, Cell>();
  private readonly retired = new Set<string>();
  private readonly external = new Map<string, ExternalCell>();
  private readonly replies = new Map<string, (m: Message) => void>();
  private kernelStatus: KernelState = "unknown";

  private readonly cellsEl: HTMLElement;
  private readonly pill: HTMLElement;
  private readonly connEl: HTMLElement;
  private readonly infoEl: HTMLElement;
  private readonly ctxEl: HTMLElement;
  private readonly banner: HTMLElement;
  private readonly buttons: Record<"interrupt" | "restart" | "shutdown", HTMLButtonElement>;

  constructor(
    private readonly host: NotebookHost,
    model: KernelModel,
  ) {
    this.kernelId = model.id;
    this.kernelName = model.name;
    this.language = host.language(model.name);
    this.kernelStatus = (model.execution_state as KernelState) || "unknown";
    this.lastActivity = model.last_activity;

    const logo = h("img", { class: "nb-logo", alt: "", width: 22, height: 22 });
    void host.logo(model.name).then((u) => (u ? (logo.src = u) : logo.remove()));
    this.pill = h("span", { class: "pill", testid: "kernel-status", "data-state": "connecting", role: "status" }, "connecting");
    this.connEl = h("span", { class: "conn", testid: "connection-state", "data-state": "connecting" });
    this.infoEl = h("span", { class: "nb-info" });
    this.ctxEl = h("span", { class: "nb-ctx" });
    const btn = (ic: "stop" | "restart" | "power", label: string, testid: string, title: string, onclick: () => void) => {
      const b = h("button", { class: "btn", testid, title }, icon(ic), h("span", null, label));
      b.addEventListener("click", onclick);
      return b;
    };
    this.buttons = {
      interrupt: btn("stop", "Interrupt", "btn-interrupt", "Interrupt the kernel (I, I)", () => void this.interrupt()),
      restart: btn("restart", "Restart", "btn-restart", "Restart the kernel: its state is lost", () => this.confirm("restart", () => this.restart())),
      shutdown: btn("power", "Shut down", "btn-shutdown", "Shut the kernel down", () => this.confirm("shutdown", () => this.shutdown())),
    };
    this.buttons.shutdown.classList.add("danger");
    this.banner = h("div", { class: "banner", hidden: true, testid: "notebook-banner" });
    this.cellsEl = h("div", { class: "cells", testid: "cells" });
    const addBtn = h("button", { class: "btn ghost", testid: "add-cell" }, icon("plus"), h("span", null, "Code cell"));
    addBtn.addEventListener("click", () => this.addCell("", true));

    this.el = h(
      "section",
      { class: "notebook", testid: "notebook", "data-kernel-id": model.id, "data-kernel-name": model.name },
      h(
        "header",
        { class: "nb-head" },
        h(
          "div",
          { class: "nb-title" },
          logo,
          h("div", null, h("h1", null, host.displayName(model.name)), h("div", { class: "nb-sub" }, h("code", { title: "kernel id" }, model.id), this.ctxEl, this.infoEl)),
        ),
        h("div", { class: "nb-actions" }, this.connEl, this.pill, this.buttons.interrupt, this.buttons.restart, this.buttons.shutdown),
      ),
      this.banner,
      this.cellsEl,
      h("div", { class: "nb-foot" }, addBtn, h("span", { class: "hint" }, "Shift+Enter run · Ctrl+Enter run in place · Alt+Enter run and insert · Tab completes")),
    );
    this.el.addEventListener("keydown", (ev) => this.commandKeys(ev));

    this.conn = new KernelConnection(host.api, model.id);
    this.conn.onMessage = (m) => this.dispatch(m);
    this.conn.onState = (s, detail) => this.onConnState(s, detail);
    this.conn.onOpen = (reconnected) => {
      if (reconnected) host.toast("Reconnected to the kernel", "info");
      this.requestInfo();
    };
    this.addCell("", false);
    this.updateContexts();
    this.render();
    this.conn.connect();
  }

  // -------------------------------------------------------------------------
  // Cells

  addCell(code: string, focus: boolean, after?: Cell): Cell {
    const cell = new Cell(this, code);
    if (after) {
      after.el.after(cell.el);
      this.cells.splice(this.cells.indexOf(after) + 1, 0, cell);
    } else {
      this.cellsEl.append(cell.el);
      this.cells.push(cell);
    }
    if (focus) cell.editor.focus(true);
    return cell;
  }

  removeCell(cell: Cell): void {
    const i = this.cells.indexOf(cell);
    if (i < 0) return;
    this.cells.splice(i, 1);
    cell.destroy();
    if (this.cells.length === 0) this.addCell("", true);
    else this.cells[Math.min(i, this.cells.length - 1)].editor.focus();
  }

  setFocused(cell: Cell): void {
    if (this.focused === cell) return;
    this.focused?.el.classList.remove("focused");
    this.focused = cell;
    cell.el.classList.add("focused");
  }

  focusNeighbour(cell: Cell, dir: -1 | 1): boolean {
    const next = this.cells[this.cells.indexOf(cell) + dir];
    if (!next) return false;
    next.editor.focus(dir === -1);
    return true;
  }

  afterRun(cell: Cell, mode: "advance" | "stay" | "insert"): void {
    if (mode === "stay") return;
    if (mode === "insert") {
      this.addCell("", true, cell);
      return;
    }
    const next = this.cells[this.cells.indexOf(cell) + 1];
    if (next) next.editor.focus(true);
    else this.addCell("", true);
  }

  focusFirstEmpty(): void {
    const c = this.cells.find((x) => !x.editor.code) ?? this.addCell("", false);
    c.editor.focus();
  }

  // -------------------------------------------------------------------------
  // Kernel messages

  execute(code: string, cell: Cell): string {
    const hdr = this.conn.send("shell", "execute_request", {
      code,
      silent: false,
      store_history: true,
      user_expressions: {},
      allow_stdin: true,
      stop_on_error: true,
    });
    this.own.set(hdr.msg_id, cell);
    this.setKernelStatus(this.kernelStatus === "idle" ? "busy" : this.kernelStatus);
    return hdr.msg_id;
  }

  retire(msgId: string): void {
    if (this.own.delete(msgId)) this.retired.add(msgId);
  }

  private request(channel: "shell" | "control", type: string, content: unknown, timeoutMs: number): Promise<Message | null> {
    return new Promise((resolve) => {
      const hdr = this.conn.send(channel, type, content);
      const timer = setTimeout(() => {
        this.replies.delete(hdr.msg_id);
        resolve(null);
      }, timeoutMs);
      this.replies.set(hdr.msg_id, (m) => {
        clearTimeout(timer);
        this.replies.delete(hdr.msg_id);
        resolve(m);
      });
    });
  }

  async complete(code: string, pos: number): Promise<Completion | null> {
    if (this.state !== "idle") return null;
    const reply = await this.request("shell", "complete_request", { code, cursor_pos: toCodePoints(code, pos) }, 3000);
    const c = reply?.content;
    if (!c || c.status !== "ok" || !Array.isArray(c.matches)) return null;
    return { matches: c.matches, start: fromCodePoints(code, c.cursor_start), end: fromCodePoints(code, c.cursor_end) };
  }

  private requestInfo(): void {
    void this.request("shell", "kernel_info_request", {}, 30000).then((reply) => reply && this.applyInfo(reply));
  }

  private applyInfo(reply: Message): void {
    const c = reply.content ?? {};
    const li = c.language_info ?? {};
    if (typeof li.name === "string" && li.name && this.language === "") {
      this.language = li.name;
      for (const cell of this.cells) cell.editor.setLanguage(li.name);
    }
    const impl = c.implementation && c.implementation_version ? `${c.implementation} ${c.implementation_version}` : c.implementation;
    this.infoEl.textContent = [li.name && li.version ? `${li.name} ${li.version}` : li.name, impl].filter(Boolean).join(" · ");
    if (this.kernelStatus === "starting" || this.kernelStatus === "unknown" || this.kernelStatus === "restarting") this.setKernelStatus("idle");
  }

  private awaitingRestart = false;

  /**
   * After the server said the kernel is restarting (it died and is being
   * restarted), asks for kernel info until the new kernel answers: its
   * first status messages may have gone by before anyone listened.
   */
  private async awaitRestart(): Promise<void> {
    if (this.awaitingRestart) return;
    this.awaitingRestart = true;
    try {
      for (const wait of [1000, 2000, 3000, 5000, 5000, 10000, 10000, 15000, 15000]) {
        if (this.isGone || this.conn.state === "closed" || this.kernelStatus !== "restarting") return;
        const reply = await this.request("shell", "kernel_info_request", {}, wait);
        if (reply) {
          this.applyInfo(reply);
          return;
        }
      }
    } finally {
      this.awaitingRestart = false;
    }
  }

  private dispatch(msg: Message): void {
    const type = msg.header?.msg_type ?? (msg as unknown as { msg_type: string }).msg_type;
    const parent = msg.parent_header ?? {};
    const parentId = parent.msg_id ?? "";
    const c = msg.content ?? {};
    switch (msg.channel) {
      case "iopub":
        this.onIOPub(type, parentId, parent, c, msg);
        return;
      case "shell":
      case "control": {
        const waiter = this.replies.get(parentId);
        if (waiter) {
          waiter(msg);
          return;
        }
        if (type === "execute_reply") this.own.get(parentId)?.onReply(c);
        return;
      }
      case "stdin":
        // The kernel asks only the client whose request it runs.
        if (type === "input_request") {
          const area = this.own.get(parentId)?.outputs;
          area?.askInput({
            prompt: String(c.prompt ?? ""),
            password: Boolean(c.password),
            answer: (value) => void this.conn.send("stdin", "input_reply", { value }, msg.header),
          });
        }
        return;
    }
  }

  private onIOPub(type: string, parentId: string, parent: Message["parent_header"], c: Record<string, any>, msg: Message): void {
    if (type === "status") {
      const st = String(c.execution_state ?? "") as KernelState;
      if (st === "restarting" || st === "dead") this.abandonAll(st === "dead" ? "The kernel died." : "The kernel is restarting.");
      if (st) this.setKernelStatus(st);
      if (st === "restarting" && !parentId) void this.awaitRestart();
      this.lastActivity = msg.header?.date ?? new Date().toISOString();
      if (st === "idle" && parentId) {
        this.own.get(parentId)?.onIdle();
        this.external.get(parentId)?.onIdle();
      }
      return;
    }
    if (type === "update_display_data") {
      const id = c.transient?.display_id;
      if (typeof id === "string") this.displays.update(id, c.data ?? {}, c.metadata ?? {});
      return;
    }
    if (!OUTPUT_TYPES.has(type)) return;
    if (this.retired.has(parentId)) return;
    const cell = this.own.get(parentId);
    if (cell) {
      if (type === "execute_input") cell.onInput(c.execution_count);
      else cell.outputs.handle(type, c);
      return;
    }
    // Not one of this page's requests: another client's run.
    const ext = this.externalFor(parentId, parent);
    if (type === "execute_input") ext.setInput(String(c.code ?? ""), c.execution_count);
    else ext.outputs.handle(type, c);
  }

  private externalFor(parentId: string, parent: Message["parent_header"]): ExternalCell {
    const key = parentId || "(no parent)";
    let ext = this.external.get(key);
    if (!ext) {
      ext = new ExternalCell(this, parentId, parent);
      this.external.set(key, ext);
      // Runs are shown in the order they happen, above the cells at the end
      // that were never run (where the person is typing).
      let anchor: Element | null = null;
      for (let el = this.cellsEl.lastElementChild; el && (el as HTMLElement).dataset.fresh === "true"; el = el.previousElementSibling) {
        anchor = el;
      }
      this.cellsEl.insertBefore(ext.el, anchor);
      if (this.external.size > 200) {
        const [oldest] = this.external.entries().next().value as [string, ExternalCell];
        this.external.get(oldest)?.destroy();
        this.external.delete(oldest);
      }
    }
    return ext;
  }

  private abandonAll(why: string): void {
    for (const cell of this.own.values()) cell.abandon(why);
  }

  // -------------------------------------------------------------------------
  // Kernel actions

  private confirming: string | null = null;
  private confirmTimer: number | undefined;

  /** Two clicks for actions that lose state: the first arms the button. */
  private confirm(action: "restart" | "shutdown", run: () => void): void {
    const b = this.buttons[action];
    if (this.confirming === action) {
      this.disarm();
      run();
      return;
    }
    this.disarm();
    this.confirming = action;
    b.classList.add("armed");
    b.dataset.armed = "true";
    b.lastElementChild!.textContent = action === "restart" ? "Confirm restart" : "Confirm shut down";
    this.confirmTimer = window.setTimeout(() => this.disarm(), 4000);
  }

  private disarm(): void {
    clearTimeout(this.confirmTimer);
    this.confirming = null;
    for (const [k, b] of Object.entries(this.buttons)) {
      if (!b.dataset.armed) continue;
      delete b.dataset.armed;
      b.classList.remove("armed");
      b.lastElementChild!.textContent = k === "restart" ? "Restart" : "Shut down";
    }
  }

  async interrupt(): Promise<void> {
    try {
      await this.host.api.interruptKernel(this.kernelId);
    } catch (e) {
      this.host.toast(`Interrupt failed: ${(e as Error).message}`);
    }
  }

  async restart(): Promise<void> {
    this.setKernelStatus("restarting");
    this.abandonAll("The kernel was restarted.");
    try {
      const model = await this.host.api.restartKernel(this.kernelId);
      this.lastActivity = model.last_activity ?? this.lastActivity;
      this.conn.renew(); // requests kernel info once open
      this.host.toast("Kernel restarted", "info");
    } catch (e) {
      this.host.toast(`Restart failed: ${(e as Error).message}`);
      this.setKernelStatus("unknown");
      this.requestInfo();
    }
  }

  async shutdown(): Promise<void> {
    try {
      await this.host.api.shutdownKernel(this.kernelId);
    } catch (e) {
      if (!(e instanceof Error && "status" in e && (e as { status: number }).status === 404)) {
        this.host.toast(`Shut down failed: ${(e as Error).message}`);
        return;
      }
    }
    this.dispose();
    this.host.closed(this);
  }

  /** Interrupt with I, I (twice within a second) when no editor has focus. */
  private lastI = 0;
  private commandKeys(ev: KeyboardEvent): void {
    const t = ev.target as HTMLElement;
    if (t.closest(".cm-editor") || t instanceof HTMLInputElement) return;
    if (ev.key === "i" || ev.key === "I") {
      const now = Date.now();
      if (now - this.lastI < 1000) void this.interrupt();
      this.lastI = now;
    }
  }

  // -------------------------------------------------------------------------
  // State

  private onConnState(s: ConnState, detail?: string): void {
    if (s === "gone") {
      this.isGone = true;
      this.abandonAll("The kernel is gone.");
      this.showBanner(detail ?? "The kernel no longer exists.", "error");
      this.setKernelStatus("dead");
    } else if (s === "disconnected") {
      this.showBanner("Connection lost; reconnecting… Output produced meanwhile is replayed on reconnect.", "warn");
    } else if (s === "connected") {
      this.showBanner(null);
    }
    this.render();
  }

  showBanner(text: string | null, kind: "warn" | "error" = "warn"): void {
    this.banner.hidden = !text;
    this.banner.className = `banner ${kind}`;
    this.banner.textContent = text ?? "";
  }

  setKernelStatus(s: KernelState): void {
    this.kernelStatus = s;
    if (s === "dead") this.abandonAll("The kernel died.");
    this.render();
  }

  /** Takes what the REST listing says, for what the websocket has not told. */
  syncModel(model: KernelModel): void {
    if (model.last_activity && (!this.lastActivity || model.last_activity > this.lastActivity)) this.lastActivity = model.last_activity;
    if (this.conn.state !== "connected" && model.execution_state) this.kernelStatus = model.execution_state as KernelState;
    this.updateContexts();
    this.render();
  }

  updateContexts(): void {
    const ids = this.host.contextsOf(this.kernelId);
    replace(this.ctxEl, ids.map((id) => h("span", { class: "tag", title: "interpreter context" }, `context ${id}`)));
  }

  private render(): void {
    const conn = this.conn?.state ?? "connecting";
    let shown: KernelState;
    if (this.isGone) shown = "dead";
    else if (conn === "connecting" && this.kernelStatus !== "restarting") shown = "connecting";
    else if (conn === "disconnected") shown = "disconnected";
    else shown = this.kernelStatus;
    this.state = shown;
    this.pill.dataset.state = shown;
    this.pill.textContent = shown === "disconnected" ? "reconnecting…" : shown;
    this.pill.title = this.lastActivity ? `last activity ${ago(this.lastActivity)}` : "";
    this.connEl.dataset.state = conn;
    this.connEl.textContent = conn === "connected" ? "" : conn;
    this.buttons.interrupt.disabled = this.isGone;
    this.buttons.restart.disabled = this.isGone;
    this.el.dataset.state = shown;
    this.host.changed(this);
  }

  get title(): string {
    return `${this.host.displayName(this.kernelName)} · ${shortId(this.kernelId)}`;
  }

  dispose(): void {
    this.conn.close();
    for (const c of this.cells) c.destroy();
    for (const e of this.external.values()) e.destroy();
    this.el.remove();
  }
}
