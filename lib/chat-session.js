'use strict'
// A conversation with a model: the history, the chat template, generation defaults and the
// functions the model may call, so that each turn sends only the new message.
//
// Every turn renders the whole history, and the engine's prefix cache finds the part it
// evaluated for the turn before (`usage.cachedTokens`), so a turn's prefill costs only its new
// messages. When the history outgrows the context, the oldest turns go (the system prompt stays):
// down to half of the room, not just below it, so that shifts are rare and the turns between two
// shifts reuse the cached prefix.

const { templates: builtinTemplates, stops: builtinStops } = require('./chat-templates.js')
const { addAsyncDispose } = require('./dispose.js')

const DEFAULT_MAX_TOKENS = 256
const SESSION_KEYS = ['systemPrompt', 'chatTemplate', 'contextShift', 'functions', 'maxToolRounds']
const SHIFTS = ['drop-oldest', 'error']
const JSON_VERSION = 1

function coded(Kind, code, message) {
  const e = new Kind(message)
  e.code = code
  return e
}
const typeError = (message) => coded(TypeError, 'ERR_INVALID_ARG', message)
const rangeError = (message) => coded(RangeError, 'ERR_INVALID_ARG', message)

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v)
}

function describe(v) {
  return v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v
}

/** The `chatTemplate` option: a built-in name or a Jinja template; else the model's, else 'plain'. */
function resolveTemplate(llm, given) {
  if (given === undefined) {
    return llm.info.hasChatTemplate ? { text: undefined, stop: [] } : { name: 'plain', text: builtinTemplates.plain, stop: builtinStops.plain }
  }
  if (typeof given !== 'string' || given.trim() === '') {
    throw typeError(`chatTemplate must be a built-in template name (${Object.keys(builtinTemplates).join(', ')}) or a Jinja template, got ${describe(given)}`)
  }
  if (Object.hasOwn(builtinTemplates, given)) return { name: given, text: builtinTemplates[given], stop: builtinStops[given] || [] }
  return { text: given, stop: [] }
}

/** `functions`: `{ name: { description?, parameters?, handler } }` as `generate`'s tools. */
function readFunctions(functions) {
  if (functions === undefined) return { tools: undefined, handlers: new Map() }
  if (!isObject(functions)) throw typeError(`functions must be an object of { description?, parameters?, handler }, got ${describe(functions)}`)
  const tools = []
  const handlers = new Map()
  for (const [name, f] of Object.entries(functions)) {
    if (!isObject(f) || typeof f.handler !== 'function') throw typeError(`functions.${name} must be { description?, parameters?, handler: (args) => result }`)
    tools.push({ type: 'function', function: { name, ...(f.description !== undefined && { description: f.description }), ...(f.parameters !== undefined && { parameters: f.parameters }) } })
    handlers.set(name, f.handler)
  }
  return { tools: tools.length ? tools : undefined, handlers }
}

/** Index of the first message after the oldest turn of `history` (a user message and the replies and tool messages after it). */
function oldestTurnEnd(history) {
  if (history.length === 0) return 0
  const next = history.findIndex((m, i) => i > 0 && m.role === 'user')
  return next < 0 ? history.length : next
}

function toolResultText(v) {
  if (typeof v === 'string') return v
  const s = JSON.stringify(v)
  return s === undefined ? String(v) : s
}

/**
 * A chat with `llm`: `await session.prompt(text)` answers with the history so far; the history is
 * kept here, in OpenAI's message shape (`session.history`), and can be saved (`toJSON()`) and
 * restored (`ChatSession.from(llm, json)`).
 */
class ChatSession {
  #llm
  #system
  #templateOption
  #template
  #shift
  #defaults
  #handlers
  #tools
  #maxToolRounds
  #messages = []
  #tail = Promise.resolve()
  #closed = false
  #running = new Set()

  /**
   * `options`: `systemPrompt`, `chatTemplate` (a Jinja template or a built-in name; default the
   * model's, else 'plain'), `contextShift` ('drop-oldest', the default, or 'error'),
   * `functions` (`{ name: { description?, parameters?, handler } }`: calls the model makes run
   * inside the turn), `maxToolRounds` (default 8: rounds of calls in a turn, after which the
   * model must answer in text), and any `generate` option as a default for every turn.
   */
  constructor(llm, options = {}) {
    if (!llm || typeof llm.stream !== 'function' || typeof llm.tokenize !== 'function') throw typeError('new ChatSession(llm, options): llm must be an LLM from LLM.load')
    if (llm.closed) throw coded(Error, 'ERR_CLOSED', 'the model is closed')
    if (options === null || typeof options !== 'object' || Array.isArray(options)) throw typeError(`ChatSession options must be an object, got ${describe(options)}`)
    const { systemPrompt, chatTemplate, contextShift = 'drop-oldest', functions, maxToolRounds = 8, ...defaults } = options
    if (systemPrompt !== undefined && typeof systemPrompt !== 'string') throw typeError(`systemPrompt must be a string, got ${describe(systemPrompt)}`)
    if (!SHIFTS.includes(contextShift)) throw rangeError(`contextShift must be one of ${SHIFTS.map((s) => `'${s}'`).join(', ')}, got ${JSON.stringify(contextShift)}`)
    if (!Number.isInteger(maxToolRounds) || maxToolRounds < 0 || maxToolRounds > 64) throw rangeError(`maxToolRounds must be an integer in 0..64, got ${maxToolRounds}`)
    for (const k of ['signal', 'onToken', 'onStep', 'tools']) {
      if (k in defaults) throw typeError(`${k} is not a session default: ${k === 'tools' ? 'give functions with handlers' : `pass it to prompt()`}`)
    }
    // The same checks as generate's, before the first turn.
    llm.constructor.checkOptions(undefined, defaults)
    this.#llm = llm
    this.#system = systemPrompt
    this.#templateOption = chatTemplate
    this.#template = resolveTemplate(llm, chatTemplate)
    this.#shift = contextShift
    this.#defaults = defaults
    const f = readFunctions(functions)
    this.#tools = f.tools
    this.#handlers = f.handlers
    this.#maxToolRounds = maxToolRounds
  }

