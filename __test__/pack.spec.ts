// The npm packages as a user installs them: scripts/pack.sh packs @ruvector/ruvllm and
// @ruvector/ruvllm-linux-x64-gnu (the built addon inside); an empty project installs the two
// tarballs offline from an empty npm cache, with no registry reachable and no Rust toolchain on
// PATH, then runs the real model through `require`, `import` and the CLI (`npx ruvllm`).
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { spawnSync, type SpawnSyncOptions } from 'node:child_process'
import { accessSync, constants, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { CAPITALS, ROOT, modelPath } from './helpers.js'

const ADDON = 'ruvllm.linux-x64-gnu.node'
const MAIN = '@ruvector/ruvllm'
const PLATFORM = '@ruvector/ruvllm-linux-x64-gnu'
const mainPkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'))

let tmp = ''
let mainTgz = ''
let platformTgz = ''
let env: NodeJS.ProcessEnv = {}
let app = ''
const started = Date.now()

function run(cmd: string, args: string[], opts: SpawnSyncOptions = {}) {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 90_000, env, ...opts })
  const out = { status: r.status, stdout: String(r.stdout ?? ''), stderr: String(r.stderr ?? ''), error: r.error }
  return { ...out, text: `${cmd} ${args.join(' ')} -> ${out.status}${out.error ? ` (${out.error.message})` : ''}\n${out.stdout}\n${out.stderr}` }
}

/** The first executable `name` on PATH `path`. */
function which(name: string, path: string): string | undefined {
  for (const dir of path.split(delimiter).filter(Boolean)) {
    try {
      accessSync(join(dir, name), constants.X_OK)
      return join(dir, name)
    } catch {}
  }
  return undefined
}

/** An empty project with the given tarballs installed (npm install, offline, empty cache). */
function install(dir: string, tarballs: string[]) {
  mkdirSync(dir, { recursive: true })
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  const r = run('npm', ['install', '--offline', '--no-audit', '--no-fund', ...tarballs], { cwd: dir })
  expect(r.status, r.text).toBe(0)
}

