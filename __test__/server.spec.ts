// The OpenAI-compatible server, driven by the official `openai` client over loopback: chat,
// streaming, completions, embeddings, models, errors, API key, limits, disconnects and close.
// Structured output (json_schema, tools) is checked against ajv and the tool's schema.
import OpenAI from 'openai'
import Ajv from 'ajv'
import { basename, join } from 'node:path'
import { spawn, spawnSync } from 'node:child_process'
import { Agent, request } from 'node:http'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { addon, LLM, modelPath, ROOT, templates, type LLMType } from './helpers.js'

const { createServer } = addon as any

// The test model is a base model without a chat template: serve chat with Gemma's own.
const chat = { chatTemplate: templates.gemma, stop: ['<end_of_turn>', '<start_of_turn>'] }

let llm: LLMType
let server: any
let client: OpenAI

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024 })
  server = await createServer({ model: llm, host: '127.0.0.1', port: 0, parallel: 2, maxQueue: 2, maxBodyBytes: 64 * 1024, name: 'gemma-test', ...chat })
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0 })
})

afterAll(async () => {
  await server?.close()
  llm?.close()
})

const health = async () => (await fetch(`${server.url}/health`)).json() as Promise<any>

async function waitIdle() {
  const t0 = Date.now()
  while ((await health()).running !== 0) {
    if (Date.now() - t0 > 5000) throw new Error('a request kept running after its client went away')
    await new Promise((r) => setTimeout(r, 20))
  }
}

/** The openai client's promise as a plain Promise: Bun's `expect(…).rejects` does not wait for its own promise class. */
const native = <T>(p: PromiseLike<T>): Promise<T> => Promise.resolve(p)

