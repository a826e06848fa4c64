// The Ollama-compatible endpoints, driven by the official `ollama` client over loopback (chat,
// generate, streaming, embed, list, show, format, tools), with greedy text checked against
// `llm.generate`; llama-server's /tokenize and /detokenize, /metrics (parsed as Prometheus
// text), opt-in CORS, coded errors, and the CLI's llama-server flag spellings.
import { Ollama } from 'ollama'
import Ajv from 'ajv'
import parsePrometheusTextFormat from 'parse-prometheus-text-format'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawn } from 'node:child_process'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { addon, LLM, modelPath, ROOT, templates, type LLMType } from './helpers.js'
import { randomFactors, shapeOf, writeLoraGguf } from '../tools/lora-files.mjs'

const { createServer } = addon as any

// The test model is a base model without a chat template: serve chat with Gemma's own.
const chat = { chatTemplate: templates.gemma, stop: ['<end_of_turn>', '<start_of_turn>'] }

let llm: LLMType
let server: any
let client: Ollama

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024 })
  server = await createServer({ model: llm, host: '127.0.0.1', port: 0, parallel: 2, name: 'gemma-test', ...chat })
  client = new Ollama({ host: server.url })
})

afterAll(async () => {
  await server?.close()
  llm?.close()
})

const greedy = (n: number) => ({ temperature: 0, num_predict: n })
/** What the library itself answers, for the same prompt and decoding. */
const direct = async (prompt: string | { role: string; content: string }[], maxTokens: number, opts: object = {}) =>
  (await llm.generate(prompt as any, { temperature: 0, maxTokens, ...(typeof prompt === 'string' ? {} : chat), ...opts } as any)).text

const post = (url: string, path: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) })

