//! A tiny HTTP/1.1 server on 127.0.0.1 that speaks the Hub's resolve layout
//! (`/{owner}/{repo}/resolve/{rev}/{file}` with ETag, x-linked-etag, x-linked-size,
//! x-repo-commit, Range) and a PyPI-like JSON API (`/pypi/{project}/json`, wheels
//! under `/files/`). One thread per connection, `Connection: close`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Clone)]
pub struct HubFile {
    pub data: Arc<Vec<u8>>,
    /// What the server claims (LFS SHA-256 of the real content).
    pub sha256: String,
    pub commit: String,
}

#[derive(Default)]
pub struct Behaviour {
    /// Drop the connection after sending this many body bytes, for the next `n` GETs.
    pub drop_after: Option<(u64, usize)>,
    /// Flip the byte at this offset in what is served.
    pub corrupt_at: Option<usize>,
    /// Require `Authorization: Bearer <token>`; answer 401 otherwise.
    pub token: Option<String>,
    /// Sleep per 64 KiB sent (to make downloads overlap).
    pub throttle: Option<Duration>,
    /// Answer every request with this status.
    pub fail_all: Option<u16>,
    /// Ignore Range (always 200 with the whole body).
    pub ignore_range: bool,
}

#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

#[derive(Default)]
pub struct State {
    /// "owner/repo/file" -> file
    pub hub: HashMap<String, HubFile>,
    /// "project" -> JSON body (with {BASE} replaced by the server URL)
    pub pypi: HashMap<String, String>,
    /// "/files/<name>" -> bytes
    pub files: HashMap<String, Arc<Vec<u8>>>,
    pub behaviour: Behaviour,
    pub log: Vec<Logged>,
}

pub struct Server {
    pub url: String,
    pub state: Arc<Mutex<State>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let base = url.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                let base = base.clone();
                std::thread::spawn(move || {
                    let _ = handle(conn, &st, &base);
                });
            }
        });
        Server { url, state }
    }

    pub fn add_hub_file(&self, repo: &str, file: &str, data: Vec<u8>, commit: &str) -> String {
        let sha = sha256_hex(&data);
        self.state.lock().unwrap().hub.insert(format!("{repo}/{file}"), HubFile { data: Arc::new(data), sha256: sha.clone(), commit: commit.to_string() });
        sha
    }

    /// Publishes a wheel; `claimed_sha` overrides the digest in the JSON.
    pub fn add_wheel(&self, project: &str, version: &str, filename: &str, wheel: Vec<u8>, claimed_sha: Option<String>) {
        let sha = claimed_sha.unwrap_or_else(|| sha256_hex(&wheel));
        let file = format!(
            r#"[{{"filename":"{filename}","packagetype":"bdist_wheel","url":"{{BASE}}/files/{filename}","size":{},"digests":{{"sha256":"{sha}","md5":"x"}}}}]"#,
            wheel.len()
        );
        // Like pypi.org's /pypi/<project>/json: the latest release in `urls`, all in `releases`.
        let json = format!(r#"{{"info":{{"name":"{project}","version":"{version}"}},"urls":{file},"releases":{{"0.0.1":[],"{version}":{file}}}}}"#);
        let mut s = self.state.lock().unwrap();
        s.pypi.insert(project.to_string(), json);
        s.files.insert(format!("/files/{filename}"), Arc::new(wheel));
    }

    pub fn log(&self) -> Vec<Logged> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn gets(&self, path_contains: &str) -> Vec<Logged> {
        self.log().into_iter().filter(|l| l.method == "GET" && l.path.contains(path_contains)).collect()
    }
}

fn respond(conn: &mut TcpStream, status: u16, headers: &[(String, String)], body: &[u8], head_only: bool) -> std::io::Result<()> {
    let mut h = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("content-length")) {
        h.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    h.push_str("\r\n");
    conn.write_all(h.as_bytes())?;
    if !head_only {
        conn.write_all(body)?;
    }
    conn.flush()
}

