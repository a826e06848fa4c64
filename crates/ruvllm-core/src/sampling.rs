//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
//! penalties, seeded RNG; and stop-string matching on the output text.
//!
//! The order follows llama.cpp's common sampler: penalties → (greedy if `temperature <= 0`) →
//! top-k → softmax with temperature → top-p → min-p → a draw from a seeded xoshiro256** RNG.
//! Same seed and same logits give the same tokens.

use std::cmp::Ordering;

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Debug, Clone)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` (or NaN) means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` disables.
    pub min_p: f32,
    /// llama.cpp-style: positive logits of recent tokens are divided by it, negative ones
    /// multiplied. 1 disables (as does a value `<= 0`).
    pub repeat_penalty: f32,
    /// OpenAI-style: subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// OpenAI-style: subtracted from a recent token's logit once per occurrence.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Always the most likely token, no penalties.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }
}

/// One token still in the running.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
    /// Unnormalized probability, set by the softmax.
    prob: f32,
}

/// Higher logit first; equal logits by lower id, so every order is total and reproducible.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Picks tokens from logits. Keeps its scratch buffers between calls, so sampling does not
/// allocate once warmed up.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Candidates of the current call (capacity reused).
    candidates: Vec<Candidate>,
    /// Sorted copy of the penalty window (capacity reused).
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler whose random generator is seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = Rng::new(params.seed);
        Self { params, rng, candidates: Vec::new(), window: Vec::new() }
    }

    /// The settings this sampler uses.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether [`sample`](Self::sample) is a plain argmax of the logits (greedy, no penalties),
    /// which a backend can compute where the logits are.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        let t = p.temperature;
        let repeat = p.repeat_penalty > 0.0 && p.repeat_penalty != 1.0;
        let additive = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        (t.is_nan() || t <= 0.0) && (!(repeat || additive) || p.repeat_last_n == 0)
    }

    /// Picks the next token. `logits` may be modified in place; `history` is prompt + output.
    /// NaN logits are never chosen; with no usable logit at all (empty or all NaN) it returns 0.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        let t = self.params.temperature;
        if t.is_nan() || t <= 0.0 {
            return argmax(logits);
        }
        self.collect_top_k(logits);
        if self.candidates.is_empty() {
            return argmax(logits);
        }
        self.softmax();
        self.top_p();
        self.min_p();
        self.draw()
    }

    /// Repeat penalty (llama.cpp style) then presence / frequency penalties (OpenAI style) on
    /// the tokens of the last `repeat_last_n` of `history`.
    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let repeat = self.penalty_window(history);
        for run in self.window.chunk_by(|a, b| a == b) {
            if let Some(logit) = logits.get_mut(run[0] as usize) {
                *logit = penalize(*logit, run.len(), &self.params, repeat);
            }
        }
    }

    /// Fills `window` with the penalized tokens, sorted (the last `repeat_last_n` of `history`;
    /// empty when no penalty applies); returns whether the repeat penalty is on.
    fn penalty_window(&mut self, history: &[u32]) -> bool {
        let p = &self.params;
        let repeat = p.repeat_penalty > 0.0 && p.repeat_penalty != 1.0;
        let additive = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        self.window.clear();
        if (repeat || additive) && p.repeat_last_n > 0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            self.window.extend_from_slice(&history[start..]);
            self.window.sort_unstable();
        }
        repeat
    }

    /// The `top_k` best tokens (all when `top_k` is 0) among those whose logit is neither NaN
    /// nor -inf; +inf is clamped to the largest f32. One pass over the vocabulary with a buffer
    /// of at most `2 * top_k`: once `top_k` tokens are kept, a logit no higher than the k-th best
    /// cannot get in (on a tie the earlier, lower id wins), so most tokens are skipped at once.
    fn collect_top_k(&mut self, logits: &[f32]) {
        let k = match self.params.top_k {
            0 => usize::MAX,
            k => k,
        };
        self.candidates.clear();
        let mut floor = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() || l <= floor {
                continue;
            }
            self.candidates.push(Candidate { id: i as u32, logit: l.min(f32::MAX), prob: 0.0 });
            if self.candidates.len() >= k.saturating_mul(2) {
                floor = self.keep_best(k);
            }
        }
        if self.candidates.len() > k {
            self.keep_best(k);
        }
        if k != usize::MAX {
            // One order for the draw whatever the scan left (`sample_top` draws in this order).
            self.candidates.sort_unstable_by(by_logit_desc);
        }
    }

    /// [`sample`](Self::sample) from a row's best logits `top` (sorted as
    /// `DevicePicks::top_logits` gives them: higher first, lower id on ties; the last one bounds
    /// every logit not listed), where they decide the pick as the whole row would, with the
    /// same result: greedy, or top-k with `top_k` below `top.len()`, under penalties that only
    /// lower logits. `None` (nothing drawn): sample from the whole row.
    pub fn sample_top(&mut self, top: &[(u32, f32)], history: &[u32]) -> Option<u32> {
        let p = self.params.clone();
        let t = p.temperature;
        let greedy = t.is_nan() || t <= 0.0;
        let k = if greedy { 1 } else { p.top_k };
        let raising = (p.repeat_penalty > 0.0 && p.repeat_penalty < 1.0) || p.presence_penalty < 0.0 || p.frequency_penalty < 0.0;
        let (&(_, bound), pool) = top.split_last()?;
        if k == 0 || k > pool.len() || raising {
            return None;
        }
        let repeat = self.penalty_window(history);
        // Every unlisted logit is at most `bound` (penalties only lower it), and one equal to
        // it has a higher id than the listed ones equal to it: a listed logit above `bound`, or
        // equal to it and not penalized, is surely ahead of every unlisted one. With `bound` =
        // -inf every usable logit is listed.
        self.candidates.clear();
        for &(id, logit) in pool.iter().filter(|c| c.1 > f32::NEG_INFINITY) {
            let count = self.window.partition_point(|&x| x <= id) - self.window.partition_point(|&x| x < id);
            let l = if count > 0 { penalize(logit, count, &p, repeat) } else { logit };
            if bound == f32::NEG_INFINITY || l > bound || (l == bound && count == 0) {
                self.candidates.push(Candidate { id, logit: l, prob: 0.0 });
            }
        }
        if bound > f32::NEG_INFINITY && self.candidates.len() < k {
            return None;
        }
        if self.candidates.is_empty() {
            return None;
        }
        self.candidates.sort_unstable_by(by_logit_desc);
        self.candidates.truncate(k);
        if greedy {
            return Some(self.candidates[0].id);
        }
        self.softmax();
        self.top_p();
        self.min_p();
        Some(self.draw())
    }

    /// Truncates the candidates to the best `k` (`1 <= k < len`); returns the k-th best logit.
    fn keep_best(&mut self, k: usize) -> f32 {
        self.candidates.select_nth_unstable_by(k - 1, by_logit_desc);
        self.candidates.truncate(k);
        self.candidates[k - 1].logit
    }

    /// Unnormalized probabilities `exp((logit - max) / temperature)`; the best one is 1.
    fn softmax(&mut self) {
        let max = self.candidates.iter().map(|c| c.logit).fold(f32::MIN, f32::max);
        let t = self.params.temperature;
        for c in &mut self.candidates {
            let p = ((c.logit - max) / t).exp();
            c.prob = if p.is_nan() { 0.0 } else { p };
        }
    }

    /// Keeps the most likely tokens until their share of the probability reaches `top_p` (at
    /// least one). Sorts only as much of the candidates as it needs, in growing chunks.
    fn top_p(&mut self) {
        let top_p = self.params.top_p;
        if top_p.is_nan() || top_p >= 1.0 {
            return;
        }
        let total: f64 = self.candidates.iter().map(|c| f64::from(c.prob)).sum();
        let target = f64::from(top_p) * total;
        let (mut sorted, mut chunk, mut cum) = (0, 64, 0.0f64);
        while sorted < self.candidates.len() {
            let end = (sorted + chunk).min(self.candidates.len());
            sort_prefix(&mut self.candidates[sorted..], end - sorted);
            for i in sorted..end {
                cum += f64::from(self.candidates[i].prob);
                if cum >= target {
                    self.candidates.truncate(i + 1);
                    return;
                }
            }
            sorted = end;
            chunk *= 2;
        }
    }

    /// Drops tokens whose probability is below `min_p` times the best one (which always stays).
    fn min_p(&mut self) {
        let min_p = self.params.min_p;
        if min_p.is_nan() || min_p <= 0.0 {
            return;
        }
        let best = self.candidates.iter().map(|c| c.prob).fold(0.0, f32::max);
        let threshold = (min_p * best).min(best);
        self.candidates.retain(|c| c.prob >= threshold);
    }

    /// Draws one candidate in proportion to its probability.
    fn draw(&mut self) -> u32 {
        let total: f64 = self.candidates.iter().map(|c| f64::from(c.prob)).sum();
        let target = self.rng.next_f64() * total;
        let mut cum = 0.0;
        for c in &self.candidates {
            cum += f64::from(c.prob);
            if target < cum {
                return c.id;
            }
        }
        self.candidates.last().map_or(0, |c| c.id)
    }
}

