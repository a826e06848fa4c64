// Makes node-llama-cpp run one named CPU variant of its prebuilt llama.cpp instead of the best one
// for this host: `node --import ./benches/nlc-cpu-variant.mjs …` with NLC_CPU_VARIANT=haswell
// (AVX2 + FMA + F16C, what a CPU without AVX-512 gets; the names are its
// bins/linux-x64/libggml-cpu-<variant>.so files). ggml loads whichever libggml-cpu-*.so in the
// addon's folder scores best on this CPU, so the prebuilt package is copied (once, ~20 MB, into
// ~/.cache/ruvllm-bench/nlc-<variant>/) with that variant as its only CPU library, and the import
// of `@node-llama-cpp/linux-x64` is pointed at the copy. Nothing in node_modules changes.
import { copyFileSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync } from 'node:fs'
import { createRequire, register } from 'node:module'
import { homedir } from 'node:os'
import { dirname, join } from 'node:path'
import { pathToFileURL } from 'node:url'

const variant = process.env.NLC_CPU_VARIANT
if (variant) {
  if (!/^[a-z0-9_]+$/.test(variant)) throw new Error(`NLC_CPU_VARIANT: not a variant name: ${variant}`)
  // Resolved from node-llama-cpp's own folder, where its optional dependency is installed.
  const fromNlc = createRequire(createRequire(import.meta.url).resolve('node-llama-cpp'))
  const pkgDir = dirname(dirname(fromNlc.resolve('@node-llama-cpp/linux-x64')))
  const bins = join(pkgDir, 'bins', 'linux-x64')
  if (!existsSync(join(bins, `libggml-cpu-${variant}.so`))) throw new Error(`NLC_CPU_VARIANT: node-llama-cpp has no ${variant} CPU library in ${bins}`)
  const copy = join(homedir(), '.cache', 'ruvllm-bench', `nlc-${variant}`)
  if (!existsSync(join(copy, 'package.json'))) {
    // Built beside and renamed into place, so an interrupted copy is never taken for a whole one.
    const tmp = `${copy}.tmp-${process.pid}`
    rmSync(tmp, { recursive: true, force: true })
    mkdirSync(join(tmp, 'bins', 'linux-x64'), { recursive: true })
    mkdirSync(join(tmp, 'dist'))
    for (const f of readdirSync(join(pkgDir, 'dist'))) copyFileSync(join(pkgDir, 'dist', f), join(tmp, 'dist', f))
    for (const f of readdirSync(bins)) {
      if (f.startsWith('libggml-cpu-') && f !== `libggml-cpu-${variant}.so`) continue
      copyFileSync(join(bins, f), join(tmp, 'bins', 'linux-x64', f))
    }
    copyFileSync(join(pkgDir, 'package.json'), join(tmp, 'package.json'))
    rmSync(copy, { recursive: true, force: true })
    renameSync(tmp, copy)
  }
  const target = pathToFileURL(join(copy, 'dist', 'index.js')).href
  register(
    `data:text/javascript,${encodeURIComponent(`export async function resolve(s, c, next) {
      if (s === '@node-llama-cpp/linux-x64') return { url: ${JSON.stringify(target)}, shortCircuit: true }
      return next(s, c)
    }`)}`,
  )
}