  /** A session from `toJSON()`'s output; `options` adds what JSON cannot hold (`functions`) or overrides. */
  static from(llm, json, options = {}) {
    if (!isObject(json) || json.version !== JSON_VERSION || !Array.isArray(json.messages)) {
      throw typeError(`ChatSession.from: not a saved session (want { version: ${JSON_VERSION}, messages: [...] })`)
    }
    json.messages.forEach((m, i) => {
      if (!isObject(m) || typeof m.role !== 'string' || (m.content !== undefined && typeof m.content !== 'string')) {
        throw typeError(`ChatSession.from: messages[${i}] must be { role, content }`)
      }
      if (m.role === 'system') throw typeError(`ChatSession.from: messages[${i}]: the system prompt is saved as systemPrompt`)
    })
    const session = new ChatSession(llm, {
      ...(isObject(json.options) ? json.options : {}),
      ...(json.systemPrompt !== undefined && { systemPrompt: json.systemPrompt }),
      ...(json.chatTemplate !== undefined && { chatTemplate: json.chatTemplate }),
      ...(json.contextShift !== undefined && { contextShift: json.contextShift }),
      ...options,
    })
    session.#messages = json.messages.map((m) => ({ ...m }))
    return session
  }

  /** The model this session talks to (the session never closes it). */
  get llm() {
    return this.#llm
  }

