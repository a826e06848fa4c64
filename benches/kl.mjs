#!/usr/bin/env node
// The accuracy oracle by KL divergence, as llama.cpp measures quantization quality: next-token
// distributions of each of our kernel paths (AVX-512, AVX2, scalar; whichever this CPU has) and
// of llama.cpp, against an f32 reference computed from the same GGUF weights dequantized, with no
// activation quantization (benches/kl_reference.py, numpy). Text: Hamlet (benches/text.mjs),
// never used for training; 16 chunks of 512 tokens, positions 256..510 of each scored (4,080
// positions), as `llama-perplexity --kl-divergence` scores them.
//
//   node benches/kl.mjs [--model PATH] [--chunks 16] [--threads 2] [--paths avx512,avxvnni,avx2,portable,scalar] [--no-llama] [--json out.json]
//
// Needs: python3 (a venv with numpy and gguf is made in ~/.cache/ruvllm-bench/venv), cargo (our
// examples/kl), and for the llama.cpp column `llama-perplexity` (LLAMA_PERPLEXITY=path, else
// built by scripts/llama-server.sh llama-perplexity). The reference (2 GB for 16 chunks) is kept
// in ~/.cache/ruvllm-bench/kl/ under a name made of the model's and the tokens' hashes.
import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync, renameSync } from 'node:fs'
import { cpus, homedir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { createRequire } from 'node:module'
import { hamlet } from './text.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
const { values } = parseArgs({
  options: {
    model: { type: 'string' },
    chunks: { type: 'string', default: '16' },
    ctx: { type: 'string', default: '512' },
    threads: { type: 'string', default: '2' },
    paths: { type: 'string' },
    'no-llama': { type: 'boolean' },
    json: { type: 'string' },
  },
})
const { LLM, models } = require('../index.js')
const model = values.model ?? process.env.RUVLLM_TEST_MODEL ?? models.path('gemma-3-270m')
if (!existsSync(model)) {
  console.error(`kl: model not found at ${model} (npm run quickstart, or --model PATH)`)
  process.exit(1)
}
const nChunk = Number(values.chunks)
const nCtx = Number(values.ctx)
const threads = values.threads
const dir = join(homedir(), '.cache', 'ruvllm-bench', 'kl')
mkdirSync(dir, { recursive: true })
const log = (m) => process.stderr.write(`kl: ${m}\n`)

// Tokens: the text with our tokenizer, no special tokens (each chunk's first becomes BOS).
const llm = await LLM.load(model, { contextSize: 1024 })
const bos = llm.tokenize('')[0]
const ids = llm.tokenize(hamlet(), { addSpecial: false })
await llm.close()
if (ids.length < nChunk * nCtx) throw new Error(`kl: the text has ${ids.length} tokens, fewer than ${nChunk} × ${nCtx}`)
const tokens = Buffer.from(new Int32Array(ids.slice(0, nChunk * nCtx)).buffer)
const modelKey = createHash('sha256').update(`${model}:${statSync(model).size}:${statSync(model).mtimeMs}`).digest('hex').slice(0, 12)
const key = createHash('sha256').update(modelKey).update(tokens).digest('hex').slice(0, 16)
const tokFile = join(dir, `${key}.tokens`)
const refFile = join(dir, `${key}.kld`)
writeFileSync(tokFile, tokens)

// The f32 reference, once per model and token set.
if (!existsSync(refFile)) {
  const venv = join(homedir(), '.cache', 'ruvllm-bench', 'venv')
  const py = join(venv, 'bin', 'python')
  if (!existsSync(py)) {
    log(`making ${venv} (numpy, gguf)`)
    execFileSync(process.env.PYTHON || 'python3', ['-m', 'venv', venv], { stdio: 'inherit' })
    execFileSync(py, ['-m', 'pip', 'install', '--quiet', 'numpy', 'gguf'], { stdio: 'inherit' })
  }
  log(`computing the f32 reference into ${refFile}`)
  const t = Date.now()
  execFileSync(py, [join(here, 'kl_reference.py'), '--gguf', model, '--tokens', tokFile, '--ctx', String(nCtx), '--bos', String(bos), '--out', refFile], {
    stdio: 'inherit',
  })
  log(`reference done in ${((Date.now() - t) / 1000).toFixed(0)} s`)
}

const flags = readFileSync('/proc/cpuinfo', 'utf8').match(/^flags\s*:(.*)$/m)?.[1].trim().split(/\s+/) ?? []
const has512 = flags.includes('avx512f') && flags.includes('avx512_vnni')
const hasAvx2 = flags.includes('avx2') && flags.includes('fma')
const hasAvxVnni = hasAvx2 && flags.includes('avx_vnni')
// avx2: AVX2 without any VNNI (vpdpbusd emulated), what an AVX2-only CPU runs; avxvnni: AVX2 with
// AVX-VNNI's vpdpbusd (Alder Lake and later), on CPUs that have it.
const all = {
  avx512: { RUVLLM_NO_AVX512: undefined, RUVLLM_NO_VNNI: undefined },
  avxvnni: { RUVLLM_NO_AVX512: '1', RUVLLM_NO_VNNI: undefined },
  avx2: { RUVLLM_NO_AVX512: '1', RUVLLM_NO_VNNI: '1' },
  portable: { RUVLLM_PORTABLE: '1' },
  scalar: { RUVLLM_FORCE_SCALAR: '1' },
}
const available = { avx512: has512, avxvnni: hasAvxVnni, avx2: hasAvx2, portable: true, scalar: true }
const wanted = values.paths ? values.paths.split(',') : Object.keys(all).filter((p) => available[p])

log('building examples/kl')
execFileSync('cargo', ['build', '--release', '--quiet', '-p', 'ruvllm-eval', '--example', 'kl'], { cwd: root, stdio: 'inherit' })
const rows = []
for (const p of wanted) {
  if (!all[p]) throw new Error(`kl: unknown path '${p}' (avx512, avxvnni, avx2, portable, scalar)`)
  log(`our ${p} path`)
  const env = { ...process.env, ...all[p] }
  for (const [k, v] of Object.entries(all[p])) if (v === undefined) delete env[k]
  const out = execFileSync(join(root, 'target', 'release', 'examples', 'kl'), [model, refFile, threads], { env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] })
  const r = JSON.parse(out.trim().split('\n').at(-1))
  // The kernels that ran, as the binary reports them (a switch it does not know changes nothing).
  // Each path's name is in the ISA string; the AVX2 paths must not have run AVX-512 (its string
  // names avx2 too), nor the AVX2-only one any VNNI.
  const forbid = { avxvnni: ['avx512'], avx2: ['avx512', 'vnni'] }[p] ?? []
  if (!r.path.includes(p) || forbid.some((f) => r.path.includes(f))) throw new Error(`kl: asked for the ${p} path, ran '${r.path}'`)
  rows.push({ name: `ruvllm ${p} (${r.path})`, ...r })
}

