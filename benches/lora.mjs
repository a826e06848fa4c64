// LoRA adapters' cost: prefill and decode with no adapter, one rank-16 adapter on all seven
// projections of every block, and four at once, on the same model. Each measurement runs in a
// fresh process; the configurations alternate round by round (A B C A B C ...). The table gives
// median rates and the median over rounds of each round's ratio to no adapter (a ratio of
// neighbours in time, so a shared machine's slow and fast phases cancel).
//
//   npm run bench:lora -- [--model PATH] [--rounds 5] [--threads 2] [--prompt 512] [--new 128]
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, readFileSync } from 'node:fs'
import { cpus, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'
import { promptTokens } from './prompt.mjs'
import { randomFactors, shapeOf, writeLoraGguf } from '../tools/lora-files.mjs'

const require = createRequire(import.meta.url)
const { LLM, models } = require('../index.js')
const here = fileURLToPath(import.meta.url)

const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    rounds: { type: 'string', default: '5' },
    threads: { type: 'string', default: '2' },
    prompt: { type: 'string', default: '512' },
    new: { type: 'string', default: '128' },
    child: { type: 'string' },
  },
})
const model = values.model || process.env.RUVLLM_TEST_MODEL || models.path('gemma-3-270m')
const [threads, nPrompt, nNew] = [values.threads, values.prompt, values.new].map(Number)

if (values.child !== undefined) {
  // One measurement: load with the given adapters, warm up, time a prefill and a decode.
  const adapters = JSON.parse(values.child)
  const llm = await LLM.load(model, { contextSize: nPrompt + nNew + 8, threads })
  const loaded = []
  for (const p of adapters) loaded.push(await llm.loadAdapter(p))
  const ids = promptTokens((t) => llm.tokenize(t), null, nPrompt)
  await llm.generate(ids.slice(0, 16), { temperature: 0, maxTokens: 4, adapters: loaded })
  const pre = await llm.generate(ids, { temperature: 0, maxTokens: 1, adapters: loaded })
  // Decode from a short prompt (no prefix reuse: another prompt first).
  const dec = await llm.generate(ids.slice(0, 8), { temperature: 0, maxTokens: nNew, adapters: loaded, repeatPenalty: 1 })
  process.stdout.write(JSON.stringify({ prefill: pre.timings.prefillTokensPerSecond, decode: dec.timings.decodeTokensPerSecond, tokens: dec.tokens.length }))
  await llm.close()
  process.exit(0)
}

const dir = mkdtempSync(join(tmpdir(), 'ruvllm-lora-bench-'))
try {
  const probe = await LLM.load(model, { contextSize: 64 })
  const meta = probe.metadata()
  await probe.close()
  const shape = shapeOf(meta)
  const files = [1, 2, 3, 4].map((seed) => {
    const f = join(dir, `r16-${seed}.gguf`)
    writeLoraGguf(f, meta['general.architecture'], 32, 16, randomFactors(shape, 16, 0.02, BigInt(seed)))
    return f
  })
  const configs = [
    { name: 'no adapter', adapters: [] },
    { name: 'one rank-16 adapter', adapters: files.slice(0, 1) },
    { name: 'four rank-16 adapters', adapters: files },
  ]
  const results = configs.map(() => ({ prefill: [], decode: [] }))
  for (let r = 0; r < Number(values.rounds); r++) {
    for (const [i, c] of configs.entries()) {
      const out = JSON.parse(
        execFileSync(process.execPath, [here, '--child', JSON.stringify(c.adapters), '--model', model, '--threads', String(threads), '--prompt', String(nPrompt), '--new', String(nNew)], {
          encoding: 'utf8',
        }),
      )
      // A random adapter can make the model end its text early; a rate over at least a quarter
      // of the budget still compares.
      if (out.tokens < nNew / 4) throw new Error(`${c.name}: decoded only ${out.tokens} tokens of ${nNew}`)
      results[i].tokens = Math.min(results[i].tokens ?? nNew, out.tokens)
      results[i].prefill.push(out.prefill)
      results[i].decode.push(out.decode)
    }
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
  const cpu = cpus()[0].model.trim()
  const flags = ['avx512f', 'avx512_vnni', 'avx2', 'fma', 'f16c'].filter((f) => readFileSync('/proc/cpuinfo', 'utf8').includes(` ${f}`))
  const noAvx512 = process.env.RUVLLM_NO_AVX512 === '1' ? ' (RUVLLM_NO_AVX512=1: AVX2 path)' : ''
  console.log(`CPU: ${cpu} (${flags.join(' ')})${noAvx512}; ${threads} threads; ${model.split('/').pop()}; prompt ${nPrompt} tokens, ${nNew} decoded; ${values.rounds} alternating rounds, fresh process each, medians`)
  console.log('')
  console.log('| adapters | prefill tok/s | vs none | decode tok/s | vs none |')
  console.log('|---|---|---|---|---|')
  const ratio = (i, key) => median(results[i][key].map((v, r) => v / results[0][key][r]))
  for (const [i, c] of configs.entries()) {
    const [p, d] = [median(results[i].prefill), median(results[i].decode)]
    const short = results[i].tokens < nNew ? ` (as few as ${results[i].tokens} tokens decoded)` : ''
    console.log(`| ${c.name}${short} | ${p.toFixed(1)} | ${ratio(i, 'prefill').toFixed(3)} | ${d.toFixed(1)} | ${ratio(i, 'decode').toFixed(3)} |`)
  }
} finally {
  rmSync(dir, { recursive: true, force: true })
}
