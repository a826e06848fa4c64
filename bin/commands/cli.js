'use strict'
// What every CLI command shares: argument parsing, the error line and the exit codes.
//
// Errors are one line on stderr, `ruvllm: <code>: <message>`. Exit codes: 2 for a usage mistake
// or a bad argument value (ERR_USAGE, ERR_INVALID_ARG: the same mistake gives the same code
// whether the parser or the engine finds it), 130 for an interrupt, 1 for anything else.

const { parseArgs } = require('node:util')

class CliError extends Error {
  constructor(code, message) {
    super(message)
    this.code = code
  }
}

class UsageError extends CliError {
  constructor(message) {
    super('ERR_USAGE', message)
  }
}

/** The addon's option names, as the flags a CLI user typed. */
const FLAGS = {
  maxTokens: '--max-tokens',
  temperature: '--temperature',
  topK: '--top-k',
  topP: '--top-p',
  minP: '--min-p',
  repeatPenalty: '--repeat-penalty',
  presencePenalty: '--presence-penalty',
  frequencyPenalty: '--frequency-penalty',
  seed: '--seed',
  stop: '--stop',
  contextSize: '--context-size',
  threads: '--threads',
  chatTemplate: '--chat-template',
  adapters: '--lora',
}
const FLAG_NAMES = new RegExp(`\\b(${Object.keys(FLAGS).join('|')})\\b`, 'g')

/**
 * `parseArgs` in strict mode, with a number that starts with '-' taken as the value of the
 * option before it (`--max-tokens -5` reads as `--max-tokens=-5`, so both forms get the same
 * range error instead of one being a parse error). Parse errors are `ERR_USAGE`.
 */
function parse(argv, options) {
  const short = Object.fromEntries(Object.entries(options).filter(([, o]) => o.short).map(([k, o]) => [o.short, k]))
  const args = []
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    const name = a.startsWith('--') ? a.slice(2) : /^-[^-]$/.test(a) ? short[a[1]] : undefined
    const next = argv[i + 1]
    if (name && options[name] && options[name].type === 'string' && next !== undefined && /^-(\d|\.\d|Infinity)/.test(next)) {
      args.push(`--${name}=${next}`)
      i++
    } else {
      args.push(a)
    }
  }
  try {
    return parseArgs({ args, options, allowPositionals: true, strict: true })
  } catch (e) {
    throw new UsageError(`${e.message} (see --help)`)
  }
}

/** The exit code for an error code. */
function exitCode(code) {
  if (code === 'ABORT_ERR') return 130
  if (code === 'ERR_USAGE' || code === 'ERR_INVALID_ARG') return 2
  return 1
}

/** Writes the one-line error for `e` on stderr (addon option names said as flags) and returns its exit code. */
function report(e) {
  const code = (e && e.code) || 'ERR_INTERNAL'
  let message = String((e && e.message) || e).replace(/\s*\n\s*/g, ' ')
  if (code === 'ERR_INVALID_ARG') message = message.replace(FLAG_NAMES, (n) => FLAGS[n])
  process.stderr.write(`ruvllm: ${code}: ${message}\n`)
  return exitCode(code)
}

/**
 * Runs the subcommand `argv[0]` of command `name` from `handlers` (name → function of the rest
 * of `argv`, sync or async). No arguments: usage on stdout, exit code 2; `--help`: usage, 0. An
 * error is reported with its code (usage errors followed by the usage) and becomes the exit code.
 */
async function subcommands(name, usage, handlers, argv) {
  if (argv.length === 0 || argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(usage + '\n')
    return argv.length === 0 ? 2 : 0
  }
  const [sub, ...rest] = argv
  try {
    if (Object.hasOwn(handlers, sub)) return await handlers[sub](rest)
    const subs = Object.keys(handlers)
    throw new UsageError(`unknown ${name} command ${JSON.stringify(sub)}; use ${subs.slice(0, -1).join(', ')} or ${subs.at(-1)}`)
  } catch (e) {
    const code = report(e)
    if (e && e.code === 'ERR_USAGE') process.stderr.write(usage + '\n')
    return code
  }
}

/** `--gpu auto|cuda|off`: `LLM.load`'s `gpu` option (`off` is `false`, the CPU). */
function gpuFlag(v) {
  if (v === undefined) return undefined
  if (v === 'auto' || v === 'cuda') return v
  if (v === 'off') return false
  throw new CliError('ERR_INVALID_ARG', `--gpu must be auto, cuda or off, got '${v}'`)
}

module.exports = { CliError, UsageError, parse, report, exitCode, subcommands, gpuFlag }
