'use strict'
// CLI subcommands for the OpenAI- and Ollama-compatible server:
//   ruvllm serve [--model <path|id>] [--host 127.0.0.1] [--port 8080] [--api-key K] [--parallel N] ...
//   (llama-server's -c/--ctx-size, -np, -a/--alias and --lora are taken too)
//   ruvllm bench serve [--url http://127.0.0.1:8080] [--clients 1,4,8,16] [--duration 60] ...
// `serve(argv)` and `benchServe(argv)` resolve to the exit code (`serve` only when the server
// is stopped by SIGINT/SIGTERM).

const fs = require('node:fs')
const path = require('node:path')
const cli = require('./cli.js')
const { templates: builtinTemplates, stops: builtinStops } = require('../../lib/chat-templates.js')

const { UsageError, parse } = cli

function addon() {
  return require(path.join(__dirname, '..', '..', 'index.js'))
}

const SERVE_USAGE = `usage: ruvllm serve [options]
  -m, --model <path|id>      a .gguf file or a known model id (default: $RUVLLM_MODEL, else gemma-3-270m)
      --host <addr>          interface to bind (default 127.0.0.1: this machine only)
      --port <n>             TCP port (default 8080; 0 picks a free one)
      --api-key <key>        require "Authorization: Bearer <key>" on every endpoint but /health, / and /api/version
                             (default: $RUVLLM_API_KEY, else none)
  -np, --parallel <n>        requests decoded together (the engine's batch) and handed to it at once (default 8)
      --max-queue <n>        requests waiting beyond those; more get 429 (default 64)
      --max-body-bytes <n>   largest request body; larger gets 413 (default 4194304)
  -c, --context-size <n>     KV cache length in tokens (--ctx-size too)
      --threads <n>          compute threads
      --gpu <auto|cuda|off>  auto (default): the GPU where one is usable, else the CPU; cuda: the GPU or an error
      --lora <file>          a LoRA adapter (GGUF or PEFT safetensors) applied to the served model; repeatable
      --chat-template <name|file>  a Jinja template for chat requests (built-in: ${Object.keys(builtinTemplates).join(', ')});
                             default: the model's own, else 'plain'
  -a, --name <name>          the model's name in responses (--alias too; default: the id or file name)
      --cors <origin|*>      let web pages from these origins (comma-separated, or * for any) call the server (default: off)
Endpoints: OpenAI: POST /v1/chat/completions, /v1/completions, /v1/embeddings; GET /v1/models.
  Ollama: POST /api/generate, /api/chat, /api/embed, /api/show; GET /api/tags, /api/version.
  llama-server: POST /tokenize, /detokenize. GET /health; GET /metrics (Prometheus).`

const BENCH_USAGE = `usage: ruvllm bench serve [options]
      --url <url>            an OpenAI-compatible server on this machine (e.g. http://127.0.0.1:8080);
                             default: start ruvllm's own on a free loopback port
  -m, --model <path|id>      the model for the server it starts (default: $RUVLLM_MODEL, else gemma-3-270m)
      --gpu <auto|cuda|off>  where the server it starts runs the model (default auto)
      --clients <list>       concurrent clients, one run per value (default 1,4,8,16)
      --duration <s>         seconds per run (default 60; at most 600)
      --max-tokens <n>       tokens per reply (default 128)
      --system-prompt-tokens <n>  a shared system prompt of about n tokens (default 0)
      --max-requests <n>     stop a run after this many requests (default 10000)
      --api-key <key>        sent as a Bearer token (default: $RUVLLM_API_KEY)
      --json                 print the results as JSON instead of a markdown table`

function int(v, name, min, max) {
  if (v === undefined) return undefined
  const n = Number(v)
  if (!Number.isInteger(n) || n < min || n > max) throw new cli.CliError('ERR_INVALID_ARG', `${name} must be an integer in ${min}..${max}, got ${v}`)
  return n
}

/** The chat template and its stops: --chat-template (a built-in name or a file), else the model's, else 'plain'. */
function chatTemplate(flag, info) {
  if (flag !== undefined) {
    if (Object.hasOwn(builtinTemplates, flag)) return { text: builtinTemplates[flag], stop: builtinStops[flag] || [] }
    try {
      return { text: fs.readFileSync(flag, 'utf8'), stop: [] }
    } catch (e) {
      throw new cli.CliError('ERR_INVALID_ARG', `--chat-template: '${flag}' is neither a built-in template (${Object.keys(builtinTemplates).join(', ')}) nor a readable file`)
    }
  }
  if (info.hasChatTemplate) return { text: undefined, stop: [] }
  process.stderr.write(`ruvllm: note: the model ships no chat template; /v1/chat/completions uses the built-in 'plain' one (choose with --chat-template)\n`)
  return { text: builtinTemplates.plain, stop: builtinStops.plain }
}

