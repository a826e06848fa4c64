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

module.exports = { CliError, UsageError, parse, report, exitCode }
