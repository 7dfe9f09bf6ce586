// Shared set-up for the E2B JavaScript SDK tests: the SDK reads E2B_API_KEY, E2B_API_URL and
// E2B_SANDBOX_URL from the environment (scripts/e2b-js-tests.sh points them at a test daemon).
import { after } from 'node:test'
import { Sandbox } from 'e2b'

const made = []

// A sandbox killed when the test file ends, whatever the test did to it.
export async function sandbox(opts = {}, Kind = Sandbox) {
  const sbx = await Kind.create({ timeoutMs: 120_000, ...opts })
  made.push(sbx)
  return sbx
}

after(async () => {
  await Promise.allSettled(made.map((s) => s.kill()))
})

// Polls `check` until it returns a truthy value or `ms` passes.
export async function eventually(check, ms = 5_000) {
  const end = Date.now() + ms
  for (;;) {
    const v = await check()
    if (v) return v
    if (Date.now() > end) throw new Error('condition not met in time')
    await new Promise((r) => setTimeout(r, 50))
  }
}

export const PY = '/usr/bin/python3'
