// Federation of SONA's learned adapter (llm.federation) across node processes on this machine.
//
// Each of N node processes (default 8) loads the model with learning: { federate: true }, learns
// from its own slice of the SONA benchmark's domain feedback (benches/sona-data.mjs: CMU
// pronunciations, held-out words never in feedback) with instant updates and one consolidate(),
// and measures the held-out domain NLL per token (llm.score) with its local adapter. Then, for
// each phase, every node goes back to its local adapter (the learning directory as it was
// after learning), joins a federation on 127.0.0.1 (a topic per phase) and runs one round:
//   exact   the exact weighted mean of the nodes' ΔW, re-factorised to rank 8 by truncated SVD
//   fedavg  the mean of the A and B factors separately (FedAvg of factors: inexact)
//   daf     exact aggregation with DAF's hybrid weighting (quality and measured improvement;
//           SONA's adapter has no timestep buckets, so this is the non-diffusion case)
//   private tier 'private': nothing may leave the node (bytes on the wire counted)
//   public  tier 'public' (with at least 5 nodes): clipped and noised to ε = 1, δ = 1e-5,
//           released with at least 5 contributors (k-anonymity)
// and measures the held-out NLL again. In the exact phase node 0 then turns adversarial: it
// publishes a replay of its round-1 update (re-encrypted), a tampered copy, a forged update and
// garbage; the other nodes' rejections are counted.
//
//   npx ruvllm bench federation [--nodes 8] [--examples 6] [--heldout 16] [--phases exact,fedavg,daf,private,public]
//                               [--epochs 1] [--model <gguf>] [--quick] [--json]
// --quick: 3 nodes, 3 examples each, 6 held-out passages, phases exact,fedavg,private.
// --json: the summary as one JSON object on the last line of stdout.
import { cpSync, mkdtempSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { domainData, nll } from './sona-data.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
const addonPath = process.env.RUVLLM_BENCH_ADDON || join(root, 'index.js')

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    nodes: { type: 'string' },
    examples: { type: 'string' },
    heldout: { type: 'string' },
    phases: { type: 'string' },
    epochs: { type: 'string', default: '1' },
    'timeout-ms': { type: 'string', default: '120000' },
    quick: { type: 'boolean' },
    json: { type: 'boolean' },
    child: { type: 'string' },
    help: { type: 'boolean' },
  },
})
if (values.help) {
  console.log('npx ruvllm bench federation [--nodes 8] [--examples 6] [--heldout 16] [--phases exact,fedavg,daf,private,public] [--epochs 1] [--model <gguf>] [--quick] [--json]')
  process.exit(0)
}
const quick = values.quick
const N = Number(values.nodes ?? (quick ? 3 : 8))
const perNode = Number(values.examples ?? (quick ? 3 : 6))
const nHeld = Number(values.heldout ?? (quick ? 6 : 16))
const phases = (values.phases ?? (quick ? 'exact,fedavg,private' : `exact,fedavg,daf,private${N >= 5 ? ',public' : ''}`)).split(',')
const GROUP_KEY = '5a'.repeat(32)
const PHASES = {
  exact: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'fedavg' },
  fedavg: { tier: 'group', key: GROUP_KEY, method: 'fedavg', weighting: 'fedavg' },
  daf: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'hybrid' },
  // Nothing arrives on the private tier: the round ends on its timeout with nothing to apply.
  private: { tier: 'private', roundTimeoutMs: 1000 },
  public: { tier: 'public', method: 'exact', weighting: 'fedavg', epsilon: 1, delta: 1e-5, rounds: 1, kAnonymity: 5 },
}
for (const p of phases) if (!PHASES[p]) throw new Error(`unknown phase ${p}; known: ${Object.keys(PHASES).join(', ')}`)