describe('server: the openai client', () => {
  it('answers a chat completion with usage', async () => {
    const r = await client.chat.completions.create({ model: 'anything', messages: [{ role: 'user', content: 'Name a colour.' }], max_tokens: 8, temperature: 0 })
    expect(r.object).toBe('chat.completion')
    expect(r.model).toBe('gemma-test')
    expect(typeof r.choices[0].message.content).toBe('string')
    expect(['stop', 'length']).toContain(r.choices[0].finish_reason)
    expect(r.usage!.completion_tokens).toBeGreaterThan(0)
    expect(r.usage!.completion_tokens).toBeLessThanOrEqual(8)
    expect(r.usage!.total_tokens).toBe(r.usage!.prompt_tokens + r.usage!.completion_tokens)
  })

  it('streams the same greedy text, with include_usage', async () => {
    const body = { model: 'x', messages: [{ role: 'user' as const, content: 'Count to five.' }], max_completion_tokens: 12, temperature: 0 }
    const whole = await client.chat.completions.create(body)
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } })
    let text = ''
    let usage: any
    let finish: string | null = null
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage
      if (chunk.choices[0]) {
        text += chunk.choices[0].delta.content ?? ''
        finish = chunk.choices[0].finish_reason ?? finish
      }
    }
    expect(text).toBe(whole.choices[0].message.content)
    expect(finish).toBe(whole.choices[0].finish_reason)
    // The same prompt again: its tokens now come from the prefix cache.
    expect({ ...usage, prompt_tokens_details: undefined }).toEqual({ ...whole.usage, prompt_tokens_details: undefined })
    expect(usage.prompt_tokens_details.cached_tokens).toBeGreaterThan(0)
  })

  it('applies stop, seed, temperature and top_p', async () => {
    const body = { model: 'x', messages: [{ role: 'user' as const, content: 'Write a sentence.' }], max_tokens: 16, temperature: 0.9, top_p: 0.9, seed: 7 }
    const a = await client.chat.completions.create(body)
    const b = await client.chat.completions.create(body)
    expect(a.choices[0].message.content).toBe(b.choices[0].message.content)
    const text = a.choices[0].message.content!
    const cut = text.trim().split(' ')[1]
    if (cut) {
      const s = await client.chat.completions.create({ ...body, stop: [cut] })
      expect(s.choices[0].message.content).not.toContain(cut)
      expect(s.choices[0].finish_reason).toBe('stop')
    }
  })

  it('serves the legacy completions endpoint, streamed too', async () => {
    const r = await client.completions.create({ model: 'x', prompt: 'The capital of France is', max_tokens: 4, temperature: 0 })
    expect(r.object).toBe('text_completion')
    let text = ''
    for await (const c of await client.completions.create({ model: 'x', prompt: 'The capital of France is', max_tokens: 4, temperature: 0, stream: true })) {
      text += c.choices[0]?.text ?? ''
    }
    expect(text).toBe(r.choices[0].text)
  })

  it('returns logprobs in OpenAI\'s shapes, streamed too', async () => {
    const body = { model: 'x', messages: [{ role: 'user' as const, content: 'Name a fruit.' }], max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 }
    const r = await client.chat.completions.create(body)
    const content = r.choices[0].logprobs!.content!
    expect(content.length).toBe(r.usage!.completion_tokens)
    expect(content.map((c) => c.token).join('')).toBe(r.choices[0].message.content)
    for (const c of content) {
      expect(c.logprob).toBeLessThanOrEqual(0)
      expect(c.top_logprobs.length).toBe(2)
      expect(c.top_logprobs[0].token).toBe(c.token)
      expect(Buffer.from(c.bytes!).toString('utf8')).toBe(c.token)
    }
    const streamed: any[] = []
    for await (const chunk of await client.chat.completions.create({ ...body, stream: true })) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []))
    expect(streamed).toEqual(content)
    const t = await client.completions.create({ model: 'x', prompt: 'The capital of France is', max_tokens: 4, temperature: 0, logprobs: 2 })
    const lp = t.choices[0].logprobs!
    expect(lp.tokens!.join('')).toBe(t.choices[0].text)
    expect(lp.token_logprobs!.length).toBe(lp.tokens!.length)
    expect(Object.keys(lp.top_logprobs![0]).length).toBe(2)
    expect(lp.text_offset![1]).toBe(lp.tokens![0].length)
    expect(r.choices[0].logprobs).not.toBeNull()
    const none = await client.chat.completions.create({ ...body, logprobs: false, top_logprobs: undefined })
    expect(none.choices[0].logprobs).toBeNull()
    await expect(native(client.chat.completions.create({ ...body, top_logprobs: 30 }))).rejects.toMatchObject({ status: 400 })
  })

  it('embeds (base64, as the client asks by default, and float)', async () => {
    const dim = llm.info.embeddingLength
    const r = await client.embeddings.create({ model: 'x', input: ['hello world', 'goodbye'] })
    expect(r.data.length).toBe(2)
    expect(r.data[0].embedding.length).toBe(dim)
    const f = await client.embeddings.create({ model: 'x', input: 'hello world', encoding_format: 'float' })
    const direct = (await llm.embed(['hello world']))[0]
    f.data[0].embedding.forEach((x, i) => expect(x).toBeCloseTo(direct[i], 5))
    r.data[0].embedding.forEach((x, i) => expect(x).toBeCloseTo(direct[i], 5))
    expect(r.usage.prompt_tokens).toBeGreaterThan(0)
  })

  it('lists the model and reports health', async () => {
    const models = await client.models.list()
    expect(models.data.map((m) => m.id)).toEqual(['gemma-test'])
    const h = await health()
    expect(h.status).toBe('ok')
    expect(h.rss_bytes).toBeGreaterThan(0)
  })
})

