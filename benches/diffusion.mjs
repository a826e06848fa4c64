// The masked-diffusion model against the autoregressive one it was converted from, on this CPU:
//   - held-out likelihood: the diffusion model's ELBO perplexity (Monte Carlo over the mask
//     ratio, fixed seed) vs the AR model's perplexity, on the same held-out sequences (the split
//     of training/prepare_data.mjs: never trained on);
//   - generation quality vs speed: 128-token answers to a fixed prompt set at one token per step,
//     2 and 4 tokens per step, and thresholds 0.9 / 0.7; generative perplexity (the AR model
//     scores prompt + answer with `llm.score`, answer tokens only), distinct-2, forward passes
//     per token and tokens/s, next to the AR model's own greedy decode;
//   - the greedy probe "The capital of France is Paris. The capital of Germany is" -> " Berlin".
// Each adapter set is given by a manifest (default: the shipped gemma-3-270m-diffusion); more
// than one (`--manifest a.json --manifest b.json`) compares them (TALoRA vs one LoRA).
//
//   npx ruvllm bench diffusion [--manifest m.json ...] [--sequences 16] [--samples 8] [--answers 12] [--threads 2] [--json out.json]
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { cpus } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { execFileSync } from 'node:child_process'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
const { LLM, models } = require(join(root, 'index.js'))

const { values } = parseArgs({
  options: {
    manifest: { type: 'string', multiple: true },
    model: { type: 'string' },
    sequences: { type: 'string', default: '16' },
    samples: { type: 'string', default: '8' },
    answers: { type: 'string', default: '12' },
    tokens: { type: 'string', default: '128' },
    threads: { type: 'string', default: '2' },
    json: { type: 'string' },
  },
})
const SHIPPED = join(root, 'crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/manifest.json')
const manifests = values.manifest ?? [SHIPPED]
const base = values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
const threads = Number(values.threads)
const [nSeq, nSamples, nAnswers, nTokens] = [values.sequences, values.samples, values.answers, values.tokens].map(Number)

// Held-out sequences: the split of the conversion pipeline (built on first use).
const heldout = join(root, 'training/data/heldout.bin')
if (!existsSync(heldout)) execFileSync(process.execPath, [join(root, 'training/prepare_data.mjs'), '--gguf', base], { stdio: 'inherit' })
const meta = JSON.parse(readFileSync(join(root, 'training/data/meta.json'), 'utf8'))
const seqLen = meta.seq ?? 512
const all = new Uint32Array(readFileSync(heldout).buffer.slice(0))
const total = Math.floor(all.length / seqLen)
// Evenly spaced over the held-out set; each sequence cut to 256 tokens to keep a run short.
const SEQ = 256
const sequences = Array.from({ length: Math.min(nSeq, total) }, (_, i) => Array.from(all.subarray(Math.floor((i * total) / nSeq) * seqLen, Math.floor((i * total) / nSeq) * seqLen + SEQ)))

const PROMPTS = [
  'The capital of France is Paris. The capital of Germany is',
  'Once upon a time, in a small village by the sea,',
  'The best way to learn a new language is',
  'Water is made of hydrogen and oxygen. When it is heated,',
  'My favourite season of the year is autumn, because',
  'The history of the printing press begins',
  'To make a cup of tea, first',
  'The old king called his three sons and said,',
  'In the morning the market was already busy with',
  'Scientists have long wondered why the sky is blue.',
  'She opened the letter slowly and read the first line:',
  'The most important invention of the last century was',
  'HAMLET. To be, or not to be,',
  'The train left the station at noon and',
  'Dear friend, I am writing to tell you that',
  'A good teacher is someone who',
].slice(0, nAnswers)
const SETTINGS = [
  ['1 token/step', { steps: nTokens }],
  ['2 tokens/step', { steps: nTokens / 2 }],
  ['4 tokens/step', { steps: nTokens / 4 }],
  ['τ = 0.9', { threshold: 0.9 }],
  ['τ = 0.7', { threshold: 0.7 }],
]

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)
function distinct2(tokenLists) {
  const all = new Set()
  let n = 0
  for (const t of tokenLists) for (let i = 0; i + 1 < t.length; i++, n++) all.add(`${t[i]},${t[i + 1]}`)
  return n ? all.size / n : 0
}

const ar = await LLM.load(base, { contextSize: 1024, threads })
/** Generative perplexity: the AR model's perplexity of the answer tokens after the prompt. */
async function genPpl(prompt, answer) {
  const p = ar.tokenize(prompt)
  if (answer.length === 0) return NaN
  const s = await ar.score([...p, ...answer])
  const lps = s.logprobs.slice(p.length - 1)
  return Math.exp(-mean(lps))
}

