'use strict'
// CLI subcommands for a learning directory (LLM.load(_, { learning: { dir } })):
//   ruvllm learn status --dir <dir> [--json]     what it holds (no model needed)
//   ruvllm learn export --dir <dir> --out <file.gguf>
//                                                the learned adapter as a llama.cpp LoRA GGUF
//   ruvllm learn reset --dir <dir>               delete what learning wrote there
// `run(argv)`: argv the arguments after `learn`; resolves to the exit code.

const path = require('node:path')
const cli = require('./cli.js')

const { UsageError, parse } = cli

const USAGE = `usage:
  ruvllm learn status --dir <dir> [--json]   what a learning directory holds (no model needed)
  ruvllm learn export --dir <dir> --out <file.gguf>
                                             write the learned adapter as a llama.cpp LoRA GGUF
                                             (use it with --lora, llm.loadAdapter or llama.cpp)
  ruvllm learn reset --dir <dir>             delete what learning wrote in <dir>`

function learning() {
  return require(path.join(__dirname, '..', '..', 'index.js')).learning
}

function needDir(values, sub) {
  if (!values.dir) throw new UsageError(`learn ${sub} needs --dir <dir>`)
  return values.dir
}

function status(argv) {
  const { values } = parse(argv, { dir: { type: 'string' }, json: { type: 'boolean' } })
  const s = learning().status(needDir(values, 'status'))
  if (values.json) {
    process.stdout.write(JSON.stringify(s, null, 1) + '\n')
    return 0
  }
  if (!s.exists) {
    process.stdout.write(`${s.dir}: no learning state yet\n`)
    return 0
  }
  const c = s.counters || {}
  const m = s.model ? `${s.model.architecture}, ${s.model.blocks} blocks of ${s.model.dModel}` : 'unknown model'
  process.stdout.write(
    `${s.dir} (${m})\n` +
      `trajectories: ${s.trajectories} (${s.corrections} with corrections)\n` +
      `instant updates: ${c.instantUpdates ?? 0}, background rounds: ${c.rounds ?? 0} (${c.steps ?? 0} steps, ${c.tokens ?? 0} tokens)\n` +
      `consolidations: ${c.consolidations ?? 0}, Fisher updates: ${c.fisherUpdates ?? 0}, bank entries: ${s.bankSize}\n`,
  )
  return 0
}

function exportAdapter(argv) {
  const { values } = parse(argv, { dir: { type: 'string' }, out: { type: 'string' } })
  const dir = needDir(values, 'export')
  if (!values.out) throw new UsageError('learn export needs --out <file.gguf>')
  learning().export(dir, values.out)
  process.stdout.write(`wrote ${values.out}\n`)
  return 0
}

function reset(argv) {
  const { values } = parse(argv, { dir: { type: 'string' } })
  const removed = learning().reset(needDir(values, 'reset'))
  process.stdout.write(removed.length ? `removed:\n${removed.map((p) => `  ${p}`).join('\n')}\n` : 'nothing to remove\n')
  return 0
}

function run(argv) {
  return cli.subcommands('learn', USAGE, { status, export: exportAdapter, reset }, argv)
}

module.exports = { run, USAGE }