if (!values['no-llama']) {
  const bin = process.env.LLAMA_PERPLEXITY ?? execFileSync(join(root, 'scripts', 'llama-server.sh'), ['llama-perplexity'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim()
  log(`llama.cpp: ${bin}`)
  const t = Date.now()
  const r = spawnSync(bin, ['-m', model, '--kl-divergence-base', refFile, '--kl-divergence', '-c', String(nCtx), '-b', String(nCtx), '-t', threads], { encoding: 'utf8', maxBuffer: 1 << 26 })
  const text = `${r.stdout}\n${r.stderr}`
  const num = (re) => {
    const m = text.match(re)
    if (!m) throw new Error(`kl: llama-perplexity printed no ${re} (exit ${r.status}):\n${text.slice(-3000)}`)
    return Number(m[1])
  }
  rows.push({
    name: 'llama.cpp (llama-perplexity, native build)',
    positions: nChunk * (nCtx - 1 - nCtx / 2),
    mean_kld: num(/Mean\s+KLD:\s+(-?[\d.]+)/),
    p99_kld: num(/99\.0%\s+KLD:\s+(-?[\d.]+)/),
    median_kld: num(/Median\s+KLD:\s+(-?[\d.]+)/),
    max_kld: num(/Maximum KLD:\s+(-?[\d.]+)/),
    same_top: num(/Same top p:\s+([\d.]+)/) / 100,
    ppl: num(/Mean PPL\(Q\)\s+:\s+([\d.]+)/),
    ppl_base: num(/Mean PPL\(base\)\s+:\s+([\d.]+)/),
    seconds: (Date.now() - t) / 1000,
  })
}

const cpu = cpus()[0]?.model ?? 'unknown CPU'
const shown = ['avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512vl', 'avx512_vnni', 'avx_vnni'].filter((f) => flags.includes(f))
console.log(`${cpu}; flags ${shown.join(' ')}; ${rows[0]?.positions ?? 0} positions (${nChunk} chunks of ${nCtx}), reference PPL ${rows[0]?.ppl_base.toFixed(4)}`)
console.log('\n| kernels | mean KLD | 99% KLD | median KLD | max KLD | same top-1 | PPL | PPL / reference |')
console.log('|---|---:|---:|---:|---:|---:|---:|---:|')
for (const r of rows) {
  const f = (x, d = 6) => x.toFixed(d)
  console.log(`| ${r.name} | ${f(r.mean_kld)} | ${f(r.p99_kld)} | ${f(r.median_kld)} | ${f(r.max_kld, 4)} | ${(100 * r.same_top).toFixed(2)} % | ${f(r.ppl, 4)} | ${f(r.ppl / r.ppl_base, 4)} |`)
}
if (values.json) {
  writeFileSync(values.json + '.tmp', JSON.stringify({ cpu, flags: shown, chunks: nChunk, ctx: nCtx, rows }, null, 2))
  renameSync(values.json + '.tmp', values.json)
}