/** Files of a tarball, without the leading `package/`. */
const tarList = (tgz: string) =>
  run('tar', ['-tzf', tgz], { env: process.env }).stdout.split('\n').filter(Boolean).map((f) => f.replace(/^package\//, ''))

beforeAll(() => {
  // The built addon and the real model must be there: a missing one fails the test, it does not skip.
  if (!existsSync(join(ROOT, ADDON))) throw new Error(`the built addon ${ADDON} is missing: npm run build`)
  const model = modelPath()
  tmp = mkdtempSync(join(tmpdir(), 'ruvllm-pack-test-'))

  const pack = spawnSync('bash', [join(ROOT, 'scripts', 'pack.sh'), join(tmp, 'tarballs')], { encoding: 'utf8' })
  if (pack.status !== 0) throw new Error(`scripts/pack.sh failed:\n${pack.stdout}\n${pack.stderr}`)
  ;[mainTgz, platformTgz] = pack.stdout.trim().split('\n').slice(-2)

  // PATH: node, npm and npx (linked into a folder of their own), a shell, /usr/bin and /bin, but
  // no folder with cargo or rustc in it.
  const npm = process.env.npm_execpath?.endsWith('npm-cli.js') ? process.env.npm_execpath : which('npm', process.env.PATH ?? '')
  if (!npm) throw new Error('npm is not on PATH')
  const npmCli = realpathSync(npm)
  const npxCli = join(dirname(npmCli), 'npx-cli.js')
  const bin = join(tmp, 'bin')
  mkdirSync(bin)
  symlinkSync(process.execPath, join(bin, 'node'))
  symlinkSync(npmCli, join(bin, 'npm'))
  symlinkSync(npxCli, join(bin, 'npx'))
  symlinkSync('/bin/sh', join(bin, 'sh'))
  const path = [bin, ...['/usr/bin', '/bin'].filter((d) => !which('cargo', d) && !which('rustc', d))].join(delimiter)
  // A minimal environment: no npm_config_* or CARGO_*/RUSTUP_* from the caller, a fresh HOME and
  // npm cache, a registry that refuses connections.
  env = {
    PATH: path,
    HOME: join(tmp, 'home'),
    TMPDIR: tmp,
    MODEL: model,
    npm_config_cache: join(tmp, 'npm-cache'),
    npm_config_registry: 'http://127.0.0.1:9/',
    npm_config_update_notifier: 'false',
  }
  mkdirSync(env.HOME!)
  app = join(tmp, 'app')
})

afterAll(() => {
  if (tmp && !process.env.RUVLLM_KEEP_PACK_TEST) rmSync(tmp, { recursive: true, force: true })
})

describe('npm packages', () => {
  it('the tarballs hold what the runtime and the CLI need, and no build output', () => {
    const files = tarList(mainTgz)
    const tracked = run('git', ['ls-files', 'bin', 'lib'], { cwd: ROOT, env: process.env }).stdout.split('\n').filter(Boolean)
    expect(tracked.length).toBeGreaterThan(0)
    for (const f of ['package.json', 'README.md', 'index.js', 'index.mjs', 'index.d.ts', 'index.d.mts', 'binding.js', 'binding.d.ts', ...tracked]) {
      expect(files, f).toContain(f)
    }
    for (const f of files) expect(f).toMatch(/^(package\.json|README\.md|LICENSE(\.\w+)?|(index|binding)\.(js|mjs|d\.ts|d\.mts)|(bin|lib)\/[\w/-]+\.js)$/)

    expect(tarList(platformTgz).sort()).toEqual(['README.md', ADDON, 'package.json'].sort())

    // No runtime dependency that would need the network; the platform package is the only optional one.
    expect(mainPkg.dependencies ?? {}).toEqual({})
    expect(mainPkg.optionalDependencies).toEqual({ [PLATFORM]: mainPkg.version })
  })

  it('the environment has node and npm but no Rust toolchain', () => {
    for (const tool of ['cargo', 'rustc']) {
      const r = run('sh', ['-c', `command -v ${tool}`])
      expect(r.status, `${tool} is on the test PATH: ${r.stdout}`).not.toBe(0)
    }
    expect(run('node', ['--version']).status).toBe(0)
    expect(run('npm', ['--version']).status).toBe(0)
  })

  it('installs offline into an empty project; require() loads the addon from the platform package and generates', () => {
    install(app, [mainTgz, platformTgz])
    const installed = join(app, 'node_modules', '@ruvector')
    expect(readdirSync(join(installed, 'ruvllm')).filter((f) => f.endsWith('.node'))).toEqual([])
    expect(existsSync(join(installed, 'ruvllm-linux-x64-gnu', ADDON))).toBe(true)

    writeFileSync(
      join(app, 'cjs.cjs'),
      `const ruvllm = require('${MAIN}')
const { LLM } = ruvllm
;(async () => {
  const llm = await LLM.load(process.env.MODEL, { contextSize: 256 })
  const out = await llm.generate(${JSON.stringify(CAPITALS)}, { temperature: 0, maxTokens: 4 })
  await llm.close()
  const addons = require('fs').readFileSync('/proc/self/maps', 'utf8').split('\\n').filter((l) => l.endsWith('.node')).map((l) => l.split(/\\s+/).pop())
  console.log(JSON.stringify({ entry: require.resolve('${MAIN}'), addons: [...new Set(addons)], text: out.text, tokens: out.tokens.length }))
})().catch((e) => { console.error(e); process.exit(1) })
`,
    )
    const r = run('node', ['cjs.cjs'], { cwd: app })
    expect(r.status, r.text).toBe(0)
    const got = JSON.parse(r.stdout.trim().split('\n').pop()!)
    expect(got.entry).toBe(join(realpathSync(app), 'node_modules', '@ruvector', 'ruvllm', 'index.js'))
    expect(got.addons).toEqual([join(realpathSync(app), 'node_modules', '@ruvector', 'ruvllm-linux-x64-gnu', ADDON)])
    expect(got.tokens).toBe(4)
    expect(got.text.startsWith(' Berlin'), got.text).toBe(true)
  })

  it('import { LLM } (ESM) gets the same objects and generates', () => {
    writeFileSync(
      join(app, 'esm.mjs'),
      `import { LLM } from '${MAIN}'
import ruvllm, * as ns from '${MAIN}'
import { createRequire } from 'node:module'
const cjs = createRequire(import.meta.url)('${MAIN}')
const llm = await LLM.load(process.env.MODEL, { contextSize: 256 })
let text = ''
for await (const chunk of llm.stream(${JSON.stringify(CAPITALS)}, { temperature: 0, maxTokens: 4 })) text += chunk.text
await llm.close()
console.log(JSON.stringify({
  entry: import.meta.resolve('${MAIN}'),
  sameObjects: ruvllm === cjs && LLM === cjs.LLM,
  missing: Object.keys(cjs).filter((k) => !(k in ns)),
  text,
}))
`,
    )
    const r = run('node', ['esm.mjs'], { cwd: app })
    expect(r.status, r.text).toBe(0)
    const got = JSON.parse(r.stdout.trim().split('\n').pop()!)
    expect(got.entry.endsWith('/node_modules/@ruvector/ruvllm/index.mjs'), got.entry).toBe(true)
    expect(got.sameObjects).toBe(true)
    expect(got.missing).toEqual([])
    expect(got.text.startsWith(' Berlin'), got.text).toBe(true)
  })

  it('the CLI runs from the installed package (npx ruvllm)', () => {
    const npx = (...args: string[]) => run('npx', ['--offline', '--no-install', 'ruvllm', ...args], { cwd: app })
    const v = npx('--version')
    expect(v.status, v.text).toBe(0)
    expect(v.stdout.trim()).toBe(mainPkg.version)
    const h = npx('--help')
    expect(h.status, h.text).toBe(0)
    expect(h.stdout).toContain('ruvllm generate')
    for (const sub of ['models', 'learn', 'route']) {
      const s = npx(sub, '--help')
      expect(s.status, s.text).toBe(0)
      expect(s.stdout + s.stderr).toMatch(/usage/i)
    }
    const g = npx('generate', CAPITALS, '--model', env.MODEL!, '--max-tokens', '4', '--temperature', '0')
    expect(g.status, g.text).toBe(0)
    expect(g.stdout.startsWith(' Berlin'), g.stdout).toBe(true)
    const b = npx('bench', 'learning')
    expect(b.status, b.text).toBe(2)
    expect(b.stderr).toMatch(/^ruvllm: ERR_USAGE: bench learning runs benches\/learning\.mjs from a clone/)
  })

  it('without the binary in the platform package, loading fails with the loader\'s error', () => {
    // Proves that the tests above loaded the addon from the platform package and nothing else.
    const broken = join(tmp, 'platform-without-binary')
    cpSync(join(ROOT, 'npm', 'linux-x64-gnu'), broken, { recursive: true, filter: (f) => !f.endsWith('.node') })
    const p = run('npm', ['pack', '--silent', '--pack-destination', broken], { cwd: broken })
    expect(p.status, p.text).toBe(0)
    const tgz = join(broken, p.stdout.trim().split('\n').pop()!)
    expect(tarList(tgz)).not.toContain(ADDON)
    const app2 = join(tmp, 'app-without-binary')
    install(app2, [mainTgz, tgz])
    const r = run('node', ['-e', `require('${MAIN}')`], { cwd: app2 })
    expect(r.status).not.toBe(0)
    expect(r.stderr).toContain('Cannot find native binding')
    console.log(`pack test: PASS (pack, offline install, require, import, CLI) in ${((Date.now() - started) / 1000).toFixed(1)} s`)
  })
})
