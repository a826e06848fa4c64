//! Federation across node processes on loopback: each node is a `ruvllm-daf-node` process; the
//! last one is offline for a round and catches up; every process must end with the same
//! aggregate digest for every round.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const N: usize = 4;
const ROUNDS: u64 = 3;
const OFFLINE: u64 = 2;

struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// The next line, waiting at most until `end`.
    fn line(&self, end: Instant) -> String {
        self.lines.recv_timeout(end.saturating_duration_since(Instant::now())).expect("a line from the node before the deadline")
    }
}

fn spawn(i: usize, peers: &[String]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ruvllm-daf-node"));
    cmd.args(["--index", &i.to_string(), "--nodes", &N.to_string(), "--rounds", &ROUNDS.to_string(), "--timeout-ms", "5000"]);
    if i == N - 1 {
        cmd.args(["--offline-round", &OFFLINE.to_string()]);
    }
    for p in peers {
        cmd.args(["--peer", p]);
    }
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("starts the node binary");
    let out = child.stdout.take().expect("piped stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Proc { child, lines }
}

#[test]
fn node_processes_agree_after_one_was_offline() {
    let end = Instant::now() + Duration::from_secs(120);
    let mut procs: Vec<Proc> = Vec::new();
    let mut addrs: Vec<String> = Vec::new();
    for i in 0..N {
        let p = spawn(i, &addrs);
        let l = p.line(end);
        addrs.push(l.strip_prefix("LISTEN ").unwrap_or_else(|| panic!("node {i} said {l}")).to_string());
        procs.push(p);
    }
    let mut digests: Vec<BTreeMap<u64, String>> = Vec::new();
    let mut rounds: Vec<Vec<(u64, usize, bool)>> = Vec::new();
    for (i, p) in procs.iter().enumerate() {
        let (mut d, mut r) = (BTreeMap::new(), Vec::new());
        loop {
            let l = p.line(end);
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["ROUND", k, c, t] => r.push((k.parse().expect("round"), c.parse().expect("count"), *t == "true")),
                ["DIGEST", k, h] => {
                    d.insert(k.parse::<u64>().expect("round"), h.to_string());
                }
                ["STATS", _, rejected, _] => assert_eq!(*rejected, "0", "node {i} rejected honest updates"),
                ["DONE"] => break,
                _ => panic!("node {i}: unexpected line {l}"),
            }
        }
        digests.push(d);
        rounds.push(r);
    }
    for mut p in procs {
        drop(p.child.stdin.take());
        let status = p.child.wait().expect("exits");
        assert!(status.success(), "{status}");
    }
    for (i, r) in rounds.iter().enumerate() {
        if i == N - 1 {
            assert!(r.iter().all(|&(k, _, _)| k != OFFLINE), "the offline node ran round {OFFLINE}");
        } else {
            let (_, c, timed_out) = r[(OFFLINE - 1) as usize];
            assert_eq!((c, timed_out), (N - 1, true), "node {i} in the round the last node missed");
            assert_eq!(r[0], (1, N, false), "node {i}");
        }
    }
    assert_eq!(digests[0].len(), ROUNDS as usize);
    for (i, d) in digests.iter().enumerate() {
        assert_eq!(d, &digests[0], "node {i} ends with other aggregates than node 0");
    }
}
