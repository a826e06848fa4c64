// Continuous batching and the prefix cache from JS: requests decoded together stream what they
// stream alone, a repeated system prompt comes from the cache (usage.cachedTokens) with the
// same output as a fresh evaluation, and one request's abort leaves the others untouched.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { LLM, modelPath, type LLMType } from './helpers.js'

const SYSTEM = 'You are a helpful assistant who answers in one short sentence. '.repeat(12)
let llm: LLMType

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024, parallel: 4, prefixCacheMb: 64 })
})

afterAll(async () => {
  await llm?.close()
})

describe('batching', () => {
  it('a repeated system prompt is taken from the prefix cache and gives the same tokens', async () => {
    const fresh = await LLM.load(modelPath(), { contextSize: 1024, prefixCacheMb: 0 })
    const prompt = `${SYSTEM}Q: What colour is the sky?\nA:`
    const want = await fresh.generate(prompt, { temperature: 0, maxTokens: 12 })
    await fresh.close()
    expect(want.usage.cachedTokens).toBe(0)

    const first = await llm.generate(`${SYSTEM}Q: What is two plus two?\nA:`, { temperature: 0, maxTokens: 4 })
    expect(first.usage.cachedTokens).toBe(0)
    const second = await llm.generate(prompt, { temperature: 0, maxTokens: 12 })
    const shared = llm.tokenize(SYSTEM).length
    expect(second.usage.cachedTokens).toBeGreaterThanOrEqual(shared - 2)
    expect(second.usage.cachedTokens).toBeLessThan(second.usage.promptTokens)
    expect(second.tokens).toEqual(want.tokens)
  })

  it('aborting one of several concurrent streams leaves the others as they are alone', async () => {
    const prompts = ['The capital of Italy is', 'A haiku about rain:', 'def add(a, b):']
    const alone = []
    for (const p of prompts) alone.push(await llm.generate(p, { temperature: 0, maxTokens: 16 }))
    const ctl = new AbortController()
    const doomed = (async () => {
      let n = 0
      try {
        for await (const _ of llm.stream('Count to one hundred: 1, 2, 3,', { temperature: 0, maxTokens: 200, signal: ctl.signal })) {
          if (++n === 3) ctl.abort()
        }
      } catch (e: any) {
        return e.name
      }
      return 'finished'
    })()
    const together = await Promise.all(prompts.map((p) => llm.generate(p, { temperature: 0, maxTokens: 16 })))
    expect(await doomed).toBe('AbortError')
    together.forEach((c, i) => expect(c.tokens).toEqual(alone[i].tokens))
  })
})
