// Terminal text to DOM: ANSI SGR colours and styles (16 colours, 256
// colours, 24-bit), other escape sequences dropped, carriage returns and
// backspaces applied the way a terminal would show them. Builds text nodes
// only, so no kernel output is ever parsed as HTML.

const NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"];

interface Style {
  fg?: string; // class suffix (e.g. "red", "bright-red") or an rgb() colour
  bg?: string;
  bold?: boolean;
  dim?: boolean;
  italic?: boolean;
  underline?: boolean;
  inverse?: boolean;
}

function xterm256(n: number): string {
  if (n < 16) return (n < 8 ? "" : "bright-") + NAMES[n % 8];
  if (n < 232) {
    const v = [0, 95, 135, 175, 215, 255];
    const i = n - 16;
    return `rgb(${v[Math.floor(i / 36)]},${v[Math.floor(i / 6) % 6]},${v[i % 6]})`;
  }
  const g = 8 + (n - 232) * 10;
  return `rgb(${g},${g},${g})`;
}

function applySgr(st: Style, params: number[]): Style {
  const s = { ...st };
  if (params.length === 0) params = [0];
  for (let i = 0; i < params.length; i++) {
    const p = params[i];
    if (p === 0) {
      for (const k of Object.keys(s)) delete (s as Record<string, unknown>)[k];
    } else if (p === 1) s.bold = true;
    else if (p === 2) s.dim = true;
    else if (p === 3) s.italic = true;
    else if (p === 4) s.underline = true;
    else if (p === 7) s.inverse = true;
    else if (p === 22) s.bold = s.dim = false;
    else if (p === 23) s.italic = false;
    else if (p === 24) s.underline = false;
    else if (p === 27) s.inverse = false;
    else if (p >= 30 && p <= 37) s.fg = NAMES[p - 30];
    else if (p === 39) delete s.fg;
    else if (p >= 40 && p <= 47) s.bg = NAMES[p - 40];
    else if (p === 49) delete s.bg;
    else if (p >= 90 && p <= 97) s.fg = "bright-" + NAMES[p - 90];
    else if (p >= 100 && p <= 107) s.bg = "bright-" + NAMES[p - 100];
    else if (p === 38 || p === 48) {
      let colour: string | undefined;
      if (params[i + 1] === 5 && i + 2 < params.length) {
        colour = xterm256(params[i + 2] & 255);
        i += 2;
      } else if (params[i + 1] === 2 && i + 4 < params.length) {
        colour = `rgb(${params[i + 2] & 255},${params[i + 3] & 255},${params[i + 4] & 255})`;
        i += 4;
      }
      if (colour) {
        if (p === 38) s.fg = colour;
        else s.bg = colour;
      }
    }
  }
  return s;
}

function styled(text: string, s: Style): Node {
  const plain = !s.fg && !s.bg && !s.bold && !s.dim && !s.italic && !s.underline && !s.inverse;
  if (plain) return document.createTextNode(text);
  const span = document.createElement("span");
  span.textContent = text;
  let fg = s.fg;
  let bg = s.bg;
  if (s.inverse) {
    [fg, bg] = [bg ?? "inverse-fg", fg ?? "inverse-bg"];
  }
  const classes: string[] = [];
  if (fg) {
    if (fg.startsWith("rgb")) span.style.color = fg;
    else classes.push(`ansi-${fg}-fg`);
  }
  if (bg) {
    if (bg.startsWith("rgb")) span.style.backgroundColor = bg;
    else classes.push(`ansi-${bg}-bg`);
  }
  if (s.bold) classes.push("ansi-bold");
  if (s.dim) classes.push("ansi-dim");
  if (s.italic) classes.push("ansi-italic");
  if (s.underline) classes.push("ansi-underline");
  span.className = classes.join(" ");
  return span;
}

// CSI sequences (ESC [ params final), OSC (ESC ] ... BEL or ESC \), and
// two-character escapes.
// eslint-disable-next-line no-control-regex
const ESCAPE = /\x1b\[([0-9;?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]/g;

/** Appends text with ANSI escapes rendered as styled spans to `into`. */
export function renderAnsi(text: string, into: Node): void {
  const frag = document.createDocumentFragment();
  let style: Style = {};
  let last = 0;
  ESCAPE.lastIndex = 0;
  for (let m = ESCAPE.exec(text); m; m = ESCAPE.exec(text)) {
    if (m.index > last) frag.append(styled(text.slice(last, m.index), style));
    if (m[2] === "m") {
      const params = m[1] === "" ? [] : m[1].split(";").map((x) => parseInt(x, 10) || 0);
      style = applySgr(style, params);
    }
    last = ESCAPE.lastIndex;
  }
  if (last < text.length) frag.append(styled(text.slice(last), style));
  into.appendChild(frag);
}

/** Removes ANSI escapes (for copying and for tests). */
export function stripAnsi(text: string): string {
  return text.replace(ESCAPE, "");
}

/**
 * Applies carriage returns and backspaces as a terminal shows them: a "\r"
 * not followed by "\n" returns to the start of the line, so the next text
 * overwrites it (progress bars). The last, unfinished line is kept raw
 * so that a "\r" at the end of one chunk still pairs with a "\n" that
 * starts the next.
 */
export function applyControlChars(text: string): string {
  if (!/[\r\b]/.test(text)) return text;
  const lines = text.split("\n");
  const lastLine = lines.pop() ?? "";
  const out = lines.map((l) => overwriteLine(l.endsWith("\r") ? l.slice(0, -1) : l));
  const open = lastLine.endsWith("\r");
  out.push(overwriteLine(open ? lastLine.slice(0, -1) : lastLine) + (open ? "\r" : ""));
  return out.join("\n");
}

function overwriteLine(line: string): string {
  // A "\r" returns to column 0 and what follows replaces the line (the
  // way Jupyter shows it; progress bars reprint the whole line, and this
  // keeps escape sequences intact). A "\b" removes the character before it.
  const cr = line.lastIndexOf("\r");
  if (cr >= 0) line = line.slice(cr + 1);
  if (!line.includes("\b")) return line;
  const out: string[] = [];
  for (const ch of line) {
    if (ch === "\b") out.pop();
    else out.push(ch);
  }
  return out.join("");
}

/** What a display shows for a raw stream text (control chars applied). */
export function displayText(text: string): string {
  const t = applyControlChars(text);
  return t.endsWith("\r") ? t.slice(0, -1) : t;
}
