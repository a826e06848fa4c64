// Types of the ESM entry (index.mjs): those of the CommonJS loader, whose module object is also
// the default export.
export * from './index.js'
import * as ruvllm from './index.js'
export default ruvllm
