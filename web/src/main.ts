// kernelgate's browser notebook: a sidebar of kernels, interpreter contexts
// and kernelspecs, and one notebook per opened kernel.

import "./style.css";
import { Api, HttpError, type AuthReason, type Context, type KernelModel, type KernelSpecs } from "./api";
import { ago, h, icon, replace, shortId } from "./dom";
import { CommandBox } from "./commands";
import { FilesPanel } from "./files";
import { Notebook, type NotebookHost } from "./notebook";

const POLL_MS = 3000;

class App implements NotebookHost {
  readonly api = new Api();
  private specs: KernelSpecs | null = null;
  private kernels: KernelModel[] = [];
  /** null: the server has no /api/contexts (a plain Jupyter Server); undefined: not known yet. */
  private contexts: Context[] | null | undefined = undefined;
  private readonly notebooks = new Map<string, Notebook>();
  private active: Notebook | null = null;
  private logos = new Map<string, Promise<string | null>>();
  private pollTimer: number | undefined;
  private authPending = false;
  private serverText = "";

  private readonly specsEl = h("div", { class: "spec-list", testid: "kernelspec-list" });
  private readonly kernelsEl = h("div", { class: "list", testid: "kernel-list" });
  private readonly contextsEl = h("div", { class: "list", testid: "context-list" });
  private readonly contextsSection: HTMLElement;
  private readonly kernelCount = h("span", { class: "count" });
  private readonly contextCount = h("span", { class: "count" });
  private readonly main = h("main", { class: "main", testid: "main" });
  private readonly welcome: HTMLElement;
  private readonly toasts = h("div", { class: "toasts", "aria-live": "polite" });
  private readonly serverEl = h("span", { class: "server" });
  private readonly tokenEl = h("span", { class: "token-state" });
  private readonly tokenDialog: TokenDialog;
  private readonly files: FilesPanel;
  private readonly commands: CommandBox;