const report = { date: new Date().toISOString(), cpu: cpus()[0].model, threads, sequences: sequences.length, samples: nSamples, tokens: nTokens, answers: PROMPTS.length, runs: [] }
const arPpl = Math.exp(mean(await Promise.all(sequences.map(async (s) => Math.log((await ar.score(s)).perplexity)))))
{
  const t0 = performance.now()
  const outs = []
  for (const p of PROMPTS) outs.push(await ar.generate(p, { maxTokens: nTokens, temperature: 0 }))
  const secs = (performance.now() - t0) / 1000
  const toks = outs.reduce((n, c) => n + c.tokens.length, 0)
  const ppls = []
  for (let i = 0; i < outs.length; i++) ppls.push(await genPpl(PROMPTS[i], outs[i].tokens))
  report.ar = { setting: 'autoregressive greedy', genPpl: median(ppls.filter(Number.isFinite)), distinct2: distinct2(outs.map((c) => c.tokens)), passesPerToken: 1, tokPerSec: toks / secs }
}

for (const manifest of manifests) {
  const dm = await LLM.load(base, { contextSize: 1024, threads, diffusion: { adapter: manifest } })
  const run = { manifest, rows: [] }
  // Held-out ELBO, the same sequences as the AR perplexity.
  const nll = []
  for (const s of sequences) nll.push(Math.log((await dm.score(s, { elbo: { samples: nSamples, seed: 1 } })).perplexity))
  run.elboPpl = Math.exp(mean(nll))
  const probe = await dm.generate(PROMPTS[0], { maxTokens: 4, temperature: 0, diffusion: { blockSize: 4 } })
  run.probe = probe.text
  for (const [name, d] of SETTINGS) {
    const t0 = performance.now()
    const outs = []
    for (const p of PROMPTS) outs.push(await dm.generate(p, { maxTokens: nTokens, temperature: 0, diffusion: { blockSize: 32, ...d } }))
    const secs = (performance.now() - t0) / 1000
    const toks = outs.reduce((n, c) => n + c.tokens.length, 0)
    const passes = outs.reduce((n, c) => n + c.diffusion.forwardPasses, 0)
    const steps = outs.reduce((n, c) => n + c.diffusion.steps, 0)
    const ppls = []
    for (let i = 0; i < outs.length; i++) ppls.push(await genPpl(PROMPTS[i], outs[i].tokens))
    run.rows.push({
      setting: name,
      genPpl: median(ppls.filter(Number.isFinite)),
      distinct2: distinct2(outs.map((c) => c.tokens)),
      tokensPerStep: toks / Math.max(1, steps),
      passesPerToken: passes / Math.max(1, toks),
      tokPerSec: toks / secs,
      meanTokens: toks / outs.length,
    })
  }
  await dm.close()
  report.runs.push(run)
}
await ar.close()
report.arPpl = arPpl

const f = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '–')
console.log(`CPU: ${report.cpu}, ${threads} threads; ${sequences.length} held-out sequences of ${SEQ} tokens, ${nSamples} ELBO samples each; ${PROMPTS.length} prompts × ${nTokens} tokens, greedy\n`)
console.log('| model | held-out perplexity | vs AR |')
console.log('|---|---:|---:|')
console.log(`| autoregressive (base) | ${f(arPpl)} | 1.00 |`)
for (const r of report.runs) console.log(`| diffusion ELBO, ${r.manifest.split('/').slice(-2).join('/')} | ${f(r.elboPpl)} | ${f(r.elboPpl / arPpl)} |`)
for (const r of report.runs) {
  console.log(`\n${r.manifest.split('/').slice(-2).join('/')}: probe → ${JSON.stringify(r.probe)}\n`)
  console.log('| decoding | gen. perplexity (AR-scored) | distinct-2 | tokens/step | forward passes/token | tokens/s |')
  console.log('|---|---:|---:|---:|---:|---:|')
  const a = report.ar
  console.log(`| ${a.setting} | ${f(a.genPpl)} | ${f(a.distinct2)} | 1.00 | 1.00 | ${f(a.tokPerSec, 1)} |`)
  for (const x of r.rows) console.log(`| ${x.setting} | ${f(x.genPpl)} | ${f(x.distinct2)} | ${f(x.tokensPerStep)} | ${f(x.passesPerToken)} | ${f(x.tokPerSec, 1)} |`)
}
if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2))
