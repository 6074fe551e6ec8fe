// Rendering of kernel outputs. Outputs are untrusted: text is rendered as
// text nodes, markdown is sanitized, HTML runs in an iframe sandboxed with
// allow-scripts only (an opaque origin: no access to this page, its storage
// or its token), and images are data: URLs.

import DOMPurify from "dompurify";
import { marked } from "marked";
import { applyControlChars, displayText, renderAnsi } from "./ansi";
import { h } from "./dom";

export type MimeBundle = Record<string, unknown>;

/** Stream text kept per output before the oldest part is dropped. */
const MAX_STREAM_CHARS = 1_000_000;

const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];

function text(v: unknown): string {
  if (Array.isArray(v)) return v.join("");
  return typeof v === "string" ? v : JSON.stringify(v);
}

// ---------------------------------------------------------------------------
// Sandboxed HTML

const frameScript = (() => {
  const meta = document.querySelector<HTMLMetaElement>('meta[name="kernelgate-frame-script"]');
  return meta ? new URL(meta.content, document.baseURI).toString() : "";
})();

const FRAME_CSS = `
html{color-scheme:light}
body{margin:0;padding:2px 0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1f2328;overflow-x:auto;overflow-y:hidden}
table{border-collapse:collapse;border:none;font-size:12px;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;text-align:right;border:none;border-bottom:1px solid #e5e7eb}
thead th{border-bottom:1px solid #9ca3af;font-weight:600}
tbody tr:nth-child(odd){background:#f8fafc}
tbody tr:hover{background:#eef2ff}
pre,code{font:12px/1.45 ui-monospace,"SFMono-Regular","DejaVu Sans Mono",Menlo,Consolas,monospace}
img,svg{max-width:100%}
`;

const MAX_FRAME_HEIGHT = 1200;

function htmlFrame(html: string): HTMLElement {
  const frame = h("iframe", {
    class: "html-frame",
    sandbox: "allow-scripts",
    referrerpolicy: "no-referrer",
    title: "HTML output",
    testid: "output-html-frame",
  });
  frame.style.height = "24px";
  const script = frameScript ? `<script src="${frameScript}"></script>` : "";
  frame.srcdoc = `<!doctype html><html><head><meta charset="utf-8"><style>${FRAME_CSS}</style>${script}</head><body>${html}</body></html>`;
  return frame;
}

// The script inside each frame reports its content height.
window.addEventListener("message", (ev) => {
  const d = ev.data as { kernelgateFrame?: boolean; height?: number } | null;
  if (!d || d.kernelgateFrame !== true || typeof d.height !== "number") return;
  for (const f of document.querySelectorAll<HTMLIFrameElement>("iframe.html-frame")) {
    if (f.contentWindow === ev.source) {
      f.style.height = `${Math.min(Math.max(Math.ceil(d.height), 16), MAX_FRAME_HEIGHT)}px`;
      return;
    }
  }
});

// ---------------------------------------------------------------------------
// Markdown

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node instanceof HTMLAnchorElement) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
  // Nothing in an output may make the page fetch from elsewhere.
  if (node instanceof HTMLImageElement) {
    const src = node.getAttribute("src") ?? "";
    if (!/^data:image\/(png|jpeg|gif|webp);/i.test(src)) {
      node.replaceWith(document.createTextNode(node.getAttribute("alt") || "[image]"));
    }
  }
});

function markdown(md: string): HTMLElement {
  const el = h("div", { class: "markdown", testid: "output-markdown" });
  const html = marked.parse(md, { async: false, gfm: true }) as string;
  el.innerHTML = DOMPurify.sanitize(html, {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style", "srcset"],
  });
  return el;
}

// ---------------------------------------------------------------------------
// JSON

function jsonView(value: unknown): HTMLElement {
  const pre = h("pre", { class: "json", testid: "output-json" });
  const walk = (v: unknown, indent: string): void => {
    if (v === null || typeof v !== "object") {
      const cls = v === null ? "null" : typeof v;
      pre.append(h("span", { class: `json-${cls}` }, JSON.stringify(v) ?? "undefined"));
      return;
    }
    const isArr = Array.isArray(v);
    const entries = isArr ? (v as unknown[]).map((x, i) => [String(i), x] as const) : Object.entries(v as object);
    if (entries.length === 0) {
      pre.append(isArr ? "[]" : "{}");
      return;
    }
    pre.append(isArr ? "[\n" : "{\n");
    entries.forEach(([k, x], i) => {
      pre.append(indent + "  ");
      if (!isArr) pre.append(h("span", { class: "json-key" }, JSON.stringify(k)), ": ");
      walk(x, indent + "  ");
      pre.append(i < entries.length - 1 ? ",\n" : "\n");
    });
    pre.append(indent + (isArr ? "]" : "}"));
  };
  walk(value, "");
  return pre;
}

