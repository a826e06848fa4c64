// Federation from JavaScript on the real Gemma 3 270M: three nodes in this process, each with its
// own learning directory, learn from different corrections, join over libp2p on 127.0.0.1 and
// run a round; they end with the same BaseLoRA (same digest, same scores). Bad options, a model
// loaded without consent, and a stopped node get coded errors.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { LLM, addon, modelPath, rejectsWithCode, throwsWithCode, type LLMType } from './helpers.js'

const PROMPT = 'Pronunciations:\nabandon: AH0 B AE1 N D AH0 N\nability: AH0 B IH1 L AH0 T IY0\n'
const CORRECTIONS = [
  'able: EY1 B AH0 L\nabout: AH0 B AW1 T\n',
  'absent: AE1 B S AH0 N T\nabsorb: AH0 B Z AO1 R B\n',
  'access: AE1 K S EH2 S\naccount: AH0 K AW1 N T\n',
]
const GENERAL = ['The history of the city goes back to the Romans, who built a bridge over the river and a road to the coast.']
const GROUP_KEY = '07'.repeat(32)

let dir: string
const models: LLMType[] = []

function load(name: string, extra: Record<string, unknown> = {}): Promise<LLMType> {
  const learning = { dir: join(dir, name), background: false, generalText: GENERAL, epochs: 1, maxSeq: 64, federate: true, ...extra }
  return LLM.load(modelPath(), { threads: 1, contextSize: 256, learning } as any).then((m) => {
    models.push(m)
    return m
  })
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'ruvllm-federation-'))
})

afterAll(async () => {
  for (const m of models) await m.close()
  rmSync(dir, { recursive: true, force: true })
})

