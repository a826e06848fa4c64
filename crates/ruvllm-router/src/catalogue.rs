//! The Claude Flow agent catalogue (13 agent types with descriptions, keywords for the keyword
//! baseline, and training examples), the held-out test split and the paraphrase pairs. All three
//! are JSON files under `data/`, compiled in.
//!
//! The test split is never used to build a router; only the benchmark reads it.

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::router::AgentSpec;

const AGENTS_JSON: &str = include_str!("../data/agents.json");
const TEST_JSON: &str = include_str!("../data/test.json");
const PAIRS_JSON: &str = include_str!("../data/pairs.json");

/// One catalogue entry.
#[derive(Debug, Clone, Deserialize)]
pub struct CatalogueAgent {
    pub name: String,
    pub description: String,
    pub keywords: Vec<String>,
    pub examples: Vec<String>,
}

/// A held-out task with its label and difficulty (`easy`, `medium`, `hard`).
#[derive(Debug, Clone, Deserialize)]
pub struct TestTask {
    pub text: String,
    pub agent: String,
    pub difficulty: String,
}

/// An anchor sentence, a paraphrase of it, and an unrelated sentence.
#[derive(Debug, Clone, Deserialize)]
pub struct ParaphrasePair {
    pub text: String,
    pub paraphrase: String,
    pub unrelated: String,
}

#[derive(Deserialize)]
struct AgentsFile {
    agents: Vec<CatalogueAgent>,
}
#[derive(Deserialize)]
struct TestFile {
    tests: Vec<TestTask>,
}
#[derive(Deserialize)]
struct PairsFile {
    pairs: Vec<ParaphrasePair>,
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, s: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|e| Error::Internal(format!("built-in {what} is malformed: {e}")))
}

/// The 13 Claude Flow agents with descriptions, keywords and training examples.
pub fn claude_flow_agents() -> Result<Vec<CatalogueAgent>> {
    Ok(parse::<AgentsFile>("agent catalogue", AGENTS_JSON)?.agents)
}

/// The catalogue as router agent specs (description + examples).
pub fn default_agent_specs() -> Result<Vec<AgentSpec>> {
    Ok(claude_flow_agents()?
        .into_iter()
        .map(|a| AgentSpec { name: a.name, description: a.description, examples: a.examples })
        .collect())
}

/// The held-out test split.
pub fn test_split() -> Result<Vec<TestTask>> {
    Ok(parse::<TestFile>("test split", TEST_JSON)?.tests)
}

/// Paraphrase / unrelated triples for the embedding sanity check.
pub fn paraphrase_pairs() -> Result<Vec<ParaphrasePair>> {
    Ok(parse::<PairsFile>("paraphrase pairs", PAIRS_JSON)?.pairs)
}
