// Writes LoRA adapters for the tests and benchmarks, as the tools users have write them: a llama.cpp LoRA GGUF
// (what convert_lora_to_gguf.py produces) and a PEFT folder (adapter_model.safetensors +
// adapter_config.json). The factors are random but reproducible (xorshift64*).
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

export const PROJS = ['q', 'k', 'v', 'o', 'gate', 'up', 'down']
const GGUF_NAME = { q: 'attn_q', k: 'attn_k', v: 'attn_v', o: 'attn_output', gate: 'ffn_gate', up: 'ffn_up', down: 'ffn_down' }
const HF_NAME = {
  q: 'self_attn.q_proj',
  k: 'self_attn.k_proj',
  v: 'self_attn.v_proj',
  o: 'self_attn.o_proj',
  gate: 'mlp.gate_proj',
  up: 'mlp.up_proj',
  down: 'mlp.down_proj',
}

/** The model's shape from its GGUF metadata (`llm.metadata()`). */
export function shapeOf(meta) {
  const arch = meta['general.architecture']
  const g = (k) => Number(meta[`${arch}.${k}`])
  const headDim = g('attention.key_length') || g('embedding_length') / g('attention.head_count')
  return {
    layers: g('block_count'),
    dModel: g('embedding_length'),
    qDim: g('attention.head_count') * headDim,
    kvDim: g('attention.head_count_kv') * headDim,
    ffDim: g('feed_forward_length'),
  }
}

function dims(s, p) {
  // [out, in]
  switch (p) {
    case 'q':
      return [s.qDim, s.dModel]
    case 'k':
    case 'v':
      return [s.kvDim, s.dModel]
    case 'o':
      return [s.dModel, s.qDim]
    case 'gate':
    case 'up':
      return [s.ffDim, s.dModel]
    case 'down':
      return [s.dModel, s.ffDim]
  }
}

/** Factors: { layer, proj, out, in, a: Float32Array (rank × in), b: Float32Array (out × rank) }. */
/** Random rank-`rank` factors on every projection of every block: A ~ U(-1,1)/sqrt(in), B ~ U(-1,1)·bScale. */
export function randomFactors(s, rank, bScale, seed) {
  let x = seed
  const M = (1n << 64n) - 1n
  const uniform = () => {
    x ^= x >> 12n
    x ^= (x << 25n) & M
    x ^= x >> 27n
    const v = (x * 0x2545f4914f6cdd1dn) & M
    return Number(v >> 40n) / 2 ** 24 * 2 - 1
  }
  const out = []
  for (let layer = 0; layer < s.layers; layer++) {
    for (const proj of PROJS) {
      const [o, i] = dims(s, proj)
      const a = new Float32Array(rank * i)
      for (let j = 0; j < a.length; j++) a[j] = uniform() / Math.sqrt(i)
      const b = new Float32Array(o * rank)
      for (let j = 0; j < b.length; j++) b[j] = uniform() * bScale
      out.push({ layer, proj, out: o, in: i, a, b })
    }
  }
  return out
}

class Bytes {
  parts = []
  length = 0
  push(b) {
    this.parts.push(b)
    this.length += b.length
  }
  u32(v) {
    const b = Buffer.alloc(4)
    b.writeUInt32LE(v)
    this.push(b)
  }
  u64(v) {
    const b = Buffer.alloc(8)
    b.writeBigUInt64LE(BigInt(v))
    this.push(b)
  }
  f32(v) {
    const b = Buffer.alloc(4)
    b.writeFloatLE(v)
    this.push(b)
  }
  str(s) {
    const b = Buffer.from(s, 'utf8')
    this.u64(b.length)
    this.push(b)
  }
  pad(align) {
    const n = (align - (this.length % align)) % align
    if (n) this.push(Buffer.alloc(n))
  }
}