describe('federation', () => {
  it('refuses bad options and a model loaded without consent, with coded errors', async () => {
    const plain = await LLM.load(modelPath(), { threads: 1, contextSize: 128 })
    models.push(plain)
    await rejectsWithCode(plain.federation.join({ peers: [], tier: 'group', key: GROUP_KEY }), 'ERR_FEDERATION_CONSENT')
    const noConsent = await load('no-consent', { federate: undefined })
    await rejectsWithCode(noConsent.federation.join({ peers: [], tier: 'group', key: GROUP_KEY }), 'ERR_FEDERATION_CONSENT')
    await rejectsWithCode(LLM.load(modelPath(), { learning: { dir: join(dir, 'x'), federate: 'yes' } } as any), 'ERR_INVALID_ARG')
    const m = await load('bad-options')
    const join_ = (o: unknown) => m.federation.join(o as any)
    expect(await rejectsWithCode(join_({ peers: [], tier: 'secret' }), 'ERR_INVALID_ARG')).toBeInstanceOf(RangeError)
    expect(await rejectsWithCode(join_({ peers: 'x', tier: 'group', key: GROUP_KEY }), 'ERR_INVALID_ARG')).toBeInstanceOf(TypeError)
    expect(await rejectsWithCode(join_({ peers: [], tier: 7 }), 'ERR_INVALID_ARG')).toBeInstanceOf(TypeError)
    expect(await rejectsWithCode(join_({ tier: 'group', key: GROUP_KEY }), 'ERR_INVALID_ARG')).toBeInstanceOf(TypeError)
    expect(await rejectsWithCode(join_({ peers: [], tier: 'group' }), 'ERR_INVALID_ARG')).toBeInstanceOf(TypeError)
    expect(await rejectsWithCode(join_({ peers: [], tier: 'group', key: 'abc' }), 'ERR_INVALID_ARG')).toBeInstanceOf(RangeError)
    await rejectsWithCode(join_({ peers: [], tier: 'group', key: GROUP_KEY, method: 'stack' }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: [], tier: 'group', key: GROUP_KEY, weighting: 'loudest' }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: [], tier: 'group', key: GROUP_KEY, expectedNodes: 0 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: [], tier: 'group', key: GROUP_KEY, keepRounds: 0 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: [], tier: 'group', key: GROUP_KEY, bogus: 1 }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: [], tier: 'tenant', key: GROUP_KEY, members: [] }), 'ERR_INVALID_ARG')
    await rejectsWithCode(join_({ peers: ['not a multiaddr'], tier: 'group', key: GROUP_KEY }), 'ERR_INVALID_ARG')
    // Keys: fresh ones differ; a secret gives its node id back.
    const k = addon.federationKey()
    expect(k.secret).toMatch(/^[0-9a-f]{64}$/)
    expect(k.nodeId).toMatch(/^[0-9a-f]{64}$/)
    expect(addon.federationKey(k.secret).nodeId).toBe(k.nodeId)
    expect(addon.federationKey().secret).not.toBe(k.secret)
    throwsWithCode(() => addon.federationKey('zz'), 'ERR_INVALID_ARG')
  })

  // Learning runs at the lowest CPU priority: on a busy machine the three rounds take minutes.
  it('three nodes that learned different corrections end a round with identical adapters', { timeout: 600_000 }, async () => {
    const nodes = await Promise.all([0, 1, 2].map((i) => load(`node-${i}`)))
    // Each learns from its own correction (instant step, then a BaseLoRA round).
    for (const [i, m] of nodes.entries()) {
      const c = await m.generate(PROMPT, { maxTokens: 4, temperature: 0 })
      await m.feedback(c.id, { quality: 1, correction: CORRECTIONS[i] })
      const r = await m.consolidate()
      expect(r.steps).toBeGreaterThan(0)
    }
    const scores = async () => Promise.all(nodes.map(async (m) => (await m.score(PROMPT + CORRECTIONS[0])).logprobs.slice(-6)))
    const before = await scores()
    expect(before[0].join()).not.toBe(before[1].join())
    const opts = { tier: 'group' as const, key: GROUP_KEY, expectedNodes: 3, roundTimeoutMs: 60_000, topic: 'ruvllm-test/federation' }
    const a = await nodes[0].federation.join({ ...opts, peers: [] })
    const b = await nodes[1].federation.join({ ...opts, peers: [a.address] })
    const c = await nodes[2].federation.join({ ...opts, peers: [a.address, b.address] })
    expect(a.address).toMatch(/^\/ip4\/127\.0\.0\.1\/tcp\/\d+\/p2p\//)
    expect(new Set([a.nodeId, b.nodeId, c.nodeId]).size).toBe(3)
    const handles = [a, b, c]
    try {
      const reports = await Promise.all(handles.map((h) => h.round()))
      for (const r of reports) {
        expect(r.round).toBe(1)
        expect(r.contributors).toBe(3)
        expect(r.timedOut).toBe(false)
        expect(r.applied).toBe(true)
        expect(r.published).toBe(1)
        expect(r.weights).toHaveLength(3)
        expect(r.bytesSent).toBeGreaterThan(0)
        expect(r.bytesReceived).toBeGreaterThan(0)
        expect(r.digest).toBe(reports[0].digest)
        expect(r.adapterDigest).toBe(reports[0].adapterDigest)
        // The exact mean of the three BaseLoRAs (stacked, rank up to 3 × 8): its 8 strongest
        // components per projection are the new BaseLoRA, the rest the global adapter.
        expect(r.method).toBe('stack')
        expect(r.truncationError).toBe(0)
      }
      for (const m of nodes) {
        const s = m.learningStats()!
        expect(s.globalRank).toBeGreaterThan(0)
        expect(s.globalRank).toBeLessThanOrEqual(16)
        expect(s.counters.federatedRounds).toBe(1)
      }
      // The same adapter on every node: the same scores, bit for bit.
      const after = await scores()
      expect(after[1]).toEqual(after[0])
      expect(after[2]).toEqual(after[0])
      for (const h of handles) {
        const s = h.stats()
        expect(s.rounds).toBe(1)
        // Its own update is accepted when it is prepared, the two others' on arrival.
        expect(s.accepted).toBe(3)
        expect(s.rejectedTotal).toBe(0)
        expect(s.perRound[0].contributors).toBe(3)
        expect(s.bytesSent).toBeGreaterThan(0)
        expect(s.peers).toBeGreaterThanOrEqual(1)
      }
      // Node a turns adversarial: a replay of its round-1 update, a tampered copy, a forged
      // update and garbage. Every one is rejected by the others, for its own reason.
      expect(await a.attack(1)).toBe(4)
      for (const h of [b, c]) {
        const end = Date.now() + 20_000
        while (h.stats().rejectedTotal < 4 && Date.now() < end) await new Promise((r) => setTimeout(r, 50))
        const s = h.stats()
        expect(s.rejected).toEqual({ replayed: 1, undecryptable: 1, badSignature: 1, malformed: 1 })
        expect(s.accepted).toBe(3)
      }
    } finally {
      await Promise.all(handles.map((h) => h.stop()))
    }
    await rejectsWithCode(a.round(), 'ERR_CLOSED')
    expect(a.stats().rounds).toBe(1)
    await a.stop()
    // The private tier: nothing leaves the node, the round has nothing to aggregate.
    const p = await nodes[0].federation.join({ peers: [], tier: 'private', expectedNodes: 2, roundTimeoutMs: 500 })
    try {
      const r = await p.round()
      expect(r.published).toBe(0)
      expect(r.bytesSent).toBe(0)
      expect(r.applied).toBe(false)
      expect(p.stats().privateKept).toBe(1)
      expect(p.stats().bytesSent).toBe(0)
    } finally {
      await p.stop()
    }
  })
})
