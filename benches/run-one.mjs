// One measurement in a fresh process, so load time and peak RSS are clean.
// Usage: node benches/run-one.mjs <ruvllm|llamacpp> <model.gguf> <threads> <promptTokens> <newTokens>
// Prints one JSON line: { runtime, threads, loadMs, ttftMs, prefillTps, decodeTps, peakRssMb, tokens }.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { performance } from 'node:perf_hooks'
import { promptTokens } from './prompt.mjs'

const [runtime, modelPath, threadsArg, promptLenArg, newArg] = process.argv.slice(2)
const threads = Number(threadsArg)
const promptLen = Number(promptLenArg)
const nNew = Number(newArg)
const contextSize = 1024

function peakRssMb() {
  const m = readFileSync('/proc/self/status', 'utf8').match(/VmHWM:\s+(\d+) kB/)
  return m ? Number(m[1]) / 1024 : NaN
}

async function runOurs() {
  const require = createRequire(import.meta.url)
  const { LLM } = require('../index.js')
  const t0 = performance.now()
  const llm = await LLM.load(modelPath, { contextSize, threads })
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

async function runLlamaCpp() {
  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
  const t0 = performance.now()
  const model = await llama.loadModel({ modelPath })
  const ctx = await model.createContext({ contextSize, threads, batchSize: 512, sequences: 1 })
  const loadMs = performance.now() - t0
  const seq = ctx.getSequence()
  const tokens = promptTokens((t) => [model.tokens.bos, ...model.tokenize(t)], (ids) => model.detokenize(ids), promptLen, model.fileInfo?.tensorInfo ? undefined : undefined)
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

const res = runtime === 'ruvllm' ? await runOurs() : await runLlamaCpp()
console.log(JSON.stringify({ runtime, threads, promptLen, ...res, tokens: res.tokens.slice(0, 16), peakRssMb: peakRssMb() }))
