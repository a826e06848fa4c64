//! The learning directory: every file is written atomically (a temporary file, fsync, rename,
//! fsync of the directory), except the trajectory journal, which is append-only with an fsync
//! per record; a record torn by a crash is the last line and is skipped when read back.
//!
//! Layout: `state.json` (counters, options the state depends on, the model it belongs to),
//! `micro.bin` / `base.bin` (factors and Adam moments), `fisher.bin` (EWC++ Fisher and anchor),
//! `trajectories.jsonl`, `general.json` (general text for the Fisher), `bank.json` and
//! `bank/<id>.bin` (the adapter bank).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use ruvllm_core::nn::Proj;
use serde::{Deserialize, Serialize};

use crate::adam::Adam;
use crate::grad::{LoraParams, Slot};
use crate::{Error, Result};

/// Writes `bytes` to `path` atomically (the project's one atomic writer, with our error).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    ruvllm_core::gguf::writer::write_atomic(path, bytes).map_err(|e| Error::io(path, e))
}

/// Removes `path` if it exists.
pub fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Removes temporary files a killed process left behind ([`write_atomic`]'s `.name.PID-N.tmp`,
/// or an older `.name.tmp-PID`), in `dir` and `dir/bank`.
pub fn remove_stale_temporaries(dir: &Path) {
    for d in [dir.to_path_buf(), dir.join("bank")] {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && (name.ends_with(".tmp") || name.contains(".tmp-")) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// A stored trajectory: what was asked, what the model answered, what the user said.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trajectory {
    pub id: u64,
    pub completion_id: String,
    /// Milliseconds since the Unix epoch.
    pub time: u64,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub quality: f32,
    pub correction: Option<Vec<u32>>,
}

/// Appends one trajectory to the journal and syncs it.
pub fn append_trajectory(dir: &Path, t: &Trajectory) -> Result<()> {
    let path = dir.join("trajectories.jsonl");
    let mut line = serde_json::to_string(t).map_err(|e| Error::Internal(e.to_string()))?;
    line.push('\n');
    let mut f = OpenOptions::new().create(true).append(true).open(&path).map_err(|e| Error::io(&path, e))?;
    f.write_all(line.as_bytes()).and_then(|()| f.sync_data()).map_err(|e| Error::io(&path, e))
}

/// Reads the journal back; a last line that does not parse (torn by a crash) is skipped, any
/// other bad line is an error.
pub fn read_trajectories(dir: &Path) -> Result<Vec<Trajectory>> {
    let path = dir.join("trajectories.jsonl");
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let lines: Vec<String> = BufReader::new(f).lines().collect::<std::io::Result<_>>().map_err(|e| Error::io(&path, e))?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Trajectory>(line) {
            Ok(t) => out.push(t),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => return Err(Error::corrupt(&path, format!("line {}: {e}", i + 1))),
        }
    }
    Ok(out)
}

#[derive(Serialize, Deserialize)]
struct SlotHeader {
    layer: usize,
    proj: String,
    d_in: usize,
    d_out: usize,
}

#[derive(Serialize, Deserialize)]
struct ParamsHeader {
    format: String,
    rank: usize,
    scale: f32,
    slots: Vec<SlotHeader>,
    len: usize,
    /// How many f32 vectors of `len` follow: 1 (factors) or 3 (factors, Adam m, Adam v).
    vectors: usize,
    adam: Option<Adam>,
}

const MAGIC: &[u8; 8] = b"RVSONA1\n";

fn proj_from(name: &str) -> Option<Proj> {
    Proj::ALL.into_iter().find(|p| p.gguf_name() == name)
}

/// Serializes factors (and optionally their optimizer) as `MAGIC`, a u32 header length, the
/// JSON header, then little-endian f32 vectors.
pub fn params_bytes(p: &LoraParams, adam: Option<&Adam>) -> Vec<u8> {
    let header = ParamsHeader {
        format: "ruvllm-sona-lora".into(),
        rank: p.rank,
        scale: p.scale,
        slots: p.slots.iter().map(|s| SlotHeader { layer: s.layer, proj: s.proj.gguf_name().into(), d_in: s.d_in, d_out: s.d_out }).collect(),
        len: p.w.len(),
        vectors: if adam.is_some() { 3 } else { 1 },
        adam: adam.cloned(),
    };
    let h = serde_json::to_vec(&header).expect("header serializes");
    let mut out = Vec::with_capacity(16 + h.len() + p.w.len() * 12);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    out.extend_from_slice(&h);
    let mut put = |v: &[f32]| v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    put(&p.w);
    if let Some(a) = adam {
        put(&a.m);
        put(&a.v);
    }
    out
}

/// Reads what [`params_bytes`] wrote, checking it against a model of `n_layer` blocks whose
/// projection shapes `shape(proj)` gives (`None`: the file's own shapes, for tools that run
/// without the model).
pub fn params_from_bytes(path: &Path, b: &[u8], n_layer: usize, shape: impl Fn(Proj) -> Option<(usize, usize)>) -> Result<(LoraParams, Option<Adam>)> {
    let bad = |m: String| Error::corrupt(path, m);
    if b.len() < 12 || &b[..8] != MAGIC {
        return Err(bad("not a ruvllm learning file".into()));
    }
    let hl = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
    let h: ParamsHeader = serde_json::from_slice(b.get(12..12 + hl).ok_or_else(|| bad("truncated header".into()))?).map_err(|e| bad(e.to_string()))?;
    let mut slots = Vec::new();
    let mut off = 0;
    for s in &h.slots {
        let proj = proj_from(&s.proj).ok_or_else(|| bad(format!("unknown projection {}", s.proj)))?;
        let (o, i) = shape(proj).unwrap_or((s.d_out, s.d_in));
        if s.layer >= n_layer || (s.d_out, s.d_in) != (o, i) {
            return Err(bad(format!("slot layer {} {} does not fit this model", s.layer, s.proj)));
        }
        slots.push(Slot { layer: s.layer, proj, d_in: i, d_out: o, a: off, b: off + h.rank * i });
        off += h.rank * (i + o);
    }
    if off != h.len || h.rank == 0 || !(1..=3).contains(&h.vectors) {
        return Err(bad("header does not add up".into()));
    }
    let data = &b[12 + hl..];
    if data.len() != h.len * 4 * h.vectors {
        return Err(bad(format!("expected {} bytes of data, found {}", h.len * 4 * h.vectors, data.len())));
    }
    let vec_at =
        |k: usize| -> Vec<f32> { data[k * h.len * 4..(k + 1) * h.len * 4].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let w = vec_at(0);
    if !w.iter().all(|v| v.is_finite()) {
        return Err(bad("factors that are not finite".into()));
    }
    let adam = match (h.adam, h.vectors) {
        (Some(mut a), 3) => {
            a.m = vec_at(1);
            a.v = vec_at(2);
            Some(a)
        }
        _ => None,
    };
    Ok((LoraParams::from_parts(n_layer, h.rank, h.scale, slots, w), adam))
}

/// f32 vectors as bytes, and back (`fisher.bin`: Fisher then anchor).
pub fn f32s_bytes(vs: &[&[f32]]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"RVFISH1\n");
    out.extend_from_slice(&(vs.len() as u32).to_le_bytes());
    for v in vs {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
    }
    out
}

pub fn f32s_from_bytes(path: &Path, b: &[u8]) -> Result<Vec<Vec<f32>>> {
    let bad = || Error::corrupt(path, "not a ruvllm Fisher file, or truncated".into());
    if b.len() < 12 || &b[..8] != b"RVFISH1\n" {
        return Err(bad());
    }
    let n = u32::from_le_bytes(b[8..12].try_into().unwrap()) as usize;
    let mut at = 12;
    let mut out = Vec::new();
    for _ in 0..n {
        let len = u64::from_le_bytes(b.get(at..at + 8).ok_or_else(bad)?.try_into().unwrap()) as usize;
        at += 8;
        let bytes = b.get(at..at + len.checked_mul(4).ok_or_else(bad)?).ok_or_else(bad)?;
        out.push(bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect());
        at += len * 4;
    }
    if at != b.len() {
        return Err(bad());
    }
    Ok(out)
}

/// Reads a file if it exists.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Removes everything the learner writes in `dir` (not the directory, nor other files).
pub fn reset(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let talora = (0..crate::talora::BUCKETS.len()).flat_map(crate::talora::bucket_files).map(|n| n.to_string());
    let names = [
        "state.json",
        "micro.bin",
        "base.bin",
        "fisher.bin",
        "trajectories.jsonl",
        "general.json",
        "bank.json",
        "global.bin",
        "round-start.bin",
        crate::talora::STATE_FILE,
    ];
    for name in names.iter().map(|s| s.to_string()).chain(talora) {
        let p = dir.join(name);
        if p.exists() {
            fs::remove_file(&p).map_err(|e| Error::io(&p, e))?;
            removed.push(p);
        }
    }
    let bank = dir.join("bank");
    if bank.is_dir() {
        fs::remove_dir_all(&bank).map_err(|e| Error::io(&bank, e))?;
        removed.push(bank);
    }
    Ok(removed)
}
