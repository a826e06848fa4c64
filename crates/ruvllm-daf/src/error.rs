//! The crate's one error type. Rejections of received updates are not errors of the caller:
//! they are [`Reject`] reasons, counted in the stats; an [`Error::Rejected`] only surfaces when
//! the caller itself hands over something that fails validation.

use crate::validate::Reject;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A private-tier update was asked to leave the node.
    #[error("adapter '{adapter}' is private: its updates never leave this node")]
    PrivateTier { adapter: String },
    /// An update failed validation.
    #[error("update rejected: {0:?}")]
    Rejected(Reject),
    /// Factor shapes that do not fit together (`a.len() != rank·d_in`, ...).
    #[error("target {target}: {msg}")]
    Shape { target: String, msg: String },
    /// Nothing to aggregate, or updates of different adapters/buckets/targets mixed.
    #[error("cannot aggregate: {0}")]
    Aggregate(String),
    /// The public tier's k-anonymity rule: fewer distinct nodes than required contributed.
    #[error("public aggregate withheld: {have} distinct nodes contributed, {need} required")]
    TooFewContributors { have: usize, need: usize },
    /// The privacy budget would be exceeded by another public release.
    #[error("privacy budget spent: releasing again would make epsilon {would_be:.4} > {budget}")]
    BudgetExhausted { would_be: f64, budget: f64 },
    /// A key or tenant setting that cannot be used (wrong length, not a member, ...).
    #[error("key: {0}")]
    Key(String),
    /// A bad configuration value.
    #[error("invalid config: {0}")]
    Config(String),
    /// A peer-to-peer transport failure (listen, dial, publish, request).
    #[error("transport: {0}")]
    Transport(String),
    /// The node's background task has stopped.
    #[error("the federation node is closed")]
    Closed,
    /// A round did not finish: it waits for something that did not come.
    #[error("round {round}: {msg}")]
    Round { round: u64, msg: String },
}

impl Error {
    /// A stable code for the JavaScript binding.
    pub fn code(&self) -> &'static str {
        match self {
            Error::PrivateTier { .. } => "ERR_FEDERATION_PRIVATE",
            Error::Rejected(_) => "ERR_FEDERATION_REJECTED",
            Error::Shape { .. } => "ERR_FEDERATION_SHAPE",
            Error::Aggregate(_) => "ERR_FEDERATION_AGGREGATE",
            Error::TooFewContributors { .. } => "ERR_FEDERATION_K_ANONYMITY",
            Error::BudgetExhausted { .. } => "ERR_FEDERATION_BUDGET",
            Error::Key(_) => "ERR_FEDERATION_KEY",
            Error::Config(_) => "ERR_INVALID_ARG",
            Error::Transport(_) => "ERR_FEDERATION_TRANSPORT",
            Error::Closed => "ERR_CLOSED",
            Error::Round { .. } => "ERR_FEDERATION_ROUND",
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
