// Types of `@ruvector/ruvllm`: those of the napi-generated binding (`binding.d.ts`) and of the
// parts written in JavaScript (`ChatSession`, `Symbol.asyncDispose`).
import type { ChatMessage, Completion, GenerateOptions, LLM, TokenChunk } from './binding'

export * from './binding'

declare module './binding' {
  interface LLM {
    /** `close()`: `await using llm = await LLM.load(...)` frees the model at the end of the block. */
    [Symbol.asyncDispose](): Promise<void>
  }
  interface Server {
    /** `close()`. */
    [Symbol.asyncDispose](): Promise<void>
  }
  interface FederationNode {
    /** `stop()`. */
    [Symbol.asyncDispose](): Promise<void>
  }
}

/** A function the model may call inside a chat session, and what runs when it does. */
export interface ChatSessionFunction {
  description?: string
  /** A JSON schema of the arguments (the call's arguments are held to it). */
  parameters?: Record<string, unknown>
  /** Runs the call with its parsed arguments; the result (JSON-encoded unless a string) goes back to the model. */
  handler: (args: any) => unknown
}

/** `new ChatSession(llm, options)`: the session's settings and generation defaults for every turn. */
export interface ChatSessionOptions extends Omit<GenerateOptions, 'signal' | 'onToken' | 'onStep' | 'tools'> {
  /** The system message, kept first however long the conversation grows. */
  systemPrompt?: string
  /**
   * A Jinja chat template or a built-in name (`'gemma'`, `'plain'`). Default: the model's own;
   * for a model that ships none (a base model), `'plain'`.
   */
  chatTemplate?: string
  /**
   * When the history outgrows the context: `'drop-oldest'` (default) drops the oldest turns
   * (the system prompt stays) down to half of the room left by `maxTokens`, and the reply says
   * how many messages went (`droppedMessages`); `'error'` rejects with `ERR_CONTEXT_OVERFLOW`.
   */
  contextShift?: 'drop-oldest' | 'error'
  /** Functions the model may call; their calls run inside the turn and the model answers with their results. */
  functions?: Record<string, ChatSessionFunction>
  /** Most rounds of function calls in one turn (default 8); the round after them answers in text (`toolChoice: 'none'`). */
  maxToolRounds?: number
}

/** Per-turn options: `generate`'s, over the session's defaults. */
export type ChatPromptOptions = Omit<GenerateOptions, 'tools' | 'chatTemplate'>

/** A call the model made inside a turn, and what its handler returned. */
export interface ChatFunctionCall {
  id: string
  name: string
  /** The parsed arguments. */
  arguments: unknown
  result: unknown
}

/** The reply to a turn. */
export interface ChatReply extends Completion {
  /** How many of the oldest history messages were dropped to make room (0 when none). */
  droppedMessages: number
  /** The function calls run inside the turn, in order. */
  functionCalls: ChatFunctionCall[]
}

/** `toJSON()`'s output: what `ChatSession.from` restores. */
export interface ChatSessionJSON {
  version: 1
  systemPrompt?: string
  chatTemplate?: string
  contextShift: 'drop-oldest' | 'error'
  options: Record<string, unknown>
  messages: ChatMessage[]
}

/** The streaming form of a turn: chunks for `for await`, then `completion`. */
export interface ChatStream extends AsyncGenerator<TokenChunk, ChatReply, undefined> {
  /** The reply, once the loop has ended normally. */
  completion: ChatReply | undefined
}

/**
 * A conversation with a model: each turn sends only the new message; the history lives here
 * and the engine's prefix cache reuses what earlier turns evaluated (`usage.cachedTokens`).
 * Turns run one at a time, in the order they were asked.
 */
export declare class ChatSession {
  /** Throws `ERR_INVALID_ARG` for bad options, `ERR_CLOSED` for a closed model. */
  constructor(llm: LLM, options?: ChatSessionOptions)
  /** A session from `toJSON()`'s output; `options` adds `functions` (or overrides settings). */
  static from(llm: LLM, json: ChatSessionJSON, options?: ChatSessionOptions): ChatSession
  /** The model (the session never closes it). */
  get llm(): LLM
  /** The conversation, system prompt first. */
  get history(): ChatMessage[]
  get closed(): boolean
  /**
   * Sends `text` as the user's next message; resolves with the reply. Rejects with
   * `ERR_CONTEXT_OVERFLOW` when the message cannot fit (or the history cannot, with
   * `contextShift: 'error'`), an `AbortError`, or a generation error; the history is unchanged then.
   */
  prompt(text: string, options?: ChatPromptOptions): Promise<ChatReply>
  /** The streaming form of `prompt`; leaving the loop early cancels the turn. */
  stream(text: string, options?: Omit<ChatPromptOptions, 'onToken'>): ChatStream
  /** Forgets the conversation (the system prompt stays). */
  reset(): void
  toJSON(): ChatSessionJSON
  /** Cancels a turn in progress; later calls throw `ERR_CLOSED`. The model stays open. */
  dispose(): Promise<void>
  [Symbol.asyncDispose](): Promise<void>
}
