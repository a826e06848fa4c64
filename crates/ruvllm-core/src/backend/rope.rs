//! Rotary position embeddings: the cos/sin table every backend applies.

/// Which dimensions RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama.cpp's `LLAMA_ROPE_TYPE_NORM` (Llama, Mistral; their
    /// GGUF conversion permutes Q/K so this matches the checkpoint).
    Interleaved,
    /// Halves (i, i + d/2): `LLAMA_ROPE_TYPE_NEOX` (Gemma 3, Qwen2).
    Neox,
}

/// Frequency factors and attention factor of a scaled RoPE ([`RopeTable::scaled`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeScaling {
    /// One divisor per rotated frequency (`rot_dim / 2`), or none.
    pub freq_factors: Option<Vec<f32>>,
    /// Multiplies cos and sin (1.0 for none).
    pub attn_factor: f32,
}

impl Default for RopeScaling {
    fn default() -> Self {
        RopeScaling { freq_factors: None, attn_factor: 1.0 }
    }
}

/// Precomputed cos/sin for positions `0..max_pos`, shared by every layer that uses the same base.
pub struct RopeTable {
    pub rot_dim: usize,
    pub style: RopeStyle,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// `rot_dim` rotated dimensions per head (even), frequencies `base^(-2i/rot_dim)` divided by
    /// `linear_factor` (linear scaling, 1.0 for none).
    pub fn new(rot_dim: usize, base: f32, linear_factor: f32, max_pos: usize, style: RopeStyle) -> Self {
        Self::scaled(rot_dim, base, linear_factor, &RopeScaling::default(), max_pos, style)
    }

    /// [`Self::new`] with per-frequency factors and an attention factor (`scaling`): frequency
    /// `i` is divided by `factors[i]` and cos/sin are multiplied by `attn_factor`, as ggml's
    /// `rope_ext` does with its `freq_factors` tensor and `attn_factor` (Llama 3.1's `rope_freqs`,
    /// Phi-3's LongRoPE `rope_factors_long`/`_short`). A query and a key both rotated with the
    /// factor scale their dot product by its square, which is what LongRoPE asks for.
    pub fn scaled(rot_dim: usize, base: f32, linear_factor: f32, scaling: &RopeScaling, max_pos: usize, style: RopeStyle) -> Self {
        let half = rot_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        let factor = |i: usize| scaling.freq_factors.as_ref().and_then(|f| f.get(i).copied()).unwrap_or(1.0);
        let inv: Vec<f32> = (0..half).map(|i| 1.0 / base.powf(2.0 * i as f32 / rot_dim as f32) / linear_factor / factor(i)).collect();
        let m = scaling.attn_factor;
        for p in 0..max_pos {
            for &f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos() * m);
                sin.push(a.sin() * m);
            }
        }
        RopeTable { rot_dim, style, cos, sin }
    }

    /// The cosines and sines, `[pos][rot_dim / 2]` each (what a GPU backend uploads).
    pub fn cos_sin(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    pub fn max_pos(&self) -> usize {
        self.cos.len() / (self.rot_dim / 2).max(1)
    }

    /// Rotates every head (chunks of `head_dim`) of one token's vector at position `pos`.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.rotate(x, head_dim, pos, 1.0)
    }

    /// The inverse rotation (by the negated angles): the rotation's transpose, which is how a
    /// gradient flows back through RoPE.
    pub fn apply_inverse(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        self.rotate(x, head_dim, pos, -1.0)
    }

    fn rotate(&self, x: &mut [f32], head_dim: usize, pos: usize, sign: f32) {
        let half = self.rot_dim / 2;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(head_dim) {
            match self.style {
                RopeStyle::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * cos[i] - b * sign * sin[i];
                        head[2 * i + 1] = a * sign * sin[i] + b * cos[i];
                    }
                }
                RopeStyle::Neox => {
                    for i in 0..half {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * cos[i] - b * sign * sin[i];
                        head[i + half] = a * sign * sin[i] + b * cos[i];
                    }
                }
            }
        }
    }
}
