// Sandbox output is hostile: SGR escape sequences become styled spans whose text is set with
// textContent; every other escape sequence is dropped. Colours are classes for the 16 basic
// ones and CSSOM properties (allowed by the CSP, unlike style attributes) for 256/true colour.

interface Style {
  fg?: string;
  bg?: string;
  bold: boolean;
  dim: boolean;
  italic: boolean;
  underline: boolean;
}

const plain = (): Style => ({ bold: false, dim: false, italic: false, underline: false });

// CSI with parameters and a final byte, OSC up to BEL or ST, and two-byte escapes.
// eslint-disable-next-line no-control-regex
const ESCAPE = /\x1b\[([0-9;?]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?/g;

function cube(n: number): string {
  if (n < 16) return `c${n}`;
  if (n >= 232) {
    const v = 8 + (n - 232) * 10;
    return `rgb(${v},${v},${v})`;
  }
  const i = n - 16;
  const level = (x: number) => (x === 0 ? 0 : 55 + x * 40);
  return `rgb(${level(Math.floor(i / 36))},${level(Math.floor(i / 6) % 6)},${level(i % 6)})`;
}

/** Applies one SGR parameter list to a style (a fresh object: spans already made keep theirs). */
export function sgr(params: number[], current: Style): Style {
  const s = { ...current };
  for (let i = 0; i < params.length; i++) {
    const p = params[i];
    if (p === 0) Object.assign(s, plain(), { fg: undefined, bg: undefined });
    else if (p === 1) s.bold = true;
    else if (p === 2) s.dim = true;
    else if (p === 3) s.italic = true;
    else if (p === 4) s.underline = true;
    else if (p === 22) s.bold = s.dim = false;
    else if (p === 23) s.italic = false;
    else if (p === 24) s.underline = false;
    else if (p >= 30 && p <= 37) s.fg = `c${p - 30}`;
    else if (p >= 90 && p <= 97) s.fg = `c${p - 90 + 8}`;
    else if (p === 39) s.fg = undefined;
    else if (p >= 40 && p <= 47) s.bg = `c${p - 40}`;
    else if (p >= 100 && p <= 107) s.bg = `c${p - 100 + 8}`;
    else if (p === 49) s.bg = undefined;
    else if (p === 38 || p === 48) {
      let colour: string | undefined;
      if (params[i + 1] === 5 && i + 2 < params.length) {
        colour = cube(params[i + 2] & 255);
        i += 2;
      } else if (params[i + 1] === 2 && i + 4 < params.length) {
        const [r, g, b] = params.slice(i + 2, i + 5).map((v) => v & 255);
        colour = `rgb(${r},${g},${b})`;
        i += 4;
      }
      if (p === 38) s.fg = colour;
      else s.bg = colour;
    }
  }
  return s;
}

function paint(span: HTMLSpanElement, s: Style): void {
  const apply = (colour: string | undefined, prefix: string, prop: "color" | "backgroundColor") => {
    if (!colour) return;
    if (colour.startsWith("c")) span.classList.add(`${prefix}${colour.slice(1)}`);
    else span.style[prop] = colour;
  };
  apply(s.fg, "fg", "color");
  apply(s.bg, "bg", "backgroundColor");
  if (s.bold) span.classList.add("b");
  if (s.dim) span.classList.add("dim");
  if (s.italic) span.classList.add("i");
  if (s.underline) span.classList.add("u");
}

/** A stream renderer: keeps its style (and a split escape) across chunks. */
export class AnsiWriter {
  private style: Style = plain();
  private pending = "";

  constructor(
    private readonly target: HTMLElement,
    private readonly extraClass = "",
  ) {}

  write(chunk: string): void {
    let data = this.pending + chunk;
    this.pending = "";
    // An escape cut at the chunk's end waits for the next chunk.
    const cut = data.lastIndexOf("\x1b");
    if (cut >= 0 && cut > data.length - 32 && !/[@-~]/.test(data.slice(cut + 2))) {
      this.pending = data.slice(cut);
      data = data.slice(0, cut);
    }
    let last = 0;
    for (const m of data.matchAll(ESCAPE)) {
      this.text(data.slice(last, m.index));
      last = (m.index ?? 0) + m[0].length;
      if (m[2] === "m") {
        const params = (m[1] || "0").split(";").map((v) => Number.parseInt(v || "0", 10) || 0);
        this.style = sgr(params, this.style);
      }
    }
    this.text(data.slice(last));
  }

  private text(t: string): void {
    if (!t) return;
    const span = document.createElement("span");
    if (this.extraClass) span.classList.add(this.extraClass);
    paint(span, this.style);
    span.textContent = t;
    this.target.appendChild(span);
  }
}
