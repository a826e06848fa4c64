// llama.cpp as the oracle (through node-llama-cpp's prebuilt binaries, a dev dependency):
// our greedy token ids equal llama.cpp's for the first 32 tokens, and our tokenizer equals
// llama.cpp's, on the same prompts.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { LLM, modelPath, type LLMType } from './helpers.js'

const PROMPTS = [
  'The capital of France is Paris. The capital of Germany is',
  'Once upon a time',
  'def fibonacci(n):',
  'The quick brown fox',
  '1, 2, 3, 4, 5,',
  'Hello, my name is',
  'The capital of France is',
  'Water boils at a temperature of',
  'Here is a list of fruits: apple, banana,',
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

  it(`greedy token ids equal llama.cpp's for the first ${N} tokens on ${PROMPTS.length} prompts`, async () => {
    const eos = new Set([1, 106]) // <eos>, <end_of_turn>
    for (const r of reference) {
      const out = await llm.generate(r.prompt, { temperature: 0, maxTokens: N })
      if (out.tokens.length < N) {
        // We stop at end-of-generation tokens; llama.cpp's evaluate() runs on through them.
        expect.soft(out.finishReason).toBe('stop')
        expect.soft(eos.has(r.greedy[out.tokens.length]), r.prompt).toBe(true)
      }
      const at = out.tokens.findIndex((t, i) => t !== r.greedy[i])
      const where =
        at < 0
          ? ''
          : ` first differs at token ${at}: ours ${out.tokens[at]} ${JSON.stringify(llm.detokenize([out.tokens[at]]))}, ` +
            `llama.cpp ${r.greedy[at]} ${JSON.stringify(llm.detokenize([r.greedy[at]]))}, after ${JSON.stringify(llm.detokenize(out.tokens.slice(0, at)))}`
      expect.soft(out.tokens, `prompt ${JSON.stringify(r.prompt)}${where}`).toEqual(r.greedy.slice(0, out.tokens.length))
    }
  })
})