fn handle(mut conn: TcpStream, st: &Arc<Mutex<State>>, base: &str) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut l = String::new();
        if reader.read_line(&mut l)? == 0 || l == "\r\n" {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let head = method == "HEAD";
    let (fail_all, token, corrupt_at, throttle, ignore_range) = {
        let mut s = st.lock().unwrap();
        s.log.push(Logged { method: method.clone(), path: path.clone(), range: headers.get("range").cloned(), auth: headers.get("authorization").cloned() });
        let b = &s.behaviour;
        (b.fail_all, b.token.clone(), b.corrupt_at, b.throttle, b.ignore_range)
    };
    if let Some(code) = fail_all {
        return respond(&mut conn, code, &[], b"failing on purpose", head);
    }
    // PyPI JSON
    if let Some(rest) = path.strip_prefix("/pypi/") {
        let key = rest.trim_end_matches("/json").to_string();
        let body = st.lock().unwrap().pypi.get(&key).cloned();
        return match body {
            Some(b) => respond(&mut conn, 200, &[("Content-Type".into(), "application/json".into())], b.replace("{BASE}", base).as_bytes(), head),
            None => respond(&mut conn, 404, &[], b"Not Found", head),
        };
    }
    // Files (wheels)
    let (data, extra, sha_for_corrupt) = if path.starts_with("/files/") {
        let f = st.lock().unwrap().files.get(&path).cloned();
        match f {
            Some(d) => (d, vec![], false),
            None => return respond(&mut conn, 404, &[], b"Not Found", head),
        }
    } else if let Some((repo_part, rest)) = path.trim_start_matches('/').split_once("/resolve/") {
        let (_rev, file) = rest.split_once('/').unwrap_or((rest, ""));
        let key = format!("{repo_part}/{file}");
        if let Some(t) = &token {
            if headers.get("authorization") != Some(&format!("Bearer {t}")) {
                return respond(&mut conn, 401, &[("X-Error-Code".into(), "GatedRepo".into())], b"Access restricted", head);
            }
        }
        let f = st.lock().unwrap().hub.get(&key).cloned();
        match f {
            Some(f) => (
                f.data.clone(),
                vec![
                    ("ETag".to_string(), format!("\"{}\"", f.sha256)),
                    ("X-Linked-Etag".to_string(), format!("\"{}\"", f.sha256)),
                    ("X-Linked-Size".to_string(), f.data.len().to_string()),
                    ("X-Repo-Commit".to_string(), f.commit.clone()),
                    ("Accept-Ranges".to_string(), "bytes".to_string()),
                ],
                true,
            ),
            None => {
                let repo_known = st.lock().unwrap().hub.keys().any(|k| k.starts_with(&format!("{repo_part}/")));
                let code = if repo_known { "EntryNotFound" } else { "RepoNotFound" };
                return respond(&mut conn, 404, &[("X-Error-Code".into(), code.into())], b"Entry not found", head);
            }
        }
    } else {
        return respond(&mut conn, 404, &[], b"Not Found", head);
    };
    let total = data.len() as u64;
    let mut start = 0u64;
    let mut status = 200;
    let mut hdrs = extra;
    if let (Some(r), false) = (headers.get("range"), ignore_range) {
        if let Some(s) = r.strip_prefix("bytes=").and_then(|r| r.split('-').next()).and_then(|s| s.parse::<u64>().ok()) {
            if s >= total {
                return respond(&mut conn, 416, &[("Content-Range".into(), format!("bytes */{total}"))], b"", head);
            }
            start = s;
            status = 206;
            hdrs.push(("Content-Range".into(), format!("bytes {start}-{}/{total}", total - 1)));
        }
    }
    hdrs.push(("Content-Length".into(), (total - start).to_string()));
    let mut h = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    for (k, v) in &hdrs {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    conn.write_all(h.as_bytes())?;
    if head {
        return conn.flush();
    }
    let drop_after = {
        let mut s = st.lock().unwrap();
        match &mut s.behaviour.drop_after {
            Some((n, left)) if *left > 0 => {
                *left -= 1;
                Some(*n)
            }
            _ => None,
        }
    };
    let mut pos = start as usize;
    let mut sent = 0u64;
    while pos < data.len() {
        let end = (pos + 65536).min(data.len());
        let mut chunk = data[pos..end].to_vec();
        if let (Some(c), true) = (corrupt_at, sha_for_corrupt) {
            if c >= pos && c < end {
                chunk[c - pos] ^= 0xff;
            }
        }
        if let Some(limit) = drop_after {
            if sent + chunk.len() as u64 > limit {
                let keep = (limit - sent) as usize;
                conn.write_all(&chunk[..keep])?;
                conn.flush()?;
                // Abrupt close.
                let _ = conn.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
        }
        conn.write_all(&chunk)?;
        sent += chunk.len() as u64;
        pos = end;
        if let Some(t) = throttle {
            std::thread::sleep(t);
        }
    }
    conn.flush()
}

/// Pseudo-random bytes (xorshift), so no test data is committed.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A wheel (zip) with one stored or deflated member.
pub fn wheel(member: &str, data: &[u8], deflate: bool) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let method = if deflate { zip::CompressionMethod::Deflated } else { zip::CompressionMethod::Stored };
        let opts = SimpleFileOptions::default().compression_method(method).large_file(data.len() > (1 << 31));
        z.start_file("pkg/__init__.py", opts).unwrap();
        z.write_all(b"").unwrap();
        z.start_file(member, opts).unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap();
    }
    buf.into_inner()
}

/// Every regular file under `dir` (recursive), relative.
pub fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(d: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                if e.file_type().unwrap().is_dir() {
                    walk(&p, root, out);
                } else {
                    out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
                }
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A wheel (zip, deflated) with the given members, as a package that ships data files.
pub fn wheel_with(members: &[(&str, &[u8])]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut buf = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in members {
            z.start_file(*name, opts).unwrap();
            z.write_all(data).unwrap();
        }
        z.finish().unwrap();
    }
    buf.into_inner()
}
