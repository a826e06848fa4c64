// The masked-diffusion model against the autoregressive one it was converted from, on one
// backend (`--gpu cuda` or the CPU), in one run:
//   - held-out likelihood: the diffusion model's ELBO perplexity (Monte Carlo over the mask
//     ratio, fixed seed) vs the AR model's perplexity, on the same held-out sequences (the split
//     of training/prepare_data.mjs: never trained on; `--sequences 0` skips it);
//   - per decoding setting and temperature (greedy and 0.7): tokens/s of the diffusion model and
//     of the AR model (its run just before, same prompts), generative perplexity (the AR model
//     scores prompt + answer with `llm.score`, answer tokens only), distinct-2 and distinct-3,
//     tokens per step and forward passes per token;
//   - a fact probe (capitals, chemical symbols, authors: none of them in the distillation
//     prompts), greedy, for both models: a hit is the expected word in the first 12 tokens.
// Each adapter set is given by a manifest (default: the shipped gemma-3-270m-diffusion); more
// than one (`--manifest a.json --manifest b.json`) compares them (TALoRA vs one LoRA).
//
//   npx ruvllm bench diffusion [--manifest m.json ...] [--gpu cuda] [--sequences 16] [--samples 8] [--answers 12]
//       [--blocks 4,8] [--thresholds 0.9] [--temperatures 0,0.7] [--threads 2] [--json out.json]
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
    gpu: { type: 'string', default: 'off' },
    sequences: { type: 'string', default: '16' },
    samples: { type: 'string', default: '8' },
    answers: { type: 'string', default: '12' },
    tokens: { type: 'string', default: '128' },
    threads: { type: 'string', default: '2' },
    blocks: { type: 'string', default: '4,8' },
    thresholds: { type: 'string', default: '0.9' },
    temperatures: { type: 'string', default: '0,0.7' },
    'no-repeat': { type: 'string', default: '0' },
    json: { type: 'string' },
  },
})
const list = (s) => s.split(',').filter(Boolean).map(Number)
const SHIPPED = join(root, 'crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/manifest.json')
const manifests = values.manifest ?? [SHIPPED]
const base = values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
const threads = Number(values.threads)
const [nSeq, nSamples, nAnswers, nTokens] = [values.sequences, values.samples, values.answers, values.tokens].map(Number)

