#!/usr/bin/env node
// ruvllm CLI: `generate` streams a completion to stdout, `chat` is an interactive chat with
// history. No dependencies beyond the addon and Node's own modules. Any error is one line on
// stderr (`ruvllm: <code>: <message>`) and a non-zero exit; Ctrl-C during generation aborts it
// (exit 130), a second Ctrl-C exits at once.
'use strict'

const fs = require('node:fs')
const path = require('node:path')
const readline = require('node:readline')

const pkg = require('../package.json')
const { templates: builtinTemplates, stops: builtinStops } = require('../lib/chat-templates.js')
const { CliError, UsageError, parse, report, gpuFlag } = require('./commands/cli.js')

const HELP = `ruvllm ${pkg.version}: run GGUF language models from Node.js on a Rust engine

Usage:
  ruvllm generate "<prompt>" [options]   stream a completion of <prompt> to stdout
  ruvllm chat [options]                  interactive chat with history (Ctrl-D or /exit quits)
  ruvllm models list|download|status|path|delete|import ...
                                         the model manager (ruvllm models --help)
  ruvllm route "<task>" | hooks pre-task|post-task ... | bench routing
                                         agent routing for Claude Flow
  ruvllm serve [--model <path|id>] [--host 127.0.0.1] [--port 8080] [--api-key K] [--parallel N]
                                         an OpenAI-compatible HTTP server (ruvllm serve --help)
  ruvllm learn status|export|reset --dir <dir>
                                         a learning directory (ruvllm learn --help)
  ruvllm federate keys|status|round ...  federate the learned adapter with other nodes (ruvllm federate --help)
  ruvllm bench learning|federation|diffusion ...
                                         the SONA, federation and diffusion benchmarks
  ruvllm bench serve [--url U] [--clients 1,4,8,16] [--duration 60]
                                         load-test an OpenAI-compatible server
  ruvllm --help | --version

Model:
  -m, --model <path|id>      a .gguf file, a known id (downloaded when missing) or hf:owner/repo/file.gguf
                             (default: $RUVLLM_MODEL, else gemma-3-270m)
      --context-size <n>     KV cache length in tokens (default: min(model's context, 4096))
      --kv-cache-type <t>    f16 (default), q8_0 (about half the memory) or f32
      --threads <n>          compute threads (default: all cores)
      --gpu <auto|cuda|off>  auto (default): the GPU where one is usable, else the CPU; cuda: the GPU or an error
      --lora <file>[:scale]  apply a LoRA adapter (llama.cpp LoRA GGUF, or PEFT adapter_model.safetensors
                             or its folder) to every reply, at scale (default 1); repeat for several
      --diffusion-adapter <file>  load the model as a masked-diffusion LM with this manifest.json or
                             adapter GGUF (repeat for several); the id gemma-3-270m-diffusion brings its own

Generation:
  -n, --max-tokens <n>       most tokens to generate (default 256)
  -t, --temperature <x>      0 = greedy (default 0.8)
      --top-k <n>            (default 40; 0 = off)
      --top-p <x>            (default 0.95)
      --min-p <x>            (default 0.05)
      --repeat-penalty <x>   (default 1 = off)
      --presence-penalty <x> (default 0)
      --frequency-penalty <x>(default 0)
      --seed <n>             same seed, same text
      --stop <s>             stop string; repeat for several
      --stats                print tokens, tokens/s and time to first token on stderr

Diffusion (a diffusion model, e.g. --model gemma-3-270m-diffusion; on a terminal the masks resolve live):
      --steps <n>            denoising steps for the whole answer (= -n: one token per step)
      --block-size <n>       positions per block, decoded left to right (default 4)
      --threshold <x>        commit every position more likely than x per step (0 < x < 1;
                             0.9 when neither --steps nor --threshold is given)
      --schedule <s>         linear (default) or cosine
      --remasking <r>        confidence (default) or random
      --no-repeat-ngram <n>  a token that would repeat a run of n decided tokens gives way (default 0: off)

Chat:
      --chat-template <name|file>  a Jinja chat template: a file, or a built-in name
                             (${Object.keys(builtinTemplates).join(', ')}). Default: the model's own; a model
                             that ships none (a base model) gets 'plain' (a "User: / Assistant:" transcript).
      --system <text>        a system message to start the conversation with

Every command takes --help. Errors print one line, "ruvllm: <code>: <message>", and exit 2 for a
usage mistake or a bad value, 1 otherwise; options are checked before the model loads. Ctrl-C
stops a generation (exit 130; in chat it returns to the prompt); a second Ctrl-C exits.`

