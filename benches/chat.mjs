// A long chat through ChatSession: how much of each turn's prompt the prefix cache supplies and
// what that saves in time to first token, against the same chat with the prefix cache off
// (`prefixCacheMb: 0`, every turn evaluates the whole history). Each (model, cache) run is a fresh
// process; the two alternate, `--rounds` times; medians are printed as a markdown table.
//
//   node benches/chat.mjs [--models a.gguf,b.gguf] [--turns 50] [--context 2048] [--max-tokens 40] [--rounds 2]
//   node benches/chat.mjs --one <model> <cache|nocache> <turns> <context> <maxTokens>   (one run, JSON)
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { readFileSync } from 'node:fs'
import { basename, dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const require = createRequire(import.meta.url)
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}

async function one(model, mode, turns, context, maxTokens) {
  const { LLM, ChatSession } = require(join(root, 'index.js'))
  const llm = await LLM.load(model, { contextSize: context, ...(mode === 'nocache' && { prefixCacheMb: 0 }), seed: 1 })
  const session = new ChatSession(llm, { systemPrompt: 'You are a terse assistant.', maxTokens, temperature: 0, ...(!llm.info.hasChatTemplate && { chatTemplate: 'plain' }) })
  const rows = []
  const t0 = performance.now()
  for (let turn = 1; turn <= turns; turn++) {
    const r = await session.prompt(`Turn ${turn}: name a fruit and a colour, then count from ${turn} to ${turn + 5}.`)
    rows.push({ prompt: r.usage.promptTokens, cached: r.usage.cachedTokens, ttftMs: r.timings.ttftMs, dropped: r.droppedMessages })
  }
  const totalS = (performance.now() - t0) / 1000
  await llm.close()
  const later = rows.slice(1)
  return {
    model: basename(model),
    mode,
    turns,
    shifts: rows.filter((r) => r.dropped > 0).length,
    reusedTurns: later.filter((r) => r.cached > 0).length,
    cachedShare: later.reduce((a, r) => a + r.cached, 0) / later.reduce((a, r) => a + r.prompt, 0),
    ttftMs: median(later.map((r) => r.ttftMs)),
    totalS,
  }
}

const argv = process.argv.slice(2)
if (argv[0] === '--one') {
  const [model, mode, turns, context, maxTokens] = argv.slice(1)
  console.log(JSON.stringify(await one(model, mode, Number(turns), Number(context), Number(maxTokens))))
  process.exit(0)
}

const { values } = parseArgs({
  args: argv,
  options: { models: { type: 'string' }, turns: { type: 'string', default: '50' }, context: { type: 'string', default: '2048' }, 'max-tokens': { type: 'string', default: '40' }, rounds: { type: 'string', default: '2' } },
})
const { models } = require(join(root, 'index.js'))
const list = values.models ? values.models.split(',') : [models.path('gemma-3-270m')]
const cpu = (readFileSync('/proc/cpuinfo', 'utf8').match(/model name\s*:\s*(.*)/) || [])[1]
const flags = ['avx512f', 'avx512_vnni', 'avx_vnni', 'amx_int8', 'avx2'].filter((f) => new RegExp(`\\b${f}\\b`).test(readFileSync('/proc/cpuinfo', 'utf8')))
console.log(`CPU: ${cpu} (${flags.join(', ')}); ${values.turns} turns, context ${values.context}, maxTokens ${values['max-tokens']}, ${values.rounds} rounds alternating`)
const results = {}
for (let round = 0; round < Number(values.rounds); round++) {
  for (const model of list) {
    for (const mode of round % 2 ? ['nocache', 'cache'] : ['cache', 'nocache']) {
      const r = spawnSync(process.execPath, [fileURLToPath(import.meta.url), '--one', model, mode, values.turns, values.context, values['max-tokens']], { encoding: 'utf8' })
      if (r.status !== 0) throw new Error(`${model} ${mode}: ${r.stderr}`)
      const res = JSON.parse(r.stdout.trim().split('\n').pop())
      ;(results[`${res.model}|${mode}`] ??= []).push(res)
    }
  }
}
console.log('\n| model | turns with a shift | turns 2.. reusing the cache | prompt tokens from the cache | median TTFT, cache on / off | chat wall time, cache on / off |')
console.log('|---|---|---|---|---|---|')
for (const model of list.map((m) => basename(m))) {
  const on = results[`${model}|cache`]
  const off = results[`${model}|nocache`]
  const ttftOn = median(on.map((r) => r.ttftMs))
  const ttftOff = median(off.map((r) => r.ttftMs))
  const wallOn = median(on.map((r) => r.totalS))
  const wallOff = median(off.map((r) => r.totalS))
  console.log(
    `| ${model} | ${on[0].shifts} | ${on[0].reusedTurns}/${on[0].turns - 1} | ${(100 * on[0].cachedShare).toFixed(0)} % | ` +
      `${ttftOn.toFixed(1)} / ${ttftOff.toFixed(1)} ms (${(ttftOff / ttftOn).toFixed(1)}×) | ${wallOn.toFixed(1)} / ${wallOff.toFixed(1)} s (${(wallOff / wallOn).toFixed(2)}×) |`,
  )
}