function expectStats(r: any) {
  expect(r.done).toBe(true)
  expect(['stop', 'length']).toContain(r.done_reason)
  expect(Number.isNaN(Date.parse(r.created_at))).toBe(false)
  expect(r.prompt_eval_count).toBeGreaterThan(0)
  expect(r.eval_count).toBeGreaterThan(0)
  for (const k of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration']) expect(Number.isInteger(r[k]), k).toBe(true)
  expect(r.total_duration).toBeGreaterThanOrEqual(r.eval_duration)
  expect(r.prompt_eval_duration).toBeGreaterThan(0)
}

describe('ollama: the official client', () => {
  const messages = [{ role: 'user', content: 'Name a colour.' }]

  it('chat: the greedy answer is llm.generate\'s, and streaming gives the same text', async () => {
    const r = await client.chat({ model: 'anything', messages, options: greedy(8) })
    expect(r.model).toBe('gemma-test')
    expect(r.message.role).toBe('assistant')
    expect(r.message.content).toBe(await direct(messages, 8))
    expectStats(r)
    expect(r.eval_count).toBeLessThanOrEqual(8)

    let text = ''
    let last: any
    for await (const part of await client.chat({ model: 'x', messages, options: greedy(8), stream: true })) {
      if (!part.done) expect(part.message.role).toBe('assistant')
      text += part.message.content
      last = part
    }
    expect(text).toBe(r.message.content)
    expectStats(last)
    expect(last.eval_count).toBe(r.eval_count)
  })

  it('generate: raw is the plain prompt, templated equals the chat turn (streamed)', async () => {
    const prompt = 'The capital of France is'
    const raw = await client.generate({ model: 'x', prompt, raw: true, options: greedy(6) })
    expect(raw.response).toBe(await direct(prompt, 6))
    expectStats(raw)
    let text = ''
    for await (const part of await client.generate({ model: 'x', prompt: 'Name a colour.', options: greedy(8), stream: true })) text += part.response
    expect(text).toBe(await direct(messages, 8))
    const sys = await client.generate({ model: 'x', prompt: 'Name a colour.', system: 'Answer in French.', options: greedy(6) })
    expect(sys.response).toBe(await direct([{ role: 'system', content: 'Answer in French.' }, ...messages], 6))
  })

  it('embed: one vector per input, as llm.embed gives them; the older /api/embeddings too', async () => {
    const r = await client.embed({ model: 'x', input: ['hello world', 'goodbye'] })
    expect(r.model).toBe('gemma-test')
    expect(r.embeddings.length).toBe(2)
    expect(r.embeddings[0].length).toBe(llm.info.embeddingLength)
    expect(r.prompt_eval_count).toBeGreaterThan(0)
    const want = await llm.embed(['hello world', 'goodbye'])
    r.embeddings.forEach((v, i) => v.forEach((x, j) => expect(x).toBeCloseTo(want[i][j], 5)))
    const one = await client.embeddings({ model: 'x', prompt: 'hello world' })
    one.embedding.forEach((x, j) => expect(x).toBeCloseTo(want[0][j], 5))
  })

  it('list, show, version and the root answer', async () => {
    const { models } = await client.list()
    expect(models.length).toBe(1)
    expect(models[0]).toMatchObject({ name: 'gemma-test', model: 'gemma-test', details: { format: 'gguf', family: llm.info.architecture } })
    expect(models[0].size).toBeGreaterThan(1e8)
    expect(models[0].digest).toMatch(/^[0-9a-f]{64}$/)
    const s: any = await client.show({ model: 'gemma-test' })
    expect(s.details.quantization_level).toBe(llm.info.quantization)
    expect(s.model_info['general.architecture']).toBe(llm.info.architecture)
    expect(s.model_info['general.parameter_count']).toBe(llm.info.parameterCount)
    expect(s.model_info['tokenizer.ggml.tokens']).toEqual([])
    expect(s.template).toBe(templates.gemma)
    expect(s.capabilities).toContain('completion')
    expect(s.parameters).toContain('stop "<end_of_turn>"')
    expect((await (await fetch(`${server.url}/api/version`)).json()).version).toMatch(/^\d+\.\d+\.\d+$/)
    const root = await fetch(server.url)
    expect(await root.text()).toBe('Ollama is running')
    expect((await fetch(server.url, { method: 'HEAD' })).status).toBe(200)
  })

  it('format: "json" and a JSON schema constrain the answer', async () => {
    const ajv = new Ajv()
    const r = await client.chat({ model: 'x', messages: [{ role: 'user', content: 'Give a JSON object with the name and colour of a cat.' }], format: 'json', options: greedy(64) })
    const v = JSON.parse(r.message.content)
    expect(typeof v === 'object' && v !== null && !Array.isArray(v)).toBe(true)
    const book = {
      type: 'object',
      properties: { title: { type: 'string', maxLength: 24 }, year: { type: 'integer', minimum: 1450, maximum: 2030 } },
      required: ['title', 'year'],
      additionalProperties: false,
    }
    const g = await client.generate({ model: 'x', prompt: 'Name a famous book.', format: book, options: greedy(96) })
    expect(g.done_reason).toBe('stop')
    expect(ajv.validate(book, JSON.parse(g.response)), JSON.stringify(ajv.errors)).toBe(true)
  })

  it('tools: a call comes back with its arguments as an object, streamed too, and goes back as history', async () => {
    const ajv = new Ajv()
    const weather = {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'The current weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 24 } }, required: ['city'], additionalProperties: false },
      },
    }
    const ask = [{ role: 'user', content: 'What is the weather in Paris? Use the get_weather tool.' }]
    // Left to itself (Ollama has no tool_choice) the small base model answers in words; the
    // server reads OpenAI's tool_choice when a client sends it, to ask for the call.
    const body = { model: 'x', messages: ask, tools: [weather], tool_choice: 'required', options: greedy(64) } as any
    const r = await client.chat(body)
    const call = r.message.tool_calls![0]
    expect(call.function.name).toBe('get_weather')
    expect(typeof call.function.arguments).toBe('object')
    expect(ajv.validate(weather.function.parameters, call.function.arguments)).toBe(true)
    // Ollama gives no reason of its own for a call: 'stop' (or 'length' at the token budget).
    expect(['stop', 'length']).toContain(r.done_reason)
    const parts: any[] = []
    for await (const part of await client.chat({ ...body, stream: true })) parts.push(part)
    expect(parts.find((p) => p.message.tool_calls)?.message.tool_calls).toEqual(r.message.tool_calls)
    expect(parts.at(-1).done).toBe(true)
    const followUp = await client.chat({
      model: 'x',
      messages: [...ask, { role: 'assistant', content: '', tool_calls: [call] }, { role: 'tool', tool_name: 'get_weather', content: 'Sunny, 21 C' }],
      tools: [weather],
      options: greedy(8),
    })
    expect(followUp.message.content.length).toBeGreaterThan(0)
    expect(followUp.message.tool_calls).toBeUndefined()
  })

  it('bad requests: a coded 400 in Ollama\'s error shape; the client throws the message', async () => {
    let r = await post(server.url, '/api/chat', '{"messages": [')
    expect(r.status).toBe(400)
    expect(await r.json()).toMatchObject({ error: expect.any(String), code: 'ERR_INVALID_JSON' })
    r = await post(server.url, '/api/generate', { model: 'x', prompt: 'hi', options: { temperature: 'hot' } })
    expect(r.status).toBe(400)
    expect(await r.json()).toMatchObject({ code: 'ERR_INVALID_ARG', param: 'options.temperature' })
    r = await post(server.url, '/api/generate', { model: 'x', prompt: 'hi', options: { mirostat: 2 } })
    expect(await r.json()).toMatchObject({ code: 'ERR_UNSUPPORTED', param: 'options.mirostat' })
    await expect(client.chat({ model: 'x', messages: [{ role: 'wizard', content: 'x' }] })).rejects.toMatchObject({ status_code: 400, error: expect.stringContaining('wizard') })
    // Load-time options are accepted (the model is loaded once); a prompt-less request is "loaded".
    const loaded = await client.generate({ model: 'x', prompt: '', keep_alive: '5m', options: { num_ctx: 8192, num_thread: 2 } })
    expect(loaded).toMatchObject({ done: true, done_reason: 'load', response: '' })
  })
})

