import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { sandbox } from './common.mjs'

const sbx = await sandbox({}, Sandbox)

test('state persists between runs', async () => {
  await sbx.runCode('x = 40')
  const r = await sbx.runCode('x + 2')
  assert.equal(r.text, '42')
  assert.equal(r.error, undefined)
})

test('stdout, stderr and errors are reported', async () => {
  const out = []
  const r = await sbx.runCode('import sys\nprint("out")\nprint("err", file=sys.stderr)', {
    onStdout: (m) => out.push(m.line),
  })
  assert.deepEqual(r.logs.stdout, ['out\n'])
  assert.deepEqual(r.logs.stderr, ['err\n'])
  assert.deepEqual(out, ['out\n'])
  const bad = await sbx.runCode('1 / 0')
  assert.equal(bad.error.name, 'ZeroDivisionError')
  assert.ok(bad.error.traceback.includes('ZeroDivisionError'))
})

test('contexts are separate', async () => {
  const ctx = await sbx.createCodeContext({ language: 'python' })
  await sbx.runCode('y = "in ctx"', { context: ctx })
  const inside = await sbx.runCode('y', { context: ctx })
  assert.equal(inside.text, 'in ctx')
  const outside = await sbx.runCode('y')
  assert.equal(outside.error.name, 'NameError')
  const listed = await sbx.listCodeContexts()
  assert.ok(listed.some((c) => c.id === ctx.id))
  await sbx.removeCodeContext(ctx)
})

test('javascript runs in its own context', async () => {
  const r = await sbx.runCode('const a = 20; a * 2 + 2', { language: 'javascript' })
  assert.equal(r.text, '42')
})

test('default contexts exist from the start, in the user home', async () => {
  const fresh = await sandbox({}, Sandbox)
  try {
    const listed = await fresh.listCodeContexts()
    assert.deepEqual(
      listed.slice(0, 2).map((c) => [c.language, c.cwd]),
      [['python', '/home/user'], ['javascript', '/home/user']],
    )
    const r = await fresh.runCode('process.cwd()', { language: 'js' })
    assert.equal(r.text, '/home/user')
  } finally {
    await fresh.kill()
  }
})

test('bash runs in a long-lived shell of its own', async () => {
  await sbx.runCode('cd /tmp; n=41', { language: 'bash' })
  const r = await sbx.runCode('echo $((n + 1)) $(pwd)', { language: 'bash' })
  assert.deepEqual(r.logs.stdout, ['42 /tmp\n'])
  const failed = await sbx.runCode('false', { language: 'bash' })
  assert.deepEqual([failed.error.name, failed.error.value], ['ExitCode', '1'])
})

test('a run the client gave up on is interrupted, the context kept', async () => {
  await sbx.runCode('kept = 6')
  await assert.rejects(sbx.runCode('import time; time.sleep(300)', { timeoutMs: 2000 }))
  const r = await sbx.runCode('kept * 7', { timeoutMs: 20000 })
  assert.equal(r.text, '42')
  assert.equal(r.error, undefined)
})

test('ES imports and top-level await in JavaScript cells', async () => {
  const r = await sbx.runCode("import { join } from 'path'\nawait Promise.resolve(join('a', 'b'))", {
    language: 'javascript',
  })
  assert.equal(r.text, 'a/b')
})

test('a silent run its client gives up on ends at the timeout, and the next one runs', async () => {
  // The SDK times a run from its answer's headers: they must come before the run prints.
  const started = Date.now()
  await assert.rejects(sbx.runCode('import time; time.sleep(60)', { timeoutMs: 1_500 }))
  assert.ok(Date.now() - started < 20_000, `gave up after ${Date.now() - started} ms`)
  const r = await sbx.runCode('1 + 1', { timeoutMs: 15_000 })
  assert.equal(r.text, '2')
})

test('a figure comes with the chart it draws', async () => {
  const r = await sbx.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4], label='up')\nplt.title('T')\nplt.show()",
  )
  const [figure] = r.results
  assert.ok(figure.png, 'the figure as PNG')
  assert.deepEqual([figure.chart.type, figure.chart.title], ['line', 'T'])
  assert.deepEqual(figure.chart.elements[0].points, [[1, 3], [2, 4]])
})

test('typescript cells lose their types and run', async () => {
  const r = await sbx.runCode('const n: number = 41\nn + 1', { language: 'typescript' })
  assert.deepEqual([r.text, r.error], ['42', undefined])
  const bad = await sbx.runCode('const x: = 1', { language: 'ts' })
  assert.equal(bad.error.name, 'SyntaxError')
})

test('java keeps its declarations, its values are the results', async () => {
  await sbx.runCode('int n = 41;', { language: 'java' })
  const r = await sbx.runCode('n + 1 + System.getProperty("FOO")', {
    language: 'java',
    envs: { FOO: 'bar' },
  })
  assert.equal(r.text, '42bar')
  const bad = await sbx.runCode('Integer.parseInt("x")', { language: 'java' })
  assert.equal(bad.error.name, 'java.lang.NumberFormatException')
})

test('r prints as its prompt does, the last value being the result', async () => {
  const r = await sbx.runCode('x <- 1:3\nx * 2\nsum(x)', { language: 'r' })
  assert.deepEqual([r.logs.stdout, r.text], [['[1] 2 4 6\n'], '[1] 6'])
  const bad = await sbx.runCode("stop('boom')", { language: 'r' })
  assert.deepEqual([bad.error.name, bad.error.value], ['Error', 'boom'])
})