const OPTIONS = {
  model: { type: 'string', short: 'm' },
  'context-size': { type: 'string' },
  'kv-cache-type': { type: 'string' },
  threads: { type: 'string' },
  gpu: { type: 'string' },
  lora: { type: 'string', multiple: true },
  'diffusion-adapter': { type: 'string', multiple: true },
  steps: { type: 'string' },
  'block-size': { type: 'string' },
  'no-repeat-ngram': { type: 'string' },
  threshold: { type: 'string' },
  schedule: { type: 'string' },
  remasking: { type: 'string' },
  'max-tokens': { type: 'string', short: 'n' },
  temperature: { type: 'string', short: 't' },
  'top-k': { type: 'string' },
  'top-p': { type: 'string' },
  'min-p': { type: 'string' },
  'repeat-penalty': { type: 'string' },
  'presence-penalty': { type: 'string' },
  'frequency-penalty': { type: 'string' },
  seed: { type: 'string' },
  stop: { type: 'string', multiple: true },
  stats: { type: 'boolean' },
  'chat-template': { type: 'string' },
  system: { type: 'string' },
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean', short: 'v' },
}

function num(values, flag) {
  const raw = values[flag]
  if (raw === undefined) return undefined
  const n = Number(raw)
  if (raw.trim() === '' || Number.isNaN(n)) throw new CliError('ERR_INVALID_ARG', `--${flag} must be a number, got '${raw}'`)
  return n
}

/** `--lora file[:scale]`: the scale is the part after the last ':' when it is a number. */
function loraFlag(spec) {
  const m = /^(.*):([^:]*)$/.exec(spec)
  if (m && m[1] !== '' && m[2].trim() !== '' && !Number.isNaN(Number(m[2]))) return { path: m[1], scale: Number(m[2]) }
  if (spec === '') throw new CliError('ERR_INVALID_ARG', '--lora needs a file: --lora adapter.gguf[:scale]')
  return { path: spec }
}

function loadOptions(values) {
  const o = {
    contextSize: num(values, 'context-size'),
    kvCacheType: values['kv-cache-type'],
    threads: num(values, 'threads'),
    gpu: gpuFlag(values.gpu),
    adapters: values.lora && values.lora.map(loraFlag),
    diffusion: values['diffusion-adapter'] && { adapter: values['diffusion-adapter'] },
  }
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined))
}

function generateOptions(values) {
  const o = {
    maxTokens: num(values, 'max-tokens'),
    temperature: num(values, 'temperature'),
    topK: num(values, 'top-k'),
    topP: num(values, 'top-p'),
    minP: num(values, 'min-p'),
    repeatPenalty: num(values, 'repeat-penalty'),
    presencePenalty: num(values, 'presence-penalty'),
    frequencyPenalty: num(values, 'frequency-penalty'),
    seed: num(values, 'seed'),
    stop: values.stop,
    diffusion: diffusionOptions(values),
  }
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined))
}

/** `--steps`, `--block-size`, ... as the `diffusion` option; undefined when none is given. */
function diffusionOptions(values) {
  const d = {
    steps: num(values, 'steps'),
    blockSize: num(values, 'block-size'),
    threshold: num(values, 'threshold'),
    schedule: values.schedule,
    remasking: values.remasking,
    noRepeatNgram: num(values, 'no-repeat-ngram'),
  }
  const given = Object.entries(d).filter(([, v]) => v !== undefined)
  return given.length ? Object.fromEntries(given) : undefined
}

/**
 * Redraws a diffusion model's answer in place on a terminal after every step: committed text,
 * '░' where positions are still masked. Returns the `onStep` callback and `done`, which leaves
 * the final text on screen.
 */
function liveView(out) {
  let lines = 0
  const cols = () => Math.max(20, out.columns || 80)
  const height = (text) => text.split('\n').reduce((n, l) => n + Math.max(1, Math.ceil([...l].length / cols())), 0)
  const draw = (text) => {
    if (lines > 1) out.write(`\x1b[${lines - 1}A`)
    out.write(`\r\x1b[J${text}`)
    lines = height(text)
  }
  return { onStep: (step) => draw(step.text), done: (text) => draw(text) }
}