describe('llama-server endpoints and metrics', () => {
  it('/tokenize and /detokenize round-trip', async () => {
    const content = 'Hello, world! Ünïcödé'
    const t = await (await post(server.url, '/tokenize', { content })).json()
    expect(t.tokens).toEqual(llm.tokenize(content, { addSpecial: false }))
    const withBos = await (await post(server.url, '/tokenize', { content, add_special: true })).json()
    expect(withBos.tokens.length).toBe(t.tokens.length + 1)
    const pieces = await (await post(server.url, '/tokenize', { content, with_pieces: true })).json()
    expect(pieces.tokens.map((p: any) => p.id)).toEqual(t.tokens)
    const d = await (await post(server.url, '/detokenize', { tokens: t.tokens })).json()
    expect(d.content).toBe(content)
    const bad = await post(server.url, '/detokenize', { tokens: [1e9] })
    expect(bad.status).toBe(400)
    expect((await bad.json()).error.code).toBe('ERR_INVALID_ARG')
  })

  it('/metrics parses as Prometheus text, and the counts move with requests', async () => {
    const scrape = async () => {
      const r = await fetch(`${server.url}/metrics`)
      expect(r.headers.get('content-type')).toContain('text/plain')
      return Object.fromEntries(parsePrometheusTextFormat(await r.text()).map((m: any) => [m.name, m]))
    }
    const count = (m: any, endpoint: string, status: string) =>
      Number(m.ruvllm_requests_total?.metrics.find((s: any) => s.labels.endpoint === endpoint && s.labels.status === status)?.value ?? 0)
    const before = await scrape()
    const r = await client.generate({ model: 'x', prompt: 'Once upon a time', raw: true, options: greedy(5) })
    await post(server.url, '/api/chat', '{')
    const after = await scrape()
    expect(count(after, '/api/generate', '200') - count(before, '/api/generate', '200')).toBe(1)
    expect(count(after, '/api/chat', '400') - count(before, '/api/chat', '400')).toBe(1)
    const gen = (m: any, name: string) => Number(m[name].metrics[0].value)
    expect(gen(after, 'ruvllm_generated_tokens_total') - gen(before, 'ruvllm_generated_tokens_total')).toBe(r.eval_count)
    expect(gen(after, 'ruvllm_prompt_tokens_total') - gen(before, 'ruvllm_prompt_tokens_total')).toBe(r.prompt_eval_count)
    expect(after.ruvllm_requests_running.type).toBe('GAUGE')
    expect(gen(after, 'ruvllm_requests_queued')).toBe(0)
    for (const h of ['ruvllm_request_duration_seconds', 'ruvllm_time_to_first_token_seconds']) {
      expect(after[h].type).toBe('HISTOGRAM')
      const [a, b] = [before[h].metrics[0], after[h].metrics[0]]
      expect(Number(b.count) - Number(a.count)).toBe(1)
      expect(Number(b.buckets['+Inf'])).toBe(Number(b.count))
      expect(Number(b.sum)).toBeGreaterThan(Number(a.sum))
    }
  })
})

