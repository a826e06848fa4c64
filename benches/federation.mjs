// Federation of SONA's learned adapter (llm.federation) across node processes on this machine.
//
// Each of N node processes (default 8) loads the model with learning: { federate: true } and
// owns its own slice of the SONA benchmark's domain feedback (benches/sona-data.mjs: CMU
// pronunciations; held-out words are never in feedback), cut into R chunks (--rounds, default
// 3) of --examples each. One arm per phase, each starting from the same state (every node has
// learned its chunk 0: instant updates and one consolidate(), then a copy of its learning
// directory is restored at the start of every arm), then R rounds:
//   round r: (r > 0) the node learns its chunk r on top of what it has (in the federated arms:
//            a fresh BaseLoRA on top of the global adapter), consolidates, then runs one round
//            of the federation on 127.0.0.1: it publishes its BaseLoRA (what it learned since
//            the last round), adds the round's aggregate to the global adapter and starts its
//            BaseLoRA afresh; every node measures its held-out NLL.
// So local-only and federated nodes have seen exactly the same examples; the federated ones
// also get the others' adapters every round. The arms:
//   local   tier 'private': nothing leaves the node (bytes on the wire counted), nothing is
//           applied: local learning only
//   exact   the exact weighted mean of the nodes' ΔW: their BaseLoRAs stacked (FLoRA) and added
//           to the global adapter, which keeps up to --global-rank (default 64) components per
//           projection (beyond that a truncated SVD, its relative error reported per round)
//   svd     the same mean re-factorised to the BaseLoRA's rank (8) before it is added: the
//           previous method, inexact (not in the defaults)
//   fedavg  the mean of the A and B factors separately, B̄·Ā (its relative distance from the
//           exact mean reported per round)
//   daf     exact with DAF's hybrid weighting (quality and improvement; SONA's adapter has no
//           timestep buckets, so this is the non-diffusion case): not in the defaults
//   public  tier 'public' (≥ 5 nodes), one round from chunk 0: clipped and noised to ε = 1,
//           δ = 1e-5, released with at least 5 contributors (k-anonymity)
//   timestep, quality  exact with DAF's TimestepAligned (clients weighted by their measured loss
//           improvement, per bucket) or QualityWeighted weighting (not in the defaults)
// --diffusion: the same on the masked-diffusion model (gemma-3-270m-diffusion): each node learns
// TALoRA (one BaseLoRA per range of mask ratios, trained with the masked-diffusion loss on its
// feedback) and the rounds aggregate each timestep bucket on its own; held-out NLL is the
// diffusion ELBO per token (--elbo-samples mask ratios, default 8, the same seed for every node
// and arm), measured after each arm's last round only (--measure-every-round: after each).
// Default phases there: local, exact (FedAvg weighting), timestep, daf (hybrid). QualityWeighted
// ('quality') equals FedAvg here: every feedback example has quality 1.
// After the exact arm's last round node 0 turns adversarial (a re-encrypted replay of its
// update of round R - 1, a tampered copy, a forged update and garbage); the others' rejections are
// counted. Then the dropout phase (unless --no-dropout): from chunk 0, round 1: the last node
// is killed before it publishes; round 2: the next-to-last is killed right after it has
// published; the others finish both rounds (the first on its round timeout).
//
//   npx ruvllm bench federation [--nodes 8] [--examples 4] [--rounds 3] [--heldout 16]
//       [--phases local,exact,fedavg,public] [--global-rank 64] [--server-lr 1] [--no-dropout] [--epochs N] [--model <gguf>]
//       [--diffusion [--elbo-samples 8] [--measure-every-round]] [--quick] [--json]
// --epochs: passes over each chunk when a node consolidates (default: the learner's own, 2).
// --quick: 3 nodes, 2 examples per round, 2 rounds, 6 held-out passages, phases local,exact,fedavg.
// --json: the summary as one JSON object on the last line of stdout.
import { cpSync, mkdtempSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { spawn } from 'node:child_process'
import { createInterface } from 'node:readline'
import { domainData, nll as arNll } from './sona-data.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
const addonPath = process.env.RUVLLM_BENCH_ADDON || join(root, 'index.js')

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    nodes: { type: 'string' },
    examples: { type: 'string' },
    rounds: { type: 'string' },
    heldout: { type: 'string' },
    phases: { type: 'string' },
    'no-dropout': { type: 'boolean' },
    epochs: { type: 'string' },
    'global-rank': { type: 'string', default: '64' },
    'server-lr': { type: 'string', default: '1' },
    'timeout-ms': { type: 'string', default: '300000' },
    quick: { type: 'boolean' },
    diffusion: { type: 'boolean' },
    'elbo-samples': { type: 'string', default: '8' },
    'measure-every-round': { type: 'boolean' },
    json: { type: 'boolean' },
    child: { type: 'string' },
    resume: { type: 'string' },
    help: { type: 'boolean' },
  },
})
const USAGE = 'npx ruvllm bench federation [--nodes 8] [--examples 4] [--rounds 3] [--heldout 16] [--phases local,exact,fedavg,public] [--global-rank 64] [--server-lr 1] [--no-dropout] [--epochs N] [--model <gguf>] [--diffusion [--elbo-samples 8] [--measure-every-round]] [--quick] [--json]'
if (values.help) {
  console.log(USAGE)
  process.exit(0)
}
const quick = values.quick
const N = Number(values.nodes ?? (quick ? 3 : 8))
const perRound = Number(values.examples ?? (quick ? 2 : 4))
const R = Number(values.rounds ?? (quick ? 2 : 3))
const nHeld = Number(values.heldout ?? (quick ? 6 : 16))
const diffusion = Boolean(values.diffusion)
const phases = (values.phases ?? (diffusion ? (quick ? 'local,exact,timestep' : 'local,exact,timestep,daf') : quick ? 'local,exact,fedavg' : `local,exact,fedavg${N >= 5 ? ',public' : ''}`)).split(',')
const dropout = !values['no-dropout'] && N >= 3 && !diffusion
// Passes over each chunk per consolidate(); unset: the learner's default (2).
const epochs = values.epochs === undefined ? undefined : Number(values.epochs)
const epochsText = epochs === undefined ? "the learner's default epochs (2)" : `${epochs} epoch${epochs === 1 ? '' : 's'} per chunk`
for (const [k, v, min] of [['nodes', N, 1], ['examples', perRound, 1], ['rounds', R, 1], ['heldout', nHeld, 1], ['global-rank', Number(values['global-rank']), 1], ...(epochs === undefined ? [] : [['epochs', epochs, 1]])]) {
  if (!Number.isInteger(v) || v < min) {
    console.error(`bench federation: --${k} must be an integer ≥ ${min}\n${USAGE}`)
    process.exit(2)
  }
}
const serverLr = Number(values['server-lr'])
if (!(serverLr > 0 && serverLr <= 10)) {
  console.error(`bench federation: --server-lr must be a number in (0, 10]\n${USAGE}`)
  process.exit(2)
}
const GROUP_KEY = '5a'.repeat(32)
const PHASES = {
  // Nothing arrives on the private tier: each round ends on its timeout with nothing to apply.
  local: { tier: 'private', roundTimeoutMs: 1000 },
  exact: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'fedavg' },
  svd: { tier: 'group', key: GROUP_KEY, method: 'svd', weighting: 'fedavg' },
  fedavg: { tier: 'group', key: GROUP_KEY, method: 'fedavg', weighting: 'fedavg' },
  daf: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'hybrid' },
  timestep: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'timestep' },
  quality: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'quality' },
  public: { tier: 'public', method: 'exact', weighting: 'fedavg', epsilon: 1, delta: 1e-5, rounds: 1, kAnonymity: 5 },
  dropout: { tier: 'group', key: GROUP_KEY, method: 'exact', weighting: 'fedavg', roundTimeoutMs: 20000 },
}
// Rounds per arm: the public arm spends its whole ε = 1 budget on one release.
const roundsOf = (phase) => (phase === 'public' ? 1 : phase === 'dropout' ? 2 : R)
for (const p of phases) if (!PHASES[p] || p === 'dropout') throw new Error(`unknown phase ${p}; known: local, exact, svd, fedavg, daf, timestep, quality, public`)

