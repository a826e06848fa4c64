'use strict'
// CLI subcommands for federation of the adapter SONA learns (llm.federation.join):
//   ruvllm federate keys --out <file> [--force]   a fresh node key (secret and node id), written atomically
//   ruvllm federate status --key <file> [--dir <dir>] [--json]
//                                                 the node id, and what the learning directory holds
//   ruvllm federate round --dir <dir> --tier <tier> [--peers a,b] ...
//                                                 load the model, join, run one round, print the report
// `run(argv)`: argv the arguments after `federate`; resolves to the exit code.

const fs = require('node:fs')
const path = require('node:path')
const cli = require('./cli.js')

const { UsageError, parse } = cli

const USAGE = `usage:
  ruvllm federate keys [--out <file>] [--force] [--json]
                        generate a node key; with --out, write { secret, nodeId } there (mode 600,
                        atomically; an existing file is kept unless --force) and print the node id
  ruvllm federate status [--key <file>] [--dir <dir>] [--json]
                        the node id of a key file and what a learning directory holds
  ruvllm federate round --dir <dir> --tier private|group|tenant|public [--peers <multiaddr,...>]
                        [--key <file>] [--group-key <hex>] [--members <id,...>] [--listen <multiaddr>]
                        [--expected <n>] [--timeout-ms <ms>] [--method exact|svd|fedavg] [--global-rank <n>] [--server-lr <x>]
                        [--weighting fedavg|quality|timestep|hybrid]
                        [--round <k>] [--wait-ms <ms>] [-m <model>] [--threads <n>] [--json]
                        load the model with learning: { dir, federate: true }, join, run round k (default 1)
                        and add the aggregate to the global adapter in <dir>. --wait-ms waits that long
                        after joining (start the other nodes meanwhile); the address to give them is
                        printed on stderr.`

function addon() {
  return require(path.join(__dirname, '..', '..', 'index.js'))
}

function readKey(file) {
  let k
  try {
    k = JSON.parse(fs.readFileSync(file, 'utf8'))
  } catch (e) {
    throw new cli.CliError(e.code === 'ENOENT' ? 'ERR_IO' : 'ERR_INVALID_ARG', `${file}: not a node key file (${e.message})`)
  }
  if (!k || typeof k.secret !== 'string') throw new cli.CliError('ERR_INVALID_ARG', `${file}: not a node key file (no secret)`)
  return addon().federationKey(k.secret)
}

