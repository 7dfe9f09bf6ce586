// Egress from the JavaScript SDK: network rules on create and changed on a running sandbox,
// a secret injected at egress for its host only, and E2B's header rules with its secrets. The upstream is a server in a network
// namespace scripts/e2b-js-tests.sh creates (KODER_TEST_NET); nothing leaves the host.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { Sandbox, Secret } from 'e2b'
import { sandbox, PY } from './common.mjs'

const ip = process.env.KODER_TEST_NET

// What the sandbox gets from `url` with `auth` (an env var's name) as Authorization, or
// "refused".
async function get(sbx, url, authVar = '') {
  const code = `
import os, urllib.request
h = {"Authorization": "Bearer " + os.environ["${authVar}"]} if "${authVar}" else {}
try: print(urllib.request.urlopen(urllib.request.Request("${url}", headers=h), timeout=5).read().decode())
except Exception: print("refused")
`
  const r = await sbx.commands.run(`${PY} -c '${code}'`, { timeoutMs: 30_000 })
  return r.stdout.trim()
}

test('allow beats deny, and an update applies to new connections', async () => {
  const sbx = await sandbox({ network: { allowOut: [ip], denyOut: ['0.0.0.0/0'] } })
  assert.equal(await get(sbx, `http://${ip}:8080/`), 'seen:')
  await sbx.updateNetwork({ denyOut: [ip] })
  assert.equal(await get(sbx, `http://${ip}:8080/`), 'refused')
  await sbx.updateNetwork({ allowOut: [ip], denyOut: ['0.0.0.0/0'] })
  assert.equal(await get(sbx, `http://${ip}:8080/`), 'seen:')
  const denied = await sandbox({ network: { denyOut: [ip] } })
  assert.equal(await get(denied, `http://${ip}:8080/`), 'refused')
})

test('a secret reaches its host only, the sandbox sees a placeholder', async () => {
  const api = process.env.E2B_API_URL
  const auth = { authorization: `Bearer ${process.env.E2B_API_KEY}`, 'content-type': 'application/json' }
  const value = `js-${process.pid * 7 + 1}`
  let r = await fetch(`${api}/v1/sandbox/secrets`, {
    method: 'POST',
    headers: auth,
    body: JSON.stringify({ name: 'JS_TOKEN', value, hosts: ['api.test:8080'] }),
  })
  assert.equal(r.status, 201, await r.text())
  // E2B's create has no secrets: the session is made natively and driven with the SDK.
  r = await fetch(`${api}/v1/sandbox/sessions`, {
    method: 'POST',
    headers: auth,
    body: JSON.stringify({
      language: 'python',
      network: { mode: 'allowlist', allow: ['api.test', ip] },
      secrets: ['JS_TOKEN'],
    }),
  })
  const session = await r.json()
  assert.equal(r.status, 201, JSON.stringify(session))
  const sbx = await Sandbox.connect(session.id)
  try {
    const env = (await sbx.commands.run('printenv JS_TOKEN')).stdout.trim()
    assert.match(env, /^KSECRET_/)
    assert.ok(!env.includes(value))
    // The bound host got the value (echoed back masked); the same server by address, which
    // the secret is not bound to, got the placeholder.
    const bound = await get(sbx, 'http://api.test:8080/', 'JS_TOKEN')
    assert.equal(bound, `seen:Bearer ${env.slice(0, value.length)}`)
    assert.equal(await get(sbx, `http://${ip}:8080/`, 'JS_TOKEN'), `seen:Bearer ${env}`)
  } finally {
    await sbx.kill()
    await fetch(`${api}/v1/sandbox/secrets/JS_TOKEN`, { method: 'DELETE', headers: auth })
  }
})

test('header rules set headers at egress, with E2B secrets the sandbox never sees', async () => {
  const name = `js-rule-${process.pid}`
  const value = `sk-${process.pid * 13 + 7}-value`
  await Secret.create(name, value)
  const sha = (s) => createHash('sha256').update(s).digest('hex')
  const ruled = (team) => ({
    'api.test': [
      { transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } },
      { transform: { headers: { 'X-Team': team } } },
    ],
  })
  const lists = { allowOut: ['api.test', ip], denyOut: ['0.0.0.0/0'] }
  try {
    const sbx = await sandbox({ network: { ...lists, rules: ruled('a') } })
    // The ruled host got the value and the header; the same server by address got neither.
    assert.equal(await get(sbx, 'http://api.test:8080/h'), `${sha(`Bearer ${value}`)} team:a`)
    assert.equal(await get(sbx, `http://${ip}:8080/h`), `${sha('')} team:`)
    assert.ok(!(await sbx.commands.run('env')).stdout.includes(value))
    // A secret's new version reaches the running sandbox at its next connection.
    const rotated = `${value}-2`
    await Secret.update(name, rotated)
    assert.equal(await get(sbx, 'http://api.test:8080/h'), `${sha(`Bearer ${rotated}`)} team:a`)
    await Secret.update(name, value)
    // An update replaces the rules, and they last a pause.
    await sbx.updateNetwork({ ...lists, rules: ruled('b') })
    assert.equal(await get(sbx, 'http://api.test:8080/h'), `${sha(`Bearer ${value}`)} team:b`)
    assert.equal(await sbx.pause(), true)
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await get(back, 'http://api.test:8080/h'), `${sha(`Bearer ${value}`)} team:b`)
    // An update without rules clears them.
    await back.updateNetwork(lists)
    assert.equal(await get(back, 'http://api.test:8080/h'), `${sha('')} team:`)
    // A rule naming a secret the team lacks, or a header that frames the request, is refused.
    for (const headers of [{ A: Secret.fill('no-such-secret') }, { 'Content-Length': '0' }]) {
      await assert.rejects(
        Sandbox.create({ network: { ...lists, rules: { 'api.test': [{ transform: { headers } }] } } }),
        /400: network\.rules/,
      )
    }
  } finally {
    await Secret.destroy(name)
  }
})
