#!/usr/bin/env node
// Fixtures for the real-weight check of tests/families.rs: for each real model, a passage of
// Hamlet (benches/text.mjs) tokenized by llama.cpp (BOS first where the model has one), 64 tokens,
// and llama.cpp's next-token log-probabilities on them with its default f16 KV cache
// (llamacpp_logits.mjs), in OUT/real-<file name>/: model.path, text.txt, tokens.bin (BOS and the
// text's first tokens, as llama.cpp tokenizes it), llamacpp-f16.f32.
//   node tools/families/real_models.mjs OUT MODEL.gguf...
import { execFileSync } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { getLlama } from 'node-llama-cpp'
import { hamlet } from '../../benches/text.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const [out, ...models] = process.argv.slice(2)
const N = 64
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error' })
for (const m of models) {
  const dir = join(out, `real-${basename(m, '.gguf')}`)
  mkdirSync(dir, { recursive: true })
  const model = await llama.loadModel({ modelPath: m })
  const bos = model.tokens.bos
  const text = hamlet().slice(2000, 2600)
  const tokens = [...(bos != null ? [bos] : []), ...model.tokenize(text)].slice(0, N)
  await model.dispose()
  writeFileSync(join(dir, 'tokens.bin'), Buffer.from(new Uint32Array(tokens).buffer))
  writeFileSync(join(dir, 'model.path'), resolve(m))
  writeFileSync(join(dir, 'text.txt'), text)
  execFileSync(process.execPath, [join(here, 'llamacpp_logits.mjs'), m, join(dir, 'tokens.bin'), join(dir, 'llamacpp-f16.f32'), '--kv', 'f16', '--ctx', '128'], { stdio: 'inherit' })
}
