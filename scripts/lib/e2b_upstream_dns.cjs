// Preloaded (NODE_OPTIONS=--require) by scripts/e2b-upstream-js-tests.sh into every node process
// of E2B's JS suite: name resolution as the sandbox domain's wildcard DNS record would give it,
// without any DNS; the JS twin of e2b_upstream_plugin.py.
//
// KODER_E2B_HOSTS="<domain>=<address>": every name under <domain> (E2B's `<port>-<id>.<domain>`
// host names) resolves to <address>, the daemon's HTTPS listener on loopback. `localhost` and
// loopback address literals resolve as usual. Every other name is refused, so nothing the suite
// does can reach a resolver or a host off this machine.
'use strict'

const dns = require('node:dns')
const net = require('node:net')

const [rawDomain, address] = (process.env.KODER_E2B_HOSTS || '').split('=')
const domain = (rawDomain || '').replace(/\.$/, '').toLowerCase()

function isLoopback(name) {
  if (name === 'localhost') return true
  const bare = name.replace(/^\[|\]$/g, '')
  if (net.isIPv4(bare)) return bare.startsWith('127.')
  if (net.isIPv6(bare)) return bare === '::1'
  return false
}

if (!domain || !address || !isLoopback(address)) {
  throw new Error('KODER_E2B_HOSTS must be <domain>=<loopback address>')
}

// The address to resolve `host` with, or an error for a name this run must not resolve.
function target(host) {
  const name = String(host).replace(/\.$/, '').toLowerCase()
  if (name === domain || name.endsWith('.' + domain)) return { host: address }
  if (isLoopback(name)) return { host }
  const e = new Error(`getaddrinfo ENOTFOUND ${host} (not resolved in this run: nothing may leave this machine)`)
  e.code = 'ENOTFOUND'
  e.hostname = host
  return { error: e }
}

const realLookup = dns.lookup
dns.lookup = function lookup(host, options, callback) {
  if (typeof options === 'function') {
    callback = options
    options = {}
  }
  const t = target(host)
  if (t.error) {
    process.nextTick(callback, t.error)
    return {}
  }
  return realLookup.call(dns, t.host, options, callback)
}

const realPromiseLookup = dns.promises.lookup
dns.promises.lookup = function lookup(host, options) {
  const t = target(host)
  if (t.error) return Promise.reject(t.error)
  return realPromiseLookup.call(dns.promises, t.host, options)
}
