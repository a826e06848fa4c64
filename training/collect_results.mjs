// Assembles training/results.json from a run's device outputs (training/runs/phase-a/results.json,
// training/runs/final/results.json), the CPU re-check (training/runs/np_check.json) and the device
// minutes the session reported, detokenizing ids with ruvllm's own tokenizer.
//   node training/collect_results.mjs --gpu-seconds 1054 --shipped lora.gguf
//   node training/collect_results.mjs --attempt NAME --runs d1,d2 ...   (a run not shipped: see below)
import { readFileSync, readdirSync, realpathSync, writeFileSync, existsSync } from 'node:fs'
import { createRequire } from 'node:module'
import { homedir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const require = createRequire(import.meta.url)
const { LLM } = require(join(here, '..', 'index.js'))
const arg = (k, d) => {
  const i = process.argv.indexOf(k)
  return i >= 0 ? process.argv[i + 1] : d
}
const snap = join(homedir(), '.cache/huggingface/hub/models--gguf-org--gemma-3-270m-gguf/snapshots')
const llm = await LLM.load(realpathSync(join(snap, readdirSync(snap)[0], 'gemma-3-270m-q4_k_m.gguf')))
const dt = (ids) => llm.detokenize(ids)

// A later run that was not shipped: `--attempt NAME --runs cont-a,cont-b,cont-c --bench runs/bench.json
// --gpu-seconds N --note TEXT` adds results.json's attempts[NAME] and leaves the committed run's keys alone.
if (arg('--attempt')) {
  const file = join(here, 'results.json')
  const cur = JSON.parse(readFileSync(file, 'utf8'))
  const runs = arg('--runs').split(',').map((d) => JSON.parse(readFileSync(join(here, 'runs', d, 'results.json'), 'utf8')))
  const last = runs[runs.length - 1]
  const bench = arg('--bench') ? JSON.parse(readFileSync(join(here, arg('--bench')), 'utf8')) : null
  cur.attempts = cur.attempts ?? {}
  cur.attempts[arg('--attempt')] = {
    note: arg('--note'),
    gpu_device_seconds: Number(arg('--gpu-seconds')),
    gpu: last.device,
    phases: runs.map((r) => ({ phase: r.phase, wall_seconds: Math.round(r.wall_seconds), step: r.training.step, eval: r.eval })),
    self_distillation: runs[0].distill,
    eval_at_init_64_seqs: runs[0].eval_at_init,
    training: { ...last.training, history: undefined, loss_history_every_30_steps: last.training.history },
    eval: last.eval,
    probe_pytorch: Object.fromEntries(['talora', 'single'].map((k) => [k, { text: dt(last.probe[k].ids), commit_order: last.probe[k].order, berlin: last.probe[k].berlin_first }])),
    samples_32_tokens: Object.fromEntries(Object.entries(last.samples).map(([k, v]) => [k, { prompt: dt(v.prompt_ids), text: dt(v.ids) }])),
    export_check: last.export_check,
    cpu_bench: bench,
  }
  writeFileSync(file, JSON.stringify(cur, null, 1) + '\n')
  console.log(JSON.stringify({ eval: last.eval, probe: cur.attempts[arg('--attempt')].probe_pytorch }, null, 1))
  process.exit(0)
}
const a = JSON.parse(readFileSync(join(here, 'runs/phase-a/results.json'), 'utf8'))
const b = JSON.parse(readFileSync(join(here, 'runs/final/results.json'), 'utf8'))
const np = existsSync(join(here, 'runs/np_check.json')) ? JSON.parse(readFileSync(join(here, 'runs/np_check.json'), 'utf8')) : null
const meta = JSON.parse(readFileSync(join(here, 'data/meta.json'), 'utf8'))
const gpuSeconds = Number(arg('--gpu-seconds'))
const e = b.eval
const out = {
  model: 'gemma-3-270m-diffusion',
  shipped: arg('--shipped'),
  gpu_minutes: Math.round((gpuSeconds / 60) * 10) / 10,
  gpu: {
    device: b.device,
    session_device_seconds: gpuSeconds,
    note: 'device time as the lease counted it: machine start, 5 GGUF-chunk commands, phase a (555 s), phase b (420 s)',
    phase_a_wall_seconds: Math.round(a.wall_seconds),
    phase_b_wall_seconds: Math.round(b.wall_seconds),
  },
  tokens_trained_per_model: b.tokens_trained_per_model,
  masked_tokens_per_model: b.training.masked_tokens,
  data: { ...meta, self_distillation: a.distill },
  training: { ...b.training, history: undefined, loss_history_every_30_steps: b.training.history },
  eval: {
    ...e,
    elbo_over_ar_talora: e.elbo_ppl_talora / e.ar_ppl,
    elbo_over_ar_single: e.elbo_ppl_single / e.ar_ppl,
    target_elbo_within_2x_ar: { talora: e.elbo_ppl_talora <= 2 * e.ar_ppl, single: e.elbo_ppl_single <= 2 * e.ar_ppl },
    talora_beats_single: e.elbo_ppl_talora < e.elbo_ppl_single,
  },
  phase_a_eval_64_seqs: a.eval,
  probe: {
    prompt: dt(b.probe.prompt_ids),
    decode: '4 mask tokens, one commit per step: the most confident masked position (argmax), TALoRA picks its adapter by the mask ratio',
    talora: { text: dt(b.probe.talora.ids), commit_order: b.probe.talora.order, berlin: b.probe.talora.berlin_first },
    single: { text: dt(b.probe.single.ids), commit_order: b.probe.single.order, berlin: b.probe.single.berlin_first },
    cpu_recheck_from_exported_f16: np
      ? Object.fromEntries(Object.entries(np).filter(([k]) => k.startsWith('probe_')).map(([k, v]) => [k, { text: dt(v.ids), berlin: v.berlin_first, trace: v.trace }]))
      : null,
  },
  ar_greedy_vs_runtime: {
    gpu_bf16_match_of_8: a.ar_greedy_match_of_8,
    cpu_numpy_f32: np ? Object.fromEntries(Object.entries(np).filter(([k]) => k.startsWith('ar_')).map(([k, v]) => [k, { ours: dt(v.numpy_f32), runtime: dt(v.runtime), match: v.match }])) : null,
  },
  samples_32_tokens: Object.fromEntries(Object.entries(b.samples).map(([k, v]) => [k, { prompt: dt(v.prompt_ids), text: dt(v.ids) }])),
  export_check: b.export_check,
}
writeFileSync(join(here, 'results.json'), JSON.stringify(out, null, 1) + '\n')
console.log(JSON.stringify({ gpu_minutes: out.gpu_minutes, tokens: out.tokens_trained_per_model, eval: { ar: e.ar_ppl, talora: e.elbo_ppl_talora, single: e.elbo_ppl_single }, probe: out.probe.talora.text + ' | ' + out.probe.single.text }, null, 1))
