import { FileEntry, json, q, raw, sessionPath } from "../api";
import { button, field, h, say, status, table, text, when } from "../dom";

function parent(path: string): string {
  const trimmed = path.replace(/\/+$/, "");
  const i = trimmed.lastIndexOf("/");
  return i <= 0 ? "/" : trimmed.slice(0, i);
}

function join(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, "")}/${name}`;
}

export function filesPanel(root: HTMLElement, id: string): void {
  const base = sessionPath(id);
  const region = status();
  const dir = h("input", { type: "text", name: "path", value: "/workspace", spellcheck: "false" });
  const listing = h("div", { class: "list" });
  const upload = h("input", { type: "file", name: "upload", multiple: true });

  const download = async (entry: FileEntry) => {
    try {
      const res = await raw("GET", q(`${base}/files`, { path: entry.path }));
      const url = URL.createObjectURL(await res.blob());
      const a = h("a", { href: url, download: entry.name });
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
      say(region, `Downloaded ${entry.path}.`);
    } catch (e) {
      say(region, String(e), true);
    }
  };

  const show = async (path: string) => {
    dir.value = path;
    try {
      const { entries } = await json<{ entries: FileEntry[] }>("GET", q(`${base}/files/list`, { path, depth: 1 }));
      entries.sort((a, b) => (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || a.name.localeCompare(b.name));
      const rows = entries.map((e) => [
        e.type === "dir" ? button(`${e.name}/`, () => show(e.path), { class: "link" }) : text(e.name),
        text(e.type),
        text(e.type === "file" ? e.size : null),
        when(e.modified_at),
        e.type === "file" ? button("Download", () => download(e), { "aria-label": `Download ${e.name}` }) : text(""),
      ]);
      const files = table(["Name", "Type", "Size (bytes)", "Modified", ""], rows, `Files in ${path}`);
      if (path === "/") listing.replaceChildren(files);
      else listing.replaceChildren(button("Parent directory", () => show(parent(path))), files);
    } catch (e) {
      say(region, String(e), true);
    }
  };

  const browse = h("form", { class: "inline", "aria-label": "Browse" }, field("Directory", dir), h("button", { type: "submit" }, "Open"));
  browse.addEventListener("submit", (ev) => {
    ev.preventDefault();
    void show(dir.value || "/");
  });
  const send = h("form", { class: "inline", "aria-label": "Upload" }, field("Files to upload", upload), h("button", { type: "submit" }, "Upload"));
  send.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const files = Array.from(upload.files ?? []);
    try {
      for (const f of files) {
        await raw("PUT", q(`${base}/files`, { path: join(dir.value, f.name) }), { body: f });
      }
      say(region, `Uploaded ${files.map((f) => f.name).join(", ")}.`);
      upload.value = "";
      await show(dir.value);
    } catch (e) {
      say(region, String(e), true);
    }
  });
  root.append(browse, send, region, listing);
  void show(dir.value);
}
