// Structured output on the real Gemma 3 270M: JSON object and schema, Lark and GBNF grammars,
// tool calls; sampling is constrained, so the output always parses whatever the small model
// would have written.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import Ajv from 'ajv'
import { LLM, modelPath, rejectsWithCode, templates, type LLMType } from './helpers.js'

let llm: LLMType

beforeAll(async () => {
  llm = await LLM.load(modelPath(), { contextSize: 1024 })
})

afterAll(async () => {
  await llm?.close()
})

const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 20 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    languages: { type: 'array', items: { enum: ['Rust', 'TypeScript', 'Python'] }, maxItems: 3 },
  },
  required: ['name', 'age', 'languages'],
  additionalProperties: false,
}

const weather = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 30 }, unit: { enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
}
const time = {
  type: 'function' as const,
  function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 20 } }, required: ['zone'] } },
}

const chat = (text: string) => [{ role: 'user', content: text }]

describe('responseFormat', () => {
  it('json_object: the output is a JSON object', async () => {
    // Any object: the small model must choose to close it, so the prompt asks for a short one
    // (a free-form "describe" prompt makes it repeat keys until maxTokens).
    const out = await llm.generate(chat('Give a JSON object with the name and colour of a cat.'), {
      chatTemplate: templates.gemma,
      responseFormat: { type: 'json_object' },
      maxTokens: 96,
      temperature: 0,
    })
    expect(out.finishReason).toBe('stop')
    const v = JSON.parse(out.text)
    expect(typeof v).toBe('object')
    expect(Array.isArray(v)).toBe(false)
    expect(out.toolCalls).toEqual([])
  })

  it('json_schema: the output validates, greedy and sampled with a seed', async () => {
    const validate = new Ajv().compile(person)
    for (const opts of [{ temperature: 0 }, { temperature: 1.2, topP: 1, seed: 7 }, { temperature: 0.9, seed: 123 }]) {
      const out = await llm.generate(chat('Make up a programmer.'), {
        chatTemplate: templates.gemma,
        responseFormat: { type: 'json_schema', schema: person },
        maxTokens: 128,
        ...opts,
      })
      expect(out.finishReason, out.text).toBe('stop')
      const v = JSON.parse(out.text)
      expect(validate(v), JSON.stringify(validate.errors) + out.text).toBe(true)
    }
  })

  it('stream yields the same constrained text', async () => {
    const opts = { responseFormat: { type: 'json_schema' as const, schema: person }, maxTokens: 128, temperature: 0 }
    let text = ''
    for await (const chunk of llm.stream('A person:', opts)) text += chunk.text
    expect(text).toBe((await llm.generate('A person:', opts)).text)
    JSON.parse(text)
  })
})

describe('grammar', () => {
  it('Lark: the output matches the grammar', async () => {
    const lark = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'
    const out = await llm.generate('Is the sky blue?', { grammar: { lark }, maxTokens: 16, temperature: 0.8, seed: 3 })
    expect(out.text).toMatch(/^The answer is (yes|no)\.$/)
  })

  it('GBNF (a string or { gbnf }): the output matches the grammar', async () => {
    const gbnf = 'root ::= "#" [0-9a-f]{6} ws\nws ::= ""'
    for (const grammar of [gbnf, { gbnf }]) {
      const out = await llm.generate('A colour in hex:', { grammar, maxTokens: 16, temperature: 0 })
      expect(out.text).toMatch(/^#[0-9a-f]{6}$/)
    }
  })
})

describe('tools', () => {
  it("toolChoice 'required' gives a valid call of an offered tool", async () => {
    const out = await llm.generate(chat('What is the weather in Paris?'), {
      chatTemplate: templates.gemma,
      tools: [weather, time],
      toolChoice: 'required',
      maxTokens: 96,
      temperature: 0,
    })
    expect(out.toolCalls.length, out.text).toBeGreaterThan(0)
    for (const call of out.toolCalls) {
      expect(call.id).toMatch(/^call_/)
      expect(['get_weather', 'get_time']).toContain(call.name)
      const schema = call.name === 'get_weather' ? weather.function.parameters : time.function.parameters
      expect(new Ajv().validate(schema, JSON.parse(call.arguments))).toBe(true)
    }
  })

  it('a named tool is the one called, sampled with a seed too', async () => {
    const validate = new Ajv().compile(weather.function.parameters)
    for (const opts of [{ temperature: 0 }, { temperature: 1, seed: 11 }]) {
      const out = await llm.generate(chat('Weather in Oslo, please.'), {
        chatTemplate: templates.gemma,
        tools: [weather, time],
        toolChoice: { type: 'function', function: { name: 'get_weather' } },
        maxTokens: 96,
        ...opts,
      })
      expect(out.toolCalls.map((c) => c.name)).toEqual(['get_weather'])
      expect(validate(JSON.parse(out.toolCalls[0].arguments))).toBe(true)
      expect(out.text).toBe('')
    }
  })

  it("toolChoice 'none' and 'auto' still answer (text or calls), and call results go back as tool messages", async () => {
    const none = await llm.generate(chat('Say hello.'), { chatTemplate: templates.gemma, tools: [weather], toolChoice: 'none', maxTokens: 12, temperature: 0 })
    expect(none.toolCalls).toEqual([])
    const auto = await llm.generate(chat('What is the weather in Rome?'), { chatTemplate: templates.gemma, tools: [weather], maxTokens: 64, temperature: 0 })
    for (const call of auto.toolCalls) expect(call.name).toBe('get_weather')
    const call = { id: 'call_1', name: 'get_weather', arguments: '{"city":"Rome","unit":"celsius"}' }
    const followUp = await llm.generate(
      [
        { role: 'user', content: 'What is the weather in Rome?' },
        { role: 'assistant', toolCalls: [call] },
        { role: 'user', content: 'The tool said: 21 degrees. Summarise.' },
      ],
      { chatTemplate: templates.gemma, tools: [weather], toolChoice: 'none', maxTokens: 8, temperature: 0 },
    )
    expect(followUp.text.length).toBeGreaterThan(0)
  })
})

describe('errors', () => {
  it('a bad schema or grammar rejects with ERR_GRAMMAR', async () => {
    await rejectsWithCode(llm.generate('x', { responseFormat: { type: 'json_schema', schema: { type: 'nonsense' } } }), 'ERR_GRAMMAR')
    await rejectsWithCode(llm.generate('x', { grammar: { lark: 'start: missing_rule' } }), 'ERR_GRAMMAR')
    await rejectsWithCode(llm.generate('x', { grammar: 'root ::= "unterminated' }), 'ERR_GRAMMAR')
    await rejectsWithCode(llm.generate('x', { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'nonsense' } } }], toolChoice: 'required' }), 'ERR_GRAMMAR')
    // The model still works afterwards.
    expect((await llm.generate('Hello', { maxTokens: 2, temperature: 0 })).tokens.length).toBe(2)
  })

  it('bad option shapes reject with ERR_INVALID_ARG', async () => {
    await rejectsWithCode(llm.generate('x', { responseFormat: { type: 'yaml' } as any }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('x', { responseFormat: { type: 'json_object' }, grammar: 'root ::= "a"' }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('x', { grammar: { lark: 'start: "a"', gbnf: 'root ::= "a"' } }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('x', { tools: [weather], toolChoice: 'sometimes' as any }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('x', { tools: [weather], toolChoice: { type: 'function', function: { name: 'nope' } } }), 'ERR_INVALID_ARG')
    await rejectsWithCode(llm.generate('x', { tools: [weather], responseFormat: { type: 'json_object' } }), 'ERR_INVALID_ARG')
  })
})
