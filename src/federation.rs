//! `llm.federation`: federates the BaseLoRA that SONA learns with other nodes (`ruvllm-daf` over
//! libp2p). The network runs on a tokio runtime of its own (`ruvllm-federation` threads); the
//! JS thread only validates, starts work there and awaits it. Consent is explicit: the model
//! must be loaded with `learning: { dir, federate: true }`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use napi::bindgen_prelude::{PromiseRaw, ToNapiValue, Unknown};
use napi::Env;
use napi_derive::napi;
use serde_json::json;

use ruvllm_daf::federation::Stats;
use ruvllm_daf::privacy::{DpConfig, Keys, Tenant};
use ruvllm_daf::update::{public_key, Tier};
use ruvllm_daf::weighting::RoundPolicy;
use ruvllm_daf::{FederationConfig, Node};
use ruvllm_sona::federate::FederatedLearner;

use crate::error::{guard, sync_call, CodedError, Res};
use crate::options::{self, FederationArgs, Val};

fn runtime() -> Res<&'static tokio::runtime::Runtime> {
  static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
  RT.get_or_init(|| {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("ruvllm-federation").enable_all().build().map_err(|e| e.to_string())
  })
  .as_ref()
  .map_err(|e| CodedError::internal(format!("federation runtime: {e}")))
}

/// A round moves messages of tens of MB (8 nodes' TALoRA updates: 8 × 23 MB, and gossip's
/// copies of them per peer). glibc raises its mmap threshold to the size of each large block
/// freed (up to 32 MB), after which such blocks come from the heap and its fragments stay
/// resident: 8 node processes on one machine grew by ~0.5 GB a round. A fixed 4 MB threshold
/// keeps blocks that large in their own mappings, returned when freed (the per-token 1 MB
/// logits stay on the heap). Set once, when the first node joins.
fn large_blocks_mapped() {
  #[cfg(all(target_os = "linux", target_env = "gnu"))]
  {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: mallopt only changes the allocator's tuning; any value is safe.
    ONCE.call_once(|| unsafe {
      libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    });
  }
}

/// Runs `fut` on the federation runtime (a panic there becomes `ERR_INTERNAL`); the promise
/// settles on the JS thread with `map(value)`. An `Err` in `fut` rejects without running.
fn on_network<'env, T, V, F>(env: &'env Env, fut: Res<F>, map: impl FnOnce(T) -> Res<V> + 'static) -> napi::Result<PromiseRaw<'env, V>>
where
  F: Future<Output = Res<T>> + Send + 'static,
  T: Send + 'static,
  V: ToNapiValue,
{
  let task = async move {
    let fut = fut?;
    runtime()?.spawn(fut).await.unwrap_or_else(|e| match e.try_into_panic() {
      Ok(p) => Err(CodedError::from_panic(p)),
      Err(e) => Err(CodedError::internal(format!("federation task stopped: {e}"))),
    })
  };
  env.spawn_future_with_callback(async move { Ok(task.await) }, move |env, r: Res<T>| r.and_then(|v| guard(|| map(v))).map_err(|e| e.into_napi(env)))
}

/// Blocking learner work (locks, files, adapter rebuilds) from a federation task.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Res<T> + Send + 'static) -> Res<T> {
  tokio::task::spawn_blocking(move || guard(f)).await.unwrap_or_else(|e| Err(CodedError::internal(format!("worker stopped: {e}"))))
}