/// One token's logit after the penalties, given how often it occurs in the window.
fn penalize(logit: f32, count: usize, p: &SamplingParams, repeat: bool) -> f32 {
    let mut l = logit;
    if repeat {
        l = if l > 0.0 { l / p.repeat_penalty } else { l * p.repeat_penalty };
    }
    l - count as f32 * p.frequency_penalty - p.presence_penalty
}

/// The arg-max of `logits` (first on ties), the max and `ln Σ exp(l - max)`, in f64, so that
/// `ln softmax(logits)[i] = logits[i] - max - ln_sum`.
pub fn softmax_norm(logits: &[f32]) -> (u32, f64, f64) {
    let (top, max) = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |(a, m), (j, &v)| if v > m { (j, v) } else { (a, m) });
    let max = max as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    (top as u32, max, sum.ln())
}

/// `ln softmax(logits)[i]` in f64, with the arg-max (first on ties) and its own log-probability.
pub fn log_softmax_at(logits: &[f32], i: usize) -> (f64, u32, f64) {
    let (top, max, ln_sum) = softmax_norm(logits);
    (logits[i] as f64 - max - ln_sum, top, -ln_sum)
}

/// The log-softmax normalizer of `logits` and its `k` most likely tokens: `(norm, top)` with
/// `ln softmax(logits)[i] = logits[i] - norm` and `top` the `k` best `(id, log-probability)`,
/// most likely first (on ties the lower id). NaN and -inf logits are never among `top`; with no
/// finite logit, `norm` is NaN and `top` empty. Vector passes for the maximum and the sum of
/// `exp` (f32 lanes summed in f64); the best `k` skip every block of logits whose maximum is not
/// above the k-th best so far. ~0.1 ms for 262,144 logits with AVX-512, ~0.2 ms with AVX2.
pub fn log_softmax_top(logits: &[f32], k: usize) -> (f64, Vec<(u32, f64)>) {
    // The same code compiled for wider vectors (the lanes and the order of the sums are its
    // own, so every path gives the same bits).
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::runtime::cpu();
        if cpu.avx512f {
            // SAFETY: the CPU has AVX-512 F.
            return unsafe { log_softmax_top_avx512(logits, k) };
        }
        if cpu.avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { log_softmax_top_avx2(logits, k) };
        }
    }
    log_softmax_top_impl(logits, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn log_softmax_top_avx512(logits: &[f32], k: usize) -> (f64, Vec<(u32, f64)>) {
    log_softmax_top_impl(logits, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_softmax_top_avx2(logits: &[f32], k: usize) -> (f64, Vec<(u32, f64)>) {
    log_softmax_top_impl(logits, k)
}

#[inline(always)]
fn log_softmax_top_impl(logits: &[f32], k: usize) -> (f64, Vec<(u32, f64)>) {
    let max = max_of(logits);
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    // Blocks whose maximum is not above the k-th best so far are skipped whole.
    const BLOCK: usize = 256;
    for (b, block) in logits.chunks(BLOCK).enumerate() {
        if k == 0 {
            break;
        }
        let m = max_of(block);
        if m == f32::NEG_INFINITY || (top.len() == k && m <= top[k - 1].1) {
            continue;
        }
        for (j, &l) in block.iter().enumerate() {
            // Not `>=`: an equal logit later in the vocabulary loses to the one kept.
            if l > f32::NEG_INFINITY && (top.len() < k || l > top[k - 1].1) {
                let at = top.partition_point(|&(_, t)| t >= l);
                top.insert(at, ((b * BLOCK + j) as u32, l));
                top.truncate(k);
            }
        }
    }
    if max == f32::NEG_INFINITY {
        return (f64::NAN, Vec::new());
    }
    let mut sum = 0.0f64;
    for chunk in logits.chunks(4096) {
        let mut lanes = [0.0f32; 16];
        let mut it = chunk.chunks_exact(16);
        for c in &mut it {
            for (acc, &l) in lanes.iter_mut().zip(c) {
                *acc += exp_nonpositive(l - max);
            }
        }
        let rest: f32 = it.remainder().iter().map(|&l| exp_nonpositive(l - max)).sum();
        sum += lanes.iter().map(|&x| x as f64).sum::<f64>() + rest as f64;
    }
    let norm = max as f64 + sum.ln();
    (norm, top.into_iter().map(|(i, l)| (i, l as f64 - norm)).collect())
}

/// The largest of `v` ignoring NaN (-inf when there is none), in 16 lanes.
#[inline(always)]
fn max_of(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = if l > *m { l } else { *m };
        }
    }
    chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a })
}