// Held-out sequences: the split of the conversion pipeline (built on first use).
// Evenly spaced over the held-out set; each sequence cut to 256 tokens to keep a run short.
const SEQ = 256
function heldOut() {
  const heldout = join(root, 'training/data/heldout.bin')
  if (!existsSync(heldout)) execFileSync(process.execPath, [join(root, 'training/prepare_data.mjs'), '--gguf', base], { stdio: 'inherit' })
  const meta = JSON.parse(readFileSync(join(root, 'training/data/meta.json'), 'utf8'))
  const seqLen = meta.seq ?? 512
  const all = new Uint32Array(readFileSync(heldout).buffer.slice(0))
  const total = Math.floor(all.length / seqLen)
  const at = (i) => Math.floor((i * total) / nSeq) * seqLen
  return Array.from({ length: Math.min(nSeq, total) }, (_, i) => Array.from(all.subarray(at(i), at(i) + SEQ)))
}
const sequences = nSeq > 0 ? heldOut() : []

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
// Greedy facts, one worked example first; none of these is among the distillation prompts.
const FACTS = [
  ['The capital of France is Paris. The capital of Japan is', 'Tokyo'],
  ['The capital of France is Paris. The capital of Italy is', 'Rome'],
  ['The capital of France is Paris. The capital of Spain is', 'Madrid'],
  ['The capital of France is Paris. The capital of Egypt is', 'Cairo'],
  ['The capital of France is Paris. The capital of Russia is', 'Moscow'],
  ['The capital of France is Paris. The capital of Greece is', 'Athens'],
  ['Oxygen has the chemical symbol O. Iron has the chemical symbol', 'Fe'],
  ['Oxygen has the chemical symbol O. Sodium has the chemical symbol', 'Na'],
  ['Oxygen has the chemical symbol O. Silver has the chemical symbol', 'Ag'],
  ['Oxygen has the chemical symbol O. Copper has the chemical symbol', 'Cu'],
  ['Hamlet was written by William Shakespeare. Pride and Prejudice was written by', 'Austen'],
  ['Hamlet was written by William Shakespeare. Moby-Dick was written by', 'Melville'],
  ['Hamlet was written by William Shakespeare. War and Peace was written by', 'Tolstoy'],
  ['Hamlet was written by William Shakespeare. Oliver Twist was written by', 'Dickens'],
  ['Hamlet was written by William Shakespeare. Don Quixote was written by', 'Cervantes'],
  ['Hamlet was written by William Shakespeare. The Odyssey was written by', 'Homer'],
]
const noRepeat = Number(values['no-repeat'])
const SETTINGS = [
  ['1 token/step, block 32', { steps: nTokens, blockSize: 32 }],
  ...list(values.blocks).flatMap((b) => list(values.thresholds).map((t) => [`τ = ${t}, block ${b}`, { threshold: t, blockSize: b }])),
].map(([name, d]) => [name, noRepeat ? { ...d, noRepeatNgram: noRepeat } : d])
const TEMPS = list(values.temperatures)
const gpu = values.gpu === 'cuda' ? 'cuda' : false

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length)
function distinct(tokenLists, n) {
  const all = new Set()
  let count = 0
  for (const t of tokenLists) for (let i = 0; i + n <= t.length; i++, count++) all.add(t.slice(i, i + n).join(','))
  return count ? all.size / count : 0
}
/** Completions of every prompt with `opts`, the tokens/s over the wall time of all of them. */
async function answers(llm, prompts, opts) {
  const t0 = performance.now()
  const outs = []
  for (let i = 0; i < prompts.length; i++) outs.push(await llm.generate(prompts[i], { maxTokens: nTokens, ...opts, seed: 1000 + i }))
  const secs = (performance.now() - t0) / 1000
  return { outs, tokPerSec: outs.reduce((n, c) => n + c.tokens.length, 0) / secs }
}
async function facts(llm, diffusion) {
  let hits = 0
  const texts = []
  for (const [p, want] of FACTS) {
    const c = await llm.generate(p, { maxTokens: 12, temperature: 0, ...(diffusion ? { diffusion: {} } : {}) })
    texts.push(c.text)
    if (new RegExp(`\\b${want}\\b`).test(c.text)) hits++
  }
  return { hits, of: FACTS.length, texts }
}

const ar = await LLM.load(base, { contextSize: 1024, threads, gpu })
/** Generative perplexity: the AR model's perplexity of the answer tokens after the prompt. */
async function genPpl(prompt, answer) {
  const p = ar.tokenize(prompt)
  if (answer.length === 0) return NaN
  const s = await ar.score([...p, ...answer])
  const lps = s.logprobs.slice(p.length - 1)
  return Math.exp(-mean(lps))
}
async function quality(outs) {
  const ppls = []
  for (let i = 0; i < outs.length; i++) ppls.push(await genPpl(PROMPTS[i], outs[i].tokens))
  const toks = outs.map((c) => c.tokens)
  return { genPpl: median(ppls.filter(Number.isFinite)), distinct2: distinct(toks, 2), distinct3: distinct(toks, 3), meanTokens: mean(toks.map((t) => t.length)) }
}

const report = { date: new Date().toISOString(), cpu: cpus()[0].model, gpu, threads, sequences: sequences.length, samples: nSamples, tokens: nTokens, answers: PROMPTS.length, runs: [] }
const arPpl = sequences.length ? Math.exp(mean(await Promise.all(sequences.map(async (s) => Math.log((await ar.score(s)).perplexity))))) : NaN
report.ar = { facts: await facts(ar, false), byTemperature: {} }
for (const temperature of TEMPS) {
  const { outs } = await answers(ar, PROMPTS, { temperature })
  report.ar.byTemperature[temperature] = await quality(outs)
}

