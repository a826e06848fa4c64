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
    const r = run(['generate', CAPITALS, '--model', modelPath(), '--max-tokens', '8', '--temperature', '0', '--stats'])
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

  it('chat keeps a conversation with the built-in template on a base model', () => {
    const r = run(['chat', '--model', modelPath(), '--max-tokens', '12', '--temperature', '0'], 'Hello!\nWhat did I just say?\n')
    expect(r.status, r.stderr).toBe(0)
    expect(r.stderr).toContain('ships no chat template')
    expect(r.stdout.split('> ').length).toBeGreaterThanOrEqual(3)
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