// ---------------------------------------------------------------------------
// MIME bundles

function plain(t: string, cls = "text"): HTMLElement {
  const pre = h("pre", { class: cls });
  renderAnsi(t, pre);
  return pre;
}

function image(mime: string, data: string, meta: Record<string, unknown>): HTMLElement {
  const src = mime === "image/svg+xml" ? `data:image/svg+xml;charset=utf-8,${encodeURIComponent(data)}` : `data:${mime};base64,${data.replace(/\s/g, "")}`;
  const img = h("img", { src, alt: mime, testid: "output-image", class: "image" });
  const w = Number(meta.width);
  const hh = Number(meta.height);
  if (w > 0) img.width = w;
  if (hh > 0) img.height = hh;
  return img;
}

/** The richest renderable representation of a MIME bundle. */
export function renderBundle(data: MimeBundle, metadata: Record<string, unknown> = {}): HTMLElement {
  const metaFor = (mime: string) => (metadata[mime] as Record<string, unknown>) ?? {};
  try {
    if ("text/html" in data) return htmlFrame(text(data["text/html"]));
    if ("image/svg+xml" in data) return image("image/svg+xml", text(data["image/svg+xml"]), metaFor("image/svg+xml"));
    for (const mime of IMAGE_TYPES) {
      if (mime in data) return image(mime, text(data[mime]), metaFor(mime));
    }
    if ("text/markdown" in data) return markdown(text(data["text/markdown"]));
    if ("application/json" in data) return jsonView(data["application/json"]);
    if ("text/latex" in data && !("text/plain" in data)) return plain(text(data["text/latex"]), "text latex");
    if ("text/plain" in data) return plain(text(data["text/plain"]));
  } catch (e) {
    return plain(`[output could not be rendered: ${(e as Error).message}]`, "text note");
  }
  const types = Object.keys(data);
  if (types.includes("application/javascript")) {
    return plain("[JavaScript output is not run: outputs are untrusted]", "text note");
  }
  return plain(`[no renderer for ${types.join(", ") || "empty output"}]`, "text note");
}

// ---------------------------------------------------------------------------
// Output areas

interface DisplayRef {
  el: HTMLElement;
  area: OutputArea;
}

/** Display ids across one notebook: update_display_data updates every output with the id. */
export class Displays {
  private byId = new Map<string, DisplayRef[]>();

  add(id: string, ref: DisplayRef): void {
    const list = (this.byId.get(id) ?? []).filter((r) => r.el.isConnected);
    list.push(ref);
    this.byId.set(id, list);
  }

  update(id: string, data: MimeBundle, metadata: Record<string, unknown>): void {
    const list = (this.byId.get(id) ?? []).filter((r) => r.el.isConnected);
    this.byId.set(id, list);
    for (const r of list) r.area.replaceBody(r.el, data, metadata);
  }
}

interface StreamState {
  name: string;
  raw: string;
  dropped: number;
  pre: HTMLElement;
}

export interface StdinRequest {
  prompt: string;
  password: boolean;
  answer: (value: string) => void;
}

/** The outputs of one cell, in order, as a notebook shows them. */
export class OutputArea {
  readonly el: HTMLElement;
  private clearOnNext = false;
  private stream: StreamState | null = null;
  private renderQueued = false;
  private dirty = new Set<StreamState>();

  constructor(
    private readonly displays: Displays,
    testid = "cell-output",
  ) {
    this.el = h("div", { class: "outputs", testid });
  }

  get isEmpty(): boolean {
    return this.el.childElementCount === 0;
  }

  clear(wait = false): void {
    if (wait) {
      this.clearOnNext = true;
      return;
    }
    this.clearOnNext = false;
    this.stream = null;
    this.dirty.clear();
    this.el.replaceChildren();
  }

  private beforeOutput(): void {
    if (this.clearOnNext) this.clear(false);
  }

  /** Handles one iopub message addressed to this area. */
  handle(msgType: string, content: Record<string, any>): void {
    switch (msgType) {
      case "stream":
        this.beforeOutput();
        this.appendStream(String(content.name ?? "stdout"), text(content.text ?? ""));
        break;
      case "display_data":
      case "execute_result": {
        this.beforeOutput();
        const el = this.addBundle(msgType, content.data ?? {}, content.metadata ?? {}, content.execution_count);
        const displayId = content.transient?.display_id;
        if (typeof displayId === "string" && displayId) this.displays.add(displayId, { el, area: this });
        break;
      }
      case "error":
        this.beforeOutput();
        this.addError(content);
        break;
      case "clear_output":
        this.clear(Boolean(content.wait));
        break;
    }
  }