// ---- a node process --------------------------------------------------------------------------
async function child(index) {
  const { LLM, models } = require(addonPath)
  const model = values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
  const { examples, heldDomain } = domainData(N * perNode, nHeld)
  const mine = examples.slice(index * perNode, (index + 1) * perNode)
  const base = mkdtempSync(join(tmpdir(), `ruvllm-bench-federation-${index}-`))
  const dir = join(base, 'learned')
  const local = join(base, 'local')
  const send = (m) => process.stdout.write(JSON.stringify(m) + '\n')
  const load = () => LLM.load(model, { threads: 1, contextSize: 512, learning: { dir, background: false, epochs: Number(values.epochs), federate: true } })
  let llm = await load()
  let node
  try {
    const nllBase = await nll(llm, heldDomain, true, [])
    for (const ex of mine) {
      const c = await llm.generate(ex.prompt, { maxTokens: 8, temperature: 0 })
      await llm.feedback(c.id, { quality: 1, correction: ex.correction })
    }
    await llm.consolidate()
    cpSync(dir, local, { recursive: true })
    const nllLocal = await nll(llm, heldDomain, true)
    send({ type: 'learned', nllBase, nllLocal })
    const lines = createInterface({ input: process.stdin })
    for await (const text of lines) {
      const cmd = JSON.parse(text)
      if (cmd.cmd === 'join') {
        // Back to the local adapter before each phase.
        await llm.close()
        rmSync(dir, { recursive: true, force: true })
        cpSync(local, dir, { recursive: true })
        llm = await load()
        node = await llm.federation.join({ peers: cmd.peers, expectedNodes: cmd.expected, roundTimeoutMs: Number(values['timeout-ms']), topic: `ruvllm-bench/${cmd.phase}`, ...PHASES[cmd.phase] })
        send({ type: 'joined', address: node.address, nodeId: node.nodeId })
      } else if (cmd.cmd === 'round') {
        const report = await node.round()
        send({ type: 'round', report })
      } else if (cmd.cmd === 'attack') {
        send({ type: 'attacked', sent: await node.attack(1) })
      } else if (cmd.cmd === 'measure') {
        const nllFederated = await nll(llm, heldDomain, true)
        send({ type: 'measured', nllFederated, stats: node.stats() })
      } else if (cmd.cmd === 'stop') {
        await node.stop()
        node = undefined
        send({ type: 'stopped' })
      } else if (cmd.cmd === 'exit') {
        break
      }
    }
  } finally {
    if (node) await node.stop()
    await llm.close()
    rmSync(base, { recursive: true, force: true })
  }
}

if (values.child !== undefined) {
  await child(Number(values.child))
  process.exit(0)
}

// ---- the orchestrator ------------------------------------------------------------------------
const t0 = performance.now()
const args = process.argv.slice(2).filter((a) => a !== '--json')
const procs = Array.from({ length: N }, (_, i) => {
  const p = spawn(process.execPath, [fileURLToPath(import.meta.url), ...args, '--child', String(i)], { stdio: ['pipe', 'pipe', 'inherit'] })
  const queue = []
  const waiting = []
  createInterface({ input: p.stdout }).on('line', (l) => {
    let m
    try {
      m = JSON.parse(l)
    } catch {
      process.stderr.write(`node ${i}: ${l}\n`)
      return
    }
    const w = waiting.shift()
    if (w) w(m)
    else queue.push(m)
  })
  const exited = new Promise((resolve) => p.on('exit', resolve))
  return {
    p,
    exited,
    next: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((resolve, reject) => {
      waiting.push(resolve)
      exited.then((code) => reject(new Error(`node ${i} exited (${code}) while a reply was awaited`)))
    })),
    send: (m) => p.stdin.write(JSON.stringify(m) + '\n'),
  }
})
const expect = async (proc, type) => {
  const m = await proc.next()
  if (m.type !== type) throw new Error(`expected ${type}, got ${JSON.stringify(m)}`)
  return m
}

