//! A federation node on rust-libp2p: TCP with the Noise XX handshake (peers authenticated by
//! their Ed25519 identity, the same key that signs the node's updates) and yamux
//! multiplexing; gossipsub disseminates the envelopes of a round, request-response serves
//! catch-up of rounds a node missed.
//!
//! Gossipsub runs with application validation: a message is forwarded only after this node's
//! [`Federation::receive`] accepted it, and a rejected one counts against the peer that sent it
//! (gossipsub's peer scoring), so tampered updates do not spread. Message ids are the SHA-256
//! of the envelope, so the same envelope is delivered once however many paths it takes.
//!
//! The swarm runs on its own tokio task; the [`Node`] handle talks to it through a channel and
//! shares the [`Federation`] state behind a mutex that is never held across an await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, MessageAuthenticity, MessageId, ValidationMode};
use libp2p::request_response::{self, cbor, OutboundRequestId, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{noise, tcp, yamux, Multiaddr, PeerId, StreamProtocol, Swarm};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::federation::{bundle, Federation, FederationConfig, Stats};
use crate::update::Update;
use crate::validate::{Reject, Source};
use crate::weighting::RoundOutput;
use crate::{Error, Result};

const CATCH_UP: StreamProtocol = StreamProtocol::new("/ruvllm-daf/catch-up/1");

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CatchUpRequest {
    round: u64,
    /// Senders the requester already holds for the round: not sent again.
    have: Vec<serde_bytes::ByteBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CatchUpResponse {
    round: u64,
    envelopes: Vec<serde_bytes::ByteBuf>,
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    gossip: gossipsub::Behaviour,
    catch_up: cbor::Behaviour<CatchUpRequest, CatchUpResponse>,
}

/// What one round did at this node.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    pub round: u64,
    /// Envelopes this node published.
    pub published: usize,
    /// Distinct nodes aggregated (this one included).
    pub contributors: usize,
    /// The round aggregated on its timeout, without every expected node.
    pub timed_out: bool,
    pub output: RoundOutput,
}

/// What a catch-up brought.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CatchUpReport {
    pub round: u64,
    pub received: usize,
    pub accepted: usize,
}

enum Command {
    Publish { messages: Vec<Vec<u8>>, reply: oneshot::Sender<std::result::Result<(), gossipsub::PublishError>> },
    Dial { addr: Multiaddr, reply: oneshot::Sender<Result<()>> },
    CatchUp { round: u64, reply: oneshot::Sender<Result<CatchUpReport>> },
    Stop,
}

/// Peers as the swarm task last saw them.
#[derive(Default)]
struct PeerCounts {
    connected: AtomicUsize,
    /// Connected peers subscribed to the federation topic.
    subscribed: AtomicUsize,
}

/// A running federation node.
pub struct Node {
    fed: Arc<Mutex<Federation>>,
    cmd: mpsc::Sender<Command>,
    peers: Arc<PeerCounts>,
    addr: Multiaddr,
    peer_id: PeerId,
    task: tokio::task::JoinHandle<()>,
}

fn transport<E: std::fmt::Display>(e: E) -> Error {
    Error::Transport(e.to_string())
}

