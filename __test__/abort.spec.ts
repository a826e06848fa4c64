// Cancellation: AbortSignal on generate and stream (running and already aborted), and leaving a
// for-await loop early.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { CAPITALS, LLM, modelPath, rejectsWithCode, type LLMType } from './helpers.js'

let llm: LLMType

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024 })
})

afterAll(async () => {
  await llm?.close()
})

function expectAbortError(e: any) {
  expect(e).toBeInstanceOf(Error)
  expect(e.name).toBe('AbortError')
  expect(e.code).toBe('ABORT_ERR')
}

describe('abort', () => {
  it('aborting mid-stream throws AbortError from the loop within a token', async () => {
    const controller = new AbortController()
    const seen: number[] = []
    let caught: any
    let tokensAfterAbort = 0
    try {
      for await (const chunk of llm.stream('Once upon a time', { maxTokens: 200, seed: 1, signal: controller.signal })) {
        if (controller.signal.aborted) tokensAfterAbort++
        seen.push(chunk.token)
        if (seen.length === 5) controller.abort()
      }
    } catch (e) {
      caught = e
    }
    expectAbortError(caught)
    expect(tokensAfterAbort).toBe(0)
    expect(seen.length).toBe(5)
    expect(caught.partial.tokens).toEqual(seen)
  })

  it('aborting a running generate rejects with AbortError carrying the partial output', async () => {
    const controller = new AbortController()
    const seen: number[] = []
    const t0 = Date.now()
    const err = await rejectsWithCode(
      llm.generate('Once upon a time', {
        maxTokens: 200,
        seed: 1,
        signal: controller.signal,
        onToken: (c) => {
          seen.push(c.token)
          if (seen.length === 4) controller.abort()
        },
      }),
      'ABORT_ERR',
    )
    expectAbortError(err)
    expect(err.partial.tokens.slice(0, 4)).toEqual(seen.slice(0, 4))
    expect(typeof err.partial.text).toBe('string')
    expect(Date.now() - t0).toBeLessThan(30_000)
    // An abort from a timer (no callback involved) works too.
    const c2 = new AbortController()
    setTimeout(() => c2.abort(), 300)
    expectAbortError(await rejectsWithCode(llm.generate('Once upon a time', { maxTokens: 1000, signal: c2.signal }), 'ABORT_ERR'))
  })

  it('an already-aborted signal rejects at once, without generating', async () => {
    const signal = AbortSignal.abort()
    const t0 = performance.now()
    const err = await rejectsWithCode(llm.generate(CAPITALS, { signal }), 'ABORT_ERR')
    expectAbortError(err)
    expect(performance.now() - t0).toBeLessThan(50)
    let chunks = 0
    const err2 = await rejectsWithCode(async () => {
      for await (const _ of llm.stream(CAPITALS, { signal })) chunks++
    }, 'ABORT_ERR')
    expectAbortError(err2)
    expect(chunks).toBe(0)
  })

  it('breaking out of for-await cancels the generation', async () => {
    const stream = llm.stream('Once upon a time', { maxTokens: 1000, seed: 3 })
    let n = 0
    for await (const _ of stream) {
      if (++n === 3) break
    }
    expect(n).toBe(3)
    expect(stream.completion).toBeNull()
    // The engine is free again at once: a short greedy request finishes quickly and correctly.
    const t0 = Date.now()
    const out = await llm.generate(CAPITALS, { temperature: 0, maxTokens: 2 })
    expect(out.text.startsWith(' Berlin')).toBe(true)
    expect(Date.now() - t0).toBeLessThan(20_000)
  })

  it('a signal shared by many requests does not collect listeners', async () => {
    const controller = new AbortController()
    for (let i = 0; i < 12; i++) await llm.generate(CAPITALS, { temperature: 0, maxTokens: 1, signal: controller.signal })
    // Listener removal is asynchronous (it runs on the JS thread after the request ends).
    await new Promise((r) => setTimeout(r, 50))
    const { getEventListeners } = await import('node:events')
    expect(getEventListeners(controller.signal, 'abort').length).toBe(0)
  })
})
