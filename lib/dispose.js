'use strict'
// `Symbol.asyncDispose` for the addon's classes, which napi-rs cannot name a symbol-keyed method
// of. Node (20.4 and later) and Bun define the symbol; where it is missing, so is `await using`.

/** Makes `cls.prototype[Symbol.asyncDispose]()` call `this[method]()` (a promise-returning close). */
function addAsyncDispose(cls, method) {
  if (typeof Symbol.asyncDispose !== 'symbol' || typeof cls !== 'function') return
  Object.defineProperty(cls.prototype, Symbol.asyncDispose, {
    value: function () {
      return this[method]()
    },
    writable: true,
    configurable: true,
  })
}

module.exports = { addAsyncDispose }