// ---- a node process --------------------------------------------------------------------------
async function child(index) {
  const { LLM, models } = require(addonPath)
  const model = diffusion ? 'gemma-3-270m-diffusion' : values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
  const { examples, heldDomain } = domainData(N * R * perRound, nHeld)
  // The diffusion model's held-out NLL: its ELBO per token (an upper bound), the same ratios
  // and masks for every node and arm.
  const nll = diffusion
    ? async (llm, texts, _skip, adapters) => {
        let sum = 0
        let n = 0
        for (const t of texts) {
          const s = await llm.score(t, { elbo: { samples: Number(values['elbo-samples']), seed: 7 }, ...(adapters ? { adapters } : {}) })
          const k = llm.tokenize(t).length - 1
          sum += Math.log(s.perplexity) * k
          n += k
        }
        return sum / n
      }
    : arNll
  // This node's slice, chunk r of it learned before round r.
  const chunk = (r) => examples.slice((index * R + r) * perRound, (index * R + r + 1) * perRound)
  // A node process resumed for a later arm (--resume: the first process's directory) starts
  // from chunk 0 without learning it again.
  const base = values.resume ?? mkdtempSync(join(tmpdir(), `ruvllm-bench-federation-${index}-`))
  const dir = join(base, 'learned')
  const start = join(base, 'chunk0')
  const send = (m) => process.stdout.write(JSON.stringify(m) + '\n')
  const load = () => LLM.load(model, { threads: 1, contextSize: 512, learning: { dir, background: false, ...(epochs === undefined ? {} : { epochs }), federate: true } })
  const learn = async (r) => {
    const t = performance.now()
    for (const ex of chunk(r)) {
      const c = await llm.generate(ex.prompt, { maxTokens: 8, temperature: 0 })
      await llm.feedback(c.id, { quality: 1, correction: ex.correction })
    }
    await llm.consolidate()
    return performance.now() - t
  }
  const joinOptions = (cmd) => ({
    peers: cmd.peers,
    expectedNodes: cmd.expected,
    roundTimeoutMs: Number(values['timeout-ms']),
    topic: `ruvllm-bench/${cmd.phase}`,
    ...(cmd.phase === 'local' ? {} : { globalRank: Number(values['global-rank']), serverLr: Number(values['server-lr']) }),
    ...PHASES[cmd.phase],
  })
  const restore = () => {
    rmSync(dir, { recursive: true, force: true })
    cpSync(start, dir, { recursive: true })
  }
  if (values.resume) restore()
  let llm = await load()
  let node
  let fresh = Boolean(values.resume)
  let keep = false
  try {
    if (fresh) send({ type: 'ready' })
    else {
      const nllBase = await nll(llm, heldDomain, true, [])
      const learnMs = await learn(0)
      cpSync(dir, start, { recursive: true })
      send({ type: 'learned', nllBase, nll0: await nll(llm, heldDomain, true), learnMs, dir: base })
    }
    const lines = createInterface({ input: process.stdin })
    for await (const text of lines) {
      const cmd = JSON.parse(text)
      if (cmd.cmd === 'join' && fresh) {
        fresh = false
        node = await llm.federation.join(joinOptions(cmd))
        send({ type: 'joined', address: node.address, nodeId: node.nodeId })
      } else if (cmd.cmd === 'join') {
        // Every arm starts from the same state: chunk 0 learned, nothing federated.
        await llm.close()
        // The closed model and the last arm's federation node (each holding the learner and
        // its weights) go only when collected; 8 such processes ran out of memory without this.
        llm = node = undefined
        globalThis.gc?.()
        restore()
        llm = await load()
        node = await llm.federation.join(joinOptions(cmd))
        send({ type: 'joined', address: node.address, nodeId: node.nodeId })
      } else if (cmd.cmd === 'learn') {
        send({ type: 'learned', learnMs: await learn(cmd.chunk) })
      } else if (cmd.cmd === 'round') {
        if (cmd.die === 'before') process.exit(137)
        if (cmd.die === 'after') {
          // Report once this node's update has gone out; the orchestrator kills it then.
          const sent = node.stats().bytesSent
          node.round().catch(() => {})
          while (node.stats().bytesSent - sent < 1e6) await new Promise((r) => setTimeout(r, 10))
          // Sealed and handed to gossipsub: half a second for it to leave, then die.
          await new Promise((r) => setTimeout(r, 500))
          send({ type: 'published' })
          await new Promise(() => {})
        }
        try {
          send({ type: 'round', report: await node.round() })
        } catch (e) {
          send({ type: 'round', error: { code: e.code, message: e.message } })
        }
      } else if (cmd.cmd === 'attack') {
        // Its update of the round before the last: a node holds the last 2 rounds (keepRounds).
        send({ type: 'attacked', sent: await node.attack(Math.max(1, R - 1)) })
      } else if (cmd.cmd === 'measure') {
        send({ type: 'measured', nll: await nll(llm, heldDomain, true), stats: node.stats(), rssMb: process.memoryUsage().rss / 2 ** 20 })
      } else if (cmd.cmd === 'stop') {
        await node.stop()
        node = undefined
        send({ type: 'stopped' })
      } else if (cmd.cmd === 'exit') {
        keep = Boolean(cmd.keep)
        break
      }
    }
  } finally {
    if (node) await node.stop()
    await llm.close()
    if (!keep) rmSync(base, { recursive: true, force: true })
  }
}

