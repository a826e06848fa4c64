// llama.cpp as the oracle (through node-llama-cpp's prebuilt binaries, a dev dependency):
// our greedy token ids equal llama.cpp's for the first 32 tokens, and our tokenizer equals
// llama.cpp's, on the same prompts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { LLM, modelPath, type LLMType } from './helpers.js'

// The reference set of crates/ruvllm-core/tests/gemma3_real.rs: prompts on which llama.cpp
// agrees with itself across its attention paths for 32 greedy tokens (greedy decoding of this
// small model is numerically fragile: on other prompts llama.cpp's flash and plain attention
// disagree with each other at near-ties).
const PROMPTS = [
  "The capital of France is Paris. The capital of Germany is",
  "def fibonacci(n):",
  "The quick brown fox",
  "1, 2, 3, 4, 5,",
  "The capital of France is",
  "Water boils at a temperature of",
  "Monday, Tuesday, Wednesday,",
  "The chemical symbol for gold is",
  "<html>\n<head>\n<title>",
  "Twinkle, twinkle, little star,",
]
const N = 32

interface Reference {
  prompt: string
  promptTokens: number[]
  greedy: number[]
}

let llm: LLMType
let reference: Reference[] = []

beforeAll(async () => {
  // llama.cpp first, then our engine, so the two never compete for the cores. One llama.cpp
  // thread: its spinning workers crawl on a busy 2-core machine, and greedy ids do not depend
  // on the thread count.
  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as any })
  const model = await llama.loadModel({ modelPath: modelPath() })
  const ctx = await model.createContext({ contextSize: 256, threads: 1 })
  try {
    const seq = ctx.getSequence()
    for (const prompt of PROMPTS) {
      await seq.clearHistory()
      const promptTokens = [model.tokens.bos!, ...model.tokenize(prompt)]
      const greedy: number[] = []
      for await (const t of seq.evaluate(promptTokens, { temperature: 0 })) {
        greedy.push(t)
        if (greedy.length >= N) break
      }
      reference.push({ prompt, promptTokens: promptTokens.map(Number), greedy: greedy.map(Number) })
    }
  } finally {
    await ctx.dispose()
    await model.dispose()
    await llama.dispose()
  }
  llm = await LLM.load(modelPath(), { contextSize: 256 })
}, 900_000)

afterAll(async () => {
  await llm?.close()
})

describe('llama.cpp oracle (Gemma 3 270M Q4_K_M)', () => {
  it('tokenizes every prompt exactly as llama.cpp does (BOS included)', () => {
    expect(reference.length).toBe(PROMPTS.length)
    for (const r of reference) expect(llm.tokenize(r.prompt), r.prompt).toEqual(r.promptTokens)
  })

  // Our KV cache is f16 like llama.cpp's, but our kernels round differently (8-bit activations
  // per block, f32 accumulation), so rare late divergences at near-ties remain possible: as the
  // Rust test, we demand the first 4 tokens on every prompt and all 32 on at least 7 (the issue
  // asks for at least 5).
  it(`greedy token ids equal llama.cpp's for the first ${N} tokens on at least 7 of ${PROMPTS.length} prompts`, async () => {
    const eos = new Set([1, 106]) // <eos>, <end_of_turn>
    const report: string[] = []
    let exact = 0
    for (const r of reference) {
      const out = await llm.generate(r.prompt, { temperature: 0, maxTokens: N })
      let at = out.tokens.findIndex((t, i) => t !== r.greedy[i])
      if (at < 0 && out.tokens.length < N) {
        // We stop at end-of-generation tokens; llama.cpp's evaluate() runs on through them.
        if (!(out.finishReason === 'stop' && eos.has(r.greedy[out.tokens.length]))) at = out.tokens.length
      }
      if (at < 0) {
        exact++
        continue
      }
      report.push(
        `${JSON.stringify(r.prompt)} first differs at token ${at}: ours ${out.tokens[at]} ${JSON.stringify(llm.detokenize(out.tokens.slice(at, at + 1)))}, ` +
          `llama.cpp ${r.greedy[at]} ${JSON.stringify(llm.detokenize(r.greedy.slice(at, at + 1)))}, after ${JSON.stringify(llm.detokenize(out.tokens.slice(0, at)))}`,
      )
      expect.soft(at, report.at(-1)).toBeGreaterThanOrEqual(4)
    }
    console.log(`${exact}/${reference.length} prompts equal llama.cpp for ${N} tokens${report.length ? '; ' + report.join('; ') : ''}`)
    expect(exact, report.join('\n')).toBeGreaterThanOrEqual(7)
  })
})
