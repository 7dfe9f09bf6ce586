import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, NotFoundError, AuthenticationError } from 'e2b'
import { sandbox } from './common.mjs'

test('create, info, metadata list filter, timeout, kill', async () => {
  const tag = `js-${process.pid}-${Date.now()}`
  const sbx = await sandbox({ metadata: { tag } })
  assert.equal(await sbx.isRunning(), true)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.tag, tag)
  const page = Sandbox.list({ query: { metadata: { tag } } })
  const items = await page.nextItems()
  assert.deepEqual(
    items.map((s) => s.sandboxId),
    [sbx.sandboxId],
  )
  await sbx.setTimeout(300_000)
  const later = await sbx.getInfo()
  assert.ok(later.endAt.getTime() - Date.now() > 200_000, 'the timeout moved')
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
})

test('connect to a running sandbox by id', async () => {
  const sbx = await sandbox()
  await sbx.files.write('/tmp/mark', 'here')
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.files.read('/tmp/mark'), 'here')
})

test('pause and resume keep the filesystem', async () => {
  const sbx = await sandbox()
  await sbx.files.write('/tmp/keep', 'kept')
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  const back = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await back.files.read('/tmp/keep'), 'kept')
  assert.equal((await back.getInfo()).state, 'running')
})

test('a wrong API key is AuthenticationError', async () => {
  await assert.rejects(
    Sandbox.create({ apiKey: `e2b_${'0'.repeat(40)}` }),
    (e) => e instanceof AuthenticationError,
  )
})

test('another tenant cannot see the sandbox', async () => {
  const other = process.env.KODER_E2B_OTHER_KEY
  assert.ok(other, 'KODER_E2B_OTHER_KEY is set by the script')
  const sbx = await sandbox()
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: other }), NotFoundError)
  await assert.rejects(Sandbox.kill(sbx.sandboxId, { apiKey: other }).then((ok) => {
    if (!ok) throw new NotFoundError('not killed')
  }), NotFoundError)
  assert.equal(await sbx.isRunning(), true)
})
