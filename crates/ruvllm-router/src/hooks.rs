//! Claude Flow hooks: `pre-task` routes a task description and suggests a model; `post-task`
//! feeds the outcome back. The learned router persists in one file under the user's config
//! directory (`$RUVLLM_ROUTER_STATE`, else `$XDG_CONFIG_HOME/ruvllm/router-state.json`, else
//! `~/.config/ruvllm/router-state.json`).
//!
//! Concurrency: writers (post-task, and the first pre-task that creates the file) hold an
//! exclusive `flock` on `router-state.json.lock` around load → change → save, and save with temp
//! file + rename, so readers (pre-task) never see a half-written file and no update is lost when
//! several hook processes run at once. The lock is released by the OS if a process dies.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use ruvllm_embed::files::{env_path, user_dir};
use ruvllm_embed::Embedder;

use crate::error::{Error, Result};
use crate::index::IndexConfig;
use crate::router::{AgentScore, FeedbackEffect, Router};

/// Env var overriding the state file path.
pub const ENV_STATE: &str = "RUVLLM_ROUTER_STATE";

/// Where the hook state lives.
pub fn state_path() -> Result<PathBuf> {
    if let Some(p) = env_path(ENV_STATE) {
        return Ok(p);
    }
    let dir =
        user_dir("XDG_CONFIG_HOME", ".config").ok_or_else(|| Error::InvalidArg(format!("no config directory: set XDG_CONFIG_HOME, HOME or {ENV_STATE}")))?;
    Ok(dir.join("router-state.json"))
}

/// An exclusive lock on `<state>.lock`, released on drop.
pub struct StateLock {
    file: std::fs::File,
}

impl Drop for StateLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// Takes the writer lock for `state`, waiting up to `timeout`.
pub fn lock_state(state: &Path, timeout: Duration) -> Result<StateLock> {
    let lock_path = PathBuf::from(format!("{}.lock", state.display()));
    if let Some(dir) = lock_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating directory", dir, e))?;
    }
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(|e| Error::io("opening", &lock_path, e))?;
    let start = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(StateLock { file }),
            Err(std::fs::TryLockError::WouldBlock) => {
                if start.elapsed() > timeout {
                    return Err(Error::LockTimeout(lock_path));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("locking", &lock_path, e)),
        }
    }
}

const LOCK_TIMEOUT: Duration = Duration::from_secs(60);

/// A router with the default Claude Flow catalogue.
pub fn default_router(embedder: Arc<dyn Embedder>) -> Result<Router> {
    Router::new(crate::catalogue::default_agent_specs()?, embedder)
}

/// Loads the state, or builds the default router and saves it (under the lock) when there is
/// none. A state file that cannot be read is moved aside (`.corrupt-<secs>`) and replaced;
/// the returned warning says so.
pub fn load_or_create(path: &Path, embedder: Arc<dyn Embedder>, locked: bool) -> Result<(Router, Option<String>)> {
    if path.is_file() {
        match Router::load(path, embedder.clone(), IndexConfig::default()) {
            Ok(r) => return Ok((r, None)),
            Err(Error::BadState { reason, .. }) => {
                let _guard = if locked { None } else { Some(lock_state(path, LOCK_TIMEOUT)?) };
                // Another process may have replaced it meanwhile.
                if let Ok(r) = Router::load(path, embedder.clone(), IndexConfig::default()) {
                    return Ok((r, None));
                }
                let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                let aside = PathBuf::from(format!("{}.corrupt-{secs}", path.display()));
                std::fs::rename(path, &aside).map_err(|e| Error::io("moving aside", path, e))?;
                let r = default_router(embedder)?;
                r.save(path)?;
                let w = format!("router state was unreadable ({reason}); moved to {} and started fresh", aside.display());
                return Ok((r, Some(w)));
            }
            Err(e) => return Err(e),
        }
    }
    let _guard = if locked { None } else { Some(lock_state(path, LOCK_TIMEOUT)?) };
    if path.is_file() {
        if let Ok(r) = Router::load(path, embedder.clone(), IndexConfig::default()) {
            return Ok((r, None));
        }
    }
    let r = default_router(embedder)?;
    r.save(path)?;
    Ok((r, None))
}

/// Which Claude model tier suits the agent: planning/design/security work gets the strongest
/// model, routine docs the fastest; an uncertain routing (confidence < 0.5) moves one tier up.
pub fn model_suggestion(agent: &str, confidence: f32) -> &'static str {
    const TIERS: [&str; 3] = ["haiku", "sonnet", "opus"];
    let base = match agent {
        "architect" | "security-architect" | "planner" | "researcher" => 2,
        "documenter" | "api-docs" => 0,
        _ => 1,
    };
    let tier = if confidence < 0.5 { (base + 1).min(2) } else { base };
    TIERS[tier]
}

/// What `hooks pre-task` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreTask {
    pub agent: String,
    pub confidence: f32,
    pub alternatives: Vec<AgentScore>,
    /// Suggested Claude model tier: `haiku`, `sonnet` or `opus`.
    pub model: String,
    pub latency_ms: f64,
    pub patterns: usize,
    pub state_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Routes `description` with the persisted router.
pub fn pre_task(description: &str, embedder: Arc<dyn Embedder>, path: &Path) -> Result<PreTask> {
    let (mut router, warning) = load_or_create(path, embedder, false)?;
    let t = Instant::now();
    let route = router.route(description)?;
    let latency_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(PreTask {
        model: model_suggestion(&route.agent, route.confidence).to_string(),
        agent: route.agent,
        confidence: route.confidence,
        alternatives: route.alternatives,
        latency_ms,
        patterns: router.patterns().len(),
        state_path: path.display().to_string(),
        warning,
    })
}

/// What `hooks post-task` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PostTask {
    pub recorded: bool,
    pub effect: String,
    pub patterns: usize,
    pub state_path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Records an outcome in the persisted router (lock → load → learn → atomic save → unlock).
pub fn post_task(task: &str, agent: &str, success: bool, embedder: Arc<dyn Embedder>, path: &Path) -> Result<PostTask> {
    if task.trim().is_empty() {
        return Err(Error::InvalidArg("--task must not be empty".into()));
    }
    // Embed before taking the lock, so the lock is held for milliseconds only.
    let v = embedder.embed(&[task])?.pop().ok_or_else(|| ruvllm_embed::Error::Embed("embedder returned nothing".into()))?;
    let _guard = lock_state(path, LOCK_TIMEOUT)?;
    let (mut router, warning) = load_or_create(path, embedder, true)?;
    let a = router.agent_index(agent)?;
    let effect = router.feedback_vector(task, &v, a, success)?;
    router.save(path)?;
    Ok(PostTask {
        recorded: true,
        effect: match effect {
            FeedbackEffect::Added { .. } => "added".into(),
            FeedbackEffect::Reinforced { .. } => "reinforced".into(),
            FeedbackEffect::Penalised { patterns } => format!("penalised {} pattern(s)", patterns.len()),
        },
        patterns: router.patterns().len(),
        state_path: path.display().to_string(),
        warning,
    })
}
