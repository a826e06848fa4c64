// LoRA adapters at run time, with llama.cpp as the oracle: a random rank-8 adapter on all seven
// projections of every block of the real Gemma 3 270M, written as a llama.cpp LoRA GGUF (and a
// PEFT copy). llama.cpp (node-llama-cpp's `lora` context option) applies the same GGUF. As in
// the base oracle, the reference prompts are those where llama.cpp agrees with itself across its
// attention paths (flash attention on and off): a random adapter makes some continuations turn
// on near-ties where even llama.cpp's two paths part. On those, our greedy tokens must equal
// llama.cpp's on at least 5 prompts, and each of its tokens must be our top choice or within the
// base oracle's 0.5 nats.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawnSync } from 'node:child_process'
import { LLM, ROOT, modelPath, rejectsWithCode, type LLMType } from './helpers.js'
import { randomFactors, shapeOf, writeLoraGguf, writePeft } from '../tools/lora-files.mjs'

const PROMPTS = [
  'The capital of France is Paris. The capital of Germany is',
  'def fibonacci(n):',
  'The quick brown fox',
  '1, 2, 3, 4, 5,',
  'The capital of France is',
  'Water boils at a temperature of',
  'Monday, Tuesday, Wednesday,',
  'The chemical symbol for gold is',
  '<html>\n<head>\n<title>',
  'Twinkle, twinkle, little star,',
  'Once upon a time',
  'The largest planet in the solar system is',
  'import numpy as np\n',
  'Roses are red,',
  'The sun rises in the',
  'In 1492, Columbus',
  'The first law of thermodynamics states that',
  'for i in range(10):',
  'Dear Sir or Madam,',
  'The mitochondria is',
]
const N = 16
const RANK = 8
const ALPHA = 16
const MAX_GAP_NATS = 0.5

let dir: string
let gguf: string
let peft: string
let llm: LLMType
const llamaWith: number[][] = []
const llamaWithNoFlash: number[][] = []
const llamaBase: number[][] = []

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-lora-'))
  llm = await LLM.load(modelPath(), { contextSize: 256 })
  const meta = llm.metadata() as Record<string, any>
  const factors = randomFactors(shapeOf(meta), RANK, 0.03, 7n)
  gguf = join(dir, 'adapter.gguf')
  writeLoraGguf(gguf, meta['general.architecture'], ALPHA, RANK, factors)
  peft = writePeft(join(dir, 'peft'), ALPHA, RANK, factors)

  const { getLlama } = await import('node-llama-cpp')
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as any })
  const model = await llama.loadModel({ modelPath: modelPath() })
  try {
    const lora = { adapters: [{ filePath: gguf, scale: 1 }] }
    for (const [opts, out] of [
      [{ lora, flashAttention: true }, llamaWith],
      [{ lora, flashAttention: false }, llamaWithNoFlash],
      [{}, llamaBase],
    ] as const) {
      const ctx = await model.createContext({ contextSize: 256, threads: 1, ...opts })
      const seq = ctx.getSequence()
      for (const prompt of PROMPTS) {
        await seq.clearHistory()
        const greedy: number[] = []
        for await (const t of seq.evaluate([model.tokens.bos!, ...model.tokenize(prompt)], { temperature: 0 })) {
          greedy.push(Number(t))
          if (greedy.length >= N) break
        }
        out.push(greedy)
      }
      await ctx.dispose()
    }
  } finally {
    await model.dispose()
    await llama.dispose()
  }
}, 900_000)

