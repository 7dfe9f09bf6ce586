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
