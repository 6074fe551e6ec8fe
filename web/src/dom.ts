// Small DOM helpers. Everything the page shows is built with these (text
// nodes and attributes), never by assigning HTML strings, except sanitized
// markdown and the srcdoc of sandboxed frames.

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, unknown>;

/**
 * h("button", {class: "btn", testid: "x", onclick: f}, "Run") builds an
 * element. `testid` becomes data-testid, `dataset` sets data-* attributes,
 * on* keys add listeners, false/null/undefined values are skipped.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs?: Attrs | null,
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === false || v === null || v === undefined) continue;
      if (k === "testid") el.setAttribute("data-testid", String(v));
      else if (k === "dataset") Object.assign(el.dataset, v as Record<string, string>);
      else if (k.startsWith("on") && typeof v === "function") {
        el.addEventListener(k.slice(2), v as EventListener);
      } else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

export function append(el: Element, children: (Child | Child[])[]): void {
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === "number" ? String(c) : c);
  }
}

/** Replaces all children of el. */
export function replace(el: Element, ...children: (Child | Child[])[]): void {
  el.replaceChildren();
  append(el, children);
}

export function uuid(): string {
  return crypto.randomUUID();
}

/** "12 s ago", "3 min ago"; the title of the element keeps the exact time. */
export function ago(iso: string | undefined | null, now = Date.now()): string {
  if (!iso) return "";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 5) return "just now";
  if (s < 60) return `${s} s ago`;
  const m = Math.round(s / 60);
  if (m < 60) return `${m} min ago`;
  const hr = Math.round(m / 60);
  if (hr < 48) return `${hr} h ago`;
  return `${Math.round(hr / 24)} d ago`;
}

export function shortId(id: string): string {
  return id.length > 8 ? id.slice(0, 8) : id;
}

const ICONS: Record<string, string> = {
  stop: '<rect x="4" y="4" width="8" height="8" rx="1.5" fill="currentColor" stroke="none"/>',
  restart: '<path d="M13 8a5 5 0 1 1-1.46-3.54"/><path d="M13.5 2.5v3h-3"/>',
  power: '<path d="M8 2.5v5"/><path d="M4.8 4.6a4.8 4.8 0 1 0 6.4 0"/>',
  play: '<path d="M5 3.2v9.6L12.5 8z" fill="currentColor" stroke="none"/>',
  x: '<path d="M4.5 4.5l7 7M11.5 4.5l-7 7"/>',
  plus: '<path d="M8 3.5v9M3.5 8h9"/>',
};

/** A 16×16 stroke icon from a fixed set (our own markup, not output). */
export function icon(name: keyof typeof ICONS): SVGSVGElement {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "14");
  svg.setAttribute("height", "14");
  svg.setAttribute("fill", "none");
  svg.setAttribute("stroke", "currentColor");
  svg.setAttribute("stroke-width", "1.6");
  svg.setAttribute("stroke-linecap", "round");
  svg.setAttribute("stroke-linejoin", "round");
  svg.setAttribute("aria-hidden", "true");
  svg.classList.add("icon");
  svg.innerHTML = ICONS[name];
  return svg;
}
