//! The keyword baseline: each agent has a keyword list (from the catalogue); a task goes to the
//! agent with the most keyword hits (whole-word, case-insensitive; multi-word keywords match as
//! phrases). Ties go to the agent listed first; no hit at all goes to `fallback` (`coder`).
//! This is what keyword routers such as the one in `@ruvector/ruvllm` 2.6 do.

use crate::catalogue::CatalogueAgent;

pub struct KeywordRouter {
    agents: Vec<(String, Vec<Vec<String>>)>,
    fallback: String,
}

fn words(s: &str) -> Vec<String> {
    s.to_lowercase().split(|c: char| !(c.is_alphanumeric() || c == '/' || c == '-')).filter(|w| !w.is_empty()).map(String::from).collect()
}

impl KeywordRouter {
    pub fn new(agents: &[CatalogueAgent], fallback: &str) -> Self {
        KeywordRouter {
            agents: agents.iter().map(|a| (a.name.clone(), a.keywords.iter().map(|k| words(k)).collect())).collect(),
            fallback: fallback.to_string(),
        }
    }

    /// The chosen agent and its hit count.
    pub fn route(&self, task: &str) -> (String, usize) {
        let w = words(task);
        let mut best: Option<(&str, usize)> = None;
        for (name, kws) in &self.agents {
            let hits = kws.iter().filter(|k| !k.is_empty() && w.windows(k.len()).any(|win| win == k.as_slice())).count();
            if hits > 0 && best.is_none_or(|(_, b)| hits > b) {
                best = Some((name, hits));
            }
        }
        match best {
            Some((n, h)) => (n.to_string(), h),
            None => (self.fallback.clone(), 0),
        }
    }
}
