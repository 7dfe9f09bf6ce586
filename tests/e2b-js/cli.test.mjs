// E2B's own CLI (`@e2b/cli` from npm, unchanged) against the daemon: the commands that manage
// sandboxes, reading the same E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY as the SDK. Its
// output is what a user at a terminal reads, so the tests parse its JSON formats.
import { after, test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { sandbox, eventually } from './common.mjs'

const CLI = fileURLToPath(new URL('./node_modules/@e2b/cli/dist/index.js', import.meta.url))
// A home of its own: the CLI reads (and may write) ~/.e2b; nobody's login is used.
const HOME = mkdtempSync(join(tmpdir(), 'e2b-cli-home-'))
after(() => rmSync(HOME, { recursive: true, force: true }))

function e2b(...args) {
  const r = spawnSync(process.execPath, [CLI, ...args], {
    env: { ...process.env, HOME, NO_COLOR: '1' },
    encoding: 'utf8',
    input: '',
    timeout: 60_000,
  })
  if (r.error) throw r.error
  return r
}

function ok(...args) {
  const r = e2b(...args)
  assert.equal(r.status, 0, `e2b ${args.join(' ')}: ${r.stdout}\n${r.stderr}`)
  return r.stdout
}

// `sandbox logs --format json` prints one JSON object a line.
function logs(id, ...args) {
  return ok('sandbox', 'logs', id, '--format', 'json', ...args)
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l))
}

test('the E2B CLI lists, inspects, runs in, pauses, resumes and kills a sandbox', async () => {
  const sbx = await sandbox({ metadata: { by: 'cli-test' } })
  const id = sbx.sandboxId

  const listed = JSON.parse(ok('sandbox', 'list', '--format', 'json', '--metadata', 'by=cli-test'))
  assert.deepEqual(
    listed.map((s) => s.sandboxId),
    [id],
  )
  const info = JSON.parse(ok('sandbox', 'info', id, '--format', 'json'))
  assert.equal(info.sandboxId, id)
  assert.equal(info.state, 'running')

  assert.match(ok('sandbox', 'exec', id, '--', 'sh', '-c', 'echo from-the-cli'), /from-the-cli/)
  const failed = e2b('sandbox', 'exec', id, '--', 'sh', '-c', 'exit 3')
  assert.equal(failed.status, 3, 'the command\'s exit status is the CLI\'s')
  ok('sandbox', 'metrics', id, '--format', 'json')

  ok('sandbox', 'pause', id)
  assert.equal(JSON.parse(ok('sandbox', 'info', id, '--format', 'json')).state, 'paused')
  ok('sandbox', 'resume', id)
  assert.equal(JSON.parse(ok('sandbox', 'info', id, '--format', 'json')).state, 'running')
  ok('sandbox', 'kill', id)
  const after = JSON.parse(ok('sandbox', 'list', '--format', 'json', '--metadata', 'by=cli-test'))
  assert.deepEqual(after, [])

  // The sandbox's logs outlive it: its life, in order, as the CLI prints them.
  const lines = await eventually(() => {
    const got = logs(id)
    return got.length >= 4 && got
  })
  assert.deepEqual(
    lines.map((l) => l.message),
    ['Sandbox created', 'Sandbox paused', 'Sandbox resumed', 'Sandbox stopped: deleted'],
  )
  assert.ok(lines.every((l) => l.level === 'info' && l.logger === 'lifecycle'), JSON.stringify(lines))
  assert.equal(lines[0].runtime, 'jail', 'the event\'s fields are in its line')
  const times = lines.map((l) => Date.parse(l.timestamp))
  assert.deepEqual([...times].sort((a, b) => a - b), times)
  // Its own filters work on them (nothing here is a warning).
  assert.deepEqual(logs(id, '--level', 'WARN'), [])
  assert.equal(logs(id, '--loggers', 'lifecycle').length, 4)
})

test('the E2B CLI\'s logs of a sandbox that never was, or is another team\'s, fail', async () => {
  const missing = e2b('sandbox', 'logs', 'no-such-sandbox')
  assert.notEqual(missing.status, 0)
  assert.match(missing.stderr + missing.stdout, /not found/i)

  const sbx = await sandbox()
  const other = spawnSync(process.execPath, [CLI, 'sandbox', 'logs', sbx.sandboxId], {
    env: { ...process.env, HOME, E2B_API_KEY: process.env.KODER_E2B_OTHER_KEY },
    encoding: 'utf8',
    input: '',
    timeout: 60_000,
  })
  assert.notEqual(other.status, 0)
  assert.match(other.stderr + other.stdout, /not found/i)
})
