// Chat templates built in, by name (`ruvllm chat --chat-template gemma`, `new ChatSession(llm,
// { chatTemplate: 'gemma' })`). Models that ship a template (`tokenizer.chat_template`) use their
// own; base models such as the Gemma 3 270M used in tests ship none, so the CLI and ChatSession
// fall back to 'plain'.
'use strict'

/** Gemma 3's template as published in google/gemma-3-*-it tokenizer_config.json (chat_template). */
const gemma = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"

/** A plain transcript for base models of any family: "User: ...\nAssistant: ...". */
const plain =
  "{{ bos_token }}{% for message in messages %}" +
  "{% if message['role'] == 'system' %}{{ (message['content'] | trim) + '\\n\\n' }}" +
  "{% elif message['role'] == 'user' %}{{ 'User: ' + (message['content'] | trim) + '\\n' }}" +
  "{% else %}{{ 'Assistant: ' + (message['content'] | trim) + '\\n' }}{% endif %}" +
  "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"

/** Stop strings that end a reply for each built-in template (the engine also stops at end-of-turn tokens). */
const stops = { gemma: ['<end_of_turn>', '<start_of_turn>'], plain: ['\nUser:', '\nAssistant:'] }

module.exports = { templates: { gemma, plain }, stops }