describe('server: errors', () => {
  const bad = async (p: Promise<unknown>, status: number, code: string, param?: string) => {
    try {
      await p
    } catch (e: any) {
      expect(e).toBeInstanceOf(OpenAI.APIError)
      expect(e.status).toBe(status)
      expect(e.code).toBe(code)
      if (param) expect(e.param).toBe(param)
      return
    }
    throw new Error('expected an error')
  }
  const msgs = [{ role: 'user' as const, content: 'hi' }]

  it('gives OpenAI error bodies with the status and a stable code', async () => {
    await bad(client.chat.completions.create({ model: 'x', messages: msgs, temperature: 5 }), 400, 'ERR_INVALID_ARG', 'temperature')
    await bad(client.chat.completions.create({ model: 'x', messages: [] }), 400, 'ERR_INVALID_ARG', 'messages')
    await bad(client.chat.completions.create({ model: 'x', messages: msgs, max_tokens: 'ten' as any }), 400, 'ERR_INVALID_ARG', 'max_tokens')
    await bad(client.chat.completions.create({ model: 'x', messages: msgs, top_logprobs: 3 }), 400, 'ERR_INVALID_ARG', 'top_logprobs')
    await bad(client.completions.create({ model: 'x', prompt: 'hi', logprobs: 9 }), 400, 'ERR_INVALID_ARG', 'logprobs')
    await bad(client.chat.completions.create({ model: 'x', messages: msgs, n: 3 }), 400, 'ERR_UNSUPPORTED', 'n')
    await bad(client.completions.create({ model: 'x', prompt: 'word '.repeat(3000), max_tokens: 1 }), 400, 'ERR_CONTEXT_OVERFLOW')
    await bad(client.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'x'.repeat(70 * 1024) }] }), 413, 'ERR_BODY_TOO_LARGE')
  })

  it('says it closes a connection whose request body it did not read', async () => {
    // A keep-alive client would otherwise send its next request into a socket the server closes.
    const answer = (body: string) =>
      new Promise<{ status?: number; connection?: string }>((resolve, reject) => {
        const req = request(`${server.url}/v1/chat/completions`, { method: 'POST', agent: new Agent({ keepAlive: true }), headers: { 'content-type': 'application/json' } }, (res) => {
          res.resume()
          res.on('end', () => resolve({ status: res.statusCode, connection: res.headers.connection }))
        })
        req.on('error', reject)
        req.end(body)
      })
    expect(await answer(JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(70 * 1024) }] }))).toEqual({ status: 413, connection: 'close' })
    expect((await answer('{"messages": [')).connection).not.toBe('close')
  })

  it('answers malformed JSON, unknown paths and wrong methods with coded errors', async () => {
    const post = (path: string, body: string) => fetch(`${server.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body })
    let r = await post('/v1/chat/completions', '{"messages": [')
    expect(r.status).toBe(400)
    expect((await r.json()).error).toMatchObject({ code: 'ERR_INVALID_JSON', type: 'invalid_request_error' })
    r = await post('/v1/chat/completions', '"a string"')
    expect(r.status).toBe(400)
    r = await fetch(`${server.url}/v1/nothing`)
    expect(r.status).toBe(404)
    expect((await r.json()).error.code).toBe('ERR_NOT_FOUND')
    r = await fetch(`${server.url}/v1/embeddings`)
    expect(r.status).toBe(405)
    expect((await health()).status).toBe('ok')
  })

  it('cancels the request of a client that goes away', async () => {
    const ac = new AbortController()
    // Counting goes on for a long time under greedy decoding.
    const stream = await client.completions.create({ model: 'x', prompt: '1, 2, 3, 4, 5, 6,', max_tokens: 900, temperature: 0, stream: true }, { signal: ac.signal })
    // The client ends its iteration quietly on abort; the server must notice the closed socket.
    for await (const _ of stream) {
      expect((await health()).running).toBe(1)
      ac.abort()
    }
    await waitIdle()
  })

  it('queues beyond parallel and answers 429 beyond the queue', async () => {
    const long = () => client.completions.create({ model: 'x', prompt: 'Once upon a time', max_tokens: 64 })
    const running = [long(), long(), long(), long()] // 2 running + 2 queued
    await new Promise((r) => setTimeout(r, 100))
    await bad(long(), 429, 'ERR_BUSY')
    const done = await Promise.all(running)
    expect(done.every((d) => d.object === 'text_completion')).toBe(true)
  })
})

describe('server: a model by path, with an API key', () => {
  it('requires the Bearer key, and close() ends streams and the listener', async () => {
    const keyed = await createServer({ model: modelPath(), load: { contextSize: 512 }, port: 0, apiKey: 's3cret', ...chat })
    try {
      const wrong = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 'nope', maxRetries: 0 })
      await expect(native(wrong.models.list())).rejects.toMatchObject({ status: 401, code: 'ERR_UNAUTHORIZED' })
      const right = new OpenAI({ baseURL: `${keyed.url}/v1`, apiKey: 's3cret', maxRetries: 0 })
      expect((await right.models.list()).data[0].id).toBe(basename(modelPath()).replace(/\.gguf$/, ''))
      const stream = await right.chat.completions.create({ model: 'x', messages: [{ role: 'user', content: 'Tell a long story.' }], max_tokens: 400, stream: true })
      // Settled into a value at once: the rejection comes while `close()` is awaited.
      const consumed = (async () => {
        for await (const _ of stream);
      })().then(
        () => null,
        (e) => e,
      )
      await new Promise((r) => setTimeout(r, 200))
      await keyed.close()
      expect(await consumed).toMatchObject({ status: undefined, code: 'ERR_CLOSED' })
      await expect(fetch(`${keyed.url}/health`)).rejects.toThrow()
    } finally {
      await keyed.close()
    }
  })

  it('rejects bad options before loading anything', async () => {
    await expect(createServer({ model: llm, port: 70000 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' })
    await expect(createServer({ model: llm, parallel: 0 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' })
    await expect(createServer({ model: 42 })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' })
    await expect(createServer({ model: llm, colour: 'red' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' })
    await expect(createServer({ model: llm, port: server.port })).rejects.toMatchObject({ code: 'ERR_ADDR_IN_USE' })
  })
})

describe('server: the CLI', () => {
  const CLI = join(ROOT, 'bin', 'ruvllm.js')

  it('bench serve (short mode) drives a running server and reports a row per client count', () => {
    // The server runs on its own threads: a synchronous child does not starve it.
    const r = spawnSync(process.execPath, [CLI, 'bench', 'serve', '--url', server.url, '--duration', '2', '--clients', '1,2', '--max-tokens', '8', '--json'], {
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect(r.status, r.stderr).toBe(0)
    const out = JSON.parse(r.stdout)
    expect(out.rows.map((x: any) => x.clients)).toEqual([1, 2])
    for (const row of out.rows) {
      expect(row.errors).toBe(0)
      expect(row.requests).toBeGreaterThan(0)
      expect(row.tokensPerSecond).toBeGreaterThan(0)
      expect(row.ttftP50).toBeGreaterThan(0)
      expect(row.rssStartMiB).toBeGreaterThan(0)
    }
    const far = spawnSync(process.execPath, [CLI, 'bench', 'serve', '--url', 'http://192.0.2.1:8080'], { encoding: 'utf8' })
    expect(far.status).toBe(2)
    expect(far.stderr).toContain('ERR_USAGE')
  })

  it('serve listens until SIGINT', async () => {
    const child = spawn(process.execPath, [CLI, 'serve', '--model', modelPath(), '--port', '0', '--context-size', '512'], { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    const url = await new Promise<string>((resolve, reject) => {
      child.stderr.on('data', (d) => {
        stderr += d
        const m = /serving .* at (http:\/\/\S+)\/v1/.exec(stderr)
        if (m) resolve(m[1])
      })
      child.on('exit', () => reject(new Error(stderr)))
    })
    const models = await new OpenAI({ baseURL: `${url}/v1`, apiKey: 'x', maxRetries: 0 }).models.list()
    expect(models.data.length).toBe(1)
    const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })))
    child.kill('SIGINT')
    expect(await exited, stderr).toEqual({ code: 0, signal: null })
  })
})

// Constrained sampling: whatever the small model would write, the output parses.
describe('server: structured output', () => {
  const ajv = new Ajv()
  const book = {
    type: 'object',
    properties: {
      title: { type: 'string', maxLength: 24 },
      year: { type: 'integer', minimum: 1450, maximum: 2030 },
      genre: { enum: ['novel', 'poetry', 'essay'] },
    },
    required: ['title', 'year', 'genre'],
    additionalProperties: false,
  }
  const stock = {
    type: 'function' as const,
    function: {
      name: 'get_stock_price',
      description: 'The latest price of a stock',
      parameters: {
        type: 'object',
        properties: { symbol: { type: 'string', maxLength: 8 }, currency: { enum: ['USD', 'EUR'] } },
        required: ['symbol', 'currency'],
        additionalProperties: false,
      },
    },
  }

  it('response_format json_schema gives JSON that validates, streamed too', async () => {
    const body = {
      model: 'x',
      messages: [{ role: 'user' as const, content: 'Name a famous book.' }],
      max_tokens: 128,
      temperature: 0,
      response_format: { type: 'json_schema' as const, json_schema: { name: 'book', schema: book, strict: true } },
    }
    const r = await client.chat.completions.create(body)
    expect(r.choices[0].finish_reason).toBe('stop')
    const value = JSON.parse(r.choices[0].message.content!)
    expect(ajv.validate(book, value), JSON.stringify(ajv.errors)).toBe(true)
    let text = ''
    for await (const c of await client.chat.completions.create({ ...body, stream: true })) text += c.choices[0]?.delta.content ?? ''
    expect(text).toBe(r.choices[0].message.content)
  })

  it('response_format json_object gives a JSON object', async () => {
    const r = await client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'Give a JSON object with the name and colour of a cat.' }],
      max_tokens: 96,
      temperature: 0,
      response_format: { type: 'json_object' },
    })
    const v = JSON.parse(r.choices[0].message.content!)
    expect(typeof v === 'object' && !Array.isArray(v)).toBe(true)
  })

  it('a bad schema is a 400 ERR_GRAMMAR', async () => {
    const p = client.chat.completions.create({
      model: 'x',
      messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'nonsense' } } },
    })
    await expect(native(p)).rejects.toMatchObject({ status: 400, code: 'ERR_GRAMMAR' })
  })

  it('tools: a required call comes back as tool_calls with valid arguments, streamed too, and goes back as history', async () => {
    const body = {
      model: 'x',
      messages: [{ role: 'user' as const, content: 'What is the price of Apple stock?' }],
      max_tokens: 96,
      temperature: 0,
      tools: [stock],
      tool_choice: 'required' as const,
    }
    const r = await client.chat.completions.create(body)
    expect(r.choices[0].finish_reason).toBe('tool_calls')
    const call = r.choices[0].message.tool_calls![0]
    expect(call.id).toMatch(/^call_/)
    expect(call.function.name).toBe('get_stock_price')
    expect(ajv.validate(stock.function.parameters, JSON.parse(call.function.arguments))).toBe(true)
    let streamed: any
    let finish: string | null = null
    for await (const c of await client.chat.completions.create({ ...body, stream: true })) {
      streamed ??= c.choices[0]?.delta.tool_calls?.[0]
      finish = c.choices[0]?.finish_reason ?? finish
    }
    expect(streamed.function).toEqual(call.function)
    expect(finish).toBe('tool_calls')
    const followUp = await client.chat.completions.create({
      model: 'x',
      messages: [
        { role: 'user', content: 'What is the price of Apple stock?' },
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'user', content: 'The tool said: 190 USD. Summarise.' },
      ],
      max_tokens: 8,
      temperature: 0,
      tools: [stock],
      tool_choice: 'none',
    })
    expect(followUp.choices[0].message.content!.length).toBeGreaterThan(0)
    expect(followUp.choices[0].message.tool_calls).toBeUndefined()
  })
})