/** Loads the model and starts the server; returns { server, llm }. */
async function start(values, host, port) {
  const { LLM, createServer } = addon()
  const load = {}
  if (values['context-size'] !== undefined) load.contextSize = int(values['context-size'], '--context-size', 1, 1048576)
  if (values.threads !== undefined) load.threads = int(values.threads, '--threads', 1, 1024)
  if (values.gpu !== undefined) load.gpu = cli.gpuFlag(values.gpu)
  if (values.lora?.length) load.adapters = values.lora.map((f) => path.resolve(f))
  // The engine decodes together as many requests as the server hands it at once.
  const parallel = int(values.parallel, '--parallel', 1, 256)
  if (parallel !== undefined) load.parallel = parallel
  const model = values.model ?? process.env.RUVLLM_MODEL ?? 'gemma-3-270m'
  const llm = await LLM.load(model, load)
  try {
    const t = chatTemplate(values['chat-template'], llm.info)
    const name = values.name ?? (fs.existsSync(model) ? path.basename(model).replace(/\.gguf$/, '') : model)
    const server = await createServer({
      model: llm,
      name,
      host,
      port,
      apiKey: values['api-key'] ?? process.env.RUVLLM_API_KEY,
      parallel,
      maxQueue: int(values['max-queue'], '--max-queue', 0, 1000000),
      maxBodyBytes: int(values['max-body-bytes'], '--max-body-bytes', 1, Number.MAX_SAFE_INTEGER),
      chatTemplate: t.text,
      stop: t.stop,
      cors: values.cors,
    })
    return { server, llm }
  } catch (e) {
    llm.close()
    throw e
  }
}

const SERVE_OPTIONS = {
  model: { type: 'string', short: 'm' },
  host: { type: 'string' },
  port: { type: 'string' },
  'api-key': { type: 'string' },
  parallel: { type: 'string' },
  'max-queue': { type: 'string' },
  'max-body-bytes': { type: 'string' },
  'context-size': { type: 'string', short: 'c' },
  threads: { type: 'string' },
  gpu: { type: 'string' },
  lora: { type: 'string', multiple: true },
  'chat-template': { type: 'string' },
  name: { type: 'string', short: 'a' },
  cors: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
}

/** llama-server's spellings of our flags. `-np` is two letters, which `parseArgs` would read as `-n -p`. */
const LLAMA_SERVER_ALIASES = { '-np': '--parallel', '--ctx-size': '--context-size', '--alias': '--name' }

/**
 * `argv` with llama-server's spellings (`-np 4`, `--ctx-size=512`, `--alias x`) rewritten to ours.
 * A token that is the value of the option before it (`--name -np`) is left alone.
 */
function llamaServerAliases(argv, options) {
  const takesValue = (a) => {
    if (a.includes('=')) return false
    const name = a.startsWith('--') ? a.slice(2) : /^-[^-]$/.test(a) ? Object.keys(options).find((k) => options[k].short === a[1]) : undefined
    return name !== undefined && options[name]?.type === 'string'
  }
  const out = []
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const [flag, ...value] = a.split('=')
    const canonical = Object.hasOwn(LLAMA_SERVER_ALIASES, flag) ? LLAMA_SERVER_ALIASES[flag] : undefined
    out.push(canonical ? [canonical, ...value].join('=') : a)
    if (takesValue(out.at(-1)) && i + 1 < argv.length) out.push(argv[++i])
  }
  return out
}

async function serve(argv) {
  try {
    const { values, positionals } = parse(llamaServerAliases(argv, SERVE_OPTIONS), SERVE_OPTIONS)
    if (values.help) {
      process.stdout.write(SERVE_USAGE + '\n')
      return 0
    }
    if (positionals.length) throw new UsageError(`unexpected argument '${positionals[0]}'`)
    const { server, llm } = await start(values, values.host ?? '127.0.0.1', int(values.port, '--port', 0, 65535) ?? 8080)
    process.stderr.write(`ruvllm: serving ${llm.info.name || 'the model'} at ${server.url}/v1 (Ollama: ${server.url}/api; Ctrl-C stops)\n`)
    await new Promise((resolve) => {
      process.once('SIGINT', resolve)
      process.once('SIGTERM', resolve)
    })
    await server.close()
    llm.close()
    return 0
  } catch (e) {
    const code = cli.report(e)
    if (e && e.code === 'ERR_USAGE') process.stderr.write(SERVE_USAGE + '\n')
    return code
  }
}

