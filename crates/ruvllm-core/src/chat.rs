//! Chat templates from `tokenizer.chat_template`, rendered with minijinja (with the Python-ish
//! string methods HF templates use: pycompat), as transformers does. OWNER: tokenizer helper.

use crate::Result;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct ChatTemplate { /* helper decides */ }

impl ChatTemplate {
    /// Compiles a template; `Error::ChatTemplate` on syntax errors.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> { todo!() }
    /// From the GGUF (`tokenizer.chat_template`); `Ok(None)` when the model ships none.
    pub fn from_gguf(file: &crate::gguf::GgufFile, tok: &crate::tokenizer::Tokenizer) -> Result<Option<Self>> { todo!() }
    /// Renders messages (`add_generation_prompt` = start the assistant's turn).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> { todo!() }
}