/// `exp(x)` for `x <= 0` (NaN reads as -inf: 0), within 2 ulp, in straight-line arithmetic the
/// compiler vectorizes (the library `expf` is a call per element): `2^n · p(r)` with
/// `x = n·ln 2 + r`, `|r| <= ln 2 / 2`, `p` a degree-6 Taylor polynomial.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Below -87.3 the result is under f32's normal range: count it as 0 (NaN too, as `max`
    // turns it into -104).
    let x = x.max(-104.0);
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // ln 2 in two parts, so that `n · LN2_HI` is exact.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // n as an integer is in `t`'s low mantissa bits; 2^n is `n + 127` in the exponent field
    // (meaningless below -126, where the result is 0 anyway).
    let bits = ((t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32).wrapping_add(127) as u32) << 23;
    if x < -87.0 {
        0.0
    } else {
        p * f32::from_bits(bits)
    }
}

/// Index of the largest logit (the first on ties), ignoring NaN; 0 when there is none.
pub fn argmax(logits: &[f32]) -> u32 {
    // The largest non-NaN logit, 16 lanes at a time (a NaN never compares greater, so it is
    // skipped), then its first position: 262,144 logits in ~14 µs instead of ~180 µs.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            *m = if l > *m { l } else { *m };
        }
    }
    let best = chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    if best > f32::NEG_INFINITY {
        // `==` also matches -0.0 to 0.0: the first of equal logits wins, as below.
        return logits.iter().position(|&l| l == best).map_or(0, |i| i as u32);
    }
    // Only -inf and NaN: the first -inf (0 when all are NaN).
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i, l));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

