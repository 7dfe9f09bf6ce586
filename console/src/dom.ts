// Elements are made here and only here. Text goes in through textContent: nothing the daemon or
// a sandbox sends is ever parsed as HTML.

type Attrs = Record<string, string | boolean | undefined>;
type Child = Node | string | null | undefined | false;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === false) continue;
    el.setAttribute(k, v === true ? "" : v);
  }
  append(el, ...children);
  return el;
}

export function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  }
}

export function clear(el: Element): void {
  el.replaceChildren();
}

let ids = 0;
/** A labelled input: the label names the control for screen readers and tests. */
export function field(label: string, input: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement): HTMLElement {
  if (!input.id) input.id = `f${++ids}`;
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input);
}

export function button(label: string, onClick: (ev: MouseEvent) => void, attrs: Attrs = {}): HTMLButtonElement {
  const b = h("button", { type: "button", ...attrs }, label);
  b.addEventListener("click", onClick);
  return b;
}

/** A polite live region for outcomes and errors. */
export function status(): HTMLElement {
  return h("p", { class: "status", role: "status", "aria-live": "polite" });
}

export function say(region: HTMLElement, text: string, error = false): void {
  region.textContent = text;
  region.classList.toggle("error", error);
}

export function table(headings: string[], rows: Node[][], caption: string): HTMLTableElement {
  return h(
    "table",
    {},
    h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ...headings.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))),
  );
}

export function text(s: string | number | null | undefined): Text {
  return document.createTextNode(s === null || s === undefined ? "—" : String(s));
}

export function when(iso: string | undefined): Text {
  if (!iso) return text(null);
  const d = new Date(iso);
  return text(Number.isNaN(d.getTime()) ? iso : d.toLocaleString());
}
