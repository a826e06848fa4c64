// ESM entry of `@ruvector/ruvllm` (`import { LLM } from '@ruvector/ruvllm'`): the same objects as
// `require('@ruvector/ruvllm')`, re-exported from the napi-generated CommonJS loader `index.js`,
// which finds the addon next to it or in the platform package (`@ruvector/ruvllm-<platform>`).
export * from './index.js'
export { default } from './index.js'
