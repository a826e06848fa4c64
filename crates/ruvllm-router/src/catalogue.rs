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

/// A held-out task with its label and difficulty (`easy`, `medium`, `hard`). A follow-up task
/// (`follows: Some(i)`) is the same kind of work for the same agent coming back later, with a
/// different subject and wording, as the `i`-th task of the split (a first-round task).
#[derive(Debug, Clone, Deserialize)]
pub struct TestTask {
    pub text: String,
    pub agent: String,
    pub difficulty: String,
    #[serde(default)]
    pub follows: Option<usize>,
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
    Ok(claude_flow_agents()?.into_iter().map(|a| AgentSpec { name: a.name, description: a.description, examples: a.examples }).collect())
}

/// The held-out test split: first-round tasks, then one follow-up per first-round task.
pub fn test_split() -> Result<Vec<TestTask>> {
    let tests = parse::<TestFile>("test split", TEST_JSON)?.tests;
    validate(&tests)?;
    Ok(tests)
}

fn validate(tests: &[TestTask]) -> Result<()> {
    for (i, t) in tests.iter().enumerate() {
        if let Some(f) = t.follows {
            if tests.get(f).is_none_or(|o| o.follows.is_some() || o.agent != t.agent) {
                return Err(Error::Internal(format!("built-in test split: task {i} follows {f}, which is not a first-round task of agent {}", t.agent)));
            }
        }
    }
    Ok(())
}

/// Paraphrase / unrelated triples for the embedding sanity check.
pub fn paraphrase_pairs() -> Result<Vec<ParaphrasePair>> {
    Ok(parse::<PairsFile>("paraphrase pairs", PAIRS_JSON)?.pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_split_has_one_follow_up_per_first_round_task() {
        let tests = test_split().expect("split");
        let first: Vec<usize> = (0..tests.len()).filter(|&i| tests[i].follows.is_none()).collect();
        let mut followed = vec![0usize; tests.len()];
        for f in tests.iter().filter_map(|t| t.follows) {
            followed[f] += 1;
        }
        assert_eq!(first.len(), 104);
        assert!(first.iter().all(|&i| followed[i] == 1), "every first-round task has exactly one follow-up");
        assert_eq!(tests.len(), 2 * first.len());
        let agents: Vec<String> = claude_flow_agents().expect("agents").into_iter().map(|a| a.name).collect();
        for t in &tests {
            assert!(agents.contains(&t.agent), "{}", t.agent);
            assert!(["easy", "medium", "hard"].contains(&t.difficulty.as_str()), "{}", t.difficulty);
        }
        let mut texts: Vec<&str> = tests.iter().map(|t| t.text.as_str()).collect();
        texts.sort_unstable();
        texts.dedup();
        assert_eq!(texts.len(), tests.len(), "no duplicate tasks");
    }

    #[test]
    fn a_follow_up_must_follow_a_first_round_task_of_its_agent() {
        let bad = r#"{"tests":[{"text":"a","agent":"coder","difficulty":"easy"},{"text":"b","agent":"tester","difficulty":"easy","follows":0}]}"#;
        let tests = parse::<TestFile>("t", bad).expect("parse").tests;
        assert!(validate(&tests).is_err());
        let bad = r#"{"tests":[{"text":"a","agent":"coder","difficulty":"easy","follows":5}]}"#;
        assert!(validate(&parse::<TestFile>("t", bad).expect("parse").tests).is_err());
    }
}