if (values.child !== undefined) {
  await child(Number(values.child))
  process.exit(0)
}

// ---- the orchestrator ------------------------------------------------------------------------
const t0 = performance.now()
const secs = () => ((performance.now() - t0) / 1000).toFixed(0)
const args = process.argv.slice(2).filter((a) => a !== '--json')
const spawnNode = (i, extra = []) => {
  const p = spawn(process.execPath, ['--expose-gc', fileURLToPath(import.meta.url), ...args, '--child', String(i), ...extra], { stdio: ['pipe', 'pipe', 'inherit'] })
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
    id: i,
    p,
    exited,
    alive: true,
    next: () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((resolve, reject) => {
      waiting.push(resolve)
      exited.then((code) => reject(new Error(`node ${i} exited (${code}) while a reply was awaited`)))
    })),
    send: (m) => p.stdin.write(JSON.stringify(m) + '\n'),
  }
}
const procs = Array.from({ length: N }, (_, i) => spawnNode(i))
const expect = async (proc, type) => {
  const m = await proc.next()
  if (m.type !== type) throw new Error(`expected ${type}, got ${JSON.stringify(m)}`)
  return m
}
const all = (ps, cmd, type) => Promise.all(ps.map((p) => (p.send(cmd), expect(p, type))))
const log = (s) => process.stderr.write(`bench federation: ${s}\n`)