fn lock(fed: &Mutex<Federation>) -> MutexGuard<'_, Federation> {
    // A panic while holding the lock leaves the state as the last completed call left it;
    // every method keeps it consistent between statements, so it stays usable.
    fed.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    /// Checks `cfg`, starts a node listening on `cfg.listen` and dials `cfg.peers`. Must be
    /// called within a tokio runtime.
    pub async fn join(cfg: FederationConfig) -> Result<Node> {
        Node::start(Federation::new(cfg)?).await
    }

    /// Starts a node on an existing state (a node coming back after [`Node::stop`]).
    pub async fn start(fed: Federation) -> Result<Node> {
        let cfg = fed.config().clone();
        let mut secret = cfg.identity;
        let keypair = libp2p::identity::Keypair::ed25519_from_bytes(&mut secret).map_err(|e| Error::Key(e.to_string()))?;
        let gossip_cfg = gossipsub::ConfigBuilder::default()
            .heartbeat_interval(Duration::from_millis(250))
            .validation_mode(ValidationMode::Strict)
            .validate_messages()
            .message_id_fn(|m: &gossipsub::Message| MessageId::from(Sha256::digest(&m.data).to_vec()))
            .max_transmit_size(cfg.limits.max_message_bytes)
            .mesh_n_low(2)
            .mesh_n(4)
            .mesh_n_high(8)
            .mesh_outbound_min(1)
            .build()
            .map_err(transport)?;
        let gossip = gossipsub::Behaviour::new(MessageAuthenticity::Signed(keypair.clone()), gossip_cfg).map_err(transport)?;
        let codec = cbor::codec::Codec::default()
            .set_request_size_maximum(1 << 20)
            .set_response_size_maximum((cfg.limits.max_message_bytes as u64).saturating_mul(cfg.expected_nodes.max(1) as u64));
        let catch_up = request_response::Behaviour::with_codec(
            codec,
            [(CATCH_UP, ProtocolSupport::Full)],
            request_response::Config::default().with_request_timeout(Duration::from_secs(30)),
        );
        let behaviour = Behaviour { gossip, catch_up };
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_tcp(tcp::Config::default().nodelay(true), noise::Config::new, yamux::Config::default)
            .map_err(transport)?
            .with_behaviour(|_| behaviour)
            .map_err(transport)?
            .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(600)))
            .build();
        let topic = IdentTopic::new(&cfg.topic);
        swarm.behaviour_mut().gossip.subscribe(&topic).map_err(transport)?;
        let listen: Multiaddr = cfg.listen.parse().map_err(|e| Error::Config(format!("listen address '{}': {e}", cfg.listen)))?;
        swarm.listen_on(listen).map_err(transport)?;
        let addr = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let SwarmEvent::NewListenAddr { address, .. } = swarm.select_next_some().await {
                    return address;
                }
            }
        })
        .await
        .map_err(|_| Error::Transport("no listen address within 10 s".into()))?;
        for p in &cfg.peers {
            let a: Multiaddr = p.parse().map_err(|e| Error::Config(format!("peer address '{p}': {e}")))?;
            swarm.dial(a).map_err(transport)?;
        }
        let peer_id = *swarm.local_peer_id();
        let fed = Arc::new(Mutex::new(fed));
        let peers = Arc::new(PeerCounts::default());
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(
            Driver {
                swarm,
                topic,
                fed: fed.clone(),
                peers: peers.clone(),
                pending: HashMap::new(),
                calls: HashMap::new(),
                next_call: 0,
                dials: HashMap::new(),
            }
            .run(rx),
        );
        Ok(Node { fed, cmd: tx, peers, addr: addr.with_p2p(peer_id).unwrap_or_else(|a| a), peer_id, task })
    }

    /// The address other nodes dial (`/ip4/…/tcp/…/p2p/<peer id>`).
    pub fn listen_addr(&self) -> &Multiaddr {
        &self.addr
    }

    pub fn peer_id(&self) -> PeerId {
        self.peer_id
    }

    /// This node's public key (the libp2p identity's and the update signer's).
    pub fn node_id(&self) -> [u8; 32] {
        lock(&self.fed).node_id()
    }

    async fn send<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.cmd.send(make(tx)).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)
    }

    /// Dials a peer (a multiaddr, with or without `/p2p/…`); returns once connected.
    pub async fn dial(&self, addr: &str) -> Result<()> {
        let addr: Multiaddr = addr.parse().map_err(|e| Error::Config(format!("peer address '{addr}': {e}")))?;
        self.send(|reply| Command::Dial { addr, reply }).await?
    }

    /// Connected peers, and those of them subscribed to the federation topic.
    pub fn peer_counts(&self) -> (usize, usize) {
        (self.peers.connected.load(Ordering::Relaxed), self.peers.subscribed.load(Ordering::Relaxed))
    }

    /// Waits until at least `n` peers are subscribed to the topic.
    pub async fn wait_for_peers(&self, n: usize, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        while self.peer_counts().1 < n {
            if Instant::now() > end {
                return Err(Error::Transport(format!("{} of {n} peers after {timeout:?}", self.peer_counts().1)));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Runs `round`: signs and publishes this node's `local` updates, collects the others'
    /// until every expected node has contributed or the round's timeout passes, and
    /// aggregates. Updates that arrive later still join the round: [`Node::aggregate`] and
    /// [`Node::sync`] recompute it.
    pub async fn round(&self, round: u64, local: Vec<Update>) -> Result<RoundReport> {
        let (envelopes, expected, timeout) = {
            let mut f = lock(&self.fed);
            let env = f.prepare(round, local)?;
            (env, f.config().expected_nodes, f.config().round_timeout)
        };
        let end = Instant::now() + timeout;
        let published = envelopes.len();
        if published > 0 && expected > 1 {
            loop {
                match self.send(|reply| Command::Publish { messages: vec![bundle(&envelopes)], reply }).await? {
                    Ok(()) => break,
                    Err(gossipsub::PublishError::NoPeersSubscribedToTopic | gossipsub::PublishError::AllQueuesFull(_)) if Instant::now() < end => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(Error::Round { round, msg: format!("publish: {e}") }),
                }
            }
        }
        // Connected peers are no measure of who will contribute (a node may reach others only
        // through a relay of the mesh), so a round waits for the expected count or its timeout.
        // A node with nothing to publish (only private adapters) is not among the contributors.
        let need = if published == 0 { expected.saturating_sub(1).max(1) } else { expected };
        let mut timed_out = false;
        loop {
            if lock(&self.fed).contributors(round) >= need {
                break;
            }
            if Instant::now() > end {
                timed_out = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut f = lock(&self.fed);
        let output = f.aggregate(round)?;
        Ok(RoundReport { round, published, contributors: f.contributors(round), timed_out, output })
    }

    /// Publishes gossip `messages` exactly as given (normally each a [`bundle`] of envelopes),
    /// bypassing signing and sealing: for tests and benchmarks of what the other nodes'
    /// validation does with bad bytes.
    pub async fn publish_raw(&self, messages: Vec<Vec<u8>>) -> Result<()> {
        self.send(|reply| Command::Publish { messages, reply }).await?.map_err(transport)
    }

    /// Publishes [`Federation::attack_envelopes`] (each as its own gossip message); returns
    /// how many. For benchmarks and tests of the other nodes' validation.
    pub async fn attack(&self, from: u64, round: u64) -> Result<usize> {
        let envelopes = lock(&self.fed).attack_envelopes(from, round)?;
        let n = envelopes.len();
        let messages: Vec<Vec<u8>> = envelopes.iter().enumerate().map(|(i, e)| if i + 1 == n { e.clone() } else { bundle(std::slice::from_ref(e)) }).collect();
        self.publish_raw(messages).await?;
        Ok(n)
    }

    /// Asks connected peers, one after another until one answers, for `round`'s updates this
    /// node lacks; validates them as catch-up of that round.
    pub async fn catch_up(&self, round: u64) -> Result<CatchUpReport> {
        self.send(|reply| Command::CatchUp { round, reply }).await?
    }

    /// Catches up every round before `upto` (after this node's first) that lacks updates of
    /// some expected node, and re-aggregates them. Returns those rounds.
    pub async fn sync(&self, upto: u64) -> Result<Vec<u64>> {
        let missed = lock(&self.fed).incomplete_rounds(upto);
        for &r in &missed {
            self.catch_up(r).await?;
            lock(&self.fed).aggregate(r)?;
        }
        Ok(missed)
    }

    /// Re-aggregates `round` from what this node holds now.
    pub fn aggregate(&self, round: u64) -> Result<RoundOutput> {
        lock(&self.fed).aggregate(round)
    }

    pub fn stats(&self) -> Stats {
        let mut s = lock(&self.fed).stats();
        s.peers = self.peer_counts().0;
        s
    }

    /// Stops the node (closing its connections) and hands back its state, so it can come back
    /// with [`Node::start`].
    pub async fn stop(self) -> Result<Federation> {
        let _ = self.cmd.send(Command::Stop).await;
        let _ = self.task.await;
        Arc::try_unwrap(self.fed).map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner())).map_err(|_| Error::Closed)
    }
}

struct CatchUpCall {
    round: u64,
    have: Vec<[u8; 32]>,
    /// Peers not asked yet.
    left: Vec<PeerId>,
    asked: usize,
    reply: oneshot::Sender<Result<CatchUpReport>>,
}

struct Driver {
    swarm: Swarm<Behaviour>,
    topic: IdentTopic,
    fed: Arc<Mutex<Federation>>,
    peers: Arc<PeerCounts>,
    pending: HashMap<OutboundRequestId, u64>,
    calls: HashMap<u64, CatchUpCall>,
    next_call: u64,
    dials: HashMap<PeerId, Vec<oneshot::Sender<Result<()>>>>,
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Command::Stop) | None => break,
                    Some(c) => self.command(c),
                },
                ev = self.swarm.select_next_some() => self.event(ev),
            }
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Publish { messages, reply } => {
                let mut r = Ok(());
                for e in messages {
                    match self.swarm.behaviour_mut().gossip.publish(self.topic.clone(), e) {
                        // Republishing after a retry: the peers have it already.
                        Ok(_) | Err(gossipsub::PublishError::Duplicate) => {}
                        Err(err) => {
                            r = Err(err);
                            break;
                        }
                    }
                }
                let _ = reply.send(r);
            }
            Command::Dial { addr, reply } => {
                let peer = addr.iter().find_map(|p| if let libp2p::multiaddr::Protocol::P2p(id) = p { Some(id) } else { None });
                match (self.swarm.dial(addr), peer) {
                    (Err(e), _) => {
                        let _ = reply.send(Err(transport(e)));
                    }
                    (Ok(()), Some(p)) if !self.swarm.is_connected(&p) => self.dials.entry(p).or_default().push(reply),
                    (Ok(()), _) => {
                        let _ = reply.send(Ok(()));
                    }
                }
            }
            Command::CatchUp { round, reply } => {
                let have = lock(&self.fed).holders(round);
                let left: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
                let id = self.next_call;
                self.next_call += 1;
                self.calls.insert(id, CatchUpCall { round, have, left, asked: 0, reply });
                self.ask_next(id, CatchUpReport { round, ..Default::default() });
            }
            Command::Stop => {}
        }
    }

    /// Sends call `id`'s request to its next peer, or finishes it with `so_far`.
    fn ask_next(&mut self, id: u64, so_far: CatchUpReport) {
        let Some(call) = self.calls.get_mut(&id) else { return };
        if so_far.received > 0 || call.left.is_empty() {
            if let Some(call) = self.calls.remove(&id) {
                let r = if call.asked == 0 { Err(Error::Round { round: call.round, msg: "catch-up: no peer connected".into() }) } else { Ok(so_far) };
                let _ = call.reply.send(r);
            }
            return;
        }
        call.asked += 1;
        let peer = call.left.remove(0);
        let req = CatchUpRequest { round: call.round, have: call.have.iter().map(|h| serde_bytes::ByteBuf::from(h.to_vec())).collect() };
        let rid = self.swarm.behaviour_mut().catch_up.send_request(&peer, req);
        self.pending.insert(rid, id);
    }

    fn refresh_peers(&mut self) {
        let topic = self.topic.hash();
        let g = &self.swarm.behaviour().gossip;
        let subscribed = g.all_peers().filter(|(_, t)| t.contains(&&topic)).count();
        self.peers.connected.store(self.swarm.connected_peers().count(), Ordering::Relaxed);
        self.peers.subscribed.store(subscribed, Ordering::Relaxed);
    }

    fn event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        match ev {
            SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                for r in self.dials.remove(&peer_id).unwrap_or_default() {
                    let _ = r.send(Ok(()));
                }
                self.refresh_peers();
            }
            SwarmEvent::OutgoingConnectionError { peer_id: Some(p), error, .. } => {
                for r in self.dials.remove(&p).unwrap_or_default() {
                    let _ = r.send(Err(transport(&error)));
                }
            }
            SwarmEvent::ConnectionClosed { .. } => self.refresh_peers(),
            SwarmEvent::Behaviour(BehaviourEvent::Gossip(e)) => match e {
                gossipsub::Event::Message { propagation_source, message_id, message } => {
                    let results = lock(&self.fed).receive_bundle(&message.data, Source::Live);
                    // Forwarded only when every envelope passed; a bundle of replays (a copy
                    // that came another way) is dropped without blame; anything else is
                    // rejected, which lowers the sender's gossipsub score.
                    let acceptance = if results.iter().all(|r| r.is_ok()) {
                        MessageAcceptance::Accept
                    } else if results.iter().all(|r| matches!(r, Ok(()) | Err(Reject::Replayed))) {
                        MessageAcceptance::Ignore
                    } else {
                        MessageAcceptance::Reject
                    };
                    self.swarm.behaviour_mut().gossip.report_message_validation_result(&message_id, &propagation_source, acceptance);
                }
                gossipsub::Event::Subscribed { .. } | gossipsub::Event::Unsubscribed { .. } => self.refresh_peers(),
                _ => {}
            },
            SwarmEvent::Behaviour(BehaviourEvent::CatchUp(e)) => match e {
                request_response::Event::Message { message: request_response::Message::Request { request, channel, .. }, .. } => {
                    let have: Vec<[u8; 32]> = request.have.iter().filter_map(|h| <[u8; 32]>::try_from(h.as_slice()).ok()).collect();
                    let envelopes = lock(&self.fed).serve(request.round, &have).into_iter().map(serde_bytes::ByteBuf::from).collect();
                    // The requester may have gone; nothing to do about it here.
                    let _ = self.swarm.behaviour_mut().catch_up.send_response(channel, CatchUpResponse { round: request.round, envelopes });
                }
                request_response::Event::Message { message: request_response::Message::Response { request_id, response }, .. } => {
                    let Some(id) = self.pending.remove(&request_id) else { return };
                    let Some(round) = self.calls.get(&id).map(|c| c.round) else { return };
                    let mut rep = CatchUpReport { round, ..Default::default() };
                    if response.round == round {
                        let mut f = lock(&self.fed);
                        for e in &response.envelopes {
                            rep.received += 1;
                            if f.receive(e, Source::CatchUp { round }).is_ok() {
                                rep.accepted += 1;
                            }
                        }
                    }
                    // An empty answer may mean that peer missed the round too: ask the next.
                    if rep.received == 0 {
                        self.ask_next(id, rep);
                    } else if let Some(call) = self.calls.remove(&id) {
                        let _ = call.reply.send(Ok(rep));
                    }
                }
                request_response::Event::OutboundFailure { request_id, .. } => {
                    if let Some(id) = self.pending.remove(&request_id) {
                        let round = self.calls.get(&id).map_or(0, |c| c.round);
                        self.ask_next(id, CatchUpReport { round, ..Default::default() });
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
}