  constructor(root: HTMLElement) {
    this.contextsSection = h(
      "section",
      { class: "side-section", testid: "contexts-section" },
      h("h2", null, "Contexts ", this.contextCount),
      this.contextsEl,
    );
    this.welcome = h(
      "div",
      { class: "welcome", testid: "welcome" },
      h("h1", null, "kernelgate"),
      h("p", null, "Start a kernel from the list on the left, or open a running kernel or interpreter context to watch its output live and take over."),
      h(
        "p",
        { class: "muted" },
        "Runs made through ",
        h("code", null, "/api/execute"),
        " on an opened kernel appear as read-only cells as they happen.",
      ),
    );
    this.tokenDialog = new TokenDialog((t) => this.submitToken(t));
    this.files = new FilesPanel(this.api, (m, kind) => this.toast(m, kind));
    this.commands = new CommandBox(this.api, (m, kind) => this.toast(m, kind), () => void this.files.reload());
    const forget = h("button", { class: "link-btn", testid: "token-forget", title: "Forget the token kept for this tab" }, "forget");
    forget.addEventListener("click", () => {
      this.api.setToken(null);
      this.renderFooter();
      location.reload();
    });
    const refresh = h("button", { class: "icon-btn", title: "Refresh", "aria-label": "Refresh lists", testid: "refresh" }, icon("restart"));
    refresh.addEventListener("click", () => void this.refresh());
    root.append(
      h(
        "aside",
        { class: "sidebar" },
        h("div", { class: "brand" }, h("span", { class: "logo-mark" }), "kernelgate", refresh),
        h("section", { class: "side-section" }, h("h2", null, "New kernel"), this.specsEl),
        h("section", { class: "side-section" }, h("h2", null, "Kernels ", this.kernelCount), this.kernelsEl),
        this.contextsSection,
        this.files.el,
        this.commands.el,
        h("footer", { class: "side-foot" }, this.serverEl, h("span", null, this.tokenEl, " ", forget), licenses()),
      ),
      this.main,
      this.toasts,
      this.tokenDialog.el,
    );
    this.main.append(this.welcome);
    this.api.onAuth = (reason) => this.needToken(reason);
    window.addEventListener("hashchange", () => this.openFromHash());
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) void this.refresh();
    });
    this.renderFooter();
  }

  async start(): Promise<void> {
    void this.api
      .request<{ version?: string; kernelgate?: string }>("GET", "api")
      .then((v) => {
        // kernelgate names itself beside the Jupyter Server version it speaks.
        if (v?.kernelgate) this.serverText = `kernelgate ${v.kernelgate} · Jupyter API ${v.version ?? "?"}`;
        else if (v?.version) this.serverText = `Jupyter Server ${v.version}`;
        if (!this.serverEl.classList.contains("error")) this.serverEl.textContent = this.serverText;
      })
      .catch(() => {});
    if (await this.refresh()) this.openFromHash();
  }

  /** Reloads kernelspecs, kernels and contexts. False when the server refused or failed. */
  async refresh(): Promise<boolean> {
    clearTimeout(this.pollTimer);
    try {
      if (!this.specs) {
        this.specs = await this.api.kernelspecs();
        this.renderSpecs();
      }
      const [kernels, contexts] = await Promise.all([
        this.api.kernels(),
        this.contexts === null ? Promise.resolve(null) : this.api.contexts(),
      ]);
      this.kernels = kernels;
      this.contexts = contexts;
      this.renderLists();
      this.syncFiles();
      for (const k of kernels) this.notebooks.get(k.id)?.syncModel(k);
      if (this.serverEl.classList.contains("error")) this.setServerError(null);
      return true;
    } catch (e) {
      if (!(e instanceof HttpError && (e.status === 401 || e.status === 403))) {
        this.setServerError(`Cannot reach the gateway: ${(e as Error).message}`);
      }
      return false;
    } finally {
      if (!this.authPending) this.pollTimer = window.setTimeout(() => void this.refresh(), document.hidden ? POLL_MS * 5 : POLL_MS);
    }
  }

  private setServerError(msg: string | null): void {
    this.serverEl.classList.toggle("error", !!msg);
    this.serverEl.textContent = msg ?? this.serverText;
  }

  // -------------------------------------------------------------------------
  // Token

  private needToken(reason: AuthReason): void {
    if (reason === "forbidden") {
      this.toast("The token does not allow this action.");
      return;
    }
    if (this.authPending) return;
    this.authPending = true;
    clearTimeout(this.pollTimer);
    this.tokenDialog.show(reason === "rejected" ? "The token was not accepted. Enter the gateway's token:" : "This gateway requires a token.");
  }

  private async submitToken(token: string): Promise<void> {
    const previous = this.api.token;
    this.api.setToken(token);
    try {
      await this.api.kernelspecs();
    } catch (e) {
      this.api.setToken(previous);
      const refused = e instanceof HttpError && (e.status === 401 || e.status === 403);
      this.tokenDialog.error(refused ? "That token was not accepted." : `The gateway did not answer: ${(e as Error).message}`);
      return;
    }
    this.authPending = false;
    this.tokenDialog.hide();
    this.renderFooter();
    this.setServerError(null);
    for (const nb of this.notebooks.values()) nb.conn.retryNow();
    if (await this.refresh()) this.openFromHash();
  }

  private renderFooter(): void {
    this.tokenEl.textContent = this.api.token ? "token kept for this tab ·" : "no token";
    this.tokenEl.nextElementSibling?.toggleAttribute("hidden", !this.api.token);
  }

  // -------------------------------------------------------------------------
  // Lists

  displayName(name: string): string {
    return this.specs?.kernelspecs[name]?.spec.display_name ?? name;
  }

  language(name: string): string {
    return this.specs?.kernelspecs[name]?.spec.language ?? "";
  }

  logo(name: string): Promise<string | null> {
    let p = this.logos.get(name);
    if (!p) {
      const res = this.specs?.kernelspecs[name]?.resources ?? {};
      const path = res["logo-svg"] ?? res["logo-64x64"] ?? res["logo-32x32"];
      p = path ? this.api.objectUrl(path) : Promise.resolve(null);
      this.logos.set(name, p);
    }
    return p;
  }

  contextsOf(kernelId: string): string[] {
    return (this.contexts ?? []).filter((c) => c.kernelId === kernelId).map((c) => c.id);
  }

  private renderSpecs(): void {
    const specs = Object.values(this.specs?.kernelspecs ?? {}).sort((a, b) =>
      a.name === this.specs?.default ? -1 : b.name === this.specs?.default ? 1 : a.spec.display_name.localeCompare(b.spec.display_name),
    );
    replace(
      this.specsEl,
      specs.map((s) => {
        const logo = h("img", { class: "spec-logo", alt: "", width: 18, height: 18 });
        void this.logo(s.name).then((u) => (u ? (logo.src = u) : logo.replaceWith(h("span", { class: "spec-logo blank" }))));
        const b = h(
          "button",
          { class: "spec", testid: `kernelspec-start-${s.name}`, title: `Start a new ${s.spec.display_name} kernel` },
          logo,
          h("span", { class: "spec-name" }, s.spec.display_name),
          h("span", { class: "spec-lang" }, s.spec.language),
        );
        b.addEventListener("click", () => void this.startKernel(s.name, b));
        return b;
      }),
    );
    if (specs.length === 0) this.specsEl.append(h("p", { class: "empty" }, "No kernelspecs found."));
  }

  private renderLists(): void {
    const now = Date.now();
    this.kernelCount.textContent = String(this.kernels.length);
    const kernels = [...this.kernels].sort((a, b) => (b.last_activity ?? "").localeCompare(a.last_activity ?? ""));
    replace(
      this.kernelsEl,
      kernels.length
        ? kernels.map((k) => {
            const nb = this.notebooks.get(k.id);
            const state = nb ? nb.state : (k.execution_state ?? "unknown");
            const last = nb?.lastActivity ?? k.last_activity;
            const row = h(
              "button",
              {
                class: `row${this.active?.kernelId === k.id ? " active" : ""}${nb ? " open" : ""}`,
                testid: "kernel-item",
                "data-kernel-id": k.id,
                "data-state": state,
                title: `${this.displayName(k.name)} (${this.language(k.name) || k.name})\nkernel ${k.id}\nlast activity ${last ?? "?"}\nconnections ${k.connections ?? "?"}`,
              },
              h("span", { class: `dot s-${state}` }),
              h(
                "span",
                { class: "row-main" },
                h("span", { class: "row-title" }, this.displayName(k.name)),
                h("span", { class: "row-sub" }, this.kernelSub(k, state, last, now)),
              ),
            );
            row.addEventListener("click", () => void this.open(k.id));
            return row;
          })
        : h("p", { class: "empty" }, "No kernels running."),
    );

    this.contextsSection.hidden = !Array.isArray(this.contexts);
    if (!Array.isArray(this.contexts)) return;
    this.contextCount.textContent = String(this.contexts.length);
    const contexts = [...this.contexts].sort((a, b) => a.id.localeCompare(b.id));
    replace(
      this.contextsEl,
      contexts.length
        ? contexts.map((c) => {
            const live = c.active && !!c.kernelId;
            const state = live ? (c.executionState ?? "unknown") : "not running";
            const row = h(
              "button",
              {
                class: `row${live && this.active?.kernelId === c.kernelId ? " active" : ""}`,
                testid: "context-item",
                "data-context-id": c.id,
                "data-kernel-id": c.kernelId ?? "",
                "data-state": state,
                disabled: !live,
                title: live ? `kernel ${c.kernelId}` : "Its kernel is not running: the next run through the API starts one.",
              },
              h("span", { class: `dot s-${live ? state : "none"}` }),
              h(
                "span",
                { class: "row-main" },
                h("span", { class: "row-title mono" }, c.id),
                h("span", { class: "row-sub" }, `${c.language} · ${state} · ${ago(c.lastActivity, now)}`),
              ),
            );
            if (live) row.addEventListener("click", () => void this.open(c.kernelId!));
            return row;
          })
        : h("p", { class: "empty" }, "No contexts yet."),
    );
  }

  // -------------------------------------------------------------------------
  // Notebooks

  private async startKernel(name: string, button: HTMLButtonElement): Promise<void> {
    button.disabled = true;
    try {
      const model = await this.api.startKernel(name);
      this.kernels = [...this.kernels.filter((k) => k.id !== model.id), model];
      this.show(this.notebookFor(model));
      this.renderLists();
    } catch (e) {
      if (!(e instanceof HttpError && e.status === 401)) this.toast(`Could not start ${this.displayName(name)}: ${(e as Error).message}`);
    } finally {
      button.disabled = false;
    }
  }

  private async open(kernelId: string): Promise<void> {
    const existing = this.notebooks.get(kernelId);
    if (existing) {
      this.show(existing);
      return;
    }
    let model = this.kernels.find((k) => k.id === kernelId);
    if (!model) {
      try {
        model = await this.api.kernel(kernelId);
      } catch (e) {
        this.toast(`Cannot open kernel ${shortId(kernelId)}: ${(e as Error).message}`);
        return;
      }
    }
    this.show(this.notebookFor(model));
  }

  private notebookFor(model: KernelModel): Notebook {
    let nb = this.notebooks.get(model.id);
    if (!nb) {
      nb = new Notebook(this, model);
      this.notebooks.set(model.id, nb);
    }
    return nb;
  }

  private show(nb: Notebook): void {
    this.active = nb;
    this.main.replaceChildren(nb.el);
    const hash = `#/kernels/${nb.kernelId}`;
    if (location.hash !== hash) history.replaceState(null, "", hash);
    document.title = `${nb.title} — kernelgate`;
    nb.focusFirstEmpty();
    this.renderLists();
    this.syncFiles();
  }

  /** Shows the files of the opened kernel's context, if it has one. */
  private syncFiles(): void {
    const ctx = this.active ? (this.contextsOf(this.active.kernelId)[0] ?? null) : null;
    this.files.show(ctx);
    this.commands.show(ctx);
  }

  private openFromHash(): void {
    const m = /^#\/kernels\/([\w-]+)$/.exec(location.hash);
    if (m && this.active?.kernelId !== m[1]) void this.open(m[1]);
  }

  closed(nb: Notebook): void {
    this.notebooks.delete(nb.kernelId);
    sessionStorage.removeItem(`kernelgate.session.${nb.kernelId}`);
    this.kernels = this.kernels.filter((k) => k.id !== nb.kernelId);
    if (this.active === nb) {
      this.active = null;
      this.main.replaceChildren(this.welcome);
      history.replaceState(null, "", location.pathname + location.search);
      document.title = "kernelgate";
    }
    this.renderLists();
    this.syncFiles();
    void this.refresh();
  }

  private kernelSub(k: KernelModel, state: string, last: string | undefined, now = Date.now()): string {
    const ctx = this.contextsOf(k.id);
    const lang = this.language(k.name) || k.name;
    return [shortId(k.id), lang, ctx.length ? `ctx ${shortId(ctx[0])}` : "", state, ago(last, now)].filter(Boolean).join(" · ");
  }

  changed(nb: Notebook): void {
    // Keep the sidebar row of an open notebook in step with its live status.
    const row = this.kernelsEl.querySelector<HTMLElement>(`[data-kernel-id="${CSS.escape(nb.kernelId)}"]`);
    const k = this.kernels.find((x) => x.id === nb.kernelId);
    if (!row || !k || row.dataset.state === nb.state) return;
    row.dataset.state = nb.state;
    const dot = row.querySelector(".dot");
    if (dot) dot.className = `dot s-${nb.state}`;
    const sub = row.querySelector(".row-sub");
    if (sub) sub.textContent = this.kernelSub(k, nb.state, nb.lastActivity);
  }

  toast(message: string, kind: "error" | "info" = "error"): void {
    const t = h("div", { class: `toast ${kind}`, testid: "toast", role: kind === "error" ? "alert" : "status" }, message);
    this.toasts.append(t);
    setTimeout(() => t.remove(), kind === "error" ? 8000 : 3000);
  }

  /** Hooks for the end-to-end test and for debugging from the console. */
  debug() {
    return {
      dropConnections: () => {
        for (const nb of this.notebooks.values()) nb.conn.drop();
      },
      activeKernel: () => this.active?.kernelId ?? null,
    };
  }
}

