// Several requests at once: each result equals the same request run alone.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { CAPITALS, LLM, modelPath, type LLMType } from './helpers.js'

let llm: LLMType

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024 })
})

afterAll(async () => {
  await llm?.close()
})

const REQUESTS = [
  { prompt: CAPITALS, opts: { temperature: 0, maxTokens: 16 } },
  { prompt: 'Once upon a time', opts: { temperature: 0.8, seed: 11, maxTokens: 24 } },
  { prompt: 'def fibonacci(n):', opts: { temperature: 0.7, topK: 20, seed: 5, maxTokens: 20 } },
  { prompt: 'Here is a list of fruits: apple, banana,', opts: { temperature: 1.0, topP: 0.9, seed: 99, maxTokens: 18 } },
]

describe('concurrency', () => {
  it('4 concurrent generate calls each equal their sequential result', async () => {
    const sequential = []
    for (const r of REQUESTS) sequential.push(await llm.generate(r.prompt, r.opts))
    const concurrent = await Promise.all(REQUESTS.map((r) => llm.generate(r.prompt, r.opts)))
    for (let i = 0; i < REQUESTS.length; i++) {
      expect(concurrent[i].text).toBe(sequential[i].text)
      expect(concurrent[i].tokens).toEqual(sequential[i].tokens)
    }
    expect(new Set(concurrent.map((c) => c.id)).size).toBe(4)
  })

  it('concurrent streams and generates interleave without mixing tokens', async () => {
    const expected = await Promise.all(REQUESTS.map((r) => llm.generate(r.prompt, r.opts)))
    const collect = async (r: (typeof REQUESTS)[number]) => {
      const toks: number[] = []
      for await (const c of llm.stream(r.prompt, r.opts)) toks.push(c.token)
      return toks
    }
    const got = await Promise.all([collect(REQUESTS[0]), llm.generate(REQUESTS[1].prompt, REQUESTS[1].opts).then((c) => c.tokens), collect(REQUESTS[2]), collect(REQUESTS[3])])
    got.forEach((toks, i) => expect(toks).toEqual(expected[i].tokens))
  })
})
