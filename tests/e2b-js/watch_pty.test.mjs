import { test } from 'node:test'
import assert from 'node:assert/strict'
import { FilesystemEventType } from 'e2b'
import { sandbox, eventually } from './common.mjs'

const sbx = await sandbox()

test('watchDir reports a file made by a command', async () => {
  await sbx.files.makeDir('/tmp/w')
  const events = []
  const handle = await sbx.files.watchDir('/tmp/w', (e) => events.push(e))
  try {
    await sbx.commands.run('echo x > /tmp/w/made.txt')
    await eventually(() =>
      events.some((e) => e.name === 'made.txt' && e.type === FilesystemEventType.CREATE),
    )
  } finally {
    await handle.stop()
  }
})

test('recursive watchDir sees a nested folder', async () => {
  await sbx.files.makeDir('/tmp/wr/a')
  const events = []
  const handle = await sbx.files.watchDir('/tmp/wr', (e) => events.push(e), { recursive: true })
  try {
    await sbx.files.write('/tmp/wr/a/deep.txt', 'deep')
    await eventually(() => events.some((e) => e.name === 'a/deep.txt'))
  } finally {
    await handle.stop()
  }
})

test('a PTY runs a shell that echoes what is typed', async () => {
  const chunks = []
  const pty = await sbx.pty.create({
    cols: 80,
    rows: 24,
    onData: (d) => chunks.push(Buffer.from(d).toString()),
  })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('echo "pty-$((40+2))"\n'))
  await eventually(() => chunks.join('').includes('pty-42'))
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'))
  const r = await pty.wait()
  assert.equal(r.exitCode, 0)
  assert.ok(chunks.join('').includes('30 100'), 'the resize reached the terminal')
})
