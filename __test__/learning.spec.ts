// SONA from JavaScript on the real Gemma 3 270M, with a small feedback set (the 200-example
// benchmark is `npx ruvllm bench learning`): feedback → instant MicroLoRA step → the next
// request runs it; consolidate → BaseLoRA round, Fisher, bank; 'auto' adapters; export to a
// llama.cpp LoRA GGUF; the state survives a new process and a process killed mid-training; the
// CLI's `learn` commands; bad input gets coded errors.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { spawn, spawnSync } from 'node:child_process'
import { LLM, ROOT, addon, modelPath, rejectsWithCode, throwsWithCode, type LLMType } from './helpers.js'

// Pronunciations in the CMU dictionary's notation: text the base model does poorly on.
const PROMPT = 'Pronunciations:\nabandon: AH0 B AE1 N D AH0 N\nability: AH0 B IH1 L AH0 T IY0\n'
const CORRECTIONS = [
  'able: EY1 B AH0 L\nabout: AH0 B AW1 T\nabove: AH0 B AH1 V\n',
  'absent: AE1 B S AH0 N T\nabsorb: AH0 B Z AO1 R B\naccept: AE0 K S EH1 P T\n',
  'access: AE1 K S EH2 S\naccount: AH0 K AW1 N T\nacross: AH0 K R AO1 S\n',
]
const GENERAL = ['The history of the city goes back to the Romans, who built a bridge over the river and a road to the coast.']

let dir: string
let llm: LLMType

function learningOptions(d: string, extra: Record<string, unknown> = {}) {
  return { dir: d, background: false, generalText: GENERAL, baseLr: 0.002, ...extra }
}

/** Mean NLL per token of `answer` after `PROMPT`, under whatever adapters `opts` says. */
async function answerNll(model: LLMType, answer: string, opts: Record<string, unknown> = {}): Promise<number> {
  const s = await model.score(PROMPT + answer, opts as any)
  const n = model.tokenize(answer, { addSpecial: false }).length
  const tail = s.logprobs.slice(s.logprobs.length - n)
  return -tail.reduce((a, b) => a + b, 0) / tail.length
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-learn-'))
  llm = await LLM.load(modelPath(), { threads: 1, contextSize: 512, learning: learningOptions(join(dir, 'state')) } as any)
})

