//! The tokenizer as the GGUF describes it (`tokenizer.ggml.*`), read and checked but not yet
//! built. Tests build these by hand to exercise the tokenizer on small synthetic vocabularies.

use crate::gguf::{GgufFile, MetadataValue};
use crate::{Error, Result};

/// Kind of a vocabulary entry, as in `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0: not specified; decodes to nothing.
    Undefined,
    /// 1: an ordinary piece.
    Normal,
    /// 2: the unknown token (`<unk>`); parsed from text only with `parse_special`.
    Unknown,
    /// 3: a control token (`<bos>`, `<start_of_turn>`); parsed from text only with `parse_special`,
    /// skipped when decoding with `skip_special`.
    Control,
    /// 4: user-defined: always matched as a whole string in the text, decoded verbatim.
    UserDefined,
    /// 5: unused slot; never produced from text, decodes to nothing.
    Unused,
    /// 6: a byte-fallback token `<0xXX>`.
    Byte,
}

impl TokenType {
    /// From the GGUF integer code (unknown codes become `Undefined`, as in llama.cpp).
    pub fn from_code(code: i64) -> Self {
        match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Which algorithm the vocabulary uses (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `"llama"`: SentencePiece BPE with scores and byte fallback (Gemma, Llama 2, Mistral).
    SentencePiece,
    /// `"gpt2"`: byte-level BPE with merges (Qwen2, Llama 3).
    ByteLevelBpe,
}

/// Pre-tokenizer regex family for byte-level BPE (`tokenizer.ggml.pre`), as in llama.cpp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's `default` (also used when the key is missing).
    Default,
    /// GPT-2's pattern (`gpt-2`, `phi-2`, ...).
    Gpt2,
    /// Llama 3's pattern (`llama3`, `llama-bpe`, ...): digits in groups of up to three.
    Llama3,
    /// Qwen2's pattern (`qwen2`, `deepseek-r1-qwen`): single digits.
    Qwen2,
    /// StarCoder's: every digit alone, then GPT-2's pattern (`starcoder`, `smollm`, `refact`, ...).
    Starcoder,
}

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` name; `None` for names we do not know.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "default" => PreTokenizer::Default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" | "chatglm-bpe" => {
                PreTokenizer::Llama3
            }
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "hunyuan" | "kormo" => PreTokenizer::Qwen2,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "mpt" | "olmo" | "jais" | "trillion" | "roberta-bpe"
            | "jina-v1-en" | "jina-v2-code" => PreTokenizer::Gpt2,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva" | "mellum2" => PreTokenizer::Starcoder,
            _ => return None,
        })
    }

    /// The split regexes, applied one after the other (llama.cpp `regex_exprs`).
    pub fn regexes(self) -> &'static [&'static str] {
        const CONTRACTIONS_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
        match self {
            PreTokenizer::Default => &[r"[\p{P}\$\+<=>\^~\|]+", CONTRACTIONS_GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
            PreTokenizer::Gpt2 => &[CONTRACTIONS_GPT2],
            PreTokenizer::Starcoder => &[r"\p{N}", CONTRACTIONS_GPT2],
            PreTokenizer::Llama3 => &[
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            PreTokenizer::Qwen2 => &[
                r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
        }
    }
}

/// Everything needed to build a [`super::Tokenizer`], with llama.cpp's defaults already applied.
#[derive(Debug, Clone)]
pub struct TokenizerSpec {
    /// Algorithm.
    pub kind: TokenizerKind,
    /// Pre-tokenizer (byte-level BPE only).
    pub pre: PreTokenizer,
    /// Token strings, by id.
    pub tokens: Vec<String>,
    /// SentencePiece scores, by id (empty: all 0).
    pub scores: Vec<f32>,
    /// Token types, by id (empty: all normal).
    pub token_types: Vec<TokenType>,
    /// BPE merges as `"left right"` (byte-level BPE only).
    pub merges: Vec<String>,
    /// Beginning-of-sequence token.
    pub bos: Option<u32>,
    /// End-of-sequence token.
    pub eos: Option<u32>,
    /// End-of-turn token (`tokenizer.ggml.eot_token_id`).
    pub eot: Option<u32>,
    /// End-of-message token (`tokenizer.ggml.eom_token_id`).
    pub eom: Option<u32>,
    /// Unknown token.
    pub unk: Option<u32>,
    /// Padding token.
    pub pad: Option<u32>,
    /// Prepend BOS when encoding with `add_special`.
    pub add_bos: bool,
    /// Append EOS when encoding with `add_special`.
    pub add_eos: bool,
    /// SentencePiece: prefix text that starts the input or follows a special token with a space.
    pub add_space_prefix: bool,
    /// Byte-level BPE: a whole pre-tokenized word found in the vocabulary is taken as is (Llama 3).
    pub ignore_merges: bool,
}

impl TokenizerSpec {
    /// A SentencePiece spec with llama.cpp's defaults (BOS 1, EOS 2, UNK 0, add BOS, space prefix).
    pub fn sentencepiece(tokens: Vec<String>, scores: Vec<f32>, token_types: Vec<TokenType>) -> Self {
        TokenizerSpec {
            kind: TokenizerKind::SentencePiece,
            pre: PreTokenizer::Default,
            tokens,
            scores,
            token_types,
            merges: Vec::new(),
            bos: Some(1),
            eos: Some(2),
            eot: None,
            eom: None,
            unk: Some(0),
            pad: None,
            add_bos: true,
            add_eos: false,
            add_space_prefix: true,
            ignore_merges: false,
        }
    }

    /// A byte-level BPE spec (no special ids, no BOS).
    pub fn byte_level(tokens: Vec<String>, merges: Vec<String>, token_types: Vec<TokenType>, pre: PreTokenizer) -> Self {
        TokenizerSpec {
            kind: TokenizerKind::ByteLevelBpe,
            pre,
            tokens,
            scores: Vec::new(),
            token_types,
            merges,
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unk: None,
            pad: None,
            add_bos: pre == PreTokenizer::Llama3,
            add_eos: false,
            add_space_prefix: false,
            ignore_merges: pre == PreTokenizer::Llama3,
        }
    }

    /// Reads `tokenizer.ggml.*` from a GGUF. Missing or mistyped required keys are
    /// `Error::GgufInvalid` naming the key; an algorithm we do not implement is `Error::Unsupported`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path.clone();
        let bad = |msg: String| Error::gguf(path.clone(), msg);

        let model = file
            .get("tokenizer.ggml.model")
            .ok_or_else(|| bad("missing metadata key tokenizer.ggml.model: the file has no tokenizer".into()))?
            .as_str()
            .ok_or_else(|| bad("tokenizer.ggml.model is not a string".into()))?;
        let pre_name = match file.get("tokenizer.ggml.pre") {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| bad("tokenizer.ggml.pre is not a string".into()))?),
        };

        let tokens_arr = array(file, "tokenizer.ggml.tokens")?.ok_or_else(|| bad("missing metadata key tokenizer.ggml.tokens".into()))?;
        if tokens_arr.is_empty() {
            return Err(bad("tokenizer.ggml.tokens is empty".into()));
        }
        if tokens_arr.len() > u32::MAX as usize / 2 {
            return Err(bad(format!("tokenizer.ggml.tokens has {} entries, too many", tokens_arr.len())));
        }
        let mut tokens = Vec::with_capacity(tokens_arr.len());
        for (i, v) in tokens_arr.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| bad(format!("tokenizer.ggml.tokens[{i}] is not a string")))?;
            // llama.cpp replaces empty pieces so that every id has a distinct, non-empty text.
            tokens.push(if s.is_empty() { format!("[EMPTY_{i}]") } else { s.to_string() });
        }
        let n = tokens.len();

        let scores = match array(file, "tokenizer.ggml.scores")? {
            None => Vec::new(),
            Some(arr) => {
                if arr.len() < n {
                    return Err(bad(format!("tokenizer.ggml.scores has {} entries for {n} tokens", arr.len())));
                }
                let mut out = Vec::with_capacity(n);
                for (i, v) in arr[..n].iter().enumerate() {
                    out.push(v.as_f64().ok_or_else(|| bad(format!("tokenizer.ggml.scores[{i}] is not a number")))? as f32);
                }
                out
            }
        };
        let token_types = match array(file, "tokenizer.ggml.token_type")? {
            None => Vec::new(),
            Some(arr) => {
                if arr.len() < n {
                    return Err(bad(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", arr.len())));
                }
                let mut out = Vec::with_capacity(n);
                for (i, v) in arr[..n].iter().enumerate() {
                    let code = v.as_i64().ok_or_else(|| bad(format!("tokenizer.ggml.token_type[{i}] is not an integer")))?;
                    out.push(TokenType::from_code(code));
                }
                out
            }
        };

        let mut spec = match model {
            "llama" => TokenizerSpec::sentencepiece(tokens, scores, token_types),
            "gpt2" => {
                let pre = match pre_name {
                    None => PreTokenizer::Default,
                    Some(name) => PreTokenizer::from_name(name)
                        .ok_or_else(|| Error::unsupported(path.clone(), format!("unknown pre-tokenizer type tokenizer.ggml.pre = '{name}'")))?,
                };
                let merges_arr = array(file, "tokenizer.ggml.merges")?
                    .ok_or_else(|| bad("missing metadata key tokenizer.ggml.merges (required by the gpt2 tokenizer)".into()))?;
                let mut merges = Vec::with_capacity(merges_arr.len());
                for (i, v) in merges_arr.iter().enumerate() {
                    merges.push(v.as_str().ok_or_else(|| bad(format!("tokenizer.ggml.merges[{i}] is not a string")))?.to_string());
                }
                let mut spec = TokenizerSpec::byte_level(tokens, merges, token_types, pre);
                spec.scores = scores;
                spec
            }
            other => return Err(Error::unsupported(path, format!("tokenizer.ggml.model = '{other}' is not supported (only 'llama' and 'gpt2')"))),
        };

        let id = |key: &str| -> Result<Option<Option<u32>>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => {
                    let raw = v.as_i64().ok_or_else(|| Error::gguf(file.path.clone(), format!("{key} is not an integer")))?;
                    // A negative id (-1) means "none", as llama.cpp writes it.
                    if raw < 0 {
                        return Ok(Some(None));
                    }
                    if raw as u64 >= n as u64 {
                        return Err(Error::gguf(file.path.clone(), format!("{key} = {raw} is outside the vocabulary of {n} tokens")));
                    }
                    Ok(Some(Some(raw as u32)))
                }
            }
        };
        let flag = |key: &str| -> Result<Option<bool>> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => match v {
                    MetadataValue::Bool(b) => Ok(Some(*b)),
                    other => other.as_u64().map(|x| Some(x != 0)).ok_or_else(|| Error::gguf(file.path.clone(), format!("{key} is not a boolean"))),
                },
            }
        };
        if let Some(v) = id("tokenizer.ggml.bos_token_id")? {
            spec.bos = v;
        }
        if let Some(v) = id("tokenizer.ggml.eos_token_id")? {
            spec.eos = v;
        }
        if let Some(v) = id("tokenizer.ggml.eot_token_id")? {
            spec.eot = v;
        }
        if let Some(v) = id("tokenizer.ggml.eom_token_id")? {
            spec.eom = v;
        }
        if let Some(v) = id("tokenizer.ggml.unknown_token_id")? {
            spec.unk = v;
        }
        if let Some(v) = id("tokenizer.ggml.padding_token_id")? {
            spec.pad = v;
        }
        if let Some(v) = flag("tokenizer.ggml.add_bos_token")? {
            spec.add_bos = v;
        }
        if let Some(v) = flag("tokenizer.ggml.add_eos_token")? {
            spec.add_eos = v;
        }
        if spec.kind == TokenizerKind::SentencePiece {
            if let Some(v) = flag("tokenizer.ggml.add_space_prefix")? {
                spec.add_space_prefix = v;
            }
        }
        // Default ids that fall outside a small vocabulary are disabled, as llama.cpp does.
        for slot in [&mut spec.bos, &mut spec.eos, &mut spec.unk] {
            if slot.is_some_and(|v| v as usize >= n) {
                *slot = None;
            }
        }
        Ok(spec)
    }
}

/// An optional array-valued key; a present key of another type is an error.
fn array<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a [MetadataValue]>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v.as_array().map(Some).ok_or_else(|| Error::gguf(file.path.clone(), format!("{key} is not an array"))),
    }
}
