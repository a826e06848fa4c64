// Bad inputs give Errors with stable codes, and the process lives on.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { existsSync, mkdtempSync, openSync, readSync, closeSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { CAPITALS, LLM, modelPath, rejectsWithCode, throwsWithCode, type LLMType } from './helpers.js'

let llm: LLMType
let dir: string
const CONTEXT = 256

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-errors-'))
  llm = await LLM.load(modelPath(), { contextSize: CONTEXT })
})

afterAll(async () => {
  await llm?.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('load errors', () => {
  it('a missing file is ERR_MODEL_NOT_FOUND', async () => {
    const e = await rejectsWithCode(LLM.load(join(dir, 'nope.gguf')), 'ERR_MODEL_NOT_FOUND')
    expect(e.message).toContain('nope.gguf')
    await rejectsWithCode(LLM.load(dir), 'ERR_MODEL_NOT_FOUND')
  })

  it('an unknown id is ERR_MODEL_NOT_FOUND; a known one that is missing, with downloads off, says how to get it', async () => {
    await rejectsWithCode(LLM.load('no-such-model-id'), 'ERR_MODEL_NOT_FOUND')
    const old = { RUVLLM_MODELS_DIR: process.env.RUVLLM_MODELS_DIR, HOME: process.env.HOME }
    process.env.HOME = dir
    process.env.RUVLLM_MODELS_DIR = join(dir, 'models')
    try {
      const e = await rejectsWithCode(LLM.load('gemma-3-270m', { download: false }), 'ERR_MODEL_NOT_FOUND')
      expect(e.message).toContain('ruvllm models download gemma-3-270m')
    } finally {
      process.env.HOME = old.HOME
      if (old.RUVLLM_MODELS_DIR === undefined) delete process.env.RUVLLM_MODELS_DIR
      else process.env.RUVLLM_MODELS_DIR = old.RUVLLM_MODELS_DIR
    }
  })

  // The test model is itself found as LLM.load finds 'gemma-3-270m' unless RUVLLM_TEST_MODEL is set.
  it.skipIf(!!process.env.RUVLLM_TEST_MODEL)("finds 'gemma-3-270m' where the model manager or the pip package put it", async () => {
    const m = await LLM.load('gemma-3-270m', { contextSize: 64, download: false })
    expect(m.info.architecture).toBe('gemma3')
    expect((await m.generate(CAPITALS, { temperature: 0, maxTokens: 1 })).text).toBe(' Berlin')
    await m.close()
  })

  it('gpu: false runs on the CPU; gpu: \'cuda\' needs a usable GPU (else ERR_GPU_UNAVAILABLE); other gpu values are ERR_INVALID_ARG', async () => {
    expect(llm.info.backend).toMatch(/^(cpu|cuda) \(/)
    const cpu = await LLM.load(modelPath(), { contextSize: 64, gpu: false })
    expect(cpu.info.backend).toMatch(/^cpu \(/)
    expect((await cpu.generate(CAPITALS, { temperature: 0, maxTokens: 1 })).text).toBe(' Berlin')
    await cpu.close()
    if (existsSync('/dev/nvidiactl')) {
      const gpu = await LLM.load(modelPath(), { contextSize: 64, gpu: 'cuda' })
      expect(gpu.info.backend).toMatch(/^cuda \(/)
      await gpu.close()
    } else {
      const e = await rejectsWithCode(LLM.load(modelPath(), { contextSize: 64, gpu: 'cuda' }), 'ERR_GPU_UNAVAILABLE')
      expect(e.message).toMatch(/NVIDIA|CUDA|GPU/)
    }
    for (const bad of ['metal', true, 1, null]) {
      await rejectsWithCode(LLM.load(modelPath(), { contextSize: 64, gpu: bad as any }), 'ERR_INVALID_ARG')
    }
  })

  it('kvCacheType: q8_0 takes 34/64 of the f16 cache, still answers, and needs the CPU; other values are ERR_INVALID_ARG', async () => {
    expect(llm.info.kvCacheType).toBe('f16')
    const f16 = await LLM.load(modelPath(), { contextSize: 256, gpu: false })
    const q8 = await LLM.load(modelPath(), { contextSize: 256, gpu: false, kvCacheType: 'q8_0' })
    expect(q8.info.kvCacheType).toBe('q8_0')
    expect(q8.info.kvCacheBytes * 64).toBe(f16.info.kvCacheBytes * 34)
    expect((await q8.generate(CAPITALS, { temperature: 0, maxTokens: 2 })).text).toBe((await f16.generate(CAPITALS, { temperature: 0, maxTokens: 2 })).text)
    await Promise.all([f16.close(), q8.close()])
    const f32 = await LLM.load(modelPath(), { contextSize: 64, gpu: false, kvCacheType: 'f32' })
    expect(f32.info.kvCacheType).toBe('f32')
    await f32.close()
    await rejectsWithCode(LLM.load(modelPath(), { contextSize: 64, gpu: 'cuda', kvCacheType: 'q8_0' }), 'ERR_GPU_UNAVAILABLE')
    for (const bad of ['q4_0', 'F16', 8, null]) {
      await rejectsWithCode(LLM.load(modelPath(), { contextSize: 64, kvCacheType: bad as any }), 'ERR_INVALID_ARG')
    }
  })

  it('corrupt GGUF files are ERR_GGUF_INVALID', async () => {
    const garbage = join(dir, 'garbage.gguf')
    writeFileSync(garbage, Buffer.from('this is not a gguf file at all, just some text'.repeat(100)))
    await rejectsWithCode(LLM.load(garbage), 'ERR_GGUF_INVALID')

    // Right magic and version, absurd counts.
    const absurd = Buffer.alloc(64)
    absurd.write('GGUF', 0, 'latin1')
    absurd.writeUInt32LE(3, 4)
    absurd.writeBigUInt64LE(0xffffffffffffn, 8) // tensor count
    absurd.writeBigUInt64LE(0xffffffffffffn, 16) // metadata count
    const absurdPath = join(dir, 'absurd.gguf')
    writeFileSync(absurdPath, absurd)
    await rejectsWithCode(LLM.load(absurdPath), 'ERR_GGUF_INVALID')

    writeFileSync(join(dir, 'empty.gguf'), Buffer.alloc(0))
    await rejectsWithCode(LLM.load(join(dir, 'empty.gguf')), 'ERR_GGUF_INVALID')
  })

  it('a truncated copy of the real model (first 1 MB) is ERR_GGUF_INVALID', async () => {
    const buf = Buffer.alloc(1 << 20)
    const fd = openSync(modelPath(), 'r')
    readSync(fd, buf, 0, buf.length, 0)
    closeSync(fd)
    const p = join(dir, 'truncated.gguf')
    writeFileSync(p, buf)
    const e = await rejectsWithCode(LLM.load(p), 'ERR_GGUF_INVALID')
    expect(e.message).toContain('truncated.gguf')
  })

  it('bad load arguments are ERR_INVALID_ARG', async () => {
    await rejectsWithCode(LLM.load(42 as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(''), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { contextSize: 0 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { contextSize: 1.5 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { threads: -1 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { seed: 'x' as any }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { contxtSize: 5 } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { download: 'yes' } as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), 'opts' as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { parallel: 0 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { parallel: 257 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(LLM.load(modelPath(), { prefixCacheMb: -1 }), 'ERR_INVALID_ARG')
  })
})

describe('generate argument validation', () => {
  const bad: [string, Record<string, unknown>][] = [
    ['maxTokens', { maxTokens: 0 }],
    ['maxTokens', { maxTokens: 1.5 }],
    ['maxTokens', { maxTokens: CONTEXT + 1 }],
    ['maxTokens', { maxTokens: '10' }],
    ['temperature', { temperature: -0.1 }],
    ['temperature', { temperature: Number.NaN }],
    ['temperature', { temperature: Infinity }],
    ['temperature', { temperature: '1' }],
    ['topP', { topP: 0 }],
    ['topP', { topP: 1.01 }],
    ['topK', { topK: -1 }],
    ['topK', { topK: 2.5 }],
    ['minP', { minP: 2 }],
    ['repeatPenalty', { repeatPenalty: 0 }],
    ['presencePenalty', { presencePenalty: Number.NaN }],
    ['frequencyPenalty', { frequencyPenalty: 'x' }],
    ['repeatLastN', { repeatLastN: -5 }],
    ['seed', { seed: -1 }],
    ['seed', { seed: 1.5 }],
    ['seed', { seed: 2 ** 60 }],
    ['stop', { stop: '' }],
    ['stop', { stop: ['ok', ''] }],
    ['stop', { stop: 5 }],
    ['stop', { stop: [5] }],
    ['signal', { signal: {} }],
    ['signal', { signal: 'abort' }],
    ['chatTemplate', { chatTemplate: 5 }],
    ['chatTemplate', { chatTemplate: '' }],
    ['onToken', { onToken: 'f' }],
    ['maxTokenz', { maxTokenz: 5 }],
  ]

  it.each(bad)('rejects a bad %s', async (name, opts) => {
    const e = await rejectsWithCode(llm.generate(CAPITALS, opts as any), 'ERR_INVALID_ARG')
    expect(e.message).toContain(name)
    const e2 = throwsWithCode(() => llm.stream(CAPITALS, opts as any), 'ERR_INVALID_ARG')
    expect(e2.message).toContain(name)
  })

  it('uses TypeError for wrong types and RangeError for values out of range', async () => {
    expect(await rejectsWithCode(llm.generate(CAPITALS, { maxTokens: '1' as any }), 'ERR_INVALID_ARG')).toBeInstanceOf(TypeError)
    expect(await rejectsWithCode(llm.generate(CAPITALS, { maxTokens: -1 }), 'ERR_INVALID_ARG')).toBeInstanceOf(RangeError)
  })

  it('rejects a wrong prompt type', async () => {
    for (const p of [undefined, null, 42, {}, [], [1, 'x'], [-1], [1.5], [{ role: 'user' }], [{ role: 5, content: 'x' }], [{ role: '', content: 'x' }]]) {
      const e = await rejectsWithCode(llm.generate(p as any), 'ERR_INVALID_ARG')
      expect(e.message).toContain('prompt')
      throwsWithCode(() => llm.stream(p as any), 'ERR_INVALID_ARG')
    }
    await rejectsWithCode(llm.generate(CAPITALS, 'opts' as any), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate(CAPITALS, null as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.stream(CAPITALS, { onToken: () => {} }), 'ERR_INVALID_ARG')
  })

  it('rejects bad tokenize / detokenize arguments', () => {
    throwsWithCode(() => llm.tokenize(5 as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.tokenize('x', { addSpecial: 'yes' } as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.detokenize('abc' as any), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.detokenize([1, -1]), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.detokenize([1.5]), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.detokenize([262144]), 'ERR_INVALID_ARG')
    throwsWithCode(() => llm.detokenize(['1'] as any), 'ERR_INVALID_ARG')
  })

  it('a prompt longer than the context is ERR_CONTEXT_OVERFLOW', async () => {
    const huge = 'The quick brown fox jumps over the lazy dog. '.repeat(100)
    expect(llm.tokenize(huge).length).toBeGreaterThan(CONTEXT)
    const e = await rejectsWithCode(llm.generate(huge, { maxTokens: 4 }), 'ERR_CONTEXT_OVERFLOW')
    expect(e.message).toMatch(/context/)
    await rejectsWithCode(async () => {
      for await (const _ of llm.stream(huge, { maxTokens: 4 })) {
        /* nothing */
      }
    }, 'ERR_CONTEXT_OVERFLOW')
  })

  it('the process and the model survive all of the above', async () => {
    const out = await llm.generate(CAPITALS, { temperature: 0, maxTokens: 2 })
    expect(out.text.startsWith(' Berlin')).toBe(true)
  })
})

describe('close', () => {
  it('every call after close() is ERR_CLOSED; close is idempotent', async () => {
    const m = await LLM.load(modelPath(), { contextSize: 128 })
    expect(m.closed).toBe(false)
    const running = m.generate('Once upon a time', { maxTokens: 100 }).then(
      (c) => c,
      (e) => e,
    )
    const queuedStream = m.stream('Hello', { maxTokens: 100 })
    await new Promise((r) => setTimeout(r, 300))
    const t0 = Date.now()
    await m.close()
    // Running requests are stopped, not waited for.
    expect(Date.now() - t0).toBeLessThan(5_000)
    expect(m.closed).toBe(true)
    await m.close()
    const r = await running
    expect(r).toBeInstanceOf(Error)
    expect(r.code).toBe('ERR_CLOSED')
    await rejectsWithCode(async () => {
      for await (const _ of queuedStream) {
        /* nothing */
      }
    }, 'ERR_CLOSED')
    await rejectsWithCode(m.generate(CAPITALS), 'ERR_CLOSED')
    await rejectsWithCode(async () => {
      for await (const _ of m.stream(CAPITALS)) {
        /* nothing */
      }
    }, 'ERR_CLOSED')
    throwsWithCode(() => m.tokenize('x'), 'ERR_CLOSED')
    throwsWithCode(() => m.detokenize([1]), 'ERR_CLOSED')
    throwsWithCode(() => m.metadata(), 'ERR_CLOSED')
    throwsWithCode(() => m.info, 'ERR_CLOSED')
  })

  it('a stream created before close() fails with ERR_CLOSED when iterated after it', async () => {
    const m = await LLM.load(modelPath(), { contextSize: 128 })
    const s = m.stream(CAPITALS, { maxTokens: 4 })
    await m.close()
    await rejectsWithCode(async () => {
      for await (const _ of s) {
        /* nothing */
      }
    }, 'ERR_CLOSED')
  })
})
