// The masked-diffusion LM from JavaScript. The API, options and errors run on the real Gemma 3
// 270M with small random two-bucket conversion adapters written here (the decoder's mechanics);
// the trained model the repo ships (`gemma-3-270m-diffusion`) answers the greedy probe.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { existsSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawnSync } from 'node:child_process'
import { LLM, ROOT, modelPath, rejectsWithCode, type LLMType } from './helpers.js'
import { randomFactors, shapeOf, writeLoraGguf } from '../tools/lora-files.mjs'

const PROMPT = 'The capital of France is Paris. The capital of Germany is'
const MANIFEST = join(ROOT, 'crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/manifest.json')

let dir: string
let adapters: string[]
let llm: LLMType

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-diffusion-'))
  const base = await LLM.load(modelPath(), { contextSize: 128 })
  const meta = base.metadata() as Record<string, any>
  await base.close()
  const shape = shapeOf(meta)
  const maskEmbd = new Float32Array(shape.dModel).map((_, i) => Math.sin(i) * 0.05)
  adapters = [
    [0, 0.5, 1n],
    [0.5, 1, 2n],
  ].map(([tMin, tMax, seed]) => {
    const p = join(dir, `t${tMin}.gguf`)
    writeLoraGguf(p, meta['general.architecture'], 4, 4, randomFactors(shape, 4, 0.01, seed as bigint), {
      maskTokenId: 4,
      tMin: tMin as number,
      tMax: tMax as number,
      shift: true,
      maskEmbd,
    })
    return p
  })
  llm = await LLM.load(modelPath(), { contextSize: 256, threads: 2, diffusion: { adapter: adapters } })
}, 120_000)