/** Writes `text` to `file` through a temporary file in the same folder and a rename. */
function writeAtomic(file, text, force) {
  if (!force && fs.existsSync(file)) throw new cli.CliError('ERR_EXISTS', `${file} exists; pass --force to replace it`)
  const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${process.pid}.tmp`)
  try {
    fs.writeFileSync(tmp, text, { mode: 0o600 })
    const fd = fs.openSync(tmp, 'r')
    fs.fsyncSync(fd)
    fs.closeSync(fd)
    fs.renameSync(tmp, file)
  } catch (e) {
    fs.rmSync(tmp, { force: true })
    throw new cli.CliError('ERR_IO', `${file}: ${e.message}`)
  }
}

function keys(argv) {
  const { values } = parse(argv, { out: { type: 'string' }, force: { type: 'boolean' }, json: { type: 'boolean' } })
  const k = addon().federationKey()
  if (values.out) {
    writeAtomic(values.out, JSON.stringify(k, null, 1) + '\n', values.force)
    process.stdout.write(values.json ? JSON.stringify({ nodeId: k.nodeId, file: values.out }) + '\n' : `wrote ${values.out}\nnode id: ${k.nodeId}\n`)
  } else {
    process.stdout.write(values.json ? JSON.stringify(k) + '\n' : `secret: ${k.secret}\nnode id: ${k.nodeId}\n`)
  }
  return 0
}

function status(argv) {
  const { values } = parse(argv, { key: { type: 'string' }, dir: { type: 'string' }, json: { type: 'boolean' } })
  if (!values.key && !values.dir) throw new UsageError('federate status needs --key <file> and/or --dir <dir>')
  const out = {}
  if (values.key) out.nodeId = readKey(values.key).nodeId
  if (values.dir) out.learning = addon().learning.status(values.dir)
  if (values.json) {
    process.stdout.write(JSON.stringify(out, null, 1) + '\n')
    return 0
  }
  if (out.nodeId) process.stdout.write(`node id: ${out.nodeId}\n`)
  if (out.learning) {
    const s = out.learning
    const c = s.counters || {}
    process.stdout.write(
      s.exists
        ? `${s.dir}: ${s.trajectories} trajectories, BaseLoRA ${c.baseTrained ? 'trained' : 'not trained yet'}, ${c.rounds ?? 0} learning rounds\n`
        : `${s.dir}: no learning state yet\n`,
    )
  }
  return 0
}

function int(v, name, min) {
  if (v === undefined) return undefined
  const n = Number(v)
  if (!Number.isInteger(n) || n < min) throw new UsageError(`--${name} must be an integer >= ${min}, got ${JSON.stringify(v)}`)
  return n
}

function list(v) {
  return v ? v.split(',').map((s) => s.trim()).filter(Boolean) : []
}

async function round(argv) {
  const { values } = parse(argv, {
    model: { type: 'string', short: 'm' },
    threads: { type: 'string' },
    dir: { type: 'string' },
    tier: { type: 'string' },
    peers: { type: 'string' },
    key: { type: 'string' },
    'group-key': { type: 'string' },
    members: { type: 'string' },
    listen: { type: 'string' },
    expected: { type: 'string' },
    'timeout-ms': { type: 'string' },
    method: { type: 'string' },
    'global-rank': { type: 'string' },
    'server-lr': { type: 'string' },
    weighting: { type: 'string' },
    round: { type: 'string' },
    'wait-ms': { type: 'string' },
    json: { type: 'boolean' },
  })
  if (!values.dir) throw new UsageError('federate round needs --dir <dir> (the learning directory)')
  if (!values.tier) throw new UsageError('federate round needs --tier private|group|tenant|public')
  const options = {
    peers: list(values.peers),
    tier: values.tier,
    key: values['group-key'],
    nodeKey: values.key ? readKey(values.key).secret : undefined,
    members: values.members ? list(values.members) : undefined,
    listen: values.listen,
    expectedNodes: int(values.expected, 'expected', 1),
    roundTimeoutMs: int(values['timeout-ms'], 'timeout-ms', 1),
    method: values.method,
    globalRank: int(values['global-rank'], 'global-rank', 1),
    serverLr: values['server-lr'] === undefined ? undefined : Number(values['server-lr']),
    weighting: values.weighting,
  }
  const k = int(values.round, 'round', 1) ?? 1
  const waitMs = int(values['wait-ms'], 'wait-ms', 0) ?? 0
  const { LLM } = addon()
  const model = values.model || process.env.RUVLLM_MODEL || 'gemma-3-270m'
  const threads = int(values.threads, 'threads', 1)
  const llm = await LLM.load(model, { ...(threads ? { threads } : {}), learning: { dir: values.dir, background: false, federate: true } })
  let node
  try {
    node = await llm.federation.join(options)
    process.stderr.write(`ruvllm: federation node ${node.nodeId} listening on ${node.address}\n`)
    if (waitMs > 0) await new Promise((r) => setTimeout(r, waitMs))
    const report = await node.round({ round: k })
    const stats = node.stats()
    if (values.json) {
      process.stdout.write(JSON.stringify({ report, stats }) + '\n')
    } else {
      process.stdout.write(
        `round ${report.round}: ${report.contributors} nodes${report.timedOut ? ' (timed out)' : ''}, ` +
          `${report.applied ? `aggregate applied (${report.method})` : 'nothing applied'}\n` +
          `adapter: ${report.adapterDigest}\n` +
          `bytes: ${report.bytesSent} sent, ${report.bytesReceived} received; accepted ${stats.accepted}, rejected ${stats.rejectedTotal}` +
          (Object.keys(stats.rejected).length ? ` (${Object.entries(stats.rejected).map(([r, n]) => `${r}: ${n}`).join(', ')})` : '') +
          `; epsilon ${stats.epsilon}\n`,
      )
    }
    return 0
  } finally {
    if (node) await node.stop()
    await llm.close()
  }
}

function run(argv) {
  return cli.subcommands('federate', USAGE, { keys, status, round }, argv)
}

module.exports = { run, USAGE }