/** A link to the licence texts of the bundled packages (build.mjs writes them). */
function licenses(): HTMLElement | null {
  const link = document.querySelector<HTMLLinkElement>('link[rel="license"]');
  return link ? h("a", { href: link.href, target: "_blank", rel: "noopener noreferrer" }, "third-party licences") : null;
}

class TokenDialog {
  readonly el: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly msg: HTMLElement;
  private readonly err: HTMLElement;
  private readonly submit: HTMLButtonElement;

  constructor(onSubmit: (token: string) => Promise<void>) {
    this.input = h("input", {
      type: "password",
      testid: "token-input",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "token",
      "aria-label": "Token",
    });
    this.msg = h("p", { class: "dialog-msg" });
    this.err = h("p", { class: "dialog-err", testid: "token-error", role: "alert" });
    this.submit = h("button", { class: "btn primary", type: "submit", testid: "token-submit" }, "Connect");
    const form = h(
      "form",
      { class: "dialog", testid: "token-dialog", role: "dialog", "aria-modal": "true", "aria-labelledby": "token-title" },
      h("h2", { id: "token-title" }, "Token required"),
      this.msg,
      this.input,
      this.err,
      h("p", { class: "dialog-note" }, "The token is kept in this tab only (sessionStorage) and sent only to this gateway."),
      h("div", { class: "dialog-actions" }, this.submit),
    );
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = this.input.value.trim();
      if (!t) return;
      this.submit.disabled = true;
      this.err.textContent = "";
      void onSubmit(t).finally(() => (this.submit.disabled = false));
    });
    this.el = h("div", { class: "overlay", hidden: true }, form);
  }

  show(message: string): void {
    this.msg.textContent = message;
    this.err.textContent = "";
    this.el.hidden = false;
    this.input.value = "";
    this.input.focus();
  }

  error(message: string): void {
    this.err.textContent = message;
    this.input.select();
  }

  hide(): void {
    this.el.hidden = true;
  }
}

const root = document.getElementById("app");
if (root) {
  const app = new App(root);
  (window as unknown as { kernelgate: unknown }).kernelgate = app.debug();
  void app.start();
}