function addon() {
  try {
    return require('../index.js')
  } catch (e) {
    throw new CliError('ERR_ADDON_LOAD', `the native addon did not load (in a clone, build it with \`npm run build\`; from npm, install @ruvector/ruvllm on a platform with a binary: linux-x64-gnu): ${e.message}`)
  }
}

/** Checks every option (throws ERR_INVALID_ARG, exit 2) before anything is loaded. */
function checkOptions(values) {
  const load = loadOptions(values)
  const generate = generateOptions(values)
  addon().LLM.checkOptions(load, generate)
  return { load, generate }
}

async function load(values, loadOpts) {
  const { LLM } = addon()
  const model = values.model || process.env.RUVLLM_MODEL || 'gemma-3-270m'
  return LLM.load(model, loadOpts)
}

/** Ctrl-C handling: the first press calls `onFirst` (abort), a second one exits at once. */
function onInterrupt(onFirst) {
  let pressed = false
  const handler = () => {
    if (pressed) process.exit(130)
    pressed = true
    onFirst()
  }
  process.on('SIGINT', handler)
}

function printStats(stream) {
  const c = stream.completion
  if (!c) return
  process.stderr.write(
    `[${c.usage.promptTokens} prompt + ${c.usage.completionTokens} generated tokens, ` +
      `prefill ${c.timings.prefillTokensPerSecond.toFixed(1)} tok/s, decode ${c.timings.decodeTokensPerSecond.toFixed(1)} tok/s, ` +
      `first token after ${c.timings.ttftMs.toFixed(0)} ms, finish: ${c.finishReason}` +
      (c.diffusion ? `, ${c.diffusion.steps} steps, ${c.diffusion.tokensPerStep.toFixed(2)} tokens/step` : '') +
      ']\n',
  )
}

async function generate(values, positionals) {
  if (positionals.length !== 1) {
    throw new UsageError('generate takes exactly one prompt argument: ruvllm generate "<prompt>" [options] (see --help)')
  }
  const { load: loadOpts, generate: opts } = checkOptions(values)
  const controller = new AbortController()
  onInterrupt(() => controller.abort()) // stays installed: a second Ctrl-C exits with 130
  const llm = await load(values, loadOpts)
  if (controller.signal.aborted) process.exit(130)
  try {
    const live = llm.info.diffusion && process.stdout.isTTY ? liveView(process.stdout) : undefined
    const stream = llm.stream(positionals[0], { ...opts, signal: controller.signal, ...(live && { onStep: live.onStep }) })
    for await (const chunk of stream) if (!live) process.stdout.write(chunk.text)
    if (live && stream.completion) live.done(stream.completion.text)
    process.stdout.write('\n')
    if (values.stats) printStats(stream)
  } catch (e) {
    if (e && e.code === 'ABORT_ERR') process.stdout.write('\n')
    throw e
  }
  // No llm.close(): the process exits right after, which frees everything at once.
}

/** The --chat-template flag as { name, text }, read before the model loads; undefined when not given. */
function templateFlag(values) {
  const given = values['chat-template']
  if (given !== undefined) {
    if (Object.hasOwn(builtinTemplates, given)) return { name: given, text: builtinTemplates[given] }
    let text
    try {
      text = fs.readFileSync(given, 'utf8')
    } catch (e) {
      throw new CliError(
        'ERR_INVALID_ARG',
        `--chat-template '${given}' is neither a readable file (${e.code}) nor a built-in template (${Object.keys(builtinTemplates).join(', ')})`,
      )
    }
    return { name: path.basename(given), text }
  }
  return undefined
}

/**
 * The model's own template; for a model that ships none (a base model, not tuned for chat, which
 * answers a chat-tuned template's turn markers with junk) the plain transcript, said once.
 */
function defaultTemplate(info) {
  if (info.hasChatTemplate) return { name: 'the model\'s own', text: undefined }
  process.stderr.write(
    `ruvllm: note: this model ships no chat template (it is probably a base model, not tuned for chat); ` +
      `using the built-in 'plain' template. Choose another with --chat-template <file|${Object.keys(builtinTemplates).join('|')}>.\n`,
  )
  return { name: 'plain', text: builtinTemplates.plain }
}