fn hex(b: &[u8]) -> String {
  b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `llm.federation`: joins the model's learned adapter to a federation.
#[napi]
pub struct Federation {
  learner: Option<Arc<dyn FederatedLearner>>,
}

impl Federation {
  pub(crate) fn new(learner: Option<Arc<dyn FederatedLearner>>) -> Self {
    Federation { learner }
  }
}

/// The config a join starts with: the learner's adapter spec (consent checked there) and the
/// options.
fn config(learner: &dyn FederatedLearner, a: FederationArgs) -> Res<FederationConfig> {
  let (specs, rank) = learner.fed_specs(a.tier)?;
  let method = ruvllm_sona::federate::method(&a.method, rank)?;
  let identity = a.node_key.unwrap_or_else(ruvllm_daf::update::generate_identity);
  let mut keys = Keys::default();
  match a.tier {
    Tier::Group => keys.group = Some(a.key.ok_or_else(|| CodedError::invalid_type("tier 'group' needs key (the group's 32-byte key as 64 hex digits)"))?),
    Tier::Tenant => {
      let key = a.key.ok_or_else(|| CodedError::invalid_type("tier 'tenant' needs key (the tenant's 32-byte key as 64 hex digits)"))?;
      let mut members = a.members;
      let me = public_key(&identity);
      if !members.contains(&me) {
        return Err(CodedError::out_of_range(format!("tier 'tenant': this node ({}) is not in members", hex(&me))));
      }
      members.sort();
      keys.tenant = Some(Tenant { key, members });
    }
    Tier::Private | Tier::Public => {}
  }
  let defaults = DpConfig::default();
  let dp = DpConfig {
    epsilon: a.epsilon.unwrap_or(defaults.epsilon),
    delta: a.delta.unwrap_or(defaults.delta),
    rounds: a.rounds.unwrap_or(defaults.rounds),
    clip: a.clip.unwrap_or(defaults.clip),
  };
  let base = FederationConfig::default();
  Ok(FederationConfig {
    federate: true,
    identity,
    adapters: specs,
    keys,
    dp,
    policy: RoundPolicy { weighting: a.weighting, method, k_anonymity: a.k_anonymity.unwrap_or(RoundPolicy::default().k_anonymity) },
    expected_nodes: a.expected_nodes.unwrap_or(a.peers.len() + 1),
    round_timeout: a.round_timeout_ms.map(Duration::from_millis).unwrap_or(base.round_timeout),
    keep_rounds: a.keep_rounds.unwrap_or(base.keep_rounds),
    listen: a.listen.unwrap_or(base.listen),
    peers: a.peers,
    topic: a.topic.unwrap_or(base.topic),
    ..base
  })
}

#[napi]
impl Federation {
  /// Starts a federation node for this model's learned BaseLoRA and dials `peers`; resolves
  /// once it listens. Options: `peers` (multiaddrs, e.g. another node's `address`), `listen`
  /// (default `/ip4/127.0.0.1/tcp/0`), `tier` (`private`: nothing leaves this node; `group`:
  /// encrypted with `key`; `tenant`: encrypted with `key`, only from `members`' node ids;
  /// `public`: clipped and noised to `epsilon`/`delta` over `rounds`, released with at least
  /// `kAnonymity` nodes), `key` (64 hex digits), `nodeKey` (this node's Ed25519 secret, 64 hex
  /// digits; default a fresh one), `expectedNodes` (default peers + 1), `roundTimeoutMs`
  /// (default 10000), `keepRounds` (rounds whose updates this node holds to serve peers'
  /// catch-up, default 2), `method` (`exact`: the exact weighted mean of the nodes' BaseLoRAs, FLoRA
  /// stacking; `svd`: that mean re-factorised to the BaseLoRA's rank; `fedavg`: factor
  /// averaging, inexact), `globalRank` (most components per projection the federated adapters
  /// keep, BaseLoRA included, 1..=256, default 64; beyond it a truncated SVD, its error
  /// reported per round), `serverLr` (in (0, 10], default 1: the exact mean; else the adapters
  /// move from where the last round left them by that many times the step to the mean; every
  /// node must use the same),
  /// `weighting` (`fedavg`, `quality`,
  /// `timestep`, `hybrid`), `topic`. Rejects with `ERR_FEDERATION_CONSENT` (not loaded with
  /// `learning: { dir, federate: true }`), `ERR_INVALID_ARG`, `ERR_FEDERATION_KEY`,
  /// `ERR_FEDERATION_TRANSPORT`.
  #[napi(ts_args_type = "options: FederationOptions", ts_return_type = "Promise<FederationNode>")]
  pub fn join<'env>(&self, env: &'env Env, options: Unknown) -> napi::Result<PromiseRaw<'env, FederationNode>> {
    let learner = self.learner.clone();
    let fut = guard(|| {
      let args = options::federation_options(Some(Val::new(env, &options)))?;
      let learner =
        learner.ok_or_else(|| CodedError::new("ERR_FEDERATION_CONSENT", "federation needs learning: load the model with learning: { dir, federate: true }"))?;
      let (tier, global_rank, server_lr) = (args.tier, args.global_rank, args.server_lr);
      let cfg = config(learner.as_ref(), args)?;
      large_blocks_mapped();
      Ok(async move {
        let node = Node::join(cfg).await?;
        Ok((node, learner, tier, global_rank, server_lr))
      })
    });
    on_network(env, fut, |(node, learner, tier, global_rank, server_lr)| {
      let address = node.listen_addr().to_string();
      let node_id = hex(&node.node_id());
      Ok(FederationNode {
        inner: Arc::new(Inner {
          node: Mutex::new(Some(Arc::new(node))),
          last: Mutex::new(None),
          learner,
          tier,
          global_rank,
          server_lr,
          next_round: AtomicU64::new(1),
          address,
          node_id,
        }),
      })
    })
  }
}

