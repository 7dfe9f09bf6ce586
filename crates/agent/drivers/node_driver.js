// koder-sandbox code-interpreter driver for JavaScript, started by the agent as `node -e`.
//
// Requests arrive one JSON object per line on fd 3 ({"code", "n"}); events leave one JSON
// object per line on fd 4 ({"ev": "ready" | "display" | "done", ...}). fds 1 and 2 are the
// agent's pipes for user output (console output to pipes is synchronous on Linux, so it is in
// the pipe before "done" is written). Cells run as classic scripts in this realm, so top-level
// `let`/`const`/`class` bindings persist from one run to the next, as in Node's REPL.
'use strict';

(() => {
  const fs = require('fs');
  const net = require('net');
  const util = require('util');
  const vm = require('vm');

  // The agent's limits are the real ones; these keep a run from producing lines the agent
  // would have to throw away (one run's events must fit in one protocol frame).
  const RESULT_BUDGET = 860 * 1024;
  const MAX_TEXT = 256 * 1024;
  const MAX_ERROR_VALUE = 16 * 1024;
  const MAX_TRACEBACK = 64 * 1024;
  const MAX_RESULTS = 256;

  // Reopening through /proc yields close-on-exec descriptors, so processes user code starts
  // do not hold the control channel open (the agent reads its end-of-file as our death).
  function reopen(fd, flags) {
    try {
      const copy = fs.openSync(`/proc/self/fd/${fd}`, flags);
      fs.closeSync(fd);
      return copy;
    } catch (_) {
      return fd;
    }
  }
  const ctlIn = reopen(3, fs.constants.O_RDONLY);

  // A TypeScript context: the agent passes this argument, which user code must not see.
  const typescript = process.argv[1] === 'typescript';
  if (typescript) process.argv.splice(1, 1);
  const ctlOut = reopen(4, fs.constants.O_WRONLY);

  function emit(event) {
    const buf = Buffer.from(JSON.stringify(event) + '\n', 'utf8');
    let off = 0;
    while (off < buf.length) {
      off += fs.writeSync(ctlOut, buf, off, buf.length - off);
    }
  }

  function clip(s, n) {
    return s.length <= n ? s : `${s.slice(0, n)}\n[... ${s.length - n} characters cut]`;
  }

  let current = null; // the run in progress

  function sendOutput(data, main) {
    const run = current;
    if (!run || run.count >= MAX_RESULTS) return;
    let size = 0;
    for (const v of Object.values(data)) size += Buffer.byteLength(v);
    if (run.used + size > RESULT_BUDGET) {
      data = { text: `[output of ${size} bytes omitted: over this run's result budget]` };
      size = data.text.length;
    }
    run.used += size;
    run.count += 1;
    emit({ ev: 'display', n: run.n, main: !!main, data });
  }

  const MIME = {
    'text/plain': 'text',
    'text/html': 'html',
    'text/markdown': 'markdown',
    'image/svg+xml': 'svg',
    'image/png': 'png',
    'application/json': 'json',
    'application/pdf': 'pdf',
    'application/javascript': 'javascript',
  };
  // A MIME type's name, which tells a bundle's keys from a plain object's.
  const MIME_TYPE = /^[a-z]+\/[\w.+-]+$/i;
  // How objects render themselves: Deno's and tslab's `[Symbol.for('Jupyter.display')]()`,
  // IJavascript's (E2B's JavaScript kernel) `_toMime()` and `_toHtml()`, `_toSvg()`,
  // `_toPng()`, `_toJpeg()`.
  const DISPLAY = Symbol.for('Jupyter.display');
  const RENDERERS = [
    ['_toHtml', 'text/html'],
    ['_toSvg', 'image/svg+xml'],
    ['_toPng', 'image/png'],
    ['_toJpeg', 'image/jpeg'],
  ];

  function ownBundle(value) {
    const bundle = {};
    const call = (name) => {
      try {
        const f = value[name];
        return typeof f === 'function' ? f.call(value) : undefined;
      } catch (_) {
        return undefined; // a broken renderer leaves the plain representations
      }
    };
    for (const given of [call(DISPLAY), call('_toMime')]) {
      if (given === null || typeof given !== 'object') continue;
      try {
        for (const [mime, v] of Object.entries(given)) if (!(mime in bundle)) bundle[mime] = v;
      } catch (_) {
        // an exotic object: what was read so far
      }
    }
    for (const [name, mime] of RENDERERS) {
      if (mime in bundle) continue;
      const v = call(name);
      if (v !== undefined) bundle[mime] = v;
    }
    return bundle;
  }

  function inspect(v) {
    try {
      return util.inspect(v, { depth: 4, maxArrayLength: 200, maxStringLength: MAX_TEXT, breakLength: 100 });
    } catch (e) {
      return `<inspect failed: ${e}>`;
    }
  }

  function isPlainData(v) {
    if (v === null || typeof v === 'boolean' || typeof v === 'string') return true;
    if (typeof v === 'number') return Number.isFinite(v);
    if (Array.isArray(v)) return true;
    if (typeof v === 'object') {
      const proto = Object.getPrototypeOf(v);
      return proto === Object.prototype || proto === null;
    }
    return false;
  }

  function isBundle(v) {
    if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
    const keys = Object.keys(v);
    return keys.length > 0 && keys.every((k) => MIME_TYPE.test(k));
  }

  function putBundle(data, bundle) {
    for (const [mime, key] of Object.entries(MIME)) {
      if (!(mime in bundle)) continue;
      let v = bundle[mime];
      try {
        if (key === 'json' && typeof v !== 'string') v = JSON.stringify(v);
        if ((key === 'png' || key === 'jpeg' || key === 'pdf') && v instanceof Uint8Array) v = Buffer.from(v).toString('base64');
      } catch (_) {
        continue;
      }
      if (typeof v === 'string') data[key] = key === 'text' ? clip(v, MAX_TEXT) : v;
    }
    // The other types (Plotly's, widgets') go together as `extra`.
    const extra = Object.fromEntries(Object.entries(bundle).filter(([mime]) => !(mime in MIME) && MIME_TYPE.test(mime)));
    if (Object.keys(extra).length === 0) return;
    try {
      const text = JSON.stringify(extra);
      if (typeof text === 'string' && text.length <= MAX_TEXT) data.extra = text;
    } catch (_) {
      // cycles, BigInt: no extra
    }
  }

  function formats(value, main) {
    const data = {};
    if (value !== null && (typeof value === 'object' || typeof value === 'function')) putBundle(data, ownBundle(value));
    if (!('text' in data)) data.text = clip(inspect(value), MAX_TEXT);
    if (main && !('json' in data) && isPlainData(value)) {
      try {
        const j = JSON.stringify(value);
        if (typeof j === 'string' && j.length <= RESULT_BUDGET) data.json = j;
      } catch (_) {
        // cycles, BigInt: no JSON form
      }
    }
    return data;
  }

  function display(...values) {
    for (const v of values) {
      if (isBundle(v)) {
        const data = {};
        putBundle(data, v);
        sendOutput(data, false);
      } else {
        sendOutput(formats(v, false), false);
      }
    }
  }
  display.html = (s) => sendOutput({ html: String(s) }, false);
  display.markdown = (s) => sendOutput({ markdown: String(s) }, false);
  display.svg = (s) => sendOutput({ svg: String(s) }, false);
  display.png = (b) => sendOutput({ png: b instanceof Uint8Array ? Buffer.from(b).toString('base64') : String(b) }, false);
  display.json = (v) => sendOutput({ json: JSON.stringify(v), text: inspect(v) }, false);
  if (!('display' in globalThis)) globalThis.display = display;

  // IJavascript's `$$`, one for each run, for code written for E2B's JavaScript kernel:
  // `$$.html(s)`, `.svg`, `.png(base64)`, `.jpeg`, `.text`, `.json`, `.mime(bundle)` and
  // `.sendResult(value)` send the run's result and end the run (its last value is then not
  // sent) unless their second argument keeps it alive; `$$.async()` makes the run last until
  // `$$.done()`, a result or `$$.sendError(e)` ends it; `$$.display()` sends outputs that are
  // not the result. A promise given is awaited first. What a run sends after it ended is
  // dropped, as IJavascript drops it. Results are appended, never replaced, so `$$.clear()`
  // and display ids change nothing already sent; a run has no one to answer `$$.input()`.
  const OURS = Symbol('koder.$$');
  const SENDERS = [
    ['text', 'text/plain'],
    ['html', 'text/html'],
    ['svg', 'image/svg+xml'],
    ['png', 'image/png'],
    ['jpeg', 'image/jpeg'],
    ['json', 'application/json'],
  ];

  function ijavascript(run) {
    const live = () => current === run && !run.ended;
    const end = () => {
      run.ended = true;
      if (run.release) run.release();
    };
    const settle = (keepAlive) => (keepAlive ? (run.async = true) : end());
    const fail = (e, keepAlive) => {
      if (!live()) return;
      run.error = describe(e);
      settle(keepAlive);
    };
    const send = (data, keepAlive) => {
      if (!live()) return;
      sendOutput(data, true);
      settle(keepAlive);
    };
    const awaiting = (handler) => (value, keepAlive) => {
      if (!isThenable(value)) return handler(value, keepAlive);
      run.async = true;
      Promise.resolve(value).then((v) => handler(v, keepAlive), (e) => fail(e, false));
    };
    const bundled = (bundle) => {
      const data = {};
      if (bundle !== null && typeof bundle === 'object') putBundle(data, bundle);
      return data;
    };
    const $$ = { [OURS]: true, config: { awaitExecution: false } };
    $$.mime = awaiting((bundle, keepAlive) => send(bundled(bundle), keepAlive));
    for (const [name, mime] of SENDERS) {
      $$[name] = awaiting((v, keepAlive) => send(bundled({ [mime]: v }), keepAlive));
    }
    $$.sendResult = awaiting((v, keepAlive) => send(formats(v, true), keepAlive));
    $$.sendError = awaiting((e, keepAlive) => fail(e, keepAlive));
    $$.done = (v) => (v === undefined ? live() && end() : $$.sendResult(v));
    $$.async = (...on) => (run.async = on.length === 0 ? true : !!on[0]);
    $$.clear = () => {};
    $$.input = () => {
      throw new Error('$$.input: a run has no one to answer input requests');
    };
    $$.display = () => {
      const shown = (data) => current === run && sendOutput(data, false);
      const d = { close: () => {} };
      d.mime = (bundle) => shown(bundled(bundle));
      for (const [name, mime] of SENDERS) {
        d[name] = (v) => shown(bundled({ [mime]: v }));
      }
      return d;
    };
    return $$;
  }

  function cleanStack(stack) {
    // Frames below the innermost cell frame belong to the driver and Node's vm machinery.
    const lines = String(stack).split('\n');
    let last = -1;
    lines.forEach((l, i) => {
      if (/^\s+at /.test(l) && l.includes('<cell ')) last = i;
    });
    const kept = last >= 0 ? lines.slice(0, last + 1) : lines.filter((l) => !/^\s+at /.test(l));
    return `${kept.join('\n').replace(/\n+$/, '')}\n`;
  }

  function describe(e) {
    if (e instanceof Error || (e !== null && typeof e === 'object' && 'message' in e && 'stack' in e)) {
      let name = 'Error';
      try {
        name = String(e.name || (e.constructor && e.constructor.name) || 'Error');
      } catch (_) {
        // keep the generic name
      }
      let value = '';
      let stack = '';
      try {
        value = String(e.message);
        stack = cleanStack(e.stack || `${name}: ${value}`);
      } catch (_) {
        // an exotic error object: name only
      }
      return { name, value: clip(value, MAX_ERROR_VALUE), traceback: clip(stack, MAX_TRACEBACK) };
    }
    const shown = inspect(e);
    return {
      name: 'Error',
      value: clip(shown, MAX_ERROR_VALUE),
      traceback: clip(`Uncaught ${shown}\n`, MAX_TRACEBACK),
    };
  }

  // `import()` in a cell loads through Node's own module loader (relative to the working
  // directory), as it would in a file; without the option a script's import() throws. Node
  // warns once that the option is experimental: the first import of the context is made here,
  // with that warning dropped, rather than land in the stderr of the cell that imports.
  const MAIN_LOADER = vm.constants && vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;
  function script(source, options) {
    return new vm.Script(source, MAIN_LOADER ? { ...options, importModuleDynamically: MAIN_LOADER } : options);
  }
  let loader = null;
  function importModule(spec) {
    if (loader !== null) return loader(spec);
    if (!MAIN_LOADER) {
      loader = (s) => import(s);
      return loader(spec);
    }
    loader = script('(s) => import(s)', { filename: '<koder import>' }).runInThisContext();
    const emitWarning = process.emitWarning;
    process.emitWarning = () => {};
    try {
      return loader(spec);
    } finally {
      process.emitWarning = emitWarning;
    }
  }
  const DYNAMIC_IMPORT = /\bimport\s*\(/;

  // Node ships no JavaScript parser user code can reach, so the two rewrites below go by
  // pattern, on the forms such code takes in practice, and are tried only on a cell that does
  // not compile as it is.

  // ES module `import` declarations (one per line start) become `var` bindings of modules the
  // driver loads before the cell runs (an ES module's imports are evaluated before its body
  // too), so a cell stays a classic script whose bindings persist. Line numbers are kept.
  const IMPORT = /^([ \t]*)import[ \t]+(?:([\w$]+)[ \t]*,?[ \t]*)?(?:\*[ \t]*as[ \t]+([\w$]+)|\{([^}]*)\})?\s*(?:from[ \t]*)?(['"])([^'"\n]+)\5[ \t]*;?/gm;
  // Where the rewritten cells find what was loaded for them: a symbol, so no global name of
  // the user's is taken; keyed by run, dropped when the run ends.
  const LOADED = Symbol.for('koder.imports');
  globalThis[LOADED] = new Map();

  function importsAsLoads(code, n) {
    const specs = [];
    const source = code.replace(IMPORT, (all, indent, def, ns, named, _q, spec) => {
      const mod = `globalThis[Symbol.for("koder.imports")].get(${n})[${specs.length}]`;
      specs.push(spec);
      const bound = [];
      if (def) bound.push(`${def} = ${mod}.default`);
      if (ns) bound.push(`${ns} = ${mod}.ns`);
      for (const item of (named || '').split(',')) {
        const m = /^\s*([\w$]+)(?:\s+as\s+([\w$]+))?\s*$/.exec(item);
        if (m) bound.push(`${m[2] || m[1]} = ${mod}.ns[${JSON.stringify(m[1])}]`);
      }
      const lines = '\n'.repeat((all.match(/\n/g) || []).length);
      return `${indent}${bound.length ? `var ${bound.join(', ')}` : 'void 0'};${lines}`;
    });
    return { source, specs };
  }

  // require() first: it finds what template npm steps installed (NODE_PATH, which Node's ES
  // module loader ignores) and gives CommonJS modules their usual default. What require()
  // cannot load — ES modules it refuses, packages exporting only to `import` — or cannot
  // find from where the context started is loaded by Node's ES module loader.
  const ESM_ONLY = new Set(['ERR_REQUIRE_ESM', 'ERR_REQUIRE_ASYNC_MODULE', 'ERR_PACKAGE_PATH_NOT_EXPORTED']);

  async function loadModule(spec) {
    let required;
    try {
      required = require(spec);
    } catch (e) {
      if (!ESM_ONLY.has(e.code) && e.code !== 'MODULE_NOT_FOUND') throw e;
      try {
        const ns = await importModule(spec);
        return { default: ns.default, ns };
      } catch (again) {
        throw e.code === 'MODULE_NOT_FOUND' && again.code === 'ERR_MODULE_NOT_FOUND' ? e : again;
      }
    }
    if (Object.prototype.toString.call(required) === '[object Module]') return { default: required.default, ns: required };
    return { default: required && required.__esModule ? required.default : required, ns: required };
  }

  async function loadImports(specs, n) {
    const loaded = [];
    for (const spec of specs) loaded.push(await loadModule(spec));
    globalThis[LOADED].set(n, loaded);
  }

  // Top-level await: the cell runs as an async function. Its declarations at a line's start
  // become assignments to globals, so they outlive the run as a script's would, and its last
  // line, when it starts a statement of its own, is returned as the cell's value.
  const DECLARATION = /^(?:const|let|var)[ \t]+(?=[A-Za-z_$][\w$]*[ \t]*=)/gm;

  const STATEMENT = /^(?:const|let|var|if|for|while|do|try|return|throw|function|class|switch|import|export)\b/;

  function asyncCell(code) {
    const body = code.replace(DECLARATION, '');
    const lines = body.replace(/\s+$/, '').split('\n');
    const lastLine = lines.pop().replace(/;\s*$/, '');
    const candidates = [];
    // The whole last line, or what follows its last `;` (`await f(); x`).
    const cut = lastLine.lastIndexOf(';');
    for (const [head, last] of [['', lastLine], [lastLine.slice(0, cut + 1), lastLine.slice(cut + 1)]]) {
      const before = `${lines.join('\n')}\n${head}`;
      const statementStarts = before.trim() === '' || /[;}]$/.test(before.trim());
      const expr = last.trim();
      if (expr !== '' && statementStarts && !STATEMENT.test(expr)) {
        candidates.push(`(async () => {\n${before}return (${expr}\n);\n})()`);
      }
      if (cut < 0) break;
    }
    candidates.push(`(async () => {\n${body}\n})()`);
    return candidates;
  }

  // The cell as a script: as written, or with its imports loaded first and bound, or (it
  // awaits) as an async function. A cell that compiles in none of these forms gets its own error.
  async function compile(code, n) {
    const filename = `<cell ${n}>`;
    if (loader === null && DYNAMIC_IMPORT.test(code)) await importModule('node:fs');
    try {
      return script(code, { filename });
    } catch (e) {
      if (!(e instanceof SyntaxError)) throw e;
      const { source: plain, specs } = importsAsLoads(code, n);
      const tries = (plain === code ? [] : [plain]).concat(/\bawait\b/.test(plain) ? asyncCell(plain) : []);
      const compiled = compileFirst(tries, filename, plain);
      if (compiled === null) throw e;
      await loadImports(specs, n);
      return compiled;
    }
  }

  function compileFirst(sources, filename, plain) {
    for (const source of sources) {
      try {
        return script(source, { filename, lineOffset: source === plain ? 0 : -1 });
      } catch (_) {
        // the next form
      }
    }
    return null;
  }

  // TypeScript: each cell's types are stripped by the TypeScript compiler found in the
  // sandbox (as E2B's kernel strips them with Babel): no type checking, the rest of the cell
  // runs as JavaScript. Node 20 cannot strip types itself and no maintained stripper ships
  // with it, so the image must carry the `typescript` package: Debian's node-typescript, a
  // global npm install, or one in the working directory.
  const TS_HOMES = ['/usr/local/lib/node_modules', '/usr/lib/node_modules', '/usr/share/nodejs', '/usr/lib/nodejs'];

  function loadTypeScript() {
    const homes = [`${process.cwd()}/node_modules`, ...(process.env.NODE_PATH || '').split(':').filter(Boolean), ...TS_HOMES];
    for (const home of homes) {
      try {
        return require(`${home}/typescript`);
      } catch (_) {
        // the next place
      }
    }
    const e = new Error(`TypeScript contexts need the typescript package in the sandbox (apt install node-typescript, or npm install -g typescript); none in ${homes.join(', ')}`);
    e.name = 'TypeScriptUnavailable';
    throw e;
  }

  let ts = null;
  function transpiler() {
    if (ts === null) ts = loadTypeScript();
    return ts;
  }

  // Imports the cell does not use itself stay: a later cell may use what they bind.
  function keepImports(compiler) {
    return Number(compiler.versionMajorMinor.split('.')[0]) >= 5 ? { verbatimModuleSyntax: true } : { preserveValueImports: true };
  }

  function syntaxError(compiler, code, filename, d) {
    const message = compiler.flattenDiagnosticMessageText(d.messageText, '\n');
    const { line, character } = d.file.getLineAndCharacterOfPosition(d.start || 0);
    const text = code.split('\n')[line] || '';
    const e = new SyntaxError(message);
    e.stack = `${filename}:${line + 1}\n${text}\n${' '.repeat(character)}^\n\nSyntaxError: ${message}`;
    return e;
  }

  // The cell as JavaScript, and each line of that JavaScript's line in the cell (the compiler
  // does not keep lines: removed types and interfaces shift everything after them).
  function transpile(code, n) {
    const compiler = transpiler();
    const filename = `<cell ${n}>`;
    const out = compiler.transpileModule(code, {
      compilerOptions: {
        target: compiler.ScriptTarget.ESNext,
        module: compiler.ModuleKind.ESNext,
        experimentalDecorators: true,
        sourceMap: true,
        ...keepImports(compiler),
      },
      fileName: filename,
      reportDiagnostics: true,
    });
    const bad = (out.diagnostics || []).find((d) => d.file && d.category === compiler.DiagnosticCategory.Error);
    if (bad) throw syntaxError(compiler, code, filename, bad);
    const lines = [];
    try {
      const it = compiler.decodeMappings(JSON.parse(out.sourceMapText).mappings);
      for (let m = it.next(); !m.done; m = it.next()) {
        if (lines[m.value.generatedLine] === undefined) lines[m.value.generatedLine] = m.value.sourceLine;
      }
    } catch (_) {
      // a compiler without decodeMappings: positions stay those of the JavaScript
    }
    // A module whose only imports were types gets `export {};`, which a script cannot hold.
    const js = out.outputText.replace(/^export \{\};\n?/m, '').replace(/\n\/\/# sourceMappingURL=.*\n?$/, '\n');
    return { js, lines };
  }

  // Positions of the cell's JavaScript in an error's stack, turned into the cell's own.
  function mapStack(stack, n, lines) {
    const at = new RegExp(`<cell ${n}>:(\\d+)`, 'g');
    return stack.replace(at, (all, line) => {
      const source = lines[Number(line) - 1];
      return source === undefined ? all : `<cell ${n}>:${source + 1}`;
    });
  }

  function isThenable(v) {
    return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof v.then === 'function';
  }

  async function serve(req) {
    const n = Number(req.n) || 0;
    const run = { n, used: 0, count: 0, interrupt: null, async: false, ended: false, release: null, error: null };
    current = run;
    // A global of the user's own name is theirs.
    if (!('$$' in globalThis) || (globalThis.$$ && globalThis.$$[OURS])) globalThis.$$ = ijavascript(run);
    let error = null;
    // Variables of this run only: set for it, put back as they were once it ends.
    const env = req.env && typeof req.env === 'object' ? req.env : {};
    const saved = Object.keys(env).map((k) => [k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
    for (const [k, v] of Object.entries(env)) process.env[k] = String(v);
    let lines = null;
    try {
      let code = String(req.code ?? '');
      if (typescript) ({ js: code, lines } = transpile(code, n));
      // Loading the cell's imports (an ES module may await at its top) and the cell's promise
      // both give way to an interrupt.
      const interrupted = new Promise((_, reject) => {
        run.interrupt = reject;
      });
      interrupted.catch(() => {});
      let value = (await Promise.race([compile(code, n), interrupted])).runInThisContext();
      if (isThenable(value)) value = await Promise.race([value, interrupted]);
      if (run.async && !run.ended) {
        await Promise.race([new Promise((resolve) => (run.release = resolve)), interrupted]);
      } else if (!run.ended && value !== undefined) {
        sendOutput(formats(value, true), true);
      }
      if (run.error) error = run.error;
    } catch (e) {
      error = describe(e);
      if (lines) error.traceback = mapStack(error.traceback, n, lines);
    } finally {
      for (const [k, v] of saved) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      globalThis[LOADED].delete(n);
      run.interrupt = null;
      current = null;
      emit({ ev: 'done', n, error });
    }
  }

  const queue = [];
  let busy = false;
  async function pump() {
    if (busy) return;
    busy = true;
    try {
      while (queue.length > 0) await serve(queue.shift());
    } finally {
      busy = false;
    }
  }

  function report(kind, e) {
    try {
      const text = e instanceof Error ? cleanStack(e.stack || String(e)) : `${inspect(e)}\n`;
      process.stderr.write(`${kind}: ${text}`);
    } catch (_) {
      // nothing left to report with
    }
  }
  // Errors of callbacks and promises nobody awaits must not end the context.
  process.on('uncaughtException', (e) => report('Uncaught', e));
  process.on('unhandledRejection', (e) => report('Unhandled rejection', e));
  // A cancelled run is interrupted with SIGINT: an awaited promise is abandoned here, and
  // between runs the signal is ignored. Synchronous code is not interruptible (vm's
  // breakOnSigint costs milliseconds on every run), so the agent kills it after a grace.
  process.on('SIGINT', () => {
    if (current && current.interrupt) {
      const e = new Error('interrupted');
      e.name = 'KeyboardInterrupt';
      current.interrupt(e);
    }
  });

  const input = new net.Socket({ fd: ctlIn, readable: true, writable: false });
  input.setEncoding('utf8');
  let pending = '';
  input.on('data', (chunk) => {
    pending += chunk;
    let i;
    while ((i = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, i);
      pending = pending.slice(i + 1);
      let req;
      try {
        req = JSON.parse(line);
      } catch (_) {
        continue;
      }
      if (req !== null && typeof req === 'object') queue.push(req);
    }
    pump();
  });
  // The agent is gone.
  input.on('end', () => process.exit(0));
  input.on('error', () => process.exit(0));

  emit({ ev: 'ready', pid: process.pid, version: process.version });
})();