async function chat(values, positionals) {
  if (positionals.length !== 0) throw new UsageError('chat takes no positional arguments (see --help)')
  const { load: loadOpts, generate: opts } = checkOptions(values)
  const flagTemplate = templateFlag(values)
  const llm = await load(values, loadOpts)
  const template = flagTemplate || defaultTemplate(llm.info)
  const stop = [...(opts.stop || []), ...((template.text && builtinStops[template.name]) || [])]
  const { ChatSession } = addon()
  const session = new ChatSession(llm, {
    ...opts,
    ...(stop.length && { stop }),
    ...(template.text && { chatTemplate: template.text }),
    ...(values.system && { systemPrompt: values.system }),
  })
  const rl = readline.createInterface({ input: process.stdin, output: process.stdout, terminal: process.stdin.isTTY })
  process.stderr.write(`ruvllm chat: ${llm.info.name || llm.info.architecture} (${template.name} template). Ctrl-D or /exit to quit.\n`)

  let controller = null
  let lastInterrupt = 0
  const interrupt = () => {
    const now = Date.now()
    if (controller && !controller.signal.aborted) {
      controller.abort()
    } else if (now - lastInterrupt < 2000 || !process.stdin.isTTY) {
      process.exit(130)
    } else {
      process.stderr.write('\n(press Ctrl-C again to quit)\n')
      rl.prompt()
    }
    lastInterrupt = now
  }
  rl.on('SIGINT', interrupt)
  process.on('SIGINT', interrupt)

  /** Streams the reply to `line`; the session keeps the exchange when it completes. */
  const answer = async (line) => {
    controller = new AbortController()
    try {
      const stream = session.stream(line, { signal: controller.signal })
      for await (const chunk of stream) process.stdout.write(chunk.text)
      process.stdout.write('\n')
      if (stream.completion.droppedMessages > 0) {
        process.stderr.write(`ruvllm: note: the conversation outgrew the context; its oldest ${stream.completion.droppedMessages} messages were dropped\n`)
      }
      if (values.stats) printStats(stream)
    } catch (e) {
      if (e && e.code === 'ABORT_ERR') {
        process.stdout.write(' [stopped]\n')
      } else if (e && e.code === 'ERR_CONTEXT_OVERFLOW') {
        process.stderr.write(`ruvllm: ${e.code}: ${e.message}\n`)
      } else {
        throw e
      }
    } finally {
      controller = null
    }
  }

  // Lines are read through the async iterator, which queues them: piped input that arrives
  // while a reply is generating is not lost.
  const lines = rl[Symbol.asyncIterator]()
  rl.setPrompt('> ')
  // Bun closes the interface as soon as piped input ends, and prompting then throws; the lines
  // already read still come from the iterator.
  let inputEnded = false
  rl.on('close', () => (inputEnded = true))
  try {
    for (;;) {
      if (!inputEnded) rl.prompt()
      const { value: line, done } = await lines.next()
      if (done || line.trim() === '/exit') break
      if (line.trim() === '') continue
      await answer(line)
    }
  } finally {
    rl.close()
  }
}

/** Subcommands that live in their own modules (their own flags, usage and exit codes). */
const SUBCOMMANDS = {
  models: (argv) => require('./commands/models.js').run(argv.slice(1)),
  route: (argv) => require('./commands/router.js').run('route', argv.slice(1)),
  hooks: (argv) => require('./commands/router.js').run('hooks', argv.slice(1)),
  bench: (argv) => (argv[1] === 'serve' ? require('./commands/serve.js').benchServe(argv.slice(2)) : require('./commands/router.js').run('bench', argv.slice(1))),
  learn: (argv) => require('./commands/learn.js').run(argv.slice(1)),
  federate: (argv) => require('./commands/federate.js').run(argv.slice(1)),
  serve: (argv) => require('./commands/serve.js').serve(argv.slice(1)),
}

async function main() {
  const argv = process.argv.slice(2)
  if (Object.hasOwn(SUBCOMMANDS, argv[0])) {
    process.exitCode = await SUBCOMMANDS[argv[0]](argv)
    return
  }
  const { values, positionals } = parse(argv, OPTIONS)
  if (values.version) {
    process.stdout.write(`${pkg.version}\n`)
    return
  }
  const [command, ...rest] = positionals
  if (values.help || command === undefined || command === 'help') {
    process.stdout.write(HELP + '\n')
    return
  }
  switch (command) {
    case 'generate':
      return generate(values, rest)
    case 'chat':
      return chat(values, rest)
    default:
      throw new UsageError(`unknown command '${command}' (commands: generate, chat, ${Object.keys(SUBCOMMANDS).join(', ')}; see --help)`)
  }
}

main().then(
  () => process.exit(process.exitCode ?? 0),
  (e) => process.exit(report(e)),
)
