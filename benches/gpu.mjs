// The JavaScript API on the GPU (run by scripts/gpu-check.sh on the GPU machine): load with
// gpu: 'cuda' and gpu: false, greedy 32 tokens on three prompts on both (where the two part,
// the position is printed: examples/gpu_check.rs shows such partings are near-ties), streaming
// from the GPU, and decode speed as the API reports it. Fails when the GPU gives no text.
// With RUVLLM_CUDA_EXACT=1 RUVLLM_FORCE_SCALAR=1 (the CUDA reference mode against the CPU's
// scalar path, `scripts/gpu-check.sh exact`) every greedy prompt and a sampled text must be equal.
// Usage: node benches/gpu.mjs MODEL.gguf
import { createRequire } from 'node:module'
const require = createRequire(import.meta.url)
const { LLM } = require('../index.js')

const exact = process.env.RUVLLM_CUDA_EXACT === '1'
const model = process.argv[2]
if (!model) throw new Error('usage: node benches/gpu.mjs MODEL.gguf')
const gpu = await LLM.load(model, { gpu: 'cuda', contextSize: 2048 })
// Median of 4 128-token greedy calls: the engine's decode rate (`timings`), or the wall-clock
// rate of the whole call as the caller sees it (prefill, the promise, the event loop included)
// through `generate`, `generate` with `onToken`, or `stream`.
async function decodeSpeed(how) {
  const speeds = []
  const opts = { maxTokens: 128, temperature: 0, stop: [] }
  for (let i = 0; i < 4; i++) {
    const t0 = performance.now()
    let tokens
    if (how === 'stream') {
      tokens = 0
      for await (const _ of gpu.stream('Once upon a time', opts)) tokens++
    } else {
      let seen = 0
      const r = await gpu.generate('Once upon a time', how === 'onToken' ? { ...opts, onToken: () => void seen++ } : opts)
      if (how === 'onToken' && seen !== r.tokens.length) throw new Error(`onToken saw ${seen} of ${r.tokens.length} tokens`)
      if (!how) {
        speeds.push(r.timings.decodeTokensPerSecond)
        continue
      }
      tokens = r.tokens.length
    }
    speeds.push(tokens / ((performance.now() - t0) / 1000))
  }
  speeds.sort((x, y) => x - y)
  return speeds[2]
}
const alone = await decodeSpeed()
const walls = []
for (const how of ['generate', 'onToken', 'stream']) walls.push(`${how} ${(await decodeSpeed(how)).toFixed(0)}`)
console.log(`js: 128-token greedy, tok/s by the wall clock: ${walls.join(', ')}; timings.decodeTokensPerSecond ${alone.toFixed(0)}`)
const cpu = await LLM.load(model, { gpu: false, contextSize: 2048 })
console.log(`js: gpu backend ${gpu.info.backend}; cpu backend ${cpu.info.backend}`)
const prompts = ['The capital of France is Paris. The capital of Germany is', 'def add(a, b):', 'The three primary colors are']
let same = 0
for (const p of prompts) {
  const a = await cpu.generate(p, { maxTokens: 32, temperature: 0 })
  const b = await gpu.generate(p, { maxTokens: 32, temperature: 0 })
  const eq = a.tokens.length === b.tokens.length && a.tokens.every((t, i) => t === b.tokens[i])
  same += eq ? 1 : 0
  const at = a.tokens.findIndex((t, i) => t !== b.tokens[i])
  console.log(`js: ${eq ? 'equal' : `part at token ${at}`} ${JSON.stringify(b.text)}`)
  if (!b.text) throw new Error('the GPU produced no text')
}
let streamed = ''
for await (const t of gpu.stream('Water boils at', { maxTokens: 16, temperature: 0 })) streamed += t.text
console.log(`js: streamed ${JSON.stringify(streamed)}`)
const withCpu = await decodeSpeed()
const sampled = await gpu.generate('Once upon a time', { maxTokens: 64, temperature: 0.8, seed: 1 })
console.log(`js: sampled (temperature 0.8) ${sampled.timings.decodeTokensPerSecond.toFixed(0)} tok/s`)
if (exact) {
  const onCpu = await cpu.generate('Once upon a time', { maxTokens: 64, temperature: 0.8, seed: 1 })
  const sampledEq = onCpu.text === sampled.text
  console.log(`js: reference mode: greedy equal ${same}/${prompts.length}, sampled text ${sampledEq ? 'equal' : 'DIFFERENT'} ${JSON.stringify(sampled.text)}`)
  if (same !== prompts.length || !sampledEq) throw new Error('the reference mode parted from the CPU path')
}
console.log(`js: decode ${alone.toFixed(0)} tok/s with the GPU model alone, ${withCpu.toFixed(0)} with a CPU model loaded too (median of 4, 128 tokens); equal ${same}/${prompts.length}`)
await cpu.close?.()
if (!exact) {
  // Concurrent generate calls (prompts of 32 tokens, 128 tokens each, no stop): every token over
  // the wall time from the first call to the last completion, median of 3 rounds after a warm-up.
  const many = await LLM.load(model, { gpu: 'cuda', contextSize: 2048, parallel: 16 })
  const words = 'alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon'.split(' ')
  const promptOf = (k) => Array.from({ length: 24 }, (_, i) => words[(i * 7 + k * 13) % words.length]).join(' ')
  for (const temperature of [0, 0.7]) {
    const cells = []
    for (const streams of [1, 4, 8, 16]) {
      const rates = []
      // Per request (rounds after the warm-up): JS wall from the call to its resolution, the
      // engine's time to first token and decode time; what is left is queueing and hand-off.
      const parts = { wall: [], ttft: [], decode: [], tokens: [] }
      for (let round = 0; round < 4; round++) {
        const t0 = performance.now()
        const done = await Promise.all(
          Array.from({ length: streams }, (_, s) =>
            many.generate(promptOf(round * 16 + s), { maxTokens: 128, temperature, seed: round, stop: [] }).then((c) => ({ c, ms: performance.now() - t0 }))
          )
        )
        const tokens = done.reduce((a, d) => a + d.c.tokens.length, 0)
        rates.push(tokens / ((performance.now() - t0) / 1000))
        if (round === 0) continue
        for (const { c, ms } of done) {
          parts.wall.push(ms)
          parts.tokens.push(c.tokens.length)
          parts.ttft.push(c.timings.ttftMs)
          parts.decode.push((1000 * (c.tokens.length - 1)) / c.timings.decodeTokensPerSecond)
        }
      }
      rates.shift()
      rates.sort((x, y) => x - y)
      const med = (xs) => xs.slice().sort((x, y) => x - y)[xs.length >> 1]
      cells.push(`${streams}: ${rates[1].toFixed(0)} (per request ms: wall ${med(parts.wall).toFixed(0)}, ttft ${med(parts.ttft).toFixed(1)}, decode ${med(parts.decode).toFixed(0)}; tokens min ${Math.min(...parts.tokens)})`)
    }
    console.log(`js: concurrent generate, ${temperature ? `temperature ${temperature}` : 'greedy'}, aggregate tok/s (wall) ${cells.join(' ')}`)
  }
  await many.close?.()
}
await gpu.close?.()
