// xterm.js writes its dynamic styles (cell sizes, theme colours) into <style> elements and
// `style` attributes, both of which the console's policy (style-src 'self') refuses. Under this
// shim they go through CSSOM instead, which the policy permits as it permits any style property
// the console's own script sets: a <style> made from script is an inert, hidden element whose
// text fills a constructable stylesheet (xterm uses only `textContent` and `remove()` on them),
// and `setAttribute("style", v)` sets `style.cssText`. Nothing else in the console does either.

const create = Document.prototype.createElement;

function sheetElement(doc: Document): HTMLElement {
  const el = create.call(doc, "koder-style") as HTMLElement;
  el.hidden = true;
  const sheet = new CSSStyleSheet();
  let text = "";
  doc.adoptedStyleSheets = [...doc.adoptedStyleSheets, sheet];
  Object.defineProperty(el, "textContent", {
    get: () => text,
    set: (v: unknown) => {
      text = v === null || v === undefined ? "" : String(v);
      sheet.replaceSync(text);
    },
  });
  const remove = el.remove.bind(el);
  el.remove = () => {
    doc.adoptedStyleSheets = doc.adoptedStyleSheets.filter((s) => s !== sheet);
    remove();
  };
  return el;
}

const setAttribute = Element.prototype.setAttribute;

export function routeInlineStyles(doc: Document): void {
  Element.prototype.setAttribute = function (this: Element, name: string, value: string) {
    if (name.toLowerCase() === "style" && (this instanceof HTMLElement || this instanceof SVGElement)) {
      this.style.cssText = value;
    } else {
      setAttribute.call(this, name, value);
    }
  };
  doc.createElement = function (this: Document, tag: string, options?: ElementCreationOptions) {
    return tag.toLowerCase() === "style" ? sheetElement(this) : create.call(this, tag, options);
  } as typeof doc.createElement;
}
