// Learning on the masked-diffusion model from JavaScript (TALoRA) and its federation bucket by
// bucket (DAF), on the real Gemma 3 270M with the trained conversion adapter the repo ships. Two
// nodes in this process learn different corrections: every bucket's loss on them goes down, the
// diffusion ELBO of the corrected text goes down, and a round with TimestepAligned weighting
// aggregates the three buckets on their own and leaves both nodes with the same adapters.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { LLM, ROOT, addon, modelPath, rejectsWithCode, type LLMType } from './helpers.js'

const ADAPTER = join(ROOT, 'crates/ruvllm-models/data/diffusion/gemma-3-270m-diffusion/lora.gguf')
const PROMPT = 'Pronunciations:\nabandon: AH0 B AE1 N D AH0 N\nability: AH0 B IH1 L AH0 T IY0\n'
const CORRECTIONS = ['able: EY1 B AH0 L\nabout: AH0 B AW1 T\n', 'absent: AE1 B S AH0 N T\nabsorb: AH0 B Z AO1 R B\n']
const GROUP_KEY = '0b'.repeat(32)

let dir: string
const models: LLMType[] = []

function load(name: string, extra: Record<string, unknown> = {}): Promise<LLMType> {
  const learning = { dir: join(dir, name), epochs: 2, maxSeq: 64, federate: true, ...extra }
  return LLM.load(modelPath(), { threads: 1, contextSize: 256, diffusion: { adapter: ADAPTER }, learning } as any).then((m) => {
    models.push(m)
    return m
  })
}

const elbo = async (m: LLMType, text: string) => Math.log((await m.score(text, { elbo: { samples: 16, seed: 3 } })).perplexity)

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-talora-'))
})

afterAll(async () => {
  for (const m of models) await m.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('TALoRA learning on a diffusion model', () => {
  it('learns per timestep bucket, serves it, and federates each bucket on its own', { timeout: 900_000 }, async () => {
    const nodes = await Promise.all([0, 1].map((i) => load(`node-${i}`)))
    const text = PROMPT + CORRECTIONS[0]
    const before = await elbo(nodes[0], text)
    for (const [i, m] of nodes.entries()) {
      const c = await m.generate(PROMPT, { maxTokens: 4, temperature: 0 })
      const fb = await m.feedback(c.id, { quality: 1, correction: CORRECTIONS[i] })
      expect(fb.skipped).toBeNull()
      const r = (await m.consolidate()) as any
      // Three buckets × 2 epochs × 1 sequence.
      expect(r.steps).toBe(6)
      expect(r.lossBefore).toHaveLength(3)
      for (let b = 0; b < 3; b++) expect(r.lossAfter[b]).toBeLessThan(r.lossBefore[b])
      const s = m.learningStats() as any
      expect(s.kind).toBe('talora')
      expect(s.counters.bucketTrained).toEqual([true, true, true])
      expect(s.buckets).toEqual([[0, 0.3], [0.3, 0.6], [0.6, 1]])
    }
    // Served: the learned text's ELBO went down on the node that learned it.
    const after = await elbo(nodes[0], text)
    expect(after).toBeLessThan(before)
    expect(readdirSync(join(dir, 'node-0')).sort()).toEqual(expect.arrayContaining(['talora.json', 'talora-b0.bin', 'talora-b2.bin', 'trajectories.jsonl']))
    // What `ruvllm learn status` shows without the model.
    const st = addon.learning.status(join(dir, 'node-0')) as any
    expect(st.kind).toBe('talora')
    expect(st.model.blocks).toBe(18)
    expect(st.counters.rounds).toBe(1)
    expect(st.trajectories).toBe(1)
    // One adapter per bucket: exporting one SONA adapter is refused.
    await rejectsWithCode(nodes[0].exportAdapter(join(dir, 'x.gguf')), 'ERR_INVALID_ARG')
    expect(existsSync(join(dir, 'x.gguf'))).toBe(false)

    const opts = { tier: 'group' as const, key: GROUP_KEY, expectedNodes: 2, roundTimeoutMs: 120_000, topic: 'ruvllm-test/talora', weighting: 'timestep' as const }
    const a = await nodes[0].federation.join({ ...opts, peers: [] })
    const b = await nodes[1].federation.join({ ...opts, peers: [a.address] })
    try {
      const reports = (await Promise.all([a.round(), b.round()])) as any[]
      for (const r of reports) {
        expect(r.applied).toBe(true)
        expect(r.contributors).toBe(2)
        // One update per bucket from each node.
        expect(r.published).toBe(3)
        expect(r.buckets.map((x: any) => x.bucket)).toEqual([0, 1, 2])
        for (const x of r.buckets) {
          expect(x.weights).toHaveLength(2)
          expect(x.weights[0] + x.weights[1]).toBeCloseTo(1, 6)
        }
        expect(r.adapterDigest).toBe(reports[0].adapterDigest)
      }
      expect(a.stats().accepted).toBe(6)
      // The same adapters on both nodes: the same ELBO, bit for bit.
      expect(await elbo(nodes[1], text)).toBe(await elbo(nodes[0], text))
      for (const m of nodes) expect((m.learningStats() as any).counters.federatedRounds).toBe(1)
    } finally {
      await Promise.all([a.stop(), b.stop()])
    }
  })

  it('keeps an autoregressive learning directory and a diffusion one apart', async () => {
    const ar = await LLM.load(modelPath(), { threads: 1, contextSize: 128, learning: { dir: join(dir, 'ar'), background: false } })
    await ar.close()
    await rejectsWithCode(load('ar'), 'ERR_LEARNING_STATE')
  }, 120_000)
})