struct Inner {
  node: Mutex<Option<Arc<Node>>>,
  /// The stats at `stop`.
  last: Mutex<Option<Stats>>,
  learner: Arc<dyn FederatedLearner>,
  tier: Tier,
  /// The cap on the global adapter's components per projection.
  global_rank: usize,
  server_lr: f64,
  next_round: AtomicU64,
  address: String,
  node_id: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
  m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
  fn node(&self) -> Res<Arc<Node>> {
    lock(&self.node).clone().ok_or_else(|| CodedError::new("ERR_CLOSED", "the federation node was stopped"))
  }
}

fn stats_json(s: &Stats) -> serde_json::Value {
  let per_round: Vec<_> = s
    .per_round
    .iter()
    .map(|r| json!({ "round": r.round, "contributors": r.contributors, "bytesSent": r.bytes_sent, "bytesReceived": r.bytes_received, "aggregates": r.aggregates, "withheld": r.withheld }))
    .collect();
  json!({
    "nodeId": s.node,
    "rounds": s.rounds,
    "accepted": s.accepted,
    "rejected": s.rejected,
    "rejectedTotal": s.rejected_total,
    "privateKept": s.private_kept,
    "duplicates": s.duplicates,
    "bytesSent": s.bytes_sent,
    "bytesReceived": s.bytes_received,
    "perRound": per_round,
    "epsilon": s.epsilon,
    "peers": s.peers,
  })
}

/// A running federation node (`llm.federation.join`).
#[napi]
pub struct FederationNode {
  inner: Arc<Inner>,
}

#[napi]
impl FederationNode {
  /// The address other nodes put in `peers` (`/ip4/…/tcp/…/p2p/<peer id>`).
  #[napi(getter)]
  pub fn address(&self) -> String {
    self.inner.address.clone()
  }

  /// This node's public key (64 hex digits): what a tenant's `members` lists.
  #[napi(getter)]
  pub fn node_id(&self) -> String {
    self.inner.node_id.clone()
  }