/**
 * A llama.cpp LoRA GGUF (v3, F32 tensors `<base>.lora_a` [in, r] and `<base>.lora_b` [r, out]).
 * `diffusion` ({ maskTokenId, tMin, tMax, shift, maskEmbd: Float32Array }) adds the
 * `ruvllm.diffusion.*` metadata and mask-embedding row of a masked-diffusion conversion adapter.
 */
export function writeLoraGguf(path, arch, alpha, rank, factors, diffusion) {
  const tensors = []
  for (const f of factors) {
    const base = `blk.${f.layer}.${GGUF_NAME[f.proj]}.weight`
    tensors.push({ name: `${base}.lora_a`, dims: [f.in, rank], data: f.a })
    tensors.push({ name: `${base}.lora_b`, dims: [rank, f.out], data: f.b })
  }
  if (diffusion?.maskEmbd) tensors.push({ name: 'ruvllm.diffusion.mask_embd', dims: [diffusion.maskEmbd.length], data: diffusion.maskEmbd })
  const h = new Bytes()
  h.push(Buffer.from('GGUF', 'latin1'))
  h.u32(3)
  h.u64(tensors.length)
  h.u64(diffusion ? 8 : 4)
  const kvString = (k, v) => {
    h.str(k)
    h.u32(8)
    h.str(v)
  }
  const kvF32 = (k, v) => {
    h.str(k)
    h.u32(6)
    h.f32(v)
  }
  kvString('general.architecture', arch)
  kvString('general.type', 'adapter')
  kvString('adapter.type', 'lora')
  kvF32('adapter.lora.alpha', alpha)
  if (diffusion) {
    h.str('ruvllm.diffusion.mask_token_id')
    h.u32(4)
    h.u32(diffusion.maskTokenId)
    kvF32('ruvllm.diffusion.t_min', diffusion.tMin)
    kvF32('ruvllm.diffusion.t_max', diffusion.tMax)
    h.str('ruvllm.diffusion.shift')
    h.u32(7)
    h.push(Buffer.from([diffusion.shift === false ? 0 : 1]))
  }
  let offset = 0
  for (const t of tensors) {
    h.str(t.name)
    h.u32(t.dims.length)
    for (const d of t.dims) h.u64(d)
    h.u32(0) // F32
    h.u64(offset)
    offset += t.data.byteLength
    offset += (32 - (offset % 32)) % 32
  }
  h.pad(32)
  for (const t of tensors) {
    h.push(Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength))
    h.pad(32)
  }
  writeFileSync(path, Buffer.concat(h.parts))
}

/** A PEFT adapter folder: adapter_model.safetensors (F32) + adapter_config.json. Returns the folder. */
export function writePeft(dir, alpha, rank, factors) {
  mkdirSync(dir, { recursive: true })
  writeFileSync(
    join(dir, 'adapter_config.json'),
    JSON.stringify({ peft_type: 'LORA', r: rank, lora_alpha: alpha, target_modules: PROJS.map((p) => HF_NAME[p].split('.')[1]) }),
  )
  const header = { __metadata__: { format: 'pt' } }
  const data = []
  let offset = 0
  const add = (name, shape, v) => {
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + v.byteLength] }
    data.push(Buffer.from(v.buffer, v.byteOffset, v.byteLength))
    offset += v.byteLength
  }
  for (const f of factors) {
    const base = `base_model.model.model.layers.${f.layer}.${HF_NAME[f.proj]}`
    add(`${base}.lora_A.weight`, [rank, f.in], f.a)
    add(`${base}.lora_B.weight`, [f.out, rank], f.b)
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8')
  const padded = Buffer.alloc(Math.ceil(json.length / 8) * 8, 0x20)
  json.copy(padded)
  json = padded
  const len = Buffer.alloc(8)
  len.writeBigUInt64LE(BigInt(json.length))
  writeFileSync(join(dir, 'adapter_model.safetensors'), Buffer.concat([len, json, ...data]))
  return dir
}
