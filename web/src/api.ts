// REST client for the gateway. Every URL is relative to the page, so the
// page also works when the gateway is served under a path prefix, and every
// request goes to the page's own origin.

export interface KernelSpec {
  name: string;
  spec: {
    argv: string[];
    display_name: string;
    language: string;
    interrupt_mode?: string;
    metadata?: Record<string, unknown>;
  };
  resources: Record<string, string>;
}

export interface KernelSpecs {
  default: string;
  kernelspecs: Record<string, KernelSpec>;
}

export interface KernelModel {
  id: string;
  name: string;
  last_activity?: string;
  execution_state?: string;
  connections?: number;
  reason?: string;
}

export interface Context {
  id: string;
  language: string;
  cwd?: string;
  active: boolean;
  kernelId?: string | null;
  executionState?: string;
  createdAt?: string;
  lastActivity?: string;
}

/** An entry of a context's workspace (GET api/contexts/{id}/files). */
export interface FileEntry {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink";
  size: number;
  modified: string;
}

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** Why the page needs a token: none given yet, or the one given was refused. */
export type AuthReason = "required" | "rejected" | "forbidden";

const TOKEN_KEY = "kernelgate.token";

export class Api {
  private tokenValue: string | null;
  /** Called when a request was refused for lack of (good) credentials. */
  onAuth: (reason: AuthReason) => void = () => {};

  constructor() {
    this.tokenValue = sessionStorage.getItem(TOKEN_KEY);
    // Accept the token the way Jupyter prints it (http://host/?token=...),
    // keep it for this tab only and take it out of the address bar.
    const url = new URL(location.href);
    const t = url.searchParams.get("token");
    if (t) {
      this.setToken(t);
      url.searchParams.delete("token");
      history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
  }

  get token(): string | null {
    return this.tokenValue;
  }

  setToken(t: string | null): void {
    this.tokenValue = t || null;
    if (this.tokenValue) sessionStorage.setItem(TOKEN_KEY, this.tokenValue);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  /** Absolute URL of a path relative to the page ("api/kernels"). */
  url(path: string): URL {
    return new URL(path.replace(/^\//, ""), document.baseURI);
  }

  wsUrl(path: string, params: Record<string, string>): string {
    const u = this.url(path);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    for (const [k, v] of Object.entries(params)) u.searchParams.set(k, v);
    // Browsers cannot set headers on a websocket: the token goes in the query.
    if (this.tokenValue) u.searchParams.set("token", this.tokenValue);
    return u.toString();
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (this.tokenValue) headers.Authorization = `token ${this.tokenValue}`;
    let payload: string | undefined;
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    let res: Response;
    try {
      res = await fetch(this.url(path), {
        method,
        headers,
        body: payload,
        cache: "no-store",
        credentials: "same-origin",
        redirect: "error",
        referrerPolicy: "no-referrer",
      });
    } catch (e) {
      throw new HttpError(0, `network error: ${(e as Error).message}`);
    }
    if (res.status === 401 || (res.status === 403 && !this.tokenValue)) {
      this.onAuth(this.tokenValue ? "rejected" : "required");
    } else if (res.status === 403) {
      this.onAuth("forbidden");
    }
    if (!res.ok) {
      let msg = `${res.status} ${res.statusText}`;
      try {
        const j = await res.json();
        if (j && typeof j.message === "string" && j.message) msg = j.message;
      } catch {
        /* not JSON */
      }
      throw new HttpError(res.status, msg);
    }
    if (res.status === 204) return undefined as T;
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }

  kernelspecs(): Promise<KernelSpecs> {
    return this.request("GET", "api/kernelspecs");
  }
  kernels(): Promise<KernelModel[]> {
    return this.request("GET", "api/kernels");
  }
  kernel(id: string): Promise<KernelModel> {
    return this.request("GET", `api/kernels/${encodeURIComponent(id)}`);
  }
  startKernel(name: string): Promise<KernelModel> {
    return this.request("POST", "api/kernels", { name });
  }
  shutdownKernel(id: string): Promise<void> {
    return this.request("DELETE", `api/kernels/${encodeURIComponent(id)}`);
  }
  interruptKernel(id: string): Promise<void> {
    return this.request("POST", `api/kernels/${encodeURIComponent(id)}/interrupt`, {});
  }
  restartKernel(id: string): Promise<KernelModel> {
    return this.request("POST", `api/kernels/${encodeURIComponent(id)}/restart`, {});
  }
  /** The interpreter contexts, or null where the server has none (plain Jupyter Server). */
  async contexts(): Promise<Context[] | null> {
    try {
      return await this.request<Context[]>("GET", "api/contexts");
    } catch (e) {
      if (e instanceof HttpError && (e.status === 404 || e.status === 405)) return null;
      throw e;
    }
  }

  /** The entries of folder dir ("" for the workspace) of a context. */
  files(ctx: string, dir: string): Promise<FileEntry[]> {
    const q = dir ? `?path=${encodeURIComponent(dir)}` : "";
    return this.request("GET", `api/contexts/${encodeURIComponent(ctx)}/files${q}`);
  }

  /** Uploads a file (the browser streams it) as path of a context. */
  async upload(ctx: string, path: string, file: Blob): Promise<void> {
    const res = await this.fetchFile("PUT", ctx, path, file);
    if (!res.ok) throw new HttpError(res.status, await errorMessage(res));
  }

  /** Downloads path of a context. */
  async download(ctx: string, path: string): Promise<Blob> {
    const res = await this.fetchFile("GET", ctx, path);
    if (!res.ok) throw new HttpError(res.status, await errorMessage(res));
    return res.blob();
  }

  deleteFile(ctx: string, path: string, recursive: boolean): Promise<void> {
    return this.request("DELETE", `api/contexts/${encodeURIComponent(ctx)}/files/${filePath(path)}${recursive ? "?recursive=true" : ""}`);
  }

  private fetchFile(method: string, ctx: string, path: string, body?: Blob): Promise<Response> {
    const headers: Record<string, string> = {};
    if (this.tokenValue) headers.Authorization = `token ${this.tokenValue}`;
    if (body) headers["Content-Type"] = "application/octet-stream";
    return fetch(this.url(`api/contexts/${encodeURIComponent(ctx)}/files/${filePath(path)}`), {
      method,
      headers,
      body,
      cache: "no-store",
      credentials: "same-origin",
      redirect: "error",
      referrerPolicy: "no-referrer",
    });
  }

  /**
   * Fetches a same-origin resource with the token header and returns an
   * object URL for it (kernelspec logos: an <img> cannot send headers).
   */
  async objectUrl(path: string): Promise<string | null> {
    // Resource paths come from the server as absolute paths; anything that
    // would leave this origin is not fetched.
    const u = new URL(path, document.baseURI);
    if (u.origin !== location.origin) return null;
    const headers: Record<string, string> = {};
    if (this.tokenValue) headers.Authorization = `token ${this.tokenValue}`;
    try {
      const res = await fetch(u, { headers, referrerPolicy: "no-referrer", redirect: "error" });
      if (!res.ok) return null;
      return URL.createObjectURL(await res.blob());
    } catch {
      return null;
    }
  }
}

/** A workspace path as URL path segments ("a b/c" → "a%20b/c"). */
function filePath(path: string): string {
  return path.split("/").map(encodeURIComponent).join("/");
}

async function errorMessage(res: Response): Promise<string> {
  try {
    const j = await res.json();
    if (j && typeof j.message === "string" && j.message) return j.message;
  } catch {
    /* not JSON */
  }
  return `${res.status} ${res.statusText}`;
}
