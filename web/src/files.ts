// The files of an interpreter context's workspace, in the sidebar: shown
// while the opened kernel belongs to a context. Folders open in place,
// files download on click, and files dropped on the panel (or picked with
// its upload button) are uploaded into the folder shown.

import { type Api, type FileEntry, HttpError } from "./api";
import { h, icon, replace } from "./dom";

export class FilesPanel {
  readonly el: HTMLElement;
  private readonly list = h("div", { class: "list files", testid: "file-list" });
  private readonly title = h("span", { class: "count mono" });
  private readonly where = h("div", { class: "files-where mono", testid: "files-where" });
  private readonly picker = h("input", { type: "file", multiple: true, hidden: true, testid: "file-picker" });
  private ctx: string | null = null;
  private dir = "";
  private loading = false;

  constructor(
    private readonly api: Api,
    private readonly toast: (msg: string, kind?: "error" | "info") => void,
  ) {
    const upload = h("button", { class: "link-btn", testid: "file-upload", title: "Upload files into this folder" }, icon("plus"), " upload");
    upload.addEventListener("click", () => this.picker.click());
    this.picker.addEventListener("change", () => {
      void this.uploadAll([...(this.picker.files ?? [])]);
      this.picker.value = "";
    });
    this.el = h(
      "section",
      { class: "side-section files-section", testid: "files-section", hidden: true },
      h("h2", null, "Files ", this.title),
      this.where,
      this.list,
      h("div", { class: "drop-hint" }, "Drop files here, or ", upload, this.picker),
    );
    this.el.addEventListener("dragover", (e) => {
      if (!this.ctx || !e.dataTransfer?.types.includes("Files")) return;
      e.preventDefault();
      e.dataTransfer.dropEffect = "copy";
      this.el.classList.add("dropping");
    });
    this.el.addEventListener("dragleave", () => this.el.classList.remove("dropping"));
    this.el.addEventListener("drop", (e) => {
      this.el.classList.remove("dropping");
      if (!this.ctx || !e.dataTransfer?.files.length) return;
      e.preventDefault();
      void this.uploadAll([...e.dataTransfer.files]);
    });
  }

  /** Shows the files of context ctx (null hides the panel). */
  show(ctx: string | null): void {
    if (ctx !== this.ctx) {
      this.ctx = ctx;
      this.dir = "";
      replace(this.list);
    }
    this.el.hidden = !ctx;
    this.title.textContent = ctx ?? "";
    if (ctx) void this.reload();
  }

  async reload(): Promise<void> {
    const ctx = this.ctx;
    if (!ctx || this.loading) return;
    this.loading = true;
    try {
      const entries = await this.api.files(ctx, this.dir);
      if (ctx === this.ctx) this.render(entries);
    } catch (e) {
      if (e instanceof HttpError && e.status === 404 && this.dir) {
        this.dir = ""; // the folder went away
      } else if (ctx === this.ctx) {
        replace(this.list, h("p", { class: "empty" }, `Cannot list files: ${(e as Error).message}`));
      }
    } finally {
      this.loading = false;
    }
  }

  private render(entries: FileEntry[]): void {
    replace(this.where, "/" + this.dir);
    const rows: HTMLElement[] = [];
    if (this.dir) {
      const up = h("button", { class: "row file-row", testid: "file-up" }, h("span", { class: "row-title mono" }, ".."));
      up.addEventListener("click", () => this.cd(this.dir.split("/").slice(0, -1).join("/")));
      rows.push(up);
    }
    const sorted = [...entries].sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
    for (const f of sorted) {
      const row = h(
        "button",
        {
          class: `row file-row t-${f.type}`,
          testid: "file-item",
          "data-path": f.path,
          "data-type": f.type,
          title: f.type === "dir" ? `Open ${f.path}` : `Download ${f.path} (${f.size} bytes, modified ${f.modified})`,
        },
        h("span", { class: "row-title mono" }, f.type === "dir" ? `${f.name}/` : f.name),
        h("span", { class: "row-sub" }, f.type === "dir" ? "" : size(f.size)),
      );
      row.addEventListener("click", () => (f.type === "dir" ? this.cd(f.path) : void this.download(f)));
      const del = h("button", { class: "icon-btn file-delete", title: `Delete ${f.path}`, "aria-label": `Delete ${f.path}`, testid: "file-delete" }, icon("x"));
      del.addEventListener("click", () => void this.remove(f, del));
      rows.push(h("div", { class: "file-line" }, row, del));
    }
    if (!entries.length) rows.push(h("p", { class: "empty" }, "No files yet."));
    replace(this.list, rows);
  }

  private cd(dir: string): void {
    this.dir = dir;
    void this.reload();
  }

  private async download(f: FileEntry): Promise<void> {
    if (!this.ctx) return;
    try {
      const blob = await this.api.download(this.ctx, f.path);
      const url = URL.createObjectURL(blob);
      const a = h("a", { href: url, download: f.name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
    } catch (e) {
      this.toast(`Cannot download ${f.path}: ${(e as Error).message}`);
    }
  }

  /** Deletes f; a folder asks for a second click first. */
  private async remove(f: FileEntry, button: HTMLButtonElement): Promise<void> {
    if (!this.ctx) return;
    if (f.type === "dir" && !button.classList.contains("confirm")) {
      button.classList.add("confirm");
      button.title = `Click again to delete ${f.path} and everything in it`;
      setTimeout(() => button.classList.remove("confirm"), 3000);
      return;
    }
    try {
      await this.api.deleteFile(this.ctx, f.path, f.type === "dir");
    } catch (e) {
      this.toast(`Cannot delete ${f.path}: ${(e as Error).message}`);
    }
    void this.reload();
  }

  private async uploadAll(files: File[]): Promise<void> {
    const ctx = this.ctx;
    if (!ctx) return;
    for (const file of files) {
      const path = this.dir ? `${this.dir}/${file.name}` : file.name;
      try {
        await this.api.upload(ctx, path, file);
        this.toast(`Uploaded ${path}`, "info");
      } catch (e) {
        this.toast(`Cannot upload ${path}: ${(e as Error).message}`);
      }
    }
    void this.reload();
  }
}

/** "1.2 MB", "340 B". */
function size(n: number): string {
  if (n < 1000) return `${n} B`;
  const units = ["kB", "MB", "GB", "TB"];
  let v = n;
  let u = -1;
  do {
    v /= 1000;
    u++;
  } while (v >= 1000 && u < units.length - 1);
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}
