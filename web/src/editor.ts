// The cell editor: CodeMirror 6 with Python, JavaScript/TypeScript or R
// highlighting, Shift+Enter to run, and completion from the kernel.

import {
  autocompletion,
  closeBrackets,
  closeBracketsKeymap,
  completionKeymap,
  startCompletion,
  type CompletionContext,
  type CompletionResult,
} from "@codemirror/autocomplete";
import { defaultKeymap, history, historyKeymap, indentMore, indentLess } from "@codemirror/commands";
import { javascript } from "@codemirror/lang-javascript";
import { python } from "@codemirror/lang-python";
import {
  bracketMatching,
  defaultHighlightStyle,
  indentOnInput,
  indentUnit,
  StreamLanguage,
  syntaxHighlighting,
  type StringStream,
} from "@codemirror/language";
import { Compartment, EditorState, Prec, type Extension } from "@codemirror/state";
import { drawSelection, dropCursor, EditorView, highlightSpecialChars, keymap, placeholder } from "@codemirror/view";

export interface Completion {
  matches: string[];
  start: number; // UTF-16 offsets into the document
  end: number;
}

export interface EditorHooks {
  run: (mode: "advance" | "stay" | "insert") => void;
  complete: (code: string, pos: number) => Promise<Completion | null>;
  focusMove: (dir: -1 | 1) => boolean;
}

// R: a small tokenizer (comments, strings, numbers, keywords, constants,
// operators including %op% and <-), enough to highlight a cell.
const rKeywords = new Set(["if", "else", "repeat", "while", "function", "for", "in", "next", "break", "return"]);
const rAtoms = new Set(["TRUE", "FALSE", "NULL", "NA", "NA_integer_", "NA_real_", "NA_character_", "Inf", "NaN"]);

interface RState {
  quote: string | null; // the quote of a string that goes on past the line
}

function rString(stream: StringStream, state: RState): string {
  let escaped = false;
  for (let ch = stream.next(); ch !== undefined; ch = stream.next()) {
    if (ch === state.quote && !escaped) {
      state.quote = null;
      break;
    }
    escaped = !escaped && ch === "\\";
  }
  return "string";
}

const rLanguage = StreamLanguage.define<RState>({
  name: "r",
  startState: () => ({ quote: null }),
  token(stream, state) {
    if (state.quote) return rString(stream, state);
    if (stream.eatSpace()) return null;
    const ch = stream.next() as string;
    if (ch === "#") {
      stream.skipToEnd();
      return "comment";
    }
    if (ch === '"' || ch === "'") {
      state.quote = ch;
      return rString(stream, state);
    }
    if (ch === "`") {
      if (stream.skipTo("`")) stream.next();
      else stream.skipToEnd();
      return "variableName";
    }
    if (/[0-9]/.test(ch) || (ch === "." && stream.match(/^[0-9]/, false))) {
      stream.match(/^[0-9a-fA-FxX.]*(?:[eE][+-]?[0-9]+)?[iL]?/);
      return "number";
    }
    if (/[A-Za-z.]/.test(ch)) {
      stream.match(/^[A-Za-z0-9._]*/);
      const word = stream.current();
      if (rKeywords.has(word)) return "keyword";
      if (rAtoms.has(word)) return "atom";
      return "variableName";
    }
    if (ch === "%") {
      if (stream.skipTo("%")) stream.next();
      return "operator";
    }
    if (/[-+*/^<>=!&|~$@:?]/.test(ch)) {
      stream.match(/^[-+*/^<>=!&|~$@:]*/);
      return "operator";
    }
    return null;
  },
  languageData: { commentTokens: { line: "#" } },
});

export function languageExtension(language: string): Extension {
  const l = language.toLowerCase();
  if (l === "python" || l.startsWith("python")) return python();
  if (l === "typescript" || l === "ts") return javascript({ typescript: true });
  if (l === "javascript" || l === "js") return javascript();
  if (l === "r") return rLanguage;
  return [];
}

