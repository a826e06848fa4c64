// One measurement in a fresh process, so load time and peak RSS are clean.
// Usage: node benches/run-one.mjs <ruvllm|llamacpp> <model.gguf> <threads> <promptTokens> <newTokens>
// Prints one JSON line: { runtime, threads, loadMs, ttftMs, prefillTps, decodeTps, peakRssMb, tokens }.
// RUVLLM_KV_CACHE_TYPE=q8_0 (or f32) loads ours with that kvCacheType.
// With <newTokens> = "ppl": the perplexity of the first <promptTokens> tokens of Hamlet
// (benches/text.mjs) instead: { runtime, threads, perplexity, tokens: n }.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'
import { promptTokens } from './prompt.mjs'
import { hamlet } from './text.mjs'

const [runtime, modelPath, threadsArg, promptLenArg, newArg] = process.argv.slice(2)
const threads = Number(threadsArg)
const promptLen = Number(promptLenArg)
const nNew = Number(newArg)
// Room for the prompt and the new tokens (long-context races: --prompts 8192).
const contextSize = Math.max(1024, promptLen + (Number.isFinite(nNew) ? nNew : 0) + 16)

function peakRssMb() {
  const m = readFileSync('/proc/self/status', 'utf8').match(/VmHWM:\s+(\d+) kB/)
  return m ? Number(m[1]) / 1024 : NaN
}

async function runOurs() {
  const require = createRequire(import.meta.url)
  const { LLM } = require('../index.js')
  const t0 = performance.now()
  const kvCacheType = process.env.RUVLLM_KV_CACHE_TYPE || undefined
  const llm = await LLM.load(modelPath, { contextSize, threads, kvCacheType })
  const loadMs = performance.now() - t0
  const tokens = promptTokens(llm.tokenize.bind(llm), llm.detokenize.bind(llm), promptLen, llm.info.vocabSize)
  const out = await llm.generate(tokens, { maxTokens: nNew, temperature: 0 })
  if (out.tokens.length !== nNew) throw new Error(`ruvllm stopped after ${out.tokens.length} tokens`)
  const res = {
    loadMs,
    ttftMs: out.timings.ttftMs,
    prefillTps: out.timings.prefillTokensPerSecond,
    decodeTps: out.timings.decodeTokensPerSecond,
    tokens: out.tokens,
  }
  llm.close()
  return res
}

/** The BOS token where the model's file asks for one (`tokenizer.ggml.add_bos_token`), as our
 * `llm.tokenize` does: Qwen2.5 and SmolLM2 have none, so an unconditional BOS would give
 * llama.cpp a different (shifted) prompt from ours. */
function bosOf(model) {
  return model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : []
}

async function runLlamaCpp() {
  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
  const t0 = performance.now()
  const model = await llama.loadModel({ modelPath })
  const ctx = await model.createContext({ contextSize, threads, batchSize: 512, sequences: 1 })
  const loadMs = performance.now() - t0
  const seq = ctx.getSequence()
  const tokens = promptTokens((t) => [...bosOf(model), ...model.tokenize(t)], (ids) => model.detokenize(ids), promptLen)
  const ids = []
  const start = performance.now()
  let first = 0
  for await (const t of seq.evaluate(tokens, { temperature: 0 })) {
    if (ids.length === 0) first = performance.now()
    ids.push(t)
    if (ids.length >= nNew) break
  }
  const end = performance.now()
  const res = {
    loadMs,
    ttftMs: first - start,
    prefillTps: tokens.length / ((first - start) / 1000),
    decodeTps: (ids.length - 1) / ((end - first) / 1000),
    tokens: ids,
  }
  await ctx.dispose()
  await model.dispose()
  return res
}

/** Hamlet's first `promptLen` tokens (any BOS first) with this runtime's tokenizer. */
function pplTokens(tokenize) {
  const ids = tokenize(hamlet().slice(0, promptLen * 8))
  if (ids.length < promptLen) throw new Error('text too short')
  return Array.from(ids.slice(0, promptLen))
}

async function pplOurs() {
  const require = createRequire(import.meta.url)
  const { LLM } = require('../index.js')
  const llm = await LLM.load(modelPath, { contextSize: Math.max(contextSize, promptLen), threads })
  const tokens = pplTokens((t) => llm.tokenize(t))
  const r = await llm.score(tokens)
  await llm.close()
  return { perplexity: r.perplexity, tokens: tokens.length, first: tokens.slice(0, 8) }
}

async function pplLlamaCpp() {
  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
  const model = await llama.loadModel({ modelPath })
  const ctx = await model.createContext({ contextSize: Math.max(contextSize, promptLen), threads, batchSize: 512, sequences: 1 })
  const tokens = pplTokens((t) => [...bosOf(model), ...model.tokenize(t)])
  // Full next-token distributions (temperature 0 leaves them unmodified), a few positions per
  // call on the same sequence so that only a few vocabulary-sized maps are alive at once.
  const seq = ctx.getSequence()
  let sum = 0
  const CHUNK = 8
  for (let c = 0; c < tokens.length; c += CHUNK) {
    const part = tokens.slice(c, c + CHUNK)
    const input = part.map((t, j) => (c + j + 1 < tokens.length ? [t, { generateNext: { probabilities: true, options: { temperature: 0 } } }] : t))
    const out = await seq.controlledEvaluate(input)
    for (let j = 0; j < part.length && c + j + 1 < tokens.length; j++) {
      const p = out[j]?.next?.probabilities?.get(tokens[c + j + 1])
      if (!(p > 0)) throw new Error(`llama.cpp gave no probability at ${c + j}`)
      sum += Math.log(p)
    }
  }
  await ctx.dispose()
  await model.dispose()
  return { perplexity: Math.exp(-sum / (tokens.length - 1)), tokens: tokens.length, first: tokens.slice(0, 8) }
}

if (newArg === 'ppl') {
  const res = runtime === 'ruvllm' ? await pplOurs() : await pplLlamaCpp()
  console.log(JSON.stringify({ runtime, threads, ...res }))
} else {
  const res = runtime === 'ruvllm' ? await runOurs() : await runLlamaCpp()
  console.log(JSON.stringify({ runtime, threads, promptLen, ...res, tokens: res.tokens.slice(0, 16), peakRssMb: peakRssMb() }))
}
