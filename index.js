'use strict'
// Entry of `@ruvector/ruvllm`: the napi-generated loader (`binding.js`, which finds the addon next
// to it or in the platform package) and the parts written in JavaScript: `ChatSession`, and
// `Symbol.asyncDispose` on the classes that hold a model, a port or connections, so that
// `await using llm = await LLM.load(...)` frees them at the end of the block.
//
// `module.exports = require(...)` is the form Node's CommonJS export detection follows, so
// `import { LLM } from '@ruvector/ruvllm'` keeps finding every name of the binding.
module.exports = require('./binding.js')

const { ChatSession } = require('./lib/chat-session.js')
const { addAsyncDispose } = require('./lib/dispose.js')

addAsyncDispose(module.exports.LLM, 'close')
addAsyncDispose(module.exports.Server, 'close')
addAsyncDispose(module.exports.FederationNode, 'stop')

module.exports.ChatSession = ChatSession