describe('CORS and the API key', () => {
  it('no CORS headers unless asked; with cors, preflights and allowed origins only; the key guards /api/*', async () => {
    const origin = 'https://app.example'
    let r = await fetch(`${server.url}/api/tags`, { headers: { origin } })
    expect(r.headers.get('access-control-allow-origin')).toBeNull()
    r = await fetch(`${server.url}/api/chat`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST' } })
    expect(r.status).toBe(405)
    expect(r.headers.get('access-control-allow-origin')).toBeNull()

    const keyed = await createServer({ model: llm, port: 0, apiKey: 'k3y', cors: origin })
    try {
      r = await fetch(`${keyed.url}/api/chat`, { method: 'OPTIONS', headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' } })
      expect(r.status).toBe(204)
      expect(r.headers.get('access-control-allow-origin')).toBe(origin)
      expect(r.headers.get('access-control-allow-methods')).toContain('POST')
      expect(r.headers.get('access-control-allow-headers')).toBe('authorization,content-type')
      r = await fetch(`${keyed.url}/api/tags`, { headers: { origin } })
      expect(r.status).toBe(401)
      expect(r.headers.get('access-control-allow-origin')).toBe(origin)
      expect((await r.json()).code).toBe('ERR_UNAUTHORIZED')
      r = await fetch(`${keyed.url}/api/tags`, { headers: { origin: 'https://other.example', authorization: 'Bearer k3y' } })
      expect(r.status).toBe(200)
      expect(r.headers.get('access-control-allow-origin')).toBeNull()
      expect((await fetch(`${keyed.url}/metrics`)).status).toBe(401)
      expect((await fetch(`${keyed.url}/api/version`)).status).toBe(200)
      const authed = new Ollama({ host: keyed.url, headers: { authorization: 'Bearer k3y' } })
      expect((await authed.list()).models.length).toBe(1)
      await expect(new Ollama({ host: keyed.url }).list()).rejects.toMatchObject({ status_code: 401 })
    } finally {
      await keyed.close()
    }
    await expect(createServer({ model: llm, port: 0, cors: 'app.example' })).rejects.toMatchObject({ code: 'ERR_INVALID_ARG' })
  })
})

describe('serve: llama-server flag spellings', () => {
  const CLI = join(ROOT, 'bin', 'ruvllm.js')
  let dir: string
  afterAll(() => dir && rmSync(dir, { recursive: true, force: true }))

  it('-c, -np, -a and --lora', async () => {
    dir = mkdtempSync(join(tmpdir(), 'ruvllm-serve-'))
    const adapter = join(dir, 'adapter.gguf')
    const meta = llm.metadata() as Record<string, any>
    // Random factors large enough that the greedy continuation changes (checked below).
    writeLoraGguf(adapter, meta['general.architecture'], 16, 8, randomFactors(shapeOf(meta), 8, 0.3, 7n))
    const args = [CLI, 'serve', '-m', modelPath(), '--port', '0', '-c', '512', '-np', '2', '-a', 'aliased', '--lora', adapter, '--threads', '2']
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'ignore', 'pipe'] })
    let stderr = ''
    try {
      const url = await new Promise<string>((resolve, reject) => {
        child.stderr.on('data', (d) => {
          stderr += d
          const m = /serving .* at (http:\/\/\S+)\/v1/.exec(stderr)
          if (m) resolve(m[1])
        })
        child.on('exit', () => reject(new Error(stderr)))
      })
      const models = await (await fetch(`${url}/v1/models`)).json()
      expect(models.data[0].id).toBe('aliased')
      expect(models.data[0].meta.context_length).toBe(512)
      expect((await (await fetch(`${url}/health`)).json()).parallel).toBe(2)
      // The adapter is applied: the served text is the library's with the same adapter, not the base model's.
      const prompt = 'The capital of France is Paris. The capital of Germany is'
      const served = await new Ollama({ host: url }).generate({ model: 'aliased', prompt, raw: true, options: greedy(8) })
      const withAdapter = await llm.loadAdapter(adapter)
      expect(served.response).toBe(await direct(prompt, 8, { adapters: [withAdapter] }))
      expect(served.response).not.toBe(await direct(prompt, 8))
    } finally {
      const exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })))
      child.kill('SIGINT')
      expect(await exited, stderr).toEqual({ code: 0, signal: null })
    }
  })
})