const log = (s) => process.stderr.write(`bench federation: ${s}\n`)
log(`${N} nodes, ${perNode} feedback examples each, ${nHeld} held-out passages; phases ${phases.join(', ')}`)
const learned = await Promise.all(procs.map((p) => expect(p, 'learned')))
log(`learned locally in ${((performance.now() - t0) / 1000).toFixed(0)} s`)
const results = {}
let attack = null
for (const phase of phases) {
  const addrs = []
  for (const proc of procs) {
    proc.send({ cmd: 'join', phase, peers: phase === 'private' ? [] : [...addrs], expected: phase === 'private' ? 1 : N })
    addrs.push((await expect(proc, 'joined')).address)
  }
  for (const proc of procs) proc.send({ cmd: 'round' })
  const rounds = await Promise.all(procs.map((p) => expect(p, 'round')))
  if (phase === 'exact') {
    procs[0].send({ cmd: 'attack' })
    const sent = (await expect(procs[0], 'attacked')).sent
    // Time for the attack to reach everyone before the counters are read.
    await new Promise((r) => setTimeout(r, 3000))
    attack = { sent }
  }
  for (const proc of procs) proc.send({ cmd: 'measure' })
  const measured = await Promise.all(procs.map((p) => expect(p, 'measured')))
  for (const proc of procs) proc.send({ cmd: 'stop' })
  await Promise.all(procs.map((p) => expect(p, 'stopped')))
  results[phase] = { rounds: rounds.map((r) => r.report), measured }
  if (phase === 'exact') {
    const honest = measured.slice(1)
    attack.rejected = honest.reduce((a, m) => a + m.stats.rejectedTotal, 0)
    attack.reasons = honest.map((m) => m.stats.rejected)
    attack.receivedBy = honest.filter((m) => m.stats.rejectedTotal > 0).length
    attack.accepted = honest.reduce((a, m) => a + m.stats.accepted, 0) - honest.length * N
  }
  const digests = new Set(rounds.map((r) => r.report.adapterDigest))
  log(`${phase}: ${rounds[0].report.contributors} contributors, ${digests.size} distinct adapters after the round, ${((performance.now() - t0) / 1000).toFixed(0)} s`)
}
for (const proc of procs) proc.send({ cmd: 'exit' })
await Promise.all(procs.map((p) => p.exited))

// ---- report ----------------------------------------------------------------------------------
const f = (x, d = 3) => (Number.isFinite(x) ? x.toFixed(d) : '–')
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length
const nll_ = (phase, i) => results[phase]?.measured[i].nllFederated
const cpu = cpus()[0]?.model ?? 'unknown CPU'
const rows = learned.map((l, i) => `| ${i} | ${f(l.nllBase)} | ${f(l.nllLocal)} | ${phases.filter((p) => p !== 'private').map((p) => f(nll_(p, i))).join(' | ')} |`)
const fedPhases = phases.filter((p) => p !== 'private')
console.log(
  [
    `${cpu}; ${N} node processes, 1 engine thread each; ${perNode} feedback examples per node, ${nHeld} held-out passages; one round per phase`,
    '',
    `| node | held-out NLL base | local only | ${fedPhases.map((p) => `federated: ${p}`).join(' | ')} |`,
    `|---|---|---|${fedPhases.map(() => '---|').join('')}`,
    ...rows,
    `| mean | ${f(mean(learned.map((l) => l.nllBase)))} | ${f(mean(learned.map((l) => l.nllLocal)))} | ${fedPhases.map((p) => f(mean(learned.map((_, i) => nll_(p, i))))).join(' | ')} |`,
    '',
    ...fedPhases.map((p) => {
      const r = results[p].rounds
      return `${p}: bytes sent per node per round ${f(mean(r.map((x) => x.bytesSent)), 0)}, applied on ${r.filter((x) => x.applied).length}/${N}, withheld ${r[0].withheld}, SVD truncation error ${f(Math.max(...r.map((x) => x.truncationError)), 4)}, epsilon ${f(Math.max(...results[p].measured.map((m) => m.stats.epsilon)), 3)}`
    }),
    results.private ? `private: bytes on the wire ${results.private.rounds.reduce((a, x) => a + x.bytesSent, 0)}` : '',
    attack ? `adversary (node 0, exact phase): ${attack.sent} bad envelopes published, ${attack.rejected} rejections at ${attack.receivedBy}/${N - 1} honest nodes (${JSON.stringify(attack.reasons[0] ?? {})}), ${attack.accepted} accepted` : '',
    `${((performance.now() - t0) / 1000).toFixed(0)} s in all`,
  ].join('\n'),
)
if (values.json) {
  const main = results.exact ?? results[fedPhases[0]]
  console.log(
    JSON.stringify({
      nodes: learned.map((l, i) => ({ id: i, nllBase: l.nllBase, nllLocal: l.nllLocal, nllFederated: main?.measured[i].nllFederated, ...Object.fromEntries(fedPhases.map((p) => [`nll_${p}`, nll_(p, i)])) })),
      tampered: attack?.sent ?? 0,
      rejected: attack?.rejected ?? 0,
      tamperedAccepted: attack?.accepted ?? 0,
      privateBytesOnWire: results.private ? results.private.rounds.reduce((a, x) => a + x.bytesSent, 0) : null,
      epsilon: results.public ? Math.max(...results.public.measured.map((m) => m.stats.epsilon)) : 0,
      rounds: 1,
      bytesPerRound: main ? mean(main.rounds.map((x) => x.bytesSent)) : 0,
    }),
  )
}
