//! A missing model gives ERR_EMBEDDER_NOT_FOUND naming the model manager's download command, and
//! nothing runs Python to look for it (own test binary: it sets environment variables).

use std::path::Path;

#[test]
fn missing_model_is_a_clear_error() {
    std::env::set_var("RUVLLM_EMBEDDER", "/nonexistent/ruvllm-embedder");
    let err = ruvllm_embed::discover_model_dir().expect_err("must fail");
    assert_eq!(err.code(), "ERR_EMBEDDER_NOT_FOUND");
    assert!(err.to_string().contains("npx ruvllm models download all-minilm-l6-v2"), "{err}");
    let err = ruvllm_embed::BertEmbedder::load("/nonexistent/x", Default::default()).err().expect("load must fail");
    assert_eq!(err.code(), "ERR_EMBEDDER_NOT_FOUND");
    assert!(err.to_string().contains("npx ruvllm models download all-minilm-l6-v2"), "{err}");

    // No RUVLLM_EMBEDDER, an empty cache and HF_HUB_OFFLINE: the coded error, no download, and
    // no Python asked (a `python3` first on PATH that leaves a mark if it runs).
    let dir = std::env::temp_dir().join(format!("ruvllm-embed-missing-{}", std::process::id()));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let mark = dir.join("python-ran");
    for py in ["python3", "python"] {
        let p = bin.join(py);
        std::fs::write(&p, format!("#!/bin/sh\ntouch {}\nexit 1\n", mark.display())).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    std::env::remove_var("RUVLLM_EMBEDDER");
    std::env::remove_var("RUVLLM_MODELS_DIR");
    std::env::set_var("HF_HUB_CACHE", dir.join("hub"));
    std::env::set_var("HF_HUB_OFFLINE", "1");
    std::env::set_var("PATH", &bin);
    let err = ruvllm_embed::discover_model_dir().expect_err("must fail");
    assert_eq!(err.code(), "ERR_EMBEDDER_NOT_FOUND");
    let msg = err.to_string();
    assert!(msg.contains("npx ruvllm models download all-minilm-l6-v2") && msg.contains("HF_HUB_OFFLINE"), "{msg}");
    assert!(!Path::new(&mark).exists(), "python was run");
    assert!(!dir.join("hub").join("models--sentence-transformers--all-MiniLM-L6-v2").exists(), "offline must not write the cache");
    let _ = std::fs::remove_dir_all(&dir);
}