const theme = EditorView.theme({
  "&": { fontSize: "13px", backgroundColor: "transparent" },
  "&.cm-focused": { outline: "none" },
  ".cm-scroller": {
    fontFamily: 'ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace',
    lineHeight: "1.5",
  },
  ".cm-content": { padding: "6px 0", caretColor: "#1f2328" },
  ".cm-line": { padding: "0 10px" },
  ".cm-placeholder": { color: "#9aa4b2" },
  ".cm-tooltip-autocomplete": { fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace' },
});

export class CellEditor {
  readonly view: EditorView;
  private readonly lang = new Compartment();
  private readonly editable = new Compartment();

  constructor(parent: HTMLElement, doc: string, language: string, hooks: EditorHooks, readOnly = false) {
    const runKeys = Prec.highest(
      keymap.of([
        { key: "Shift-Enter", run: () => (hooks.run("advance"), true) },
        { key: "Mod-Enter", run: () => (hooks.run("stay"), true) },
        { key: "Alt-Enter", run: () => (hooks.run("insert"), true) },
        {
          key: "ArrowUp",
          run: (v) => v.state.selection.main.head === 0 && hooks.focusMove(-1),
        },
        {
          key: "ArrowDown",
          run: (v) => v.state.selection.main.head === v.state.doc.length && hooks.focusMove(1),
        },
      ]),
    );
    const tabKeys = keymap.of([
      {
        key: "Tab",
        run: (v) => {
          const sel = v.state.selection.main;
          const line = v.state.doc.lineAt(sel.head);
          const before = line.text.slice(0, sel.head - line.from);
          if (sel.empty && /\S$/.test(before)) return startCompletion(v);
          return indentMore(v);
        },
      },
      { key: "Shift-Tab", run: indentLess },
    ]);
    const source = async (ctx: CompletionContext): Promise<CompletionResult | null> => {
      if (!ctx.explicit) return null;
      const r = await hooks.complete(ctx.state.doc.toString(), ctx.pos);
      if (!r || r.matches.length === 0) return null;
      return { from: r.start, to: r.end, options: r.matches.map((m) => ({ label: m })), filter: false };
    };
    this.view = new EditorView({
      parent,
      state: EditorState.create({
        doc,
        extensions: [
          runKeys,
          highlightSpecialChars(),
          history(),
          drawSelection(),
          dropCursor(),
          indentOnInput(),
          indentUnit.of("    "),
          bracketMatching(),
          closeBrackets(),
          autocompletion({ override: [source], activateOnTyping: false, icons: false }),
          syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
          keymap.of([...closeBracketsKeymap, ...completionKeymap]),
          tabKeys,
          keymap.of([...defaultKeymap, ...historyKeymap]),
          placeholder(readOnly ? "" : "Code · Shift+Enter runs"),
          this.lang.of(languageExtension(language)),
          this.editable.of([EditorState.readOnly.of(readOnly), EditorView.editable.of(!readOnly)]),
          theme,
          EditorView.contentAttributes.of({ "aria-label": "Code", "data-testid": "cell-input" }),
        ],
      }),
    });
  }

  get code(): string {
    return this.view.state.doc.toString();
  }

  set code(text: string) {
    this.view.dispatch({ changes: { from: 0, to: this.view.state.doc.length, insert: text } });
  }

  setLanguage(language: string): void {
    this.view.dispatch({ effects: this.lang.reconfigure(languageExtension(language)) });
  }

  focus(atEnd = false): void {
    this.view.focus();
    if (atEnd) this.view.dispatch({ selection: { anchor: this.view.state.doc.length } });
  }

  destroy(): void {
    this.view.destroy();
  }
}

/** Jupyter counts cursor positions in code points; the editor in UTF-16 units. */
export function toCodePoints(s: string, utf16: number): number {
  return Array.from(s.slice(0, utf16)).length;
}

export function fromCodePoints(s: string, cp: number): number {
  let i = 0;
  let n = 0;
  for (const ch of s) {
    if (n === cp) return i;
    i += ch.length;
    n++;
  }
  return i;
}