// --- the load-test client -------------------------------------------------------------------

/** Nearest-rank percentile of a sorted array (NaN when empty). */
function percentile(sorted, p) {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]
}

/** One streamed chat request; resolves to { ttft, itl[], tokens } or throws. */
async function streamOnce(url, headers, body) {
  const t0 = performance.now()
  const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) })
  if (!res.ok) {
    const text = await res.text()
    throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`)
  }
  const decoder = new TextDecoder()
  let buf = ''
  let ttft
  let last
  const itl = []
  let pieces = 0
  let tokens
  for await (const bytes of res.body) {
    buf += decoder.decode(bytes, { stream: true })
    let i
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const event = buf.slice(0, i)
      buf = buf.slice(i + 2)
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue
        const data = line.slice(6)
        if (data === '[DONE]') continue
        const chunk = JSON.parse(data)
        if (chunk.error) throw new Error(`stream error: ${chunk.error.message}`)
        if (chunk.usage) tokens = chunk.usage.completion_tokens
        const content = chunk.choices && chunk.choices[0] && chunk.choices[0].delta && chunk.choices[0].delta.content
        if (content) {
          const now = performance.now()
          if (ttft === undefined) ttft = now - t0
          else itl.push(now - last)
          last = now
          pieces++
        }
      }
    }
  }
  return { ttft, itl, tokens: tokens ?? pieces }
}

/** The server's RSS from `/health` (`rss_bytes`), when it reports one. */
async function healthRss(url, headers) {
  try {
    const r = await fetch(`${url}/health`, { headers })
    const j = await r.json()
    return typeof j.rss_bytes === 'number' ? j.rss_bytes : undefined
  } catch {
    return undefined
  }
}

function isLoopback(u) {
  const h = u.hostname.replace(/^\[|\]$/g, '')
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h)
}

/** One run: `clients` concurrent clients for `duration` seconds. */
async function run(url, headers, clients, o) {
  const deadline = performance.now() + o.duration * 1000
  const ttft = []
  let ttftFirst
  const itl = []
  let tokens = 0
  let requests = 0
  let errors = 0
  let firstError
  let started = 0
  const rssStart = o.rss ? o.rss() : await healthRss(url, headers)
  const t0 = performance.now()
  const client = async (c) => {
    while (performance.now() < deadline && started < o.maxRequests) {
      const n = started++
      const messages = []
      if (o.system) messages.push({ role: 'system', content: o.system })
      messages.push({ role: 'user', content: `Request ${n} from client ${c}: write a short story about a lighthouse keeper.` })
      try {
        const r = await streamOnce(url, headers, {
          model: o.model,
          messages,
          max_tokens: o.maxTokens,
          temperature: 0.8,
          seed: n,
          stream: true,
          stream_options: { include_usage: true },
        })
        requests++
        tokens += r.tokens
        if (r.ttft !== undefined) ttft.push(r.ttft)
        // The run's first request: with a shared system prompt, the one that evaluates it.
        if (n === 0) ttftFirst = r.ttft
        itl.push(...r.itl)
      } catch (e) {
        errors++
        firstError ??= e.message
      }
    }
  }
  await Promise.all(Array.from({ length: clients }, (_, c) => client(c)))
  const elapsed = (performance.now() - t0) / 1000
  const rssEnd = o.rss ? o.rss() : await healthRss(url, headers)
  ttft.sort((a, b) => a - b)
  itl.sort((a, b) => a - b)
  return {
    clients,
    requests,
    errors,
    firstError,
    seconds: elapsed,
    completionTokens: tokens,
    tokensPerSecond: tokens / elapsed,
    ttftFirst,
    ttftP50: percentile(ttft, 50),
    ttftP99: percentile(ttft, 99),
    itlP50: percentile(itl, 50),
    itlP99: percentile(itl, 99),
    rssStartMiB: rssStart === undefined ? undefined : rssStart / 1048576,
    rssEndMiB: rssEnd === undefined ? undefined : rssEnd / 1048576,
  }
}

function table(rows) {
  const f = (x, d = 1) => (x === undefined || Number.isNaN(x) ? 'n/a' : x.toFixed(d))
  const out = [
    '| clients | requests | errors | completion tok/s | TTFT first ms | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | RSS start MiB | RSS end MiB |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for (const r of rows) {
    out.push(`| ${r.clients} | ${r.requests} | ${r.errors} | ${f(r.tokensPerSecond)} | ${f(r.ttftFirst)} | ${f(r.ttftP50)} | ${f(r.ttftP99)} | ${f(r.itlP50)} | ${f(r.itlP99)} | ${f(r.rssStartMiB, 0)} | ${f(r.rssEndMiB, 0)} |`)
  }
  return out.join('\n')
}

const BENCH_OPTIONS = {
  url: { type: 'string' },
  model: { type: 'string', short: 'm' },
  clients: { type: 'string' },
  duration: { type: 'string' },
  'max-tokens': { type: 'string' },
  'system-prompt-tokens': { type: 'string' },
  'max-requests': { type: 'string' },
  'api-key': { type: 'string' },
  gpu: { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
}

async function benchServe(argv) {
  try {
    return await benchServeRun(argv)
  } catch (e) {
    const code = cli.report(e)
    if (e && e.code === 'ERR_USAGE') process.stderr.write(BENCH_USAGE + '\n')
    return code
  }
}

async function benchServeRun(argv) {
  const { values } = parse(argv, BENCH_OPTIONS)
  if (values.help) {
    process.stdout.write(BENCH_USAGE + '\n')
    return 0
  }
  const clients = (values.clients ?? '1,4,8,16').split(',').map((c) => int(c.trim(), '--clients', 1, 256))
  const o = {
    duration: int(values.duration, '--duration', 1, 600) ?? 60,
    maxTokens: int(values['max-tokens'], '--max-tokens', 1, 1048576) ?? 128,
    maxRequests: int(values['max-requests'], '--max-requests', 1, 1000000) ?? 10000,
    model: values.model ?? process.env.RUVLLM_MODEL ?? 'gemma-3-270m',
  }
  const systemTokens = int(values['system-prompt-tokens'], '--system-prompt-tokens', 0, 1048576) ?? 0
  // About ten tokens per sentence in Gemma's and Llama's tokenizers.
  if (systemTokens > 0) o.system = 'You are a careful assistant who answers in plain words. '.repeat(Math.ceil(systemTokens / 10))
  const apiKey = values['api-key'] ?? process.env.RUVLLM_API_KEY
  const headers = { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) }
  let url = values.url
  let own
  if (url !== undefined) {
    let u
    try {
      u = new URL(url)
    } catch {
      throw new UsageError(`--url: '${url}' is not a URL`)
    }
    if (!isLoopback(u)) throw new UsageError(`--url must point at this machine (127.0.0.1, localhost or ::1); got ${u.hostname}`)
    url = url.replace(/\/+$/, '').replace(/\/v1$/, '')
  } else {
    own = await start({ model: values.model, gpu: values.gpu, parallel: String(Math.max(...clients)), 'api-key': apiKey }, '127.0.0.1', 0)
    url = own.server.url
    // The server runs in this process: its RSS is this process's.
    o.rss = () => process.memoryUsage().rss
    process.stderr.write(`ruvllm: started ${url} (${own.llm.info.backend})\n`)
  }
  const rows = []
  try {
    for (const c of clients) {
      process.stderr.write(`ruvllm: ${c} client(s) for ${o.duration} s ...\n`)
      rows.push(await run(url, headers, c, o))
      if (rows.at(-1).firstError) process.stderr.write(`ruvllm: first error: ${rows.at(-1).firstError}\n`)
    }
  } finally {
    if (own) {
      await own.server.close()
      own.llm.close()
    }
  }
  if (values.json) process.stdout.write(JSON.stringify({ url, ...o, system: undefined, rss: undefined, systemPromptTokens: systemTokens, rows }, null, 2) + '\n')
  else {
    process.stdout.write(`max_tokens ${o.maxTokens}, ${o.duration} s per run, system prompt ≈${systemTokens} tokens, ${url}\n\n`)
    process.stdout.write(table(rows) + '\n')
  }
  return rows.some((r) => r.errors > 0) ? 1 : 0
}

module.exports = { serve, benchServe, llamaServerAliases, SERVE_OPTIONS, SERVE_USAGE, BENCH_USAGE }