/// Puts the `m` best candidates of `c` first, in order (`1 <= m <= c.len()`).
fn sort_prefix(c: &mut [Candidate], m: usize) {
    if m < c.len() {
        c.select_nth_unstable_by(m - 1, by_logit_desc);
    }
    c[..m].sort_unstable_by(by_logit_desc);
}

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64.
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        Self { s: [(); 4].map(|()| splitmix64(&mut x)) }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// One step of splitmix64 (used to expand a seed into xoshiro state).
fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Finds stop strings in streamed text and holds back text that could still become one.
pub struct StopMatcher {
    /// Non-empty stop strings.
    stops: Vec<String>,
    /// Text received but not yet emitted: a prefix of some stop string.
    held: String,
    /// Set once a stop string was found.
    stopped: bool,
}

/// What to do with the text after a [`StopMatcher::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopResult {
    /// Text safe to emit now (may be empty).
    Continue(String),
    /// A stop string was found: emit this text (before the stop string), then finish.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self { stops, held: String::new(), stopped: false }
    }

    /// Adds a piece of streamed text. Once a stop was found, every later push gives `Stop("")`.
    pub fn push(&mut self, text: &str) -> StopResult {
        if self.stopped {
            return StopResult::Stop(String::new());
        }
        self.held.push_str(text);
        if let Some(pos) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(pos);
            self.stopped = true;
            return StopResult::Stop(std::mem::take(&mut self.held));
        }
        let keep = self.partial_suffix_len();
        let rest = self.held.split_off(self.held.len() - keep);
        StopResult::Continue(std::mem::replace(&mut self.held, rest))
    }

    /// Text still held back at the end of generation (empty after a stop).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn partial_suffix_len(&self) -> usize {
        let held = &self.held;
        let longest = self.stops.iter().map(|s| s.len() - 1).max().unwrap_or(0).min(held.len());
        (1..=longest)
            .rev()
            .find(|&k| {
                let start = held.len() - k;
                held.is_char_boundary(start) && self.stops.iter().any(|s| s.starts_with(&held[start..]))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's best `n` logits as `DevicePicks::top_logits` lists them.
    fn top_of(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
        let mut c: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate { id: i as u32, logit: if l.is_nan() { f32::NEG_INFINITY } else { l.min(f32::MAX) }, prob: 0.0 })
            .collect();
        c.sort_by(by_logit_desc);
        c.iter().take(n).map(|c| (c.id, c.logit)).collect()
    }

    #[test]
    fn sampling_from_the_top_logits_draws_what_the_whole_row_draws() {
        let mut rng = Rng::new(11);
        let (mut decided, mut undecided) = (0, 0);
        for case in 0..400u64 {
            // Rows with ties, a few NaN and -inf, peaked and flat.
            let scale = [0.5f32, 3.0, 12.0][case as usize % 3];
            let mut row: Vec<f32> = (0..3000).map(|_| ((rng.next_f64() * 8.0).floor() as f32 / 8.0 - 0.5) * scale).collect();
            row[(case as usize * 7) % 3000] = f32::NAN;
            row[(case as usize * 13 + 1) % 3000] = f32::NEG_INFINITY;
            let history: Vec<u32> = (0..40).map(|_| top_of(&row, 30)[(rng.next_u64() % 30) as usize].0).collect();
            let mut p = SamplingParams {
                temperature: [0.0, 0.7, 1.3][case as usize % 3],
                top_k: [1, 5, 40, 63, 64, 0][(case / 3) as usize % 6],
                top_p: if case % 2 == 0 { 0.9 } else { 1.0 },
                min_p: if case % 5 == 0 { 0.05 } else { 0.0 },
                seed: case,
                ..SamplingParams::default()
            };
            match case % 4 {
                1 => p.repeat_penalty = 1.3,
                2 => p.presence_penalty = 0.8,
                3 => p.frequency_penalty = if case % 8 == 3 { -0.5 } else { 0.4 },
                _ => {}
            }
            let (mut a, mut b) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
            let whole = a.sample(&mut row.clone(), &history);
            match b.sample_top(&top_of(&row, 64), &history) {
                Some(id) => {
                    assert_eq!(id, whole, "case {case}: {p:?}");
                    // The generators stay in step.
                    assert_eq!(a.rng.next_u64(), b.rng.next_u64(), "case {case}");
                    decided += 1;
                }
                None => {
                    // Only where the list may not hold the answer: no top-k, too many kept, or
                    // penalties (that may push listed logits below unlisted ones).
                    let greedy = p.temperature <= 0.0;
                    assert!(
                        (!greedy && (p.top_k == 0 || p.top_k >= 64)) || p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0,
                        "case {case}: {p:?} undecided"
                    );
                    undecided += 1;
                }
            }
        }
        assert!(decided > 200, "decided {decided}, undecided {undecided}");
    }

    #[test]
    fn exp_nonpositive_is_within_2_ulp() {
        let mut worst = 0.0f64;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 2.5e-7, "relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(f32::NAN), 0.0);
        assert_eq!(exp_nonpositive(-200.0), 0.0);
    }

    #[test]
    fn log_softmax_top_matches_the_definition() {
        let logits = [1.0f32, 3.0, f32::NAN, -2.0, 3.0, f32::NEG_INFINITY, 0.5];
        let (norm, top) = log_softmax_top(&logits, 3);
        let z: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| (l as f64).exp()).sum();
        assert!((norm - z.ln()).abs() < 1e-6, "{norm} vs {}", z.ln());
        // Equal logits: the lower id first.
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 4, 0]);
        for &(i, lp) in &top {
            assert!((lp - (logits[i as usize] as f64 - z.ln())).abs() < 1e-6);
        }
        // The log-probabilities of the finite logits sum to one.
        let total: f64 = logits.iter().filter(|l| l.is_finite()).map(|&l| (l as f64 - norm).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        // No alternatives asked; none possible.
        assert!(log_softmax_top(&logits, 0).1.is_empty());
        let (n, t) = log_softmax_top(&[f32::NAN, f32::NEG_INFINITY], 2);
        assert!(n.is_nan() && t.is_empty());
        // More asked than there are finite logits.
        assert_eq!(log_softmax_top(&[0.0, f32::NEG_INFINITY], 5).1.len(), 1);
        // A long row (several chunks and a remainder) against an f64 reference.
        let long: Vec<f32> = (0..10_007).map(|i| ((i * 7919) % 1000) as f32 / 97.0).collect();
        let (n, t) = log_softmax_top(&long, 20);
        let m = long.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let reference = m + long.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
        assert!((n - reference).abs() < 1e-4, "{n} vs {reference}");
        assert_eq!(t.len(), 20);
        assert!(t.windows(2).all(|w| w[0].1 >= w[1].1));
    }

    #[test]
    fn splitmix64_reference_value() {
        let mut x = 0;
        assert_eq!(splitmix64(&mut x), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn next_f64_in_unit_interval() {
        let mut rng = Rng::new(7);
        assert!((0..10_000).map(|_| rng.next_f64()).all(|x| (0.0..1.0).contains(&x)));
    }
}
