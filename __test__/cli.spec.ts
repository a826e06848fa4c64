// The CLI as a user runs it: a child process.
import { describe, expect, it } from 'vitest'
import { spawnSync, spawn } from 'node:child_process'
import { join } from 'node:path'
import { CAPITALS, ROOT, modelPath } from './helpers.js'

const CLI = join(ROOT, 'bin', 'ruvllm.js')
const run = (args: string[], input?: string) =>
  spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', input, timeout: 120_000 })

describe('ruvllm CLI', () => {
  it('--version and --help', () => {
    const v = run(['--version'])
    expect(v.status).toBe(0)
    expect(v.stdout.trim()).toMatch(/^\d+\.\d+\.\d+/)
    const h = run(['--help'])
    expect(h.status).toBe(0)
    expect(h.stdout).toContain('ruvllm generate')
    expect(h.stdout).toContain('--chat-template')
  })

  it('generate streams text from the real model to stdout', () => {
    const r = run(['generate', CAPITALS, '--model', modelPath(), '--max-tokens', '8', '--temperature', '0', '--gpu', 'off', '--stats'])
    expect(r.stderr).toMatch(/8 generated tokens/)
    expect(r.status).toBe(0)
    expect(r.stdout.startsWith(' Berlin')).toBe(true)
  })

  it('errors are one line on stderr and a non-zero exit', () => {
    for (const [args, code] of [
      [['generate', 'hi', '--model', '/nonexistent/model.gguf'], 'ERR_MODEL_NOT_FOUND'],
      [['generate', 'hi', '--model', modelPath(), '--max-tokens', 'lots'], 'ERR_INVALID_ARG'],
      [['generate', 'hi', '--model', modelPath(), '--top-p', '7'], 'ERR_INVALID_ARG'],
      [['generate', '--model', modelPath()], 'ERR_USAGE'],
      [['frobnicate'], 'ERR_USAGE'],
      [['generate', 'hi', '--no-such-flag'], 'ERR_USAGE'],
    ] as [string[], string][]) {
      const r = run(args)
      expect(r.status, args.join(' ')).not.toBe(0)
      const lines = r.stderr.trim().split('\n')
      expect(lines.length, r.stderr).toBe(1)
      expect(lines[0]).toMatch(new RegExp(`^ruvllm: ${code}: `))
    }
  })

  it('bad option values are exit 2 with the flag named, in any spelling, before the model loads', () => {
    // A model path that does not exist: the option error must come first.
    const missing = '/nonexistent/model.gguf'
    const forms = [['--max-tokens', '-5'], ['--max-tokens=-5'], ['-n', '-5']]
    for (const form of forms) {
      const r = run(['generate', 'hi', '--model', missing, ...form])
      expect(r.status, form.join(' ')).toBe(2)
      expect(r.stderr.trim()).toMatch(/^ruvllm: ERR_INVALID_ARG: --max-tokens must be an integer in 1\.\.=\d+, got -5$/)
    }
    for (const args of [
      ['generate', 'hi', '--temperature', '-1'],
      ['generate', 'hi', '--top-p', '1.5'],
      ['generate', 'hi', '--context-size', '16', '--max-tokens', '100'],
      ['chat', '--seed', '-1'],
      ['generate', 'hi', '--gpu', 'maybe'],
      ['chat', '--chat-template', '/nonexistent/template.jinja'],
    ]) {
      const r = run([...args, '--model', missing])
      expect(r.status, args.join(' ')).toBe(2)
      expect(r.stderr.trim(), args.join(' ')).toMatch(/^ruvllm: ERR_INVALID_ARG: --[a-z-]+ /)
    }
  })

  it('every command takes --help', () => {
    for (const args of [['generate', '--help'], ['chat', '--help'], ['models', '--help'], ['route', '--help'], ['hooks', '--help'], ['bench', '--help'], ['route', 'x', '-h'], ['serve', '--help'], ['bench', 'serve', '--help']]) {
      const r = run(args)
      expect(r.status, args.join(' ')).toBe(0)
      expect(r.stdout, args.join(' ')).toMatch(/usage/i)
      expect(r.stderr, args.join(' ')).toBe('')
    }
  })

  it('route and hooks errors have the same one-line format as the rest', () => {
    const r = run(['route'])
    expect(r.status).toBe(2)
    expect(r.stderr.split('\n')[0]).toMatch(/^ruvllm: ERR_USAGE: route needs a task/)
    const h = run(['hooks', 'post-task', '--no-such-flag'])
    expect(h.status).toBe(2)
    expect(h.stderr.split('\n')[0]).toMatch(/^ruvllm: ERR_USAGE: /)
  })

  it('chat keeps a conversation with the plain template on a base model, and says so', () => {
    const r = run(['chat', '--model', modelPath(), '--max-tokens', '12', '--temperature', '0'], 'Hello!\nWhat did I just say?\n')
    expect(r.status, r.stderr).toBe(0)
    expect(r.stderr).toContain('ships no chat template')
    expect(r.stderr).toContain("built-in 'plain' template")
    expect(r.stderr).toContain('(plain template)')
    // Two replies, one line each (Bun prints no prompt once piped input has ended).
    expect(r.stdout.replace(/> /g, '').trim().split('\n').filter((l) => l.trim()).length).toBeGreaterThanOrEqual(2)
  })

  it('Ctrl-C (SIGINT) during generation stops it and exits with 130', async () => {
    const child = spawn(process.execPath, [CLI, 'generate', 'Once upon a time', '--model', modelPath(), '--max-tokens', '2000'])
    let out = ''
    let sent = false
    child.stdout.on('data', (d) => {
      out += d
      if (out.length > 20 && !sent) {
        sent = true
        child.kill('SIGINT')
      }
    })
    let err = ''
    child.stderr.on('data', (d) => (err += d))
    const code = await new Promise((r) => child.on('exit', (c) => r(c)))
    expect(code).toBe(130)
    expect(err.trim().split('\n')).toHaveLength(1)
    expect(err).toMatch(/^ruvllm: ABORT_ERR: /)
  })
})