afterAll(async () => {
  await llm?.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('a diffusion model', () => {
  it('reports every step and streams the committed text in order', async () => {
    expect(llm.info.diffusion).toBe(true)
    const steps: any[] = []
    const c = await llm.generate(PROMPT, { maxTokens: 12, temperature: 0, diffusion: { blockSize: 6, steps: 12 }, onStep: (s) => void steps.push(s) })
    expect(c.diffusion).toBeDefined()
    expect(c.diffusion!.steps).toBe(steps.length)
    expect(steps.map((s) => s.step)).toEqual(steps.map((_, i) => i))
    expect(steps.every((s) => s.positions.length === 1 && s.tokens.length === 1)).toBe(true)
    expect(c.usage.completionTokens).toBeLessThanOrEqual(12)
    if (c.usage.completionTokens === 12) expect(c.diffusion!.blocks).toBe(2)
    expect(steps[0].text).toContain('░')
    // The stream gives the same text, chunk by chunk.
    const stream = llm.stream(PROMPT, { maxTokens: 12, temperature: 0, diffusion: { blockSize: 6, steps: 12 } })
    let text = ''
    for await (const chunk of stream) text += chunk.text
    expect(text).toBe(c.text)
    expect(stream.completion!.text).toBe(c.text)
  })

  it('commits several tokens per step with a threshold or fewer steps; a seed repeats the text', async () => {
    const few = await llm.generate(PROMPT, { maxTokens: 16, temperature: 0, diffusion: { steps: 4, blockSize: 16 } })
    expect(few.diffusion!.steps).toBeLessThanOrEqual(4)
    const tau = await llm.generate(PROMPT, { maxTokens: 16, temperature: 0, diffusion: { threshold: 0.3 } })
    expect(tau.diffusion!.tokensPerStep).toBeGreaterThanOrEqual(1)
    const opts = { maxTokens: 16, temperature: 0.9, seed: 11, diffusion: { schedule: 'cosine', remasking: 'random', blockSize: 8 } } as const
    expect((await llm.generate(PROMPT, opts)).text).toBe((await llm.generate(PROMPT, opts)).text)
    // Whole-block passes and repetition-aware remasking run the same request.
    const other = await llm.generate(PROMPT, { maxTokens: 16, temperature: 0, diffusion: { threshold: 0.5, reuseRows: false, noRepeatNgram: 3 } })
    expect(other.usage.completionTokens).toBeGreaterThan(0)
    expect(other.diffusion!.tokensPerStep).toBeGreaterThanOrEqual(1)
  })

  it('rejects bad diffusion options with ERR_INVALID_ARG, before any work', async () => {
    const bad: [any, string][] = [
      [{ diffusion: 5 }, 'TypeError'],
      [{ diffusion: { blockSize: 0 } }, 'RangeError'],
      [{ diffusion: { steps: 1.5 } }, 'RangeError'],
      [{ diffusion: { threshold: 1 } }, 'RangeError'],
      [{ diffusion: { schedule: 'zigzag' } }, 'RangeError'],
      [{ diffusion: { remasking: 3 } }, 'TypeError'],
      [{ diffusion: { noRepeatNgram: 65 } }, 'RangeError'],
      [{ diffusion: { reuseRows: 'yes' } }, 'TypeError'],
      [{ diffusion: { speed: 2 } }, 'TypeError'],
      [{ onStep: 'yes' }, 'TypeError'],
    ]
    for (const [opts, name] of bad) {
      const err: any = await llm.generate(PROMPT, { maxTokens: 4, ...opts }).catch((e) => e)
      expect(err.code, JSON.stringify(opts)).toBe('ERR_INVALID_ARG')
      expect(err.name, JSON.stringify(opts)).toBe(name)
      expect(err.message).toMatch(/diffusion|onStep/)
    }
  })

  it('an onStep that throws cancels the request with that error; an abort stops it', async () => {
    const boom = new Error('watcher failed')
    const err = await llm
      .generate(PROMPT, {
        maxTokens: 8,
        onStep: () => {
          throw boom
        },
      })
      .catch((e) => e)
    expect(err).toBe(boom)
    const controller = new AbortController()
    let n = 0
    const aborted: any = await llm
      .generate(PROMPT, { maxTokens: 64, onStep: () => void (++n === 2 && controller.abort()), signal: controller.signal })
      .catch((e) => e)
    expect(aborted.name).toBe('AbortError')
    // The model still serves requests afterwards.
    expect((await llm.generate(PROMPT, { maxTokens: 4, temperature: 0 })).diffusion).toBeDefined()
  })
})

describe('loading', () => {
  it('diffusion options on an autoregressive model, and bad adapters, are coded errors', async () => {
    const plain = await LLM.load(modelPath(), { contextSize: 128 })
    try {
      await rejectsWithCode(plain.generate(PROMPT, { maxTokens: 4, diffusion: { steps: 2 } }), 'ERR_INVALID_ARG')
      await rejectsWithCode(plain.generate(PROMPT, { maxTokens: 4, onStep: () => {} }), 'ERR_INVALID_ARG')
      expect(plain.info.diffusion).toBe(false)
    } finally {
      await plain.close()
    }
    await rejectsWithCode(LLM.load(modelPath(), { diffusion: { adapter: join(dir, 'missing.gguf') } }), 'ERR_MODEL_NOT_FOUND')
    await rejectsWithCode(LLM.load(modelPath(), { diffusion: { adapter: [] } }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { diffusion: { adapter: adapters[0] } }), 'ERR_INVALID_ARG') // covers [0, 0.5) only
    await rejectsWithCode(LLM.load(modelPath(), { diffusion: {} } as any), 'ERR_INVALID_ARG')
  })

  it('the CLI decodes by diffusion with --diffusion-adapter and prints the steps with --stats', () => {
    const args = ['bin/ruvllm.js', 'generate', PROMPT, '-m', modelPath(), '-n', '8', '-t', '0', '--block-size', '4', '--stats']
    for (const a of adapters) args.push('--diffusion-adapter', a)
    const r = spawnSync(process.execPath, args, { cwd: ROOT, encoding: 'utf8', timeout: 120_000 })
    expect(r.status, r.stderr).toBe(0)
    expect(r.stderr).toMatch(/\d+ steps, [\d.]+ tokens\/step/)
    const bad = spawnSync(process.execPath, ['bin/ruvllm.js', 'generate', PROMPT, '--schedule', 'zigzag'], { cwd: ROOT, encoding: 'utf8' })
    expect(bad.status).toBe(2)
    expect(bad.stderr).toMatch(/ERR_INVALID_ARG.*diffusion\.schedule/)
  })
})

describe.skipIf(!existsSync(MANIFEST))('the shipped gemma-3-270m-diffusion', () => {
  it('continues the capitals probe with " Berlin"', async () => {
    const m = await LLM.load('gemma-3-270m-diffusion', { contextSize: 256, download: false })
    try {
      expect(m.info.diffusion).toBe(true)
      const c = await m.generate(PROMPT, { maxTokens: 4, temperature: 0, diffusion: { blockSize: 4, steps: 4 } })
      // The default decoding (threshold 0.9, blocks of 4) too.
      const d = await m.generate(PROMPT, { maxTokens: 8, temperature: 0 })
      expect(d.text.startsWith(' Berlin'), JSON.stringify(d.text)).toBe(true)
      expect(c.text.startsWith(' Berlin'), JSON.stringify(c.text)).toBe(true)
    } finally {
      await m.close()
    }
  }, 120_000)
})
