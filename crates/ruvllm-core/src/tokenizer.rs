//! Tokenizer built from a GGUF's `tokenizer.ggml.*` metadata with the `tokenizers` crate:
//! SentencePiece-style BPE with scores (`tokenizer.ggml.model = "llama"`: Gemma 3, Llama 2,
//! Mistral) and byte-level BPE with merges (`"gpt2"`: Qwen2, Llama 3). Special tokens are matched
//! as whole strings. Must match llama.cpp's tokenization token for token on the real model.
//! OWNER: tokenizer helper.

use crate::gguf::GgufFile;
use crate::Result;

pub struct Tokenizer { /* helper decides */ }

impl Tokenizer {
    /// Builds from GGUF metadata; `Error::Tokenizer`/`GgufInvalid` on bad or missing metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> { todo!() }
    /// Encodes `text`. With `add_special`, prepends BOS when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`) and appends EOS when `add_eos_token`. Special-token
    /// strings in `text` (e.g. `<start_of_turn>`) are parsed as those tokens when `parse_special`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> { todo!() }
    /// Decodes ids to text (special/control tokens skipped when `skip_special`).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> { todo!() }
    pub fn vocab_size(&self) -> usize { todo!() }
    pub fn bos_id(&self) -> Option<u32> { todo!() }
    pub fn eos_id(&self) -> Option<u32> { todo!() }
    /// Every id that ends generation: EOS, EOT, `<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`...
    pub fn is_end_of_generation(&self, id: u32) -> bool { todo!() }
    /// Id of an exact token string, if any.
    pub fn token_id(&self, token: &str) -> Option<u32> { todo!() }
}

/// Turns a stream of ids into text pieces that are always valid UTF-8: bytes of a character
/// split across tokens are held back until the character is complete.
pub struct StreamDecoder<'a> { tok: &'a Tokenizer /* ... */ }

impl<'a> StreamDecoder<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self { todo!() }
    /// Returns the new text (possibly empty) that token `id` completes.
    pub fn push(&mut self, id: u32) -> Result<String> { todo!() }
    /// Remaining text at the end of the stream (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String { todo!() }
}
