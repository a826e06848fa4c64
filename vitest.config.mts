import { defineConfig } from 'vitest/config'

// The specs run against the built addon and the real Gemma 3 270M. One file at a time: each
// loads the model, and the CI machine has 2 cores.
export default defineConfig({
  test: {
    include: ['__test__/**/*.spec.ts'],
    pool: 'forks',
    fileParallelism: false,
    testTimeout: 120_000,
    hookTimeout: 180_000,
  },
})