  /** A note from the page itself (not kernel output). */
  note(message: string, kind: "info" | "warn" = "info"): void {
    this.stream = null;
    this.el.append(h("div", { class: `output note ${kind}`, testid: "output-note" }, message));
  }

  /** Shows an input() prompt; the answer is shown in place of the box once sent. */
  askInput(req: StdinRequest): void {
    this.beforeOutput();
    this.stream = null;
    const input = h("input", {
      class: "stdin-input",
      type: req.password ? "password" : "text",
      testid: "stdin-input",
      autocomplete: "off",
      spellcheck: "false",
      "aria-label": req.prompt || "input",
    });
    const row = h("div", { class: "output stdin", testid: "output-stdin" }, h("span", { class: "stdin-prompt" }, req.prompt), input);
    input.addEventListener("keydown", (ev) => {
      if (ev.key !== "Enter") return;
      ev.preventDefault();
      const value = input.value;
      const shown = req.password ? "•".repeat(Math.min(value.length, 12)) : value;
      row.replaceChildren(h("span", { class: "stdin-prompt" }, req.prompt), h("span", { class: "stdin-answer" }, shown));
      row.dataset.answered = "true";
      req.answer(value);
    });
    this.el.append(row);
    input.focus();
  }

  /** Disables prompts still open (the request ended: interrupted, restarted). */
  closeInputs(): void {
    for (const input of this.el.querySelectorAll<HTMLInputElement>("input.stdin-input")) {
      input.disabled = true;
      input.closest(".stdin")?.setAttribute("data-answered", "cancelled");
    }
  }

  replaceBody(el: HTMLElement, data: MimeBundle, metadata: Record<string, unknown>): void {
    el.replaceChildren(renderBundle(data, metadata));
  }

  private addBundle(kind: string, data: MimeBundle, metadata: Record<string, unknown>, count?: number): HTMLElement {
    this.stream = null;
    const isResult = kind === "execute_result";
    const el = h("div", {
      class: `output ${isResult ? "result" : "display"}`,
      testid: isResult ? "output-result" : "output-display",
      "data-prompt": isResult && typeof count === "number" ? `Out[${count}]` : null,
    });
    el.append(renderBundle(data, metadata));
    this.el.append(el);
    return el;
  }

  private addError(content: Record<string, any>): void {
    this.stream = null;
    const tb: string[] = Array.isArray(content.traceback) ? content.traceback : [];
    const body = tb.length ? tb.join("\n") : `${content.ename ?? "Error"}: ${content.evalue ?? ""}`;
    const pre = h("pre", { class: "text" });
    renderAnsi(body, pre);
    this.el.append(
      h("div", { class: "output error", testid: "output-error", "data-ename": String(content.ename ?? "") }, pre),
    );
  }

  private appendStream(name: string, t: string): void {
    let s = this.stream;
    if (!s || s.name !== name || !s.pre.isConnected) {
      const pre = h("pre", { class: "text" });
      const el = h("div", { class: `output stream ${name}`, testid: "output-stream", "data-name": name }, pre);
      this.el.append(el);
      s = this.stream = { name, raw: "", dropped: 0, pre };
    }
    // Complete lines are reduced at once (carriage returns applied), so a
    // progress bar that rewrites one line keeps memory flat. Text before the
    // last newline is already reduced.
    const nl = s.raw.lastIndexOf("\n");
    s.raw = s.raw.slice(0, nl + 1) + compact(s.raw.slice(nl + 1) + t);
    if (s.raw.length > MAX_STREAM_CHARS) {
      const cut = s.raw.indexOf("\n", s.raw.length - MAX_STREAM_CHARS);
      const at = cut < 0 ? s.raw.length - MAX_STREAM_CHARS : cut + 1;
      s.dropped += at;
      s.raw = s.raw.slice(at);
    }
    this.dirty.add(s);
    this.scheduleRender();
  }

  private scheduleRender(): void {
    if (this.renderQueued) return;
    this.renderQueued = true;
    requestAnimationFrame(() => {
      this.renderQueued = false;
      this.flush();
    });
  }

  /** Renders pending stream text now (also called before tests read the DOM). */
  flush(): void {
    for (const s of this.dirty) {
      s.pre.replaceChildren();
      if (s.dropped) s.pre.append(h("span", { class: "dropped" }, `[${s.dropped} earlier characters not shown]\n`));
      renderAnsi(displayText(s.raw), s.pre);
    }
    this.dirty.clear();
  }
}

/** Applies control characters to the unfinished tail of a stream (see applyControlChars). */
function compact(tail: string): string {
  if (!tail.includes("\r") && !tail.includes("\b")) return tail;
  return applyControlChars(tail);
}
