//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
//! penalties, seeded RNG; and stop-string matching on the output text. OWNER: sampling helper.

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

pub struct Sampler { /* helper decides */ }

impl Sampler {
    pub fn new(params: SamplingParams) -> Self { todo!() }
    /// Picks the next token. `logits` may be modified in place; `history` is prompt + output.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 { todo!() }
}

/// Finds stop strings in streamed text and holds back text that could still become one.
pub struct StopMatcher { /* helper decides */ }

pub enum StopResult {
    /// Text safe to emit now (may be empty).
    Continue(String),
    /// A stop string was found: emit this text (before the stop string), then finish.
    Stop(String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self { todo!() }
    pub fn push(&mut self, text: &str) -> StopResult { todo!() }
    /// Text still held back at the end of generation.
    pub fn flush(&mut self) -> String { todo!() }
}