afterAll(async () => {
  await llm?.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('learning', () => {
  it('refuses bad options and feedback with coded errors', async () => {
    await rejectsWithCode(LLM.load(modelPath(), { learning: {} } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { learning: { dir: join(dir, 'x'), microRank: 3 } } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { learning: { dir: join(dir, 'x'), bogus: 1 } } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.feedback('cmpl-unknown', { quality: 1 }), 'ERR_INVALID_ARG')
    const c = await llm.generate(PROMPT, { maxTokens: 4, temperature: 0 })
    const e1 = await rejectsWithCode(llm.feedback(c.id, { quality: 2 }), 'ERR_INVALID_ARG')
    expect(e1).toBeInstanceOf(RangeError)
    const e2 = await rejectsWithCode(llm.feedback(c.id, { quality: 'good' } as any), 'ERR_INVALID_ARG')
    expect(e2).toBeInstanceOf(TypeError)
    await rejectsWithCode(llm.feedback(c.id, { quality: 1, correction: '' }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate(PROMPT, { maxTokens: 2, adapters: 'nearest' } as any), 'ERR_INVALID_ARG')
    // A model without learning.
    const plain = await LLM.load(modelPath(), { threads: 1, contextSize: 256 })
    try {
      await rejectsWithCode(plain.feedback(c.id, { quality: 1 }), 'ERR_LEARNING_OFF')
      await rejectsWithCode(plain.consolidate(), 'ERR_LEARNING_OFF')
      expect(plain.learningStats()).toBeNull()
      await rejectsWithCode(plain.generate(PROMPT, { maxTokens: 2, adapters: 'auto' }), 'ERR_INVALID_ARG')
    } finally {
      await plain.close()
    }
    // A learning directory that is not usable: a foreign file, another model's state.
    const corrupt = join(dir, 'corrupt')
    await LLM.load(modelPath(), { threads: 1, contextSize: 128, learning: { dir: corrupt, background: false } } as any).then((m) => m.close())
    writeFileSync(join(corrupt, 'base.bin'), 'not factors')
    await rejectsWithCode(LLM.load(modelPath(), { threads: 1, contextSize: 128, learning: { dir: corrupt } } as any), 'ERR_LEARNING_STATE')
    const foreign = join(dir, 'foreign')
    await LLM.load(modelPath(), { threads: 1, contextSize: 128, learning: { dir: foreign, background: false } } as any).then((m) => m.close())
    const st = JSON.parse(readFileSync(join(foreign, 'state.json'), 'utf8'))
    writeFileSync(join(foreign, 'state.json'), JSON.stringify({ ...st, architecture: 'llama', nLayer: 16 }))
    const e3 = await rejectsWithCode(LLM.load(modelPath(), { threads: 1, contextSize: 128, learning: { dir: foreign } } as any), 'ERR_LEARNING_STATE')
    expect(e3.message).toMatch(/another model/)
    // Low quality without a correction is stored, not learned.
    const low = await llm.feedback(c.id, { quality: 0.2 })
    expect(low.instant).toBeNull()
    expect(low.skipped).toMatch(/gate/)
  })

  it('learns from corrections: instant updates, then a consolidated BaseLoRA round', async () => {
    const before = await answerNll(llm, CORRECTIONS[0])
    for (const correction of CORRECTIONS) {
      const c = await llm.generate(PROMPT, { maxTokens: 8, temperature: 0 })
      const r = await llm.feedback(c.id, { quality: 1, correction })
      expect(r.instant).not.toBeNull()
      expect(r.instant!.stepMs).toBeGreaterThan(0)
      expect(r.instant!.coveredMass).toBeGreaterThan(0)
      expect(r.instant!.coveredMass).toBeLessThanOrEqual(1.0001)
    }
    const afterInstant = await answerNll(llm, CORRECTIONS[0])
    expect(afterInstant).toBeLessThan(before)
    const round = await llm.consolidate()
    expect(round.steps).toBeGreaterThan(0)
    expect(round.fisherUpdated).toBe(true)
    expect(round.bankEntry).toBe(1)
    const after = await answerNll(llm, CORRECTIONS[0])
    expect(after).toBeLessThan(afterInstant)
    // An explicit empty adapter list is the base model again.
    expect(Math.abs((await answerNll(llm, CORRECTIONS[0], { adapters: [] })) - before)).toBeLessThan(1e-6)
    const st = llm.learningStats()!
    expect(st.trajectories).toBe(4)
    expect(st.good).toBe(3)
    expect(st.pending).toBe(0)
    expect(st.bankSize).toBe(1)
    expect(st.counters.instantUpdates).toBe(3)
    expect(st.instantStepMsP50).toBeGreaterThan(0)
  })

  it("picks the bank's adapter for adapters: 'auto' and reports it", async () => {
    const c = await llm.generate(PROMPT, { maxTokens: 4, temperature: 0, adapters: 'auto' })
    expect(c.adaptersUsed).toHaveLength(1)
    expect(c.adaptersUsed![0].id).toBe('bank-1')
    expect(c.adaptersUsed![0].similarity).toBeGreaterThan(0.5)
    const s = await llm.score(PROMPT, { adapters: 'auto' })
    expect(s.adaptersUsed![0].id).toBe('bank-1')
    let text = ''
    for await (const chunk of llm.stream(PROMPT, { maxTokens: 4, temperature: 0, adapters: 'auto' })) text += chunk.text
    expect(text).toBe(c.text)
  })

  it('exports a llama.cpp LoRA GGUF that loads back with the same effect', async () => {
    const out = join(dir, 'learned.gguf')
    await llm.exportAdapter(out)
    expect(readFileSync(out).subarray(0, 4).toString()).toBe('GGUF')
    const a = await llm.loadAdapter(out)
    // The same effect, up to the half-precision rounding of the factors: within a tenth of what
    // learning gained on this text.
    const base = await answerNll(llm, CORRECTIONS[1], { adapters: [] })
    const learned = await answerNll(llm, CORRECTIONS[1])
    const exported = await answerNll(llm, CORRECTIONS[1], { adapters: [a] })
    expect(learned).toBeLessThan(base)
    expect(Math.abs(learned - exported)).toBeLessThan(0.1 * (base - learned))
    // llama.cpp loads the same file: its greedy continuation, teacher-forced through our model
    // with the adapter, is our first choice at every step or within 0.5 nats of it (the margin
    // of the LoRA oracle), and the adapter changes llama.cpp's own output.
    const { getLlama } = await import('node-llama-cpp')
    const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' as any })
    const model = await llama.loadModel({ modelPath: modelPath() })
    const greedy = async (lora?: string) => {
      const ctx = await model.createContext({ contextSize: 256, threads: 1, ...(lora ? { lora: { adapters: [{ filePath: lora, scale: 1 }] } } : {}) })
      const out: number[] = []
      for await (const t of ctx.getSequence().evaluate([model.tokens.bos!, ...model.tokenize(PROMPT)], { temperature: 0 })) {
        out.push(Number(t))
        if (out.length >= 12) break
      }
      await ctx.dispose()
      return out
    }
    try {
      const withLora = await greedy(out)
      expect(withLora.join()).not.toBe((await greedy()).join())
      const promptTokens = llm.tokenize(PROMPT)
      const s = await llm.score([...promptTokens, ...withLora], { adapters: [a] })
      for (let j = promptTokens.length - 1; j < s.logprobs.length; j++) {
        expect(s.topLogprobs[j] - s.logprobs[j]).toBeLessThan(0.5)
      }
    } finally {
      await model.dispose()
      await llama.dispose()
    }
  })

  it('keeps everything for the next process, and the CLI reads it', async () => {
    const state = join(dir, 'state')
    const script = `
      const { LLM } = require(${JSON.stringify(join(ROOT, 'index.js'))})
      ;(async () => {
        const llm = await LLM.load(${JSON.stringify(modelPath())}, { threads: 1, contextSize: 512, learning: { dir: ${JSON.stringify(state)}, background: false } })
        const st = llm.learningStats()
        const s = await llm.score(${JSON.stringify(PROMPT + CORRECTIONS[0])})
        console.log(JSON.stringify({ trajectories: st.trajectories, bank: st.bankSize, base: st.counters.baseTrained, lp: s.logprobs.slice(-5) }))
        await llm.close()
      })().catch((e) => { console.error(e.code, e.message); process.exit(1) })`
    const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 120_000 })
    expect(r.status, r.stderr).toBe(0)
    const got = JSON.parse(r.stdout.trim().split('\n').pop()!)
    expect(got.trajectories).toBe(4)
    expect(got.bank).toBe(1)
    expect(got.base).toBe(true)
    const here = (await llm.score(PROMPT + CORRECTIONS[0])).logprobs.slice(-5)
    got.lp.forEach((v: number, i: number) => expect(Math.abs(v - here[i])).toBeLessThan(1e-3))
    const cli = (args: string[]) => spawnSync(process.execPath, [join(ROOT, 'bin/ruvllm.js'), 'learn', ...args], { encoding: 'utf8' })
    const status = cli(['status', '--dir', state, '--json'])
    expect(status.status, status.stderr).toBe(0)
    expect(JSON.parse(status.stdout).trajectories).toBe(4)
    const out = join(dir, 'cli.gguf')
    expect(cli(['export', '--dir', state, '--out', out]).status).toBe(0)
    expect(existsSync(out)).toBe(true)
    expect(cli(['status']).status).toBe(2)
    const bad = cli(['export', '--dir', join(dir, 'nothing-here'), '--out', join(dir, 'n.gguf')])
    expect(bad.status).toBe(2)
    expect(bad.stderr).toMatch(/ERR_INVALID_ARG/)
  })

  it('loses nothing that was written when the process is killed mid-training', async () => {
    const state = join(dir, 'killed')
    const script = `
      const { LLM } = require(${JSON.stringify(join(ROOT, 'index.js'))})
      ;(async () => {
        const llm = await LLM.load(${JSON.stringify(modelPath())}, { threads: 1, contextSize: 512, learning: { dir: ${JSON.stringify(state)}, background: false, epochs: 50, generalText: ${JSON.stringify(GENERAL)} } })
        for (const correction of ${JSON.stringify(CORRECTIONS)}) {
          const c = await llm.generate(${JSON.stringify(PROMPT)}, { maxTokens: 4, temperature: 0 })
          await llm.feedback(c.id, { quality: 1, correction })
          console.log('acked')
        }
        console.log('training')
        await llm.consolidate()
        console.log('finished')
      })().catch((e) => { console.error(e.code, e.message); process.exit(1) })`
    const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    child.stderr.on('data', (d) => (err += d))
    await new Promise<void>((resolve, reject) => {
      child.stdout.on('data', (d) => {
        out += d
        if (out.includes('training')) setTimeout(() => (child.kill('SIGKILL'), resolve()), 3000)
      })
      child.on('exit', (code) => (out.includes('training') ? resolve() : reject(new Error(`child exited ${code}: ${err}`))))
    })
    await new Promise((r) => child.on('close', r))
    expect(out).not.toContain('finished')
    expect(out.match(/acked/g)).toHaveLength(3)
    // A killed writer leaves at most a temporary file, which the next open removes.
    writeFileSync(join(state, '.base.bin.tmp-99999'), 'torn')
    const again = await LLM.load(modelPath(), { threads: 1, contextSize: 256, learning: learningOptions(state) } as any)
    try {
      const st = again.learningStats()!
      expect(st.trajectories).toBe(3)
      expect(st.good).toBe(3)
      expect(st.counters.instantUpdates).toBe(3)
      expect(existsSync(join(state, '.base.bin.tmp-99999'))).toBe(false)
      // What was pending is trained now.
      const r = await again.consolidate()
      expect(r.steps).toBeGreaterThan(0)
    } finally {
      await again.close()
    }
  })

  it('throws on bad CLI input and checks the learn command exists', () => {
    const r = spawnSync(process.execPath, [join(ROOT, 'bin/ruvllm.js'), 'learn', 'frobnicate', '--dir', dir], { encoding: 'utf8' })
    expect(r.status).toBe(2)
    expect(r.stderr).toMatch(/ERR_USAGE/)
    throwsWithCode(() => (addon as any).learning.status(42), 'ERR_INVALID_ARG')
  })
})
