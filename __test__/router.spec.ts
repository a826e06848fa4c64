// Agent routing against the built addon and the real all-MiniLM-L6-v2 embedder (the model
// cache's copy: `npx ruvllm models download all-minilm-l6-v2`, or RUVLLM_EMBEDDER=<dir>).
import { describe, expect, it, beforeAll } from 'vitest'
import { spawn, spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { mkdtempSync, readFileSync, existsSync, writeFileSync, chmodSync, mkdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { addon, LLM, ROOT, modelPath, rejectsWithCode, throwsWithCode } from './helpers.js'

const { embed, Embedder, Router, models } = addon as any
const ROUTER_JS = join(ROOT, 'bin', 'commands', 'router.js')

function cli(command: string, args: string[], env: Record<string, string>) {
  const script = `require(${JSON.stringify(ROUTER_JS)}).run(process.argv[1], process.argv.slice(2)).then(c => process.exit(c))`
  return spawnSync(process.execPath, ['-e', script, command, ...args], {
    encoding: 'utf8',
    env: { ...process.env, ...env },
    timeout: 120_000,
  })
}

function cliAsync(command: string, args: string[], env: Record<string, string>): Promise<number | null> {
  const script = `require(${JSON.stringify(ROUTER_JS)}).run(process.argv[1], process.argv.slice(2)).then(c => process.exit(c))`
  return new Promise((resolve) => {
    const p = spawn(process.execPath, ['-e', script, command, ...args], { env: { ...process.env, ...env }, stdio: 'ignore' })
    p.on('exit', (code) => resolve(code))
  })
}

const cos = (a: Float32Array, b: Float32Array) => a.reduce((s, x, i) => s + x * b[i], 0)

describe('embed', () => {
  it('returns L2-normalised Float32Arrays that separate meanings', async () => {
    const [a, b, c] = await embed(['fix the login bug', 'repair the authentication defect', 'bake a chocolate cake'])
    expect(a).toBeInstanceOf(Float32Array)
    expect(a.length).toBe(384)
    expect(Math.abs(cos(a, a) - 1)).toBeLessThan(1e-4)
    expect(cos(a, b)).toBeGreaterThan(cos(a, c) + 0.3)
  })

  it('validates its argument', async () => {
    await rejectsWithCode(() => embed('not an array'), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => embed([1, 2]), 'ERR_INVALID_ARG')
    expect(await embed([])).toEqual([])
  })

  it('Embedder.load with a bad directory rejects with ERR_EMBEDDER_NOT_FOUND naming the download command', async () => {
    const e = await rejectsWithCode(() => Embedder.load('/nonexistent/model'), 'ERR_EMBEDDER_NOT_FOUND')
    expect(e.message).toContain('npx ruvllm models download all-minilm-l6-v2')
    const emb = await Embedder.load()
    expect(emb.dim).toBe(384)
    const [v] = await emb.embed(['hello'])
    expect(v.length).toBe(384)
  })

  it('the routing adapter is opt-in: Embedder.load(null, { adapter: true }) or RUVLLM_EMBEDDER_ADAPTER=routing', async () => {
    const plain = await Embedder.load()
    const routing = await Embedder.load(null, { adapter: true })
    expect(routing.id).toMatch(/\+routing:/)
    expect(plain.id).not.toMatch(/\+routing:/)
    const text = 'plan the next sprint'
    const [a] = await routing.embed([text])
    const [b] = await plain.embed([text])
    const [c] = await embed([text])
    expect(Array.from(c)).toEqual(Array.from(b)) // embed() is the model as published
    expect(cos(a, b)).toBeLessThan(0.999) // the adapter changes the embedding ...
    expect(cos(a, b)).toBeGreaterThan(0.5) // ... without replacing it
    const dir = mkdtempSync(join(tmpdir(), 'ruvllm-adapter-'))
    const r = new Router({ embedder: routing })
    expect((await r.route('write unit tests for the parser')).agent).toBe('tester')
    await r.save(join(dir, 'r.json'))
    expect(JSON.parse(readFileSync(join(dir, 'r.json'), 'utf8')).embedder).toBe(routing.id)
    // The hooks (new processes) take it from the environment.
    const pre = cli('hooks', ['pre-task', '--description', 'write unit tests for the parser'], { XDG_CONFIG_HOME: dir, RUVLLM_EMBEDDER_ADAPTER: 'routing' })
    expect(pre.status).toBe(0)
    expect(JSON.parse(readFileSync(join(dir, 'ruvllm', 'router-state.json'), 'utf8')).embedder).toBe(routing.id)
    await rejectsWithCode(() => Embedder.load(null, { adapter: 'no' }), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => Embedder.load(null, { adaptor: true }), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => Embedder.load(null, 5), 'ERR_INVALID_ARG')
  })
})

describe('the embedder from the model cache, with no Python', () => {
  const require = createRequire(import.meta.url)
  /** A PATH with only a `python3` / `python` that leaves a mark when anything runs it. */
  function noPython(dir: string): { PATH: string; mark: string } {
    const bin = join(dir, 'bin')
    mkdirSync(bin, { recursive: true })
    const mark = join(dir, 'python-ran')
    for (const py of ['python3', 'python']) {
      writeFileSync(join(bin, py), `#!/bin/sh\ntouch '${mark}'\nexit 1\n`)
      chmodSync(join(bin, py), 0o755)
    }
    return { PATH: bin, mark }
  }
  /** `embed(['fix the login bug'])` in a child node; prints the vector's length and how often a
   * 20 ms timer fired while it ran (the JS thread stays free during a first-use download). */
  function child(env: Record<string, string | undefined>) {
    const script = `const { embed } = require(${JSON.stringify(ROOT)}); let ticks = 0; const t = setInterval(() => ticks++, 20);
      embed(['fix the login bug']).then((v) => { clearInterval(t); console.log(JSON.stringify({ dim: v[0].length, ticks })) },
        (e) => { clearInterval(t); console.log(JSON.stringify({ code: e.code, message: e.message })) })`
    const merged: Record<string, string | undefined> = { ...process.env, RUVLLM_EMBEDDER: undefined, ...env }
    const childEnv = Object.fromEntries(Object.entries(merged).filter(([, v]) => v !== undefined)) as Record<string, string>
    return new Promise<{ out: any; stderr: string }>((resolve) => {
      const p = spawn(process.execPath, ['-e', script], { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] })
      let stdout = ''
      let stderr = ''
      p.stdout.on('data', (d) => (stdout += d))
      p.stderr.on('data', (d) => (stderr += d))
      p.on('close', () => resolve({ out: stdout ? JSON.parse(stdout) : null, stderr }))
    })
  }

  it('is listed as the embedder and found in the cache with no python3 on PATH', async () => {
    const entry = models.list().find((m: any) => m.id === 'all-minilm-l6-v2')
    expect(entry).toMatchObject({ kind: 'embedder', sources: ['hub', 'pypi'] })
    expect(entry.downloaded).toBe(true) // npm run quickstart / npx ruvllm models download all-minilm-l6-v2
    const dir = mkdtempSync(join(tmpdir(), 'ruvllm-nopy-'))
    const { PATH, mark } = noPython(dir)
    const r = await child({ PATH, HF_HUB_OFFLINE: '1' })
    expect(r.out).toMatchObject({ dim: 384 })
    expect(r.stderr).not.toContain('downloading')
    expect(existsSync(mark)).toBe(false)
    // Nothing cached and offline: the coded error with the command that fetches it.
    const off = await child({ PATH, HF_HUB_OFFLINE: '1', RUVLLM_MODELS_DIR: join(dir, 'empty') })
    expect(off.out.code).toBe('ERR_EMBEDDER_NOT_FOUND')
    expect(off.out.message).toContain('npx ruvllm models download all-minilm-l6-v2')
    expect(existsSync(mark)).toBe(false)
  }, 60_000)

  it('the first embedding call downloads it into the cache with a one-line notice, off the JS thread', async () => {
    const real = models.path('all-minilm-l6-v2')
    const { startFakeServer } = require('../tools/fake-model-server.js')
    const srv = await startFakeServer()
    try {
      for (const f of ['config.json', 'tokenizer.json', 'model.safetensors']) {
        srv.addHubFile('sentence-transformers/all-MiniLM-L6-v2', f, { path: join(real, f) })
      }
      srv.behaviour.throttleMs = 1
      const dir = mkdtempSync(join(tmpdir(), 'ruvllm-firstuse-'))
      const { PATH, mark } = noPython(dir)
      const env = { PATH, RUVLLM_MODELS_DIR: join(dir, 'cache'), HF_ENDPOINT: srv.url, RUVLLM_PYPI_URL: `${srv.url}/pypi`, HF_HUB_OFFLINE: undefined }
      const r = await child(env)
      expect(r.out).toMatchObject({ dim: 384 })
      expect(r.out.ticks).toBeGreaterThan(5)
      const notices = r.stderr.split('\n').filter((l) => l.startsWith('ruvllm: '))
      expect(notices).toEqual(['ruvllm: downloading the sentence embedder all-minilm-l6-v2 (~90 MB) for routing …'])
      expect(srv.gets('/resolve/').length).toBe(3)
      // Now cached: the next process needs no server.
      const again = await child({ ...env, HF_ENDPOINT: 'http://127.0.0.1:9', HF_HUB_OFFLINE: '1' })
      expect(again.out).toMatchObject({ dim: 384 })
      expect(again.stderr).toBe('')
      expect(existsSync(mark)).toBe(false)
    } finally {
      await srv.close()
    }
  }, 120_000)
})

describe('LLM hidden states as embedder', () => {
  it('llm.embed and Embedder.fromModel: unit vectors of the hidden width, usable by a Router', async () => {
    const llm = await LLM.load(modelPath(), { contextSize: 256 })
    try {
      expect(llm.info.embeddingLength).toBe(640)
      const [a, b] = await llm.embed(['fix the login bug', 'fix the login bug'])
      expect(a).toBeInstanceOf(Float32Array)
      expect(a.length).toBe(640)
      expect(Math.abs(cos(a, a) - 1)).toBeLessThan(1e-4)
      expect(Array.from(b)).toEqual(Array.from(a))
      const emb = Embedder.fromModel(llm)
      expect(emb.dim).toBe(640)
      expect(emb.id).toMatch(/^llm-mean:gemma-3-270m-q4_k_m\.gguf:/)
      const [c] = await emb.embed(['fix the login bug'])
      expect(Array.from(c)).toEqual(Array.from(a))
      // Generation still works between embeddings (they share the engine thread and cache).
      const g = await llm.generate('The capital of France is', { maxTokens: 2, temperature: 0 })
      expect(g.text.length).toBeGreaterThan(0)
      const r = new Router({
        agents: [
          { name: 'kitchen', description: 'cooking and baking food', examples: ['bake bread', 'cook pasta', 'fry an egg'] },
          { name: 'garden', description: 'gardening and plants', examples: ['water the plants', 'mow the lawn', 'plant tulips'] },
        ],
        embedder: emb,
      })
      const route = await r.route('roast a chicken in the oven')
      expect(['kitchen', 'garden']).toContain(route.agent)
      expect(route.confidence).toBeGreaterThan(0)
      await rejectsWithCode(() => llm.embed(['word '.repeat(400)]), 'ERR_CONTEXT_OVERFLOW')
      await rejectsWithCode(() => llm.embed('not an array'), 'ERR_INVALID_ARG')
      throwsWithCode(() => Embedder.fromModel({}), 'ERR_INVALID_ARG')
      throwsWithCode(() => Embedder.fromModel(emb), 'ERR_INVALID_ARG')
      throwsWithCode(() => Embedder.fromModel(undefined), 'ERR_INVALID_ARG')
      await rejectsWithCode(() => (addon as any).benchRouting({}, 42), 'ERR_INVALID_ARG')
      await rejectsWithCode(() => (addon as any).benchRouting({}, llm), 'ERR_INVALID_ARG')
    } finally {
      await llm.close()
    }
    await rejectsWithCode(() => llm.embed(['hi']), 'ERR_CLOSED')
    throwsWithCode(() => Embedder.fromModel(llm), 'ERR_CLOSED')
  }, 120_000)
})

describe('Router', () => {
  let router: any
  beforeAll(async () => {
    router = new Router()
    await router.route('warm up')
  }, 120_000)

  it('routes to the 13 Claude Flow agents with a calibrated confidence', async () => {
    const r = await router.route('Write unit tests for the checkout flow')
    expect(r.agent).toBe('tester')
    expect(r.confidence).toBeGreaterThan(0)
    expect(r.confidence).toBeLessThanOrEqual(1)
    expect(r.alternatives).toHaveLength(3)
    for (const a of r.alternatives) expect(a.score).toBeLessThanOrEqual(r.confidence)
    expect(r.latencyMs).toBeGreaterThan(0)
    const s = await router.stats()
    expect(s.agents).toHaveLength(13)
    expect(s.agents).toContain('security-architect')
  })

  it('custom agents, examples, feedback, save and load', async () => {
    const r = new Router({
      agents: [
        { name: 'kitchen', description: 'cooking and baking', examples: ['bake bread', 'cook pasta'] },
        { name: 'garden', description: 'gardening', examples: ['water the plants'] },
      ],
    })
    expect(await r.addExamples([{ text: 'mow the lawn', agent: 'garden' }])).toBe(1)
    await rejectsWithCode(() => r.addExamples([{ text: 'x', agent: 'nobody' }]), 'ERR_INVALID_ARG')
    expect((await r.route('roast a chicken')).agent).toBe('kitchen')
    const fb = await r.feedback('prune the rose bushes', { agent: 'garden', success: true })
    expect(fb.effect).toBe('added')
    const fail = await r.feedback('prune the rose bushes', { agent: 'garden', success: false })
    expect(fail.effect).toBe('penalised')
    await rejectsWithCode(() => r.feedback('x', { agent: 'garden' }), 'ERR_INVALID_ARG')
    const dir = mkdtempSync(join(tmpdir(), 'ruvllm-router-'))
    const file = join(dir, 'r.json')
    await r.save(file)
    const loaded = await Router.load(file)
    expect((await loaded.stats()).patterns).toBe((await r.stats()).patterns)
    const a = await r.route('trim the hedge')
    const b = await loaded.route('trim the hedge')
    expect(b.agent).toBe(a.agent)
    expect(Math.abs(b.confidence - a.confidence)).toBeLessThan(1e-5)
    await rejectsWithCode(() => Router.load(join(dir, 'missing.json')), 'ERR_IO')
  }, 60_000)

  it('bad options are ERR_INVALID_ARG', async () => {
    throwsWithCode(() => new Router({ agents: 'coder' }), 'ERR_INVALID_ARG')
    throwsWithCode(() => new Router({ agents: [{ name: 'a' }, { name: 'a' }] }), 'ERR_INVALID_ARG')
    throwsWithCode(() => new Router({ embedder: 42 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => router.route(''), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => router.route(7), 'ERR_INVALID_ARG')
  })
})

describe('route / hooks CLI', () => {
  it('pre-task prints hook JSON, post-task learns, state persists across processes', async () => {
    const home = mkdtempSync(join(tmpdir(), 'ruvllm-hooks-'))
    const env = { XDG_CONFIG_HOME: home }
    const pre = cli('hooks', ['pre-task', '--description', 'Add OAuth login to the API'], env)
    // The first call builds the state, and says so; later ones are silent.
    expect(pre.stderr).toMatch(/^ruvllm: note: first run: building the router state/)
    expect(pre.status).toBe(0)
    const out = JSON.parse(pre.stdout)
    expect(out.agent).toBe('coder')
    expect(['haiku', 'sonnet', 'opus']).toContain(out.model)
    expect(out.alternatives.length).toBe(3)
    const state = join(home, 'ruvllm', 'router-state.json')
    expect(existsSync(state)).toBe(true)
    const base = JSON.parse(readFileSync(state, 'utf8')).patterns.length

    // Four hook processes at once: no update may be lost.
    const codes = await Promise.all(
      [0, 1, 2, 3].map((i) =>
        cliAsync('hooks', ['post-task', '--task', `provision ${i} queue brokers with terraform in region ${i}`, '--agent', 'devops', '--success', 'true'], env),
      ),
    )
    expect(codes).toEqual([0, 0, 0, 0])
    const saved = JSON.parse(readFileSync(state, 'utf8'))
    const outcomes = saved.patterns.reduce((s: number, p: any) => s + p.successes, 0)
    expect(outcomes).toBe(4)
    expect(saved.patterns.length).toBeGreaterThan(base)

    const r = cli('route', ['write the OpenAPI spec for the orders service', '--json'], env)
    expect(r.stderr).toBe('')
    expect(r.status).toBe(0)
    expect(JSON.parse(r.stdout).agent).toBe('api-docs')
    const bad = cli('hooks', ['post-task', '--task', 'x', '--agent', 'devops', '--success', 'maybe'], env)
    expect(bad.status).toBe(2)
    expect(bad.stderr).toMatch(/^ruvllm: ERR_USAGE: /)
    // A bad value is exit 2 whether the CLI or the addon finds it.
    const unknown = cli('hooks', ['post-task', '--task', 'x', '--agent', 'nobody', '--success', 'true'], env)
    expect(unknown.status).toBe(2)
    expect(unknown.stderr).toMatch(/^ruvllm: ERR_INVALID_ARG: /)
    const badHalvings = cli('bench', ['routing', '--halvings', 'many'], env)
    expect(badHalvings.status).toBe(2)
    expect(badHalvings.stderr).toContain('--halvings takes a whole number')
    // Options are checked before the benchmark starts.
    await rejectsWithCode(() => (addon as any).benchRouting({ halvings: -1 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(() => (addon as any).benchRouting({ halvings: 'all' }), 'ERR_INVALID_ARG')
  }, 180_000)
})