  /** The conversation, system prompt first, as chat messages (`{ role, content, toolCalls?, toolCallId?, name? }`). */
  get history() {
    return [...(this.#system !== undefined ? [{ role: 'system', content: this.#system }] : []), ...this.#messages.map((m) => ({ ...m }))]
  }

  /** Whether the session was disposed. */
  get closed() {
    return this.#closed
  }

  /**
   * Sends `text` as the user's next message and resolves with the reply: a `Completion` plus
   * `droppedMessages` (how many of the oldest messages left the history to make room) and
   * `functionCalls` (the calls run inside the turn, with their results). `options` are
   * `generate`'s, over the session's defaults (`onToken` and `signal` included). The history
   * changes only when the turn succeeds.
   */
  async prompt(text, options) {
    const turn = this.#turn(text, options)
    for (;;) {
      const { value, done } = await turn.next()
      if (done) return value
    }
  }

  /**
   * The streaming form of `prompt`: an async iterable of `{ text, token }` chunks (of every
   * round, when functions are called); after the loop, `completion` holds the reply. Leaving
   * the loop early cancels the turn and leaves the history as it was.
   */
  stream(text, options) {
    const turn = this.#turn(text, options)
    const out = (async function* () {
      out.completion = yield* turn
    })()
    out.completion = undefined
    return out
  }

  /** Forgets the conversation (the system prompt stays). */
  reset() {
    this.#checkOpen()
    this.#messages = []
  }

  /** The session as JSON (`ChatSession.from(llm, json)` restores it): the settings and the messages, not `functions`' handlers. */
  toJSON() {
    return {
      version: JSON_VERSION,
      ...(this.#system !== undefined && { systemPrompt: this.#system }),
      ...(this.#templateOption !== undefined && { chatTemplate: this.#templateOption }),
      contextShift: this.#shift,
      options: { ...this.#defaults },
      messages: this.#messages.map((m) => ({ ...m })),
    }
  }

  /** Ends the session: a turn in progress is cancelled and later calls throw `ERR_CLOSED`. The model stays open. */
  async dispose() {
    this.#closed = true
    for (const c of this.#running) c.abort()
    await this.#tail
  }

  #checkOpen() {
    if (this.#closed) throw coded(Error, 'ERR_CLOSED', 'the chat session was disposed')
  }

  /** Waits for the turns before this one; resolves to the function that lets the next one run. */
  async #acquire() {
    const before = this.#tail
    let release
    this.#tail = new Promise((r) => (release = r))
    await before
    return release
  }

  /**
   * The messages to send: the system prompt, as much of `history` as fits with `added` and the
   * reply, and `added`. Returns them and how many history messages went.
   */
  #fit(history, added, maxTokens, opts) {
    const context = this.#llm.info.contextLength
    const reserve = Math.min(maxTokens, context)
    const system = this.#system !== undefined ? [{ role: 'system', content: this.#system }] : []
    const count = (h) => this.#llm.tokenize([...system, ...h, ...added], { ...(this.#template.text && { chatTemplate: this.#template.text }), ...(opts.tools && { tools: opts.tools }) }).length
    let kept = history
    let tokens = count(kept)
    if (tokens + reserve <= context) return { messages: [...system, ...kept, ...added], kept, dropped: 0 }
    const overflow = (why) =>
      coded(Error, 'ERR_CONTEXT_OVERFLOW', `${why}: ${tokens} prompt tokens + maxTokens ${reserve} > the context's ${context} tokens (load with a larger contextSize, or lower maxTokens)`)
    if (this.#shift === 'error') throw overflow('the conversation outgrew the context')
    const target = Math.floor((context - reserve) / 2)
    while (kept.length > 0 && (tokens + reserve > context || tokens > target)) {
      kept = kept.slice(oldestTurnEnd(kept))
      tokens = count(kept)
    }
    if (tokens + reserve > context) throw overflow('the new message does not fit even without the earlier turns')
    return { messages: [...system, ...kept, ...added], kept, dropped: history.length - kept.length }
  }

  async *#turn(text, options = {}) {
    this.#checkOpen()
    if (typeof text !== 'string' || text === '') throw typeError(`prompt text must be a non-empty string, got ${describe(text)}`)
    if (options === null || typeof options !== 'object' || Array.isArray(options)) throw typeError(`prompt options must be an object, got ${describe(options)}`)
    const { onToken, signal, ...given } = options
    if (onToken !== undefined && typeof onToken !== 'function') throw typeError(`onToken must be a function, got ${describe(onToken)}`)
    for (const k of SESSION_KEYS.concat('tools')) if (k in given) throw typeError(`${k} is a session option (new ChatSession(llm, { ${k} }))`)
    const opts = { ...this.#defaults, ...given, ...(this.#tools && { tools: this.#tools }) }
    if (this.#template.text) opts.chatTemplate = this.#template.text
    const stop = [...(opts.stop === undefined ? [] : Array.isArray(opts.stop) ? opts.stop : [opts.stop]), ...this.#template.stop]
    if (stop.length) opts.stop = stop
    const maxTokens = opts.maxTokens ?? DEFAULT_MAX_TOKENS

    // The session's own controller, so that dispose() can stop the turn; it follows `signal`.
    const controller = new AbortController()
    const follow = () => controller.abort(signal.reason)
    if (signal !== undefined) {
      if (!signal || typeof signal.addEventListener !== 'function') throw typeError('signal must be an AbortSignal')
      if (signal.aborted) controller.abort(signal.reason)
      else signal.addEventListener('abort', follow, { once: true })
    }
    const release = await this.#acquire()
    this.#running.add(controller)
    try {
      this.#checkOpen()
      const added = [{ role: 'user', content: text }]
      const functionCalls = []
      let fit
      for (let round = 0; ; round++) {
        fit = this.#fit(this.#messages, added, maxTokens, opts)
        // A forced call ('required', or a named function) is the turn's first round only: the
        // rounds after it answer with the results; the last round allowed answers in text.
        const last = this.#tools && round === this.#maxToolRounds
        const free = round > 0 && opts.toolChoice !== undefined && opts.toolChoice !== 'none'
        const choice = last ? { toolChoice: 'none' } : free ? { toolChoice: 'auto' } : {}
        const stream = this.#llm.stream(fit.messages, { ...opts, ...choice, signal: controller.signal })
        for await (const chunk of stream) {
          if (onToken) await onToken(chunk)
          yield chunk
        }
        const c = stream.completion
        const calls = c.toolCalls || []
        if (calls.length > 0 && round < this.#maxToolRounds) {
          added.push({ role: 'assistant', ...(c.text.trim() && { content: c.text.trim() }), toolCalls: calls })
          for (const call of calls) {
            let args
            try {
              args = JSON.parse(call.arguments)
            } catch {
              args = call.arguments
            }
            const result = await this.#handlers.get(call.name)(args)
            functionCalls.push({ id: call.id, name: call.name, arguments: args, result })
            added.push({ role: 'tool', toolCallId: call.id, name: call.name, content: toolResultText(result) })
          }
          continue
        }
        added.push({ role: 'assistant', content: c.text.trim(), ...(calls.length > 0 && { toolCalls: calls }) })
        this.#messages = [...fit.kept, ...added]
        return { ...c, droppedMessages: fit.dropped, functionCalls }
      }
    } finally {
      this.#running.delete(controller)
      if (signal) signal.removeEventListener('abort', follow)
      release()
    }
  }
}

addAsyncDispose(ChatSession, 'dispose')

module.exports = { ChatSession }
