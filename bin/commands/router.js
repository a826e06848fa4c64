'use strict'
// CLI subcommands for agent routing:
//   ruvllm route "<task>" [--json] [--state <file>]
//   ruvllm hooks pre-task --description "<task>" [--state <file>]
//   ruvllm hooks post-task --task "<task>" --agent <agent> --success true|false [--state <file>]
//   ruvllm bench routing [--json] [--sizes 5000,50000] [--halvings N] [--model <gguf|id>]
//   ruvllm bench diffusion [flags of benches/diffusion.mjs]
// `run(command, argv)`: command is 'route' | 'hooks' | 'bench'; argv the arguments after it.
// Resolves to the exit code. Errors print `ruvllm: <code>: <message>` on stderr (cli.js); a
// usage error also prints the usage. `--help` on any of them prints the usage.

const fs = require('node:fs')
const path = require('node:path')
const cli = require('./cli.js')

const { UsageError, parse } = cli

function addon() {
  return require(path.join(__dirname, '..', '..', 'index.js'))
}

const USAGE = `usage:
  ruvllm route "<task>" [--json] [--state <file>]
  ruvllm hooks pre-task --description "<task>" [--state <file>]
  ruvllm hooks post-task --task "<task>" --agent <agent> --success true|false [--state <file>]
  ruvllm bench routing [--json] [--sizes 5000,50000] [--halvings N] [--model <gguf|id>]
                                   (--model: embed with that LLM's pooled hidden states)
  ruvllm bench diffusion [--manifest m.json ...] [--sequences N] [--samples N] [--answers N] [--json out.json]
  ruvllm bench learning [flags of benches/learning.mjs; --help lists them]
  ruvllm bench federation [--nodes 8] [--quick] [--json] [flags of benches/federation.mjs]
  ruvllm bench serve [--url <url>] [--clients 1,4,8,16] [--duration 60] [--max-tokens N] [--system-prompt-tokens N]
                                   (ruvllm bench serve --help)`

/**
 * Routes with the persisted router; the first call on a machine builds that state (embeds the
 * agent catalogue), which takes a while, so it is announced on stderr.
 */
function preTask(description, state) {
  const a = addon()
  const file = a.hooksStatePath(state)
  if (!fs.existsSync(file)) {
    process.stderr.write(`ruvllm: note: first run: building the router state (embedding the agent catalogue) in ${file}; this takes a few seconds, once\n`)
  }
  return a.hooksPreTask(description, state)
}

function bool(v, name) {
  if (v === 'true' || v === '1' || v === 'yes') return true
  if (v === 'false' || v === '0' || v === 'no') return false
  throw new UsageError(`${name} must be true or false (got ${JSON.stringify(v)})`)
}

async function route(argv) {
  const { values, positionals } = parse(argv, { json: { type: 'boolean' }, state: { type: 'string' } })
  const task = positionals.join(' ').trim()
  if (!task) throw new UsageError('route needs a task: ruvllm route "add OAuth login to the API"')
  // The CLI routes with the persisted (learning) router, as the hooks do.
  const r = await preTask(task, values.state)
  if (values.json) {
    process.stdout.write(JSON.stringify(r) + '\n')
  } else {
    const alts = r.alternatives.map((a) => `${a.agent} ${(a.score * 100).toFixed(1)}%`).join(', ')
    process.stdout.write(
      `${r.agent}  (confidence ${(r.confidence * 100).toFixed(1)}%, ${r.latencyMs.toFixed(1)} ms)\n` +
        `alternatives: ${alts}\nsuggested model: ${r.model}\n`,
    )
  }
  return 0
}

async function hooks(argv) {
  const [sub, ...rest] = argv
  if (sub === 'pre-task') {
    const { values } = parse(rest, { description: { type: 'string' }, state: { type: 'string' } })
    if (!values.description) throw new UsageError('hooks pre-task needs --description "<task>"')
    const r = await preTask(values.description, values.state)
    process.stdout.write(JSON.stringify(r) + '\n')
    return 0
  }
  if (sub === 'post-task') {
    const { values } = parse(rest, {
      task: { type: 'string' },
      agent: { type: 'string' },
      success: { type: 'string' },
      state: { type: 'string' },
    })
    if (!values.task || !values.agent || values.success === undefined) {
      throw new UsageError('hooks post-task needs --task "<task>" --agent <agent> --success true|false')
    }
    const r = await addon().hooksPostTask(values.task, values.agent, bool(values.success, '--success'), values.state)
    process.stdout.write(JSON.stringify(r) + '\n')
    return 0
  }
  throw new UsageError(`unknown hooks command ${JSON.stringify(sub)}; use pre-task or post-task`)
}

async function bench(argv) {
  const [sub, ...rest] = argv
  if (sub === 'diffusion' || sub === 'learning' || sub === 'federation') {
    // These benchmarks are programs of their own (benches/<name>.mjs); their flags pass through.
    // They are not in the npm package: they need a clone of the repository.
    const script = path.join(__dirname, `../../benches/${sub}.mjs`)
    if (!fs.existsSync(script)) throw new cli.CliError('ERR_USAGE', `bench ${sub} runs benches/${sub}.mjs from a clone of the repository; the npm package does not include it`)
    const r = require('node:child_process').spawnSync(process.execPath, [script, ...rest], { stdio: 'inherit' })
    return r.status ?? 1
  }
  if (sub !== 'routing') throw new UsageError(`unknown benchmark ${JSON.stringify(sub)}; use "bench routing", "bench serve", "bench learning", "bench federation" or "bench diffusion"`)
  const { values } = parse(rest, { json: { type: 'boolean' }, sizes: { type: 'string' }, model: { type: 'string' }, halvings: { type: 'string' } })
  const opts = {}
  if (values.sizes) {
    opts.sizes = values.sizes.split(',').map((s) => {
      const n = Number(s)
      if (!Number.isInteger(n) || n < 0) throw new UsageError(`--sizes takes numbers, got ${JSON.stringify(s)}`)
      return n
    })
  }
  if (values.halvings !== undefined) {
    const n = Number(values.halvings)
    if (!/^\d+$/.test(values.halvings) || n > 1000) throw new UsageError(`--halvings takes a whole number from 0 to 1000, got ${JSON.stringify(values.halvings)}`)
    opts.halvings = n
  }
  // --model: embed with that LLM's pooled hidden states instead of all-MiniLM-L6-v2.
  let llm = null
  let embedder
  if (values.model) {
    llm = await addon().LLM.load(values.model, { download: false })
    embedder = addon().Embedder.fromModel(llm)
  }
  try {
    const out = await addon().benchRouting(opts, embedder)
    process.stdout.write(values.json ? JSON.stringify(out.report, null, 1) + '\n' : out.markdown + '\n')
  } finally {
    if (llm) await llm.close()
  }
  return 0
}

async function run(command, argv) {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(USAGE + '\n')
    return 0
  }
  try {
    if (command === 'route') return await route(argv)
    if (command === 'hooks') return await hooks(argv)
    if (command === 'bench') return await bench(argv)
    throw new UsageError(`unknown command ${JSON.stringify(command)}`)
  } catch (e) {
    const code = cli.report(e)
    if (e && e.code === 'ERR_USAGE') process.stderr.write(USAGE + '\n')
    return code
  }
}

module.exports = { run, USAGE }
