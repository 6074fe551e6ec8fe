// A command box for the opened kernel's interpreter context, in the
// sidebar under its files: a shell command runs beside the kernel, in its
// workspace (POST /api/contexts/{id}/commands, in the background), and its
// output is followed from its run until it ends; a running command can be
// killed.

import { type Api } from "./api";
import { h, replace } from "./dom";

interface Execution {
  logs: { stdout: string[]; stderr: string[] };
  process: { exitCode?: number; reason?: string; message?: string };
  truncated: boolean;
}

interface RunModel {
  state: "queued" | "running" | "done";
  execution: Execution;
}

/** How often a running command's run is read. */
const POLL_MS = 400;

export class CommandBox {
  readonly el: HTMLElement;
  private readonly input = h("input", {
    type: "text",
    class: "mono command-input",
    placeholder: "pip install polars",
    "aria-label": "Command",
    spellcheck: "false",
    testid: "command-input",
  });
  private readonly runBtn = h("button", { class: "btn", testid: "command-run", title: "Run the command beside the kernel" }, "Run");
  private readonly killBtn = h("button", { class: "link-btn", testid: "command-kill", title: "Kill the running command", hidden: true }, "kill");
  private readonly out = h("pre", { class: "command-output mono", testid: "command-output" });
  private readonly status = h("div", { class: "command-status mono", testid: "command-status" });
  private ctx: string | null = null;
  private run: string | null = null;

  constructor(
    private readonly api: Api,
    private readonly toast: (msg: string, kind?: "error" | "info") => void,
    private readonly ran: () => void,
  ) {
    const form = h("form", { class: "command-form" }, this.input, this.runBtn);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      void this.start();
    });
    this.killBtn.addEventListener("click", () => void this.kill());
    this.el = h(
      "section",
      { class: "side-section command-section", testid: "command-section", hidden: true },
      h("h2", null, "Command"),
      form,
      h("div", { class: "command-line" }, this.status, this.killBtn),
      this.out,
    );
  }

  /** Shows the box for context ctx (null hides it). */
  show(ctx: string | null): void {
    if (ctx !== this.ctx) {
      this.ctx = ctx;
      this.run = null;
      replace(this.out);
      this.status.textContent = "";
      this.killBtn.hidden = true;
    }
    this.el.hidden = !ctx;
  }

  private async start(): Promise<void> {
    const ctx = this.ctx;
    const cmd = this.input.value.trim();
    if (!ctx || !cmd || this.run) return;
    replace(this.out);
    this.status.textContent = "starting…";
    try {
      const { run } = await this.api.request<{ run: string }>("POST", `api/contexts/${encodeURIComponent(ctx)}/commands`, { cmd, background: true });
      this.run = run;
      this.killBtn.hidden = false;
      this.status.textContent = "running";
      await this.follow(ctx, run);
    } catch (e) {
      this.status.textContent = "";
      this.toast(`Command not run: ${(e as Error).message}`, "error");
    } finally {
      if (this.ctx === ctx) {
        this.run = null;
        this.killBtn.hidden = true;
      }
      this.ran();
    }
  }

  /** Reads the run until it ends, showing its output as it grows. */
  private async follow(ctx: string, run: string): Promise<void> {
    for (;;) {
      const m = await this.api.request<RunModel>("GET", `api/runs/${encodeURIComponent(run)}`);
      if (this.ctx !== ctx) return;
      this.render(m.execution);
      if (m.state === "done") {
        const p = m.execution.process;
        this.status.textContent = `${p.reason ?? "done"}, exit code ${p.exitCode ?? "none"}${m.execution.truncated ? ", output cut" : ""}`;
        this.status.dataset.exit = String(p.exitCode ?? "");
        return;
      }
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  private render(e: Execution): void {
    replace(
      this.out,
      h("span", { class: "stdout" }, e.logs.stdout.join("")),
      h("span", { class: "stderr" }, e.logs.stderr.join("")),
    );
  }

  private async kill(): Promise<void> {
    if (!this.run) return;
    try {
      await this.api.request("POST", `api/runs/${encodeURIComponent(this.run)}/kill`, {});
    } catch (e) {
      this.toast(`Not killed: ${(e as Error).message}`, "error");
    }
  }
}