afterAll(async () => {
  await llm?.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('LoRA adapters (llama.cpp applies the same GGUF)', () => {
  it('the adapter changes llama.cpp\'s greedy continuation, and ours equals it on at least 5 prompts', async () => {
    const a = await llm.loadAdapter(gguf)
    expect(a.rank).toBe(RANK)
    expect(a.format).toBe('gguf')
    expect(a.targets).toEqual(['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'])
    const changed = PROMPTS.filter((_, i) => llamaWith[i].join() !== llamaBase[i].join()).length
    expect(changed).toBeGreaterThanOrEqual(5)
    const reference = [...PROMPTS.keys()].filter((i) => llamaWith[i].join() === llamaWithNoFlash[i].join())
    expect(reference.length).toBeGreaterThanOrEqual(5)

    let exact = 0
    let worst = { gap: 0, where: '' }
    let steps = 0
    let agree = 0
    for (const i of reference) {
      const prompt = PROMPTS[i]
      const out = await llm.generate(prompt, { temperature: 0, maxTokens: N, adapters: [a] })
      const n = out.tokens.length
      if (out.tokens.every((t, j) => t === llamaWith[i][j]) && (n === N || out.finishReason === 'stop')) exact++
      // llama.cpp's continuation teacher-forced through our model with the adapter.
      const promptTokens = llm.tokenize(prompt)
      const s = await llm.score([...promptTokens, ...llamaWith[i]], { adapters: [a] })
      for (let j = promptTokens.length - 1; j < s.logprobs.length; j++) {
        steps++
        if (s.topTokens[j] === s.tokens[j + 1]) agree++
        const gap = s.topLogprobs[j] - s.logprobs[j]
        if (gap > worst.gap) worst = { gap, where: `${JSON.stringify(prompt)} token ${j + 1 - promptTokens.length}` }
      }
    }
    console.log(
      `with the adapter: llama.cpp agrees with itself (flash attention on/off) on ${reference.length}/${PROMPTS.length} prompts; ` +
        `our greedy equals it for ${N} tokens on ${exact}/${reference.length} of them (the adapter changed ${changed}/${PROMPTS.length}); ` +
        `llama.cpp's token is our top at ${agree}/${steps} steps, largest gap ${worst.gap.toFixed(4)} nats (${worst.where})`,
    )
    expect(exact).toBeGreaterThanOrEqual(5)
    expect(worst.gap, worst.where).toBeLessThanOrEqual(MAX_GAP_NATS)
  })

  it('a PEFT copy gives the same tokens; load-time adapters apply to every request; [] turns them off', async () => {
    const g = await llm.loadAdapter(gguf)
    const p = await llm.loadAdapter(peft)
    expect(p.format).toBe('peft')
    const base = await llm.generate(PROMPTS[2], { temperature: 0, maxTokens: N })
    const viaG = await llm.generate(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [g] })
    const viaP = await llm.generate(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [{ adapter: p, scale: 1 }] })
    expect(viaP.tokens).toEqual(viaG.tokens)
    expect(viaG.tokens).not.toEqual(base.tokens)
    // Scale 0 is the base model; the adapter's scale from loadAdapter is the default.
    expect((await llm.generate(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [{ adapter: g, scale: 0 }] })).tokens).toEqual(base.tokens)
    const zero = await llm.loadAdapter(gguf, { scale: 0 })
    expect((await llm.generate(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [zero] })).tokens).toEqual(base.tokens)
    // Streaming applies them too.
    const streamed: number[] = []
    for await (const c of llm.stream(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [g] })) streamed.push(c.token)
    expect(streamed).toEqual(viaG.tokens)

    const withLoad = await LLM.load(modelPath(), { contextSize: 256, adapters: [{ path: gguf, scale: 1 }] })
    try {
      expect((await withLoad.generate(PROMPTS[2], { temperature: 0, maxTokens: N })).tokens).toEqual(viaG.tokens)
      expect((await withLoad.generate(PROMPTS[2], { temperature: 0, maxTokens: N, adapters: [] })).tokens).toEqual(base.tokens)
      // An adapter loaded for another LLM is refused.
      await rejectsWithCode(withLoad.generate(PROMPTS[2], { adapters: [g] }), 'ERR_INVALID_ARG')
    } finally {
      await withLoad.close()
    }
  })

  it('bad adapters are coded errors, and an unloaded adapter is refused', async () => {
    const bad = join(dir, 'bad.gguf')
    writeFileSync(bad, 'GGUF but not really a gguf file at all')
    await rejectsWithCode(llm.loadAdapter(bad), 'ERR_ADAPTER_INVALID')
    await rejectsWithCode(llm.loadAdapter(modelPath()), 'ERR_ADAPTER_INVALID') // a model, not an adapter
    await rejectsWithCode(llm.loadAdapter(join(dir, 'missing.gguf')), 'ERR_MODEL_NOT_FOUND')
    await rejectsWithCode(llm.loadAdapter(gguf, { scale: 'x' } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { adapters: [{ path: bad }] }), 'ERR_ADAPTER_INVALID')
    await rejectsWithCode(LLM.load(modelPath(), { adapters: 'x' } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('hi', { adapters: ['x'] } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('hi', { adapters: [{ adapter: {}, scale: 1 }] } as any), 'ERR_INVALID_ARG')
    const a = await llm.loadAdapter(gguf)
    expect(a.loaded).toBe(true)
    a.unload()
    expect(a.loaded).toBe(false)
    await rejectsWithCode(llm.generate('hi', { maxTokens: 2, adapters: [a] }), 'ERR_INVALID_ARG')
    // The model goes on working.
    expect((await llm.generate(PROMPTS[0], { temperature: 0, maxTokens: 1 })).text).toBe(' Berlin')
  })

  it('the CLI applies --lora file[:scale]', () => {
    const cli = (args: string[]) => spawnSync(process.execPath, [join(ROOT, 'bin', 'ruvllm.js'), ...args], { encoding: 'utf8', timeout: 120_000 })
    const args = ['generate', PROMPTS[2], '--model', modelPath(), '--max-tokens', String(N), '--temperature', '0']
    const base = cli(args)
    const adapted = cli([...args, '--lora', gguf])
    const off = cli([...args, '--lora', `${gguf}:0`])
    expect(adapted.status, adapted.stderr).toBe(0)
    expect(adapted.stdout).not.toBe(base.stdout)
    expect(off.stdout).toBe(base.stdout)
    const badScale = cli([...args, '--lora', join(dir, 'nope.gguf')])
    expect(badScale.status).toBe(1)
    expect(badScale.stderr).toMatch(/^ruvllm: ERR_MODEL_NOT_FOUND: /)
  })
})
