import { test } from 'node:test'
import assert from 'node:assert/strict'
import { FileType, NotFoundError } from 'e2b'
import { sandbox } from './common.mjs'

const sbx = await sandbox()

test('write and read text, bytes and a blob', async () => {
  const info = await sbx.files.write('/tmp/js/a.txt', 'héllo ☃')
  assert.equal(info.path, '/tmp/js/a.txt')
  assert.equal(await sbx.files.read('/tmp/js/a.txt'), 'héllo ☃')
  const bytes = new Uint8Array(256).map((_, i) => i)
  await sbx.files.write('/tmp/js/b.bin', bytes.buffer)
  const back = await sbx.files.read('/tmp/js/b.bin', { format: 'bytes' })
  assert.deepEqual(Array.from(back), Array.from(bytes))
  const blob = await sbx.files.read('/tmp/js/b.bin', { format: 'blob' })
  assert.equal(blob.size, 256)
})

test('a larger file survives the round trip', async () => {
  const big = new Uint8Array(3 * 1024 * 1024 + 17)
  for (let i = 0; i < big.length; i++) big[i] = (i * 31) & 0xff
  await sbx.files.write('/tmp/js/big.bin', big.buffer)
  const back = await sbx.files.read('/tmp/js/big.bin', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(big)))
})

test('write several files at once', async () => {
  await sbx.files.write([
    { path: '/tmp/js/multi/1.txt', data: 'one' },
    { path: '/tmp/js/multi/2.txt', data: 'two' },
  ])
  const names = (await sbx.files.list('/tmp/js/multi')).map((e) => e.name).sort()
  assert.deepEqual(names, ['1.txt', '2.txt'])
})

test('list, getInfo, exists, makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/tmp/js/d'), true)
  assert.equal(await sbx.files.makeDir('/tmp/js/d'), false, 'an existing dir is not made again')
  await sbx.files.write('/tmp/js/d/x', 'x')
  const entries = await sbx.files.list('/tmp/js/d')
  assert.equal(entries.length, 1)
  assert.equal(entries[0].type, FileType.FILE)
  const info = await sbx.files.getInfo('/tmp/js/d')
  assert.equal(info.type, FileType.DIR)
  await sbx.files.rename('/tmp/js/d/x', '/tmp/js/d/y')
  assert.equal(await sbx.files.exists('/tmp/js/d/x'), false)
  assert.equal(await sbx.files.read('/tmp/js/d/y'), 'x')
  await sbx.files.remove('/tmp/js/d')
  assert.equal(await sbx.files.exists('/tmp/js/d'), false)
})

test('reading a missing file is NotFoundError', async () => {
  await assert.rejects(sbx.files.read('/tmp/js/nope'), NotFoundError)
})

test('files written through the SDK are seen by commands and back', async () => {
  await sbx.files.write('/tmp/js/seen.txt', 'from sdk')
  assert.equal((await sbx.commands.run('cat /tmp/js/seen.txt')).stdout, 'from sdk')
  await sbx.commands.run('printf "from shell" > /tmp/js/shell.txt')
  assert.equal(await sbx.files.read('/tmp/js/shell.txt'), 'from shell')
})
