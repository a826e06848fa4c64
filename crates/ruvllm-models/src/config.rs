//! Where things live and which servers we talk to, from the environment.

use std::path::PathBuf;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
pub const DEFAULT_PYPI: &str = "https://pypi.org/pypi";

/// Everything the model manager reads from the environment, as plain data (tests build it
/// directly instead of setting process-wide variables).
#[derive(Debug, Clone)]
pub struct Config {
    /// Hugging Face hub cache root (holds `models--owner--name/{blobs,snapshots,refs}`).
    pub cache_dir: PathBuf,
    /// ruvllm's own files: `imports.json`, wheels of PyPI downloads in progress.
    pub state_dir: PathBuf,
    /// Hub endpoint (`HF_ENDPOINT`), without a trailing slash.
    pub endpoint: String,
    pub token: Option<String>,
    /// Base of PyPI's JSON API (`<base>/<project>/json`).
    pub pypi_url: String,
    pub home: Option<PathBuf>,
    /// Automatic resumes after a dropped connection within one download.
    pub retries: u32,
    /// `HF_HUB_OFFLINE=1`: never touch the network.
    pub offline: bool,
    /// Free space to keep on top of the file's size.
    pub free_margin: u64,
}

fn var(k: &str) -> Option<String> {
    std::env::var(k).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn truthy(k: &str) -> bool {
    matches!(var(k).as_deref().map(str::to_ascii_lowercase).as_deref(), Some("1" | "true" | "yes" | "on"))
}

impl Config {
    /// Reads `RUVLLM_MODELS_DIR`, `HF_HUB_CACHE`, `HF_HOME`, `XDG_CACHE_HOME`, `HF_ENDPOINT`,
    /// `HF_TOKEN` (then `$HF_HOME/token`), `HF_HUB_OFFLINE`, `RUVLLM_PYPI_URL` (then
    /// `PIP_INDEX_URL`), `RUVLLM_DOWNLOAD_RETRIES`.
    pub fn from_env() -> Self {
        let home = var("HOME").or_else(|| var("USERPROFILE")).map(PathBuf::from);
        let xdg_cache = var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".cache")))
            .unwrap_or_else(|| std::env::temp_dir().join("ruvllm-cache"));
        let hf_home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| xdg_cache.join("huggingface"));
        let (cache_dir, state_dir) = match var("RUVLLM_MODELS_DIR") {
            Some(d) => {
                let d = PathBuf::from(d);
                (d.clone(), d.join(".ruvllm"))
            }
            None => (var("HF_HUB_CACHE").map(PathBuf::from).unwrap_or_else(|| hf_home.join("hub")), xdg_cache.join("ruvllm")),
        };
        let token = var("HF_TOKEN").or_else(|| var("HUGGING_FACE_HUB_TOKEN")).or_else(|| {
            let p = var("HF_TOKEN_PATH").map(PathBuf::from).unwrap_or_else(|| hf_home.join("token"));
            std::fs::read_to_string(p).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
        });
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        Config {
            cache_dir,
            state_dir,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            pypi_url: pypi_url_from_env(),
            home,
            retries: var("RUVLLM_DOWNLOAD_RETRIES").and_then(|v| v.parse().ok()).unwrap_or(3),
            offline: truthy("HF_HUB_OFFLINE"),
            free_margin: 16 << 20,
        }
    }

    /// A config for a given cache folder and servers (tests, embedding).
    pub fn new(cache_dir: impl Into<PathBuf>, endpoint: &str, pypi_url: &str) -> Self {
        let cache_dir = cache_dir.into();
        Config {
            state_dir: cache_dir.join(".ruvllm"),
            cache_dir,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token: None,
            pypi_url: pypi_url.trim_end_matches('/').to_string(),
            home: None,
            retries: 0,
            offline: false,
            free_margin: 0,
        }
    }
}

/// `RUVLLM_PYPI_URL` (the JSON API base, e.g. `https://pypi.org/pypi`), else pip's
/// `PIP_INDEX_URL` turned from `<host>/simple` into `<host>/pypi` (pypi.org, devpi, Nexus and
/// Artifactory serve the JSON API there), else pypi.org.
fn pypi_url_from_env() -> String {
    if let Some(u) = var("RUVLLM_PYPI_URL") {
        return u.trim_end_matches('/').to_string();
    }
    if let Some(u) = var("PIP_INDEX_URL") {
        let u = u.trim_end_matches('/');
        if let Some(base) = u.strip_suffix("/simple") {
            return format!("{base}/pypi");
        }
    }
    DEFAULT_PYPI.to_string()
}
