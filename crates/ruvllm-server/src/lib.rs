//! An OpenAI- and Ollama-compatible HTTP server over a loaded [`Engine`]:
//! - OpenAI: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/embeddings`,
//!   `GET /v1/models`, streaming as Server-Sent Events ([`openai`]);
//! - Ollama: `POST /api/generate`, `POST /api/chat` (NDJSON streaming, on by default),
//!   `POST /api/embed`, `POST /api/embeddings`, `GET /api/tags`, `POST /api/show`,
//!   `GET /api/version`, `GET /` ([`ollama`]);
//! - llama-server's `POST /tokenize`, `POST /detokenize`, and `GET /health`, `GET /metrics`
//!   (Prometheus text format).
//!
//! It runs on its own tokio runtime thread(s), so whoever starts it (the Node
//! binding, a Rust program) only holds a [`Server`] handle; the model runs on the engine's
//! thread as for any other caller.
//!
//! Limits: request bodies over `max_body_bytes` get 413; at most `parallel` generation or
//! embedding requests are submitted to the engine at once, up to `max_queue` more wait, and
//! beyond that a request gets 429. A client that disconnects cancels its request (the engine
//! stops within a token). [`Server::close`] stops accepting, cancels what is running and waits.
//! CORS is off unless [`ServerOptions::cors`] names the origins allowed.

use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use ruvllm_core::engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

mod error;
mod handlers;
mod metrics;
pub mod ollama;
pub mod openai;
mod state;
mod stream;

pub use error::ApiError;
use state::State;

/// A client gets this long to send a request's headers, and again its body; a slow or stalled
/// client then loses its connection (headers) or gets 408 (body) instead of holding a slot.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most open connections; one more is closed as soon as it is accepted, so idle or slow
/// clients cannot exhaust the process's file descriptors.
const MAX_CONNECTIONS: usize = 1024;
/// How long `close` waits for open connections after cancelling their requests.
const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Interface to bind (default `127.0.0.1`: loopback only).
    pub host: String,
    /// TCP port; 0 picks a free one (see [`Server::local_addr`]).
    pub port: u16,
    /// When set, every request but `/health`, `/` and `/api/version` must carry
    /// `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Most generation/embedding requests handed to the engine at once (the engine decodes up
    /// to its `LoadOptions::parallel` of them together; give it the same number).
    pub parallel: usize,
    /// Most requests waiting for one of the `parallel` slots; more get 429.
    pub max_queue: usize,
    /// Largest request body accepted; larger gets 413.
    pub max_body_bytes: usize,
    /// The model's name in responses and `/v1/models`.
    pub model_id: String,
    /// The chat template for `/v1/chat/completions` when the model ships none (or to override
    /// its own); `None`: the model's.
    pub chat_template: Option<String>,
    /// Stop strings added to every chat request (the turn markers of `chat_template`).
    pub chat_stops: Vec<String>,
    /// Threads of the server's tokio runtime (HTTP parsing and JSON only; the model runs on the
    /// engine's thread).
    pub http_threads: usize,
    /// CORS: `*` or comma-separated origins whose pages may call the server (answers get
    /// `Access-Control-Allow-*` headers, preflights are answered); `None`: off.
    pub cors: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            parallel: ruvllm_core::engine::DEFAULT_PARALLEL,
            max_queue: 64,
            max_body_bytes: 4 << 20,
            model_id: "ruvllm".into(),
            chat_template: None,
            chat_stops: Vec::new(),
            http_threads: 2,
            cors: None,
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    InvalidArg(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot start the server: {0}")]
    Start(std::io::Error),
}

impl ServerError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ServerError::InvalidArg(_) => "ERR_INVALID_ARG",
            ServerError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse => "ERR_ADDR_IN_USE",
            ServerError::Bind { .. } | ServerError::Start(_) => "ERR_IO",
        }
    }
}

/// A running server. Dropping it closes it.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds and starts serving `engine`. Returns once the socket listens.
    pub fn start(engine: Arc<Engine>, opts: ServerOptions) -> Result<Server, ServerError> {
        if opts.parallel == 0 {
            return Err(ServerError::InvalidArg("parallel must be at least 1".into()));
        }
        if opts.max_body_bytes == 0 {
            return Err(ServerError::InvalidArg("maxBodyBytes must be at least 1".into()));
        }
        let cors = opts.cors.as_deref().map(handlers::Cors::parse).transpose().map_err(ServerError::InvalidArg)?;
        let shown = format!("{}:{}", opts.host, opts.port);
        let addr = (opts.host.as_str(), opts.port)
            .to_socket_addrs()
            .map_err(|e| ServerError::Bind { addr: shown.clone(), source: e })?
            .next()
            .ok_or_else(|| ServerError::InvalidArg(format!("host '{}' resolves to no address", opts.host)))?;
        let std_listener = StdListener::bind(addr).map_err(|e| ServerError::Bind { addr: shown.clone(), source: e })?;
        std_listener.set_nonblocking(true).map_err(ServerError::Start)?;
        let addr = std_listener.local_addr().map_err(ServerError::Start)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.http_threads.max(1))
            .thread_name("ruvllm-http")
            .enable_all()
            .build()
            .map_err(ServerError::Start)?;
        let listener = {
            let _enter = runtime.enter();
            TcpListener::from_std(std_listener).map_err(ServerError::Start)?
        };
        let state = Arc::new(State::new(engine, &opts, cors));
        let (stop, stopped) = oneshot::channel();
        let serve_state = state.clone();
        let thread = std::thread::Builder::new()
            .name("ruvllm-server".into())
            .spawn(move || {
                runtime.block_on(serve(listener, serve_state, stopped));
                // Whatever a connection still runs past the grace period is dropped here.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(ServerError::Start)?;
        Ok(Server { addr, state, stop: Some(stop), thread: Some(thread) })
    }

    /// The address it listens on (with the port picked when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, cancels running and queued requests (each client gets an error), and
    /// waits for the connections to end. Blocks; safe to call more than once.
    pub fn close(&mut self) {
        self.state.begin_close();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.close();
    }
}

async fn serve(listener: TcpListener, state: Arc<State>, mut stopped: oneshot::Receiver<()>) {
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(slot) = connections.clone().try_acquire_owned() else { continue };
                    let _ = stream.set_nodelay(true);
                    let st = state.clone();
                    let conn = builder.serve_connection(TokioIo::new(stream), service_fn(move |req| handlers::handle(st.clone(), req)));
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _ = conn.await;
                        drop(slot);
                    });
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
            _ = &mut stopped => break,
        }
    }
    drop(listener);
    state.begin_close();
    let _ = tokio::time::timeout(CLOSE_GRACE, graceful.shutdown()).await;
}
