import { test } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, TimeoutError } from 'e2b'
import { sandbox, eventually, PY } from './common.mjs'

const sbx = await sandbox()

test('run returns output and exit code', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
})

test('a failing command throws CommandExitError with its output', async () => {
  await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => {
    assert.ok(e instanceof CommandExitError, `got ${e}`)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'partial\n')
    return true
  })
})

test('envs and cwd apply to one command only', async () => {
  const r = await sbx.commands.run('echo "$FOO" && pwd', { envs: { FOO: 'bär' }, cwd: '/tmp' })
  assert.equal(r.stdout, 'bär\n/tmp\n')
  const again = await sbx.commands.run('echo "[$FOO]"')
  assert.equal(again.stdout, '[]\n')
})

test('streamed output reaches the callbacks in order', async () => {
  const seen = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 0.05; done', {
    onStdout: (d) => seen.push(d),
  })
  assert.equal(seen.join(''), '1\n2\n3\n')
})

test('background command: listed, stdin, wait', async () => {
  const h = await sbx.commands.run(`${PY} -c "import sys; print(sys.stdin.readline().upper(), end='')"`, {
    background: true,
    stdin: true,
  })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), 'the background process is listed')
  await sbx.commands.sendStdin(h.pid, 'shout\n')
  const r = await h.wait()
  assert.equal(r.stdout, 'SHOUT\n')
})

test('kill ends a running command', async () => {
  const h = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
  await eventually(async () => !(await sbx.commands.list()).some((p) => p.pid === h.pid))
  assert.equal(await sbx.commands.kill(h.pid), false, 'a second kill finds nothing')
})

test('connect to a running command sees its later output', async () => {
  const h = await sbx.commands.run('sleep 0.5; echo late', { background: true })
  const out = []
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => out.push(d) })
  const r = await again.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(out.join(''), 'late\n')
})

test('a command whose sandbox is killed under it says the sandbox is gone', async () => {
  const doomed = await sandbox()
  const h = await doomed.commands.run('sleep 60', { background: true })
  await doomed.kill()
  // The stream breaks off (as E2B's proxy cuts it), the SDK asks the sandbox's health and
  // hears it is gone; a stream that ended with an error would skip that question.
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, `got ${e}`)
    assert.match(e.message, /sandbox was killed or reached its end of life/)
    return true
  })
})