log(`${N} nodes, ${R} rounds of ${perRound} feedback examples per node, ${nHeld} held-out passages; ${epochsText}; phases ${phases.join(', ')}${dropout ? ', dropout' : ''}; global rank ${values['global-rank']}, server learning rate ${serverLr}`)
const learned = await Promise.all(procs.map((p) => expect(p, 'learned')))
log(`chunk 0 learned in ${secs()} s`)

/** One arm: every live node joins `phase`, then `rounds` rounds (learning chunk r before round r > 0). */
async function arm(phase, { attack = false, kill = [], respawn = false } = {}) {
  if (respawn) {
    // A fresh process per node and arm: a process that reloads the model for every arm grows
    // (~0.4 GB per arm even with gc()), and 8 of them ran out of the machine's memory.
    for (const old of procs.filter((p) => p.alive)) {
      old.send({ cmd: 'exit', keep: true })
      await old.exited
      procs[old.id] = spawnNode(old.id, ['--resume', learned[old.id].dir])
    }
    await Promise.all(procs.filter((p) => p.alive).map((p) => expect(p, 'ready')))
  }
  const live = procs.filter((p) => p.alive)
  const addrs = []
  const nodeIds = []
  for (const proc of live) {
    proc.send({ cmd: 'join', phase, peers: phase === 'local' ? [] : [...addrs], expected: phase === 'local' ? 1 : live.length })
    const j = await expect(proc, 'joined')
    addrs.push(j.address)
    nodeIds[proc.id] = j.nodeId
  }
  const out = { rounds: [], nll: [], learnMs: [], nodeIds }
  for (let r = 0; r < roundsOf(phase); r++) {
    const ps = procs.filter((p) => p.alive)
    if (r > 0 && phase !== 'dropout') out.learnMs.push((await all(ps, { cmd: 'learn', chunk: r }, 'learned')).map((m) => m.learnMs))
    // The victim (the last live node) drops out while the others run the round: before it
    // publishes (it exits on the command) or right after (killed once its update went out).
    const victim = kill[r] ? ps[ps.length - 1] : null
    const survivors = victim ? ps.slice(0, -1) : ps
    if (victim) {
      victim.alive = false
      victim.send({ cmd: 'round', die: kill[r] })
    }
    const pending = survivors.map((p) => (p.send({ cmd: 'round' }), expect(p, 'round')))
    if (kill[r] === 'after') {
      await expect(victim, 'published')
      victim.p.kill('SIGKILL')
    }
    if (victim) {
      await victim.exited
      // A killed node leaves its learning directory behind.
      rmSync(learned[victim.id].dir, { recursive: true, force: true })
    }
    const reports = await Promise.all(pending)
    const failed = reports.filter((m) => m.error)
    if (failed.length && phase !== 'dropout') throw new Error(`${phase} round ${r + 1}: ${JSON.stringify(failed[0].error)}`)
    const byId = new Map(reports.map((m, i) => [survivors[i].id, m.report ?? { error: m.error }]))
    out.rounds.push({ victim: victim && { id: victim.id, when: kill[r] }, reports: procs.map((p) => byId.get(p.id) ?? null) })
    if (attack && r === roundsOf(phase) - 1) {
      procs[0].send({ cmd: 'attack' })
      out.attackSent = (await expect(procs[0], 'attacked')).sent
      // Time for the attack to reach everyone before the counters are read.
      await new Promise((res) => setTimeout(res, 3000))
    }
    const live2 = procs.filter((p) => p.alive)
    if (diffusion && !values['measure-every-round'] && r < roundsOf(phase) - 1) {
      // The ELBO is costly: measured after the arm's last round only.
      out.nll.push(procs.map(() => null))
      log(`${phase} round ${r + 1}: ${reports[0]?.report?.contributors} contributors, ${secs()} s`)
      continue
    }
    const measured = await all(live2, { cmd: 'measure' }, 'measured')
    const byId2 = new Map(measured.map((m, i) => [live2[i].id, m]))
    out.nll.push(procs.map((p) => byId2.get(p.id)?.nll ?? null))
    out.stats = procs.map((p) => byId2.get(p.id)?.stats ?? null)
    out.rssMb = Math.max(out.rssMb ?? 0, ...measured.map((m) => m.rssMb))
    const rep = reports.map((m) => m.report).filter(Boolean)
    log(`${phase} round ${r + 1}: ${rep[0]?.contributors} contributors${failed.length ? ` (${failed.length} nodes failed: ${failed[0].error.code})` : ''}${victim ? ` (node ${victim.id} killed ${kill[r]} publishing)` : ''}, ${new Set(rep.map((x) => x.adapterDigest)).size} distinct adapters, mean NLL ${mean(out.nll[r].filter((x) => x !== null)).toFixed(4)}, largest node RSS ${Math.max(...measured.map((m) => m.rssMb)).toFixed(0)} MB, ${secs()} s`)
  }
  await all(procs.filter((p) => p.alive), { cmd: 'stop' }, 'stopped')
  return out
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length
const results = {}
for (const [i, phase] of phases.entries()) results[phase] = await arm(phase, { attack: phase === 'exact', respawn: i > 0 })
if (dropout) results.dropout = await arm('dropout', { kill: ['before', 'after'], respawn: phases.length > 0 })
for (const proc of procs.filter((p) => p.alive)) proc.send({ cmd: 'exit' })
await Promise.all(procs.map((p) => p.exited))

// ---- report ----------------------------------------------------------------------------------
const f = (x, d = 3) => (Number.isFinite(x) ? x.toFixed(d) : '–')
const cpu = cpus()[0]?.model ?? 'unknown CPU'
const last = (phase) => results[phase]?.nll.at(-1)
const arms = phases.filter((p) => p !== 'local')
// Without a local arm the arms are compared with the state they all start from (chunk 0 learned).
const local = results.local ? last('local') : learned.map((l) => l.nll0)
const localName = results.local ? 'local-only' : 'the chunk-0 state (no local arm run)'
const beats = (phase, other) => learned.filter((_, i) => last(phase)[i] < other[i]).length
const bytes = (phase) => mean(results[phase].rounds.flatMap((r) => r.reports.filter(Boolean).map((x) => x.bytesSent)))
const errs = (phase) => results[phase].rounds.map((r) => Math.max(...r.reports.filter(Boolean).map((x) => x.truncationError)))
const attack = results.exact?.attackSent !== undefined ? (() => {
  const honest = results.exact.stats.slice(1)
  return {
    sent: results.exact.attackSent,
    rejected: honest.reduce((a, s) => a + s.rejectedTotal, 0),
    receivedBy: honest.filter((s) => s.rejectedTotal > 0).length,
    reasons: honest[0]?.rejected ?? {},
    // Each honest node accepts N updates per round and bucket (its own too); anything more
    // came from the attack.
    accepted: honest.reduce((a, s) => a + s.accepted, 0) - honest.length * N * R * (diffusion ? 3 : 1),
  }
})() : null
const privateBytes = results.local ? results.local.rounds.reduce((a, r) => a + r.reports.reduce((b, x) => b + (x?.bytesSent ?? 0), 0), 0) : null
const epsilon = results.public ? Math.max(...results.public.stats.map((s) => s.epsilon)) : 0
const drop = results.dropout && results.dropout.rounds.map((r) => {
  const rep = r.reports.filter((x) => x && !x.error)
  const errors = r.reports.filter((x) => x?.error).map((x) => x.error.code)
  return { killed: r.victim.id, when: r.victim.when, finished: rep.length, errors, applied: rep.filter((x) => x.applied).length, contributors: rep[0]?.contributors, timedOut: rep.some((x) => x.timedOut), adapters: new Set(rep.map((x) => x.adapterDigest)).size }
})
// Which node each aggregate weight belongs to: a group's updates are ordered by node id.
const weightsByNode = (phase) => {
  const ids = results[phase].nodeIds
  const order = learned.map((_, i) => i).sort((a, b) => (ids[a] < ids[b] ? -1 : ids[a] > ids[b] ? 1 : 0))
  const sum = learned.map(() => 0)
  let n = 0
  for (const r of results[phase].rounds) {
    for (const b of r.reports.find(Boolean)?.buckets ?? []) {
      if (b.weights.length !== N) continue
      b.weights.forEach((w, k) => (sum[order[k]] += w))
      n++
    }
  }
  return sum.map((x) => x / Math.max(n, 1))
}
const localGain = () => learned.map((l, i) => l.nll0 - last('local')[i])
const ranks = (xs) => {
  const idx = xs.map((_, i) => i).sort((a, b) => xs[a] - xs[b])
  const r = []
  idx.forEach((i, k) => (r[i] = k))
  return r
}
const spearman = (xs, ys) => {
  const [a, b] = [ranks(xs), ranks(ys)]
  const [ma, mb] = [mean(a), mean(b)]
  const cov = mean(a.map((x, i) => (x - ma) * (b[i] - mb)))
  const sd = (v, m) => Math.sqrt(mean(v.map((x) => (x - m) ** 2)))
  return cov / (sd(a, ma) * sd(b, mb))
}
// An arm's mean held-out NLL after each round (null where a round was not measured). Round 1
// learns nothing new (chunk 0 was learned before it): it is where federation first applies.
const roundMeans = (p) => results[p].nll.map((r) => (r.some((x) => x === null) ? null : mean(r)))
// Rounds to converge: the first round that lowered the arm's mean held-out NLL by less than 1 %
// of the round before's (null: every round lowered it by more; undefined: not every round was
// measured).
const CONVERGED = 0.01
const roundsToConverge = (p) => {
  const m = roundMeans(p)
  if (m.includes(null)) return undefined
  const i = m.findIndex((x, i) => i > 0 && m[i - 1] - x < CONVERGED * m[i - 1])
  return i < 0 ? null : i + 1
}
// The first round after which the arm's mean is at or below local-only's after its last round.
const roundsToLocal = (p) => {
  const [m, target] = [roundMeans(p), mean(local)]
  if (m.includes(null)) return undefined
  const i = m.findIndex((x) => x <= target)
  return i < 0 ? null : i + 1
}
const roundsText = (n) => (n === undefined ? '– (not measured every round)' : (n ?? `not within ${R}`))
const convArms = (results.local ? ['local'] : []).concat(arms.filter((p) => p !== 'public'))
const perRoundRows = arms.concat(results.local ? ['local'] : []).map((p) => `| ${p} | ${roundMeans(p).map((x) => (x === null ? '–' : f(x))).join(' | ')} |`)
console.log(
  [
    `${cpu}; ${diffusion ? 'gemma-3-270m-diffusion (TALoRA, 3 timestep buckets; NLL = ELBO per token)' : 'autoregressive model (SONA BaseLoRA)'}; ${N} node processes, 1 engine thread each; ${R} rounds × ${perRound} feedback examples per node (${R * perRound} in all, every arm), ${nHeld} held-out passages; ${epochsText}; global rank ${values['global-rank']}, server learning rate ${serverLr}`,
    '',
    `| node | base | after chunk 0 | local only | ${arms.map((p) => `federated: ${p}`).join(' | ')} |`,
    `|---|---|---|---|${arms.map(() => '---|').join('')}`,
    ...learned.map((l, i) => `| ${i} | ${f(l.nllBase)} | ${f(l.nll0)} | ${results.local ? f(local[i]) : '–'} | ${arms.map((p) => f(last(p)[i])).join(' | ')} |`),
    `| mean | ${f(mean(learned.map((l) => l.nllBase)))} | ${f(mean(learned.map((l) => l.nll0)))} | ${results.local ? f(mean(local)) : '–'} | ${arms.map((p) => f(mean(last(p)))).join(' | ')} |`,
    '',
    `mean held-out NLL after each round: | arm | ${Array.from({ length: R }, (_, r) => `round ${r + 1}`).join(' | ')} |`,
    ...perRoundRows,
    '',
    ...arms.map((p) => `${p}: beats ${localName} on ${beats(p, local)}/${N} nodes${p !== 'fedavg' && results.fedavg && p !== 'public' ? `, beats fedavg on ${beats(p, last('fedavg'))}/${N}` : ''}; bytes sent per node per round ${f(bytes(p), 0)}; relative distance from the exact mean per round ${errs(p).map((e) => f(e, 4)).join(', ')}${p === 'public' ? `; epsilon ${f(epsilon)}, withheld ${results.public.rounds[0].reports[0].withheld}` : ''}`),
    ...arms.filter((p) => ['timestep', 'daf'].includes(p) && results.local).map((p) => {
      const [w, gain] = [weightsByNode(p), localGain()]
      return `${p}: each node's mean weight over rounds and buckets ${w.map((x) => x.toFixed(2)).join(' ')}; its gain learning alone (after chunk 0 minus local only) ${gain.map((x) => x.toFixed(3)).join(' ')}; rank correlation ${f(spearman(w, gain), 2)}`
    }),
    ...arms
      .filter((p) => ['timestep', 'quality', 'daf'].includes(p) && results.exact)
      .map((p) => {
        const w = results[p].rounds.at(-1).reports.find(Boolean)?.buckets ?? []
        return `${p} vs FedAvg weighting (exact): mean ${f(mean(last(p)) - mean(last('exact')), 4)} nats, better on ${beats(p, last('exact'))}/${N} nodes; last round's weights per bucket ${w.map((b) => `[${b.weights.map((x) => x.toFixed(2)).join(' ')}]`).join(' ')}`
      }),
    `rounds to converge (the first round lowering the mean held-out NLL by < 1 %): ${convArms.map((p) => `${p} ${roundsText(roundsToConverge(p))}`).join(', ')}${results.local ? `; rounds to reach local-only's mean after round ${R}: ${convArms.filter((p) => p !== 'local').map((p) => `${p} ${roundsText(roundsToLocal(p))}`).join(', ')}` : ''}`,
    privateBytes !== null ? `private (local arm): bytes on the wire over ${R} rounds × ${N} nodes: ${privateBytes}` : '',
    attack ? `adversary (node 0, after the exact arm's last round): ${attack.sent} bad envelopes published, ${attack.rejected} rejections at ${attack.receivedBy}/${N - 1} honest nodes (${JSON.stringify(attack.reasons)}), ${attack.accepted} accepted` : '',
    ...(drop ?? []).map((d) => `dropout: node ${d.killed} killed ${d.when} publishing; ${d.finished} nodes finished the round${d.errors.length ? ` (${d.errors.length} failed: ${d.errors.join(', ')})` : ''} (${d.applied} applied, ${d.contributors} contributors, timed out: ${d.timedOut}, ${d.adapters} distinct adapters)`),
    `${secs()} s in all`,
  ].join('\n'),
)
if (values.json) {
  const main = results.exact ? 'exact' : arms[0]
  console.log(
    JSON.stringify({
      nodes: learned.map((l, i) => ({
        id: i,
        nllBase: l.nllBase,
        nllChunk0: l.nll0,
        nllLocal: results.local ? local[i] : null,
        nllFederated: main ? last(main)[i] : null,
        ...Object.fromEntries(arms.map((p) => [`nll_${p}`, last(p)[i]])),
      })),
      tampered: attack?.sent ?? 0,
      rejected: attack?.rejected ?? 0,
      tamperedAccepted: attack?.accepted ?? 0,
      privateBytesOnWire: privateBytes,
      epsilon,
      rounds: R,
      diffusion,
      examplesPerRound: perRound,
      globalRank: Number(values['global-rank']),
      serverLr,
      epochs: epochs ?? null,
      bytesPerRound: main ? bytes(main) : 0,
      perRound: Object.fromEntries(Object.keys(results).filter((p) => p !== 'dropout').map((p) => [p, roundMeans(p)])),
      roundsToConverge: Object.fromEntries(convArms.map((p) => [p, roundsToConverge(p) ?? null])),
      roundsToLocal: results.local ? Object.fromEntries(convArms.filter((p) => p !== 'local').map((p) => [p, roundsToLocal(p) ?? null])) : null,
      distanceFromExact: Object.fromEntries(arms.map((p) => [p, errs(p)])),
      meanWeights: results.local ? Object.fromEntries(arms.filter((p) => ['timestep', 'daf'].includes(p)).map((p) => [p, weightsByNode(p)])) : null,
      dropout: drop ?? null,
      seconds: Number(secs()),
    }),
  )
}
