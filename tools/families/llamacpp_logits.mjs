#!/usr/bin/env node
// llama.cpp's next-token LOG-PROBABILITIES for every position of a token sequence, through
// node-llama-cpp (the repo's node_modules), full vocabulary, as little-endian f32 [N][vocab].
//
//   node tools/families/llamacpp_logits.mjs MODEL.gguf TOKENS.bin OUT.f32 [--kv f16|f32] [--ctx N]
//       [--threads N] [--flash auto|on|off] [--out-logits RAW.f32]
//
// Row i is log p(next | tokens[0..i]). The log-probabilities are a float64 log-softmax of the raw
// logits that llama.cpp returns (generateNext.logits: true, no sampler options, so no top-k,
// temperature, penalties or bias touch them). As a check, the sampler's own probabilities
// (generateNext.probabilities at temperature 0) are read too: they must cover the whole vocabulary,
// sum to 1 and match the softmax of the logits; the script prints both checks.
// --kv f32 (default) keeps the K/V cache in f32 so that an f32 GGUF is compared without the f16
// cache rounding that llama.cpp has by default; --kv f16 is llama.cpp's default.
// --ctx (default 128) is the context size: it matters for phi3 longrope, where llama.cpp uses the
// long factors iff the context (n_ctx_seq) > rope.scaling.original_context_length.
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
const argv = process.argv.slice(2)
const opt = (name, def) => {
  const i = argv.indexOf(name)
  if (i < 0) return def
  const v = argv[i + 1]
  argv.splice(i, 2)
  return v
}
const kv = opt('--kv', 'f32').toUpperCase()
const ctxSize = Number(opt('--ctx', '128'))
const threads = Number(opt('--threads', '1'))
const flash = opt('--flash', 'off')
const rawOut = opt('--out-logits', null)
const [modelPath, tokensPath, outPath] = argv
if (!outPath) {
  console.error('usage: llamacpp_logits.mjs MODEL.gguf TOKENS.bin OUT.f32 [--kv f16|f32] [--ctx N] [--threads N]')
  process.exit(2)
}

const nlcPath = process.env.NODE_LLAMA_CPP ?? path.join(here, '..', '..', 'node_modules', 'node-llama-cpp', 'dist', 'index.js')
const { getLlama } = await import(pathToFileURL(nlcPath).href)

const buf = fs.readFileSync(tokensPath)
const tokens = Array.from(new Uint32Array(buf.buffer, buf.byteOffset, buf.length / 4))
const N = tokens.length

const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
const model = await llama.loadModel({ modelPath })
const vocab = model.tokens.length ?? model.fileInfo?.metadata?.tokenizer?.ggml?.tokens?.length
const ctx = await model.createContext({
  contextSize: Math.max(ctxSize, N + 16), // room to spare: a full context would make node-llama-cpp shift it
  batchSize: 512,
  sequences: 1,
  threads,
  flashAttention: flash === 'auto' ? 'auto' : flash === 'on',
  experimentalKvCacheKeyType: kv,
  experimentalKvCacheValueType: kv,
})
const seq = ctx.getSequence()
const input = tokens.map((t) => [t, { generateNext: { logits: true, probabilities: true, options: { temperature: 0 } } }])
const res = await seq.controlledEvaluate(input)

const out = new Float32Array(N * vocab)
const raw = rawOut ? new Float32Array(N * vocab) : null
let worstSum = 0
let worstProbDiff = 0
let minCount = Infinity
for (let i = 0; i < N; i++) {
  const logits = res[i]?.next?.logits
  const probs = res[i]?.next?.probabilities
  if (!logits || logits.size !== vocab) throw new Error(`position ${i}: got ${logits?.size} logits, vocab ${vocab}`)
  const l = new Float64Array(vocab).fill(Number.NaN)
  for (const [tok, v] of logits) l[tok] = v
  if (l.some(Number.isNaN)) throw new Error(`position ${i}: missing logits`)
  let mx = -Infinity
  for (const v of l) mx = Math.max(mx, v)
  let s = 0
  for (const v of l) s += Math.exp(v - mx)
  const lse = mx + Math.log(s)
  for (let j = 0; j < vocab; j++) {
    out[i * vocab + j] = l[j] - lse
    if (raw) raw[i * vocab + j] = l[j]
  }
  // cross-check with the sampler's distribution
  let ps = 0
  minCount = Math.min(minCount, probs?.size ?? 0)
  for (const [tok, p] of probs ?? []) {
    ps += p
    worstProbDiff = Math.max(worstProbDiff, Math.abs(p - Math.exp(l[tok] - lse)))
  }
  worstSum = Math.max(worstSum, Math.abs(ps - 1))
}
fs.writeFileSync(outPath, Buffer.from(out.buffer))
if (raw) fs.writeFileSync(rawOut, Buffer.from(raw.buffer))
console.log(JSON.stringify({
  model: modelPath, n_tokens: N, vocab, written: 'log-probabilities f32 [N][vocab]', kv_cache: kv, context: ctx.contextSize,
  sampler_probabilities: { min_entries: minCount, max_abs_sum_minus_1: worstSum, max_abs_diff_vs_softmax_logits: worstProbDiff },
}))
await ctx.dispose()
await model.dispose()