  /// Runs the next round (or `options.round`): publishes this node's BaseLoRA (nothing leaves
  /// the node on the private tier), waits for the expected nodes or the round timeout,
  /// aggregates, adds the aggregate to the global adapter (frozen, the same on every node) and
  /// splits the sum again: its strongest components become the BaseLoRA, the rest the global
  /// adapter; both are served from the next request on. Call it between learning rounds (after
  /// `consolidate()`): a learning round running meanwhile overwrites the BaseLoRA when it ends. Rejects with `ERR_CLOSED`,
  /// `ERR_FEDERATION_ROUND`, `ERR_FEDERATION_BUDGET`, `ERR_FEDERATION_SHAPE`.
  #[napi(ts_args_type = "options?: { round?: number }", ts_return_type = "Promise<FederationRound>")]
  pub fn round<'env>(&self, env: &'env Env, options: Unknown) -> napi::Result<PromiseRaw<'env, serde_json::Value>> {
    let inner = self.inner.clone();
    let fut = guard(|| {
      let bag = options::option_bag(Some(Val::new(env, &options)), "round", &["round"])?;
      let round = match options::int_in(bag, "round", 1.0, options::MAX_SAFE_INTEGER)? {
        Some(r) => {
          inner.next_round.fetch_max(r as u64 + 1, Ordering::SeqCst);
          r as u64
        }
        None => inner.next_round.fetch_add(1, Ordering::SeqCst),
      };
      let node = inner.node()?;
      Ok(async move {
        let (learner, tier) = (inner.learner.clone(), inner.tier);
        let updates = blocking(move || Ok(learner.fed_updates(tier, round)?)).await?;
        let report = node.round(round, updates).await?;
        let digest = hex(&report.output.digest());
        let aggs = report.output.aggregates;
        // The first aggregate's method and weights (a TALoRA adapter has one per bucket: all
        // are listed under `buckets`).
        let first = aggs.first().map(|a| (a.method.to_string(), a.weights.clone(), aggs.iter().map(|a| a.max_truncation_error()).fold(0.0, f64::max)));
        let buckets: Vec<serde_json::Value> = aggs.iter().filter(|a| a.bucket.is_some()).map(|a| json!({ "bucket": a.bucket, "weights": a.weights })).collect();
        let learner = inner.learner.clone();
        let (cap, lr) = (inner.global_rank, inner.server_lr);
        let applied = blocking(move || Ok(learner.fed_apply(&aggs, cap, lr)?)).await?;
        let (applied, adapter_digest, method, weights, truncation) = match (applied, first) {
          (Some((digest, cap_error)), Some((method, weights, agg_error))) => (true, digest, Some(method), weights, agg_error.max(cap_error)),
          _ => (false, inner.learner.fed_digest(), None, Vec::new(), 0.0),
        };
        let stats = node.stats();
        let bytes = stats.per_round.iter().find(|r| r.round == round).cloned().unwrap_or_default();
        Ok(json!({
          "round": round,
          "published": report.published,
          "contributors": report.contributors,
          "timedOut": report.timed_out,
          "applied": applied,
          "method": method,
          "weights": weights,
          "buckets": buckets,
          "truncationError": truncation,
          "withheld": report.output.withheld.len(),
          "digest": digest,
          "adapterDigest": adapter_digest,
          "bytesSent": bytes.bytes_sent,
          "bytesReceived": bytes.bytes_received,
        }))
      })
    });
    on_network(env, fut, Ok)
  }

  /// For benchmarks and tests of the other nodes' validation: publishes, under this node's
  /// name, a replay of its update of round `from` (re-encrypted), a tampered copy, an update for
  /// the next round signed by another key, and malformed bytes; resolves to how many (4). The
  /// other nodes reject all of them (`stats().rejected`). Group and tenant tiers only.
  #[napi(ts_args_type = "from: number", ts_return_type = "Promise<number>")]
  pub fn attack<'env>(&self, env: &'env Env, from: Unknown) -> napi::Result<PromiseRaw<'env, u32>> {
    let inner = self.inner.clone();
    let fut = guard(|| {
      let from = options::int_arg(Some(Val::new(env, &from)), "from", 1.0, options::MAX_SAFE_INTEGER)? as u64;
      let node = inner.node()?;
      let round = inner.next_round.load(Ordering::SeqCst);
      Ok(async move { Ok(node.attack(from, round).await? as u32) })
    });
    on_network(env, fut, Ok)
  }

  /// Counters: updates accepted, rejected by reason, bytes sent and received (in all and per
  /// round), rounds aggregated, ε spent by public releases, connected peers. After `stop()`,
  /// the counters at the stop.
  #[napi(catch_unwind, ts_return_type = "FederationStats")]
  pub fn stats(&self, env: &Env) -> napi::Result<serde_json::Value> {
    sync_call(env, || {
      let node = lock(&self.inner.node).clone();
      match node {
        Some(n) => Ok(stats_json(&n.stats())),
        None => lock(&self.inner.last).as_ref().map(stats_json).ok_or_else(|| CodedError::new("ERR_CLOSED", "the federation node was stopped")),
      }
    })
  }

  /// Stops the node (after rounds in flight end) and closes its connections. Idempotent.
  #[napi(ts_return_type = "Promise<void>")]
  pub fn stop<'env>(&self, env: &'env Env) -> napi::Result<PromiseRaw<'env, ()>> {
    let inner = self.inner.clone();
    let fut = Ok(async move {
      let Some(mut node) = lock(&inner.node).take() else { return Ok(()) };
      *lock(&inner.last) = Some(node.stats());
      // Rounds in flight hold the node; stopping needs it alone.
      let node = loop {
        match Arc::try_unwrap(node) {
          Ok(n) => break n,
          Err(shared) => {
            node = shared;
            tokio::time::sleep(Duration::from_millis(20)).await;
          }
        }
      };
      let fed = node.stop().await?;
      *lock(&inner.last) = Some(fed.stats());
      Ok(())
    });
    on_network(env, fut, Ok)
  }
}

/// A node identity for `nodeKey`: a fresh Ed25519 secret (or the one given) and its public
/// node id, each as 64 hex digits. Throws `ERR_INVALID_ARG` for a malformed `secret`.
#[napi(catch_unwind, ts_args_type = "secret?: string", ts_return_type = "{ secret: string, nodeId: string }")]
pub fn federation_key(env: &Env, secret: Unknown) -> napi::Result<serde_json::Value> {
  sync_call(env, || {
    let v = Val::new(env, &secret);
    let secret = if v.is_undefined()? { ruvllm_daf::update::generate_identity() } else { options::hex32(&options::string(&v, "secret")?, "secret")? };
    Ok(json!({ "secret": hex(&secret), "nodeId": hex(&public_key(&secret)) }))
  })
}