for (const manifest of manifests) {
  const dm = await LLM.load(base, { contextSize: 1024, threads, gpu, diffusion: { adapter: manifest } })
  const run = { manifest, rows: [] }
  // Held-out ELBO, the same sequences as the AR perplexity.
  const nll = []
  for (const s of sequences) nll.push(Math.log((await dm.score(s, { elbo: { samples: nSamples, seed: 1 } })).perplexity))
  run.elboPpl = sequences.length ? Math.exp(mean(nll)) : NaN
  run.facts = await facts(dm, true)
  for (const temperature of TEMPS) {
    for (const [name, d] of SETTINGS) {
      // The AR model's speed just before, on the same prompts and temperature.
      const a = await answers(ar, PROMPTS, { temperature })
      const r = await answers(dm, PROMPTS, { temperature, diffusion: d })
      const toks = r.outs.reduce((n, c) => n + c.tokens.length, 0)
      const passes = r.outs.reduce((n, c) => n + c.diffusion.forwardPasses, 0)
      const steps = r.outs.reduce((n, c) => n + c.diffusion.steps, 0)
      run.rows.push({
        setting: name,
        temperature,
        ...(await quality(r.outs)),
        tokensPerStep: toks / Math.max(1, steps),
        passesPerToken: passes / Math.max(1, toks),
        tokPerSec: r.tokPerSec,
        arTokPerSec: a.tokPerSec,
        sample: r.outs[0].text.slice(0, 160),
      })
    }
  }
  await dm.close()
  report.runs.push(run)
}
await ar.close()
report.arPpl = arPpl

const f = (x, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '–')
const where = gpu ? 'CUDA' : `CPU: ${report.cpu}, ${threads} threads`
console.log(`${where}; ${sequences.length} held-out sequences of ${SEQ} tokens, ${nSamples} ELBO samples each; ${PROMPTS.length} prompts × ${nTokens} tokens\n`)
if (sequences.length) {
  console.log('| model | held-out perplexity | vs AR |')
  console.log('|---|---:|---:|')
  console.log(`| autoregressive (base) | ${f(arPpl)} | 1.00 |`)
  for (const r of report.runs) console.log(`| diffusion ELBO, ${r.manifest.split('/').slice(-2).join('/')} | ${f(r.elboPpl)} | ${f(r.elboPpl / arPpl)} |\n`)
}
console.log(`fact probe, greedy: AR ${report.ar.facts.hits}/${report.ar.facts.of}`)
for (const r of report.runs) console.log(`fact probe, greedy, diffusion at its defaults (τ = 0.9, blocks of 4) (${r.manifest.split('/').slice(-2).join('/')}): ${r.facts.hits}/${r.facts.of}`)
for (const r of report.runs) {
  console.log(`\n${r.manifest.split('/').slice(-2).join('/')}\n`)
  console.log('| decoding | temperature | gen. ppl (vs AR) | distinct-2 (vs AR) | distinct-3 (vs AR) | tokens/step | passes/token | tok/s: diffusion / AR | ratio |')
  console.log('|---|---:|---:|---:|---:|---:|---:|---:|---:|')
  for (const t of TEMPS) {
    const a = report.ar.byTemperature[t]
    console.log(`| autoregressive | ${t} | ${f(a.genPpl)} | ${f(a.distinct2)} | ${f(a.distinct3)} | – | 1.00 | – | – |`)
    for (const x of r.rows.filter((x) => x.temperature === t)) {
      console.log(`| ${x.setting} | ${t} | ${f(x.genPpl)} (${f(x.genPpl / a.genPpl)}×) | ${f(x.distinct2)} (${f(x.distinct2 / a.distinct2)}×) | ${f(x.distinct3)} (${f(x.distinct3 / a.distinct3)}×) | ${f(x.tokensPerStep)} | ${f(x.passesPerToken)} | ${f(x.tokPerSec, 1)} / ${f(x.arTokPerSec, 1)} | ${f(x.tokPerSec / x.arTokPerSec)} |`)
    }
  }
}
if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2))
