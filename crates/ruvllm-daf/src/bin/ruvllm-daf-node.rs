//! One demo federation node as a process: federates the synthetic adapters of
//! `ruvllm_daf::demo` for a number of rounds over libp2p on loopback, then prints the digest of
//! every round's aggregate. The multi-process test starts several and compares the digests.
//!
//! ```text
//! ruvllm-daf-node --index I --nodes N --rounds R [--offline-round K] [--timeout-ms T] [--peer ADDR]...
//! ```
//!
//! Prints `LISTEN <multiaddr>` once listening, `ROUND <r> <contributors> <timed_out>` per round
//! run, `DIGEST <r> <hex>` per round after catching up, `STATS <accepted> <rejected>
//! <duplicates>`, `DONE`;
//! then keeps serving catch-up until its standard input closes. With `--offline-round K` the node
//! stops before round K, stays away for one round timeout, and comes back.

use std::io::{BufRead, Write};
use std::time::Duration;

use ruvllm_daf::node::Node;
use ruvllm_daf::{demo, Error, Result};

struct Args {
    index: usize,
    nodes: usize,
    rounds: u64,
    offline: Option<u64>,
    timeout: Duration,
    peers: Vec<String>,
}

fn parse() -> Result<Args> {
    let mut a = Args { index: 0, nodes: 2, rounds: 3, offline: None, timeout: Duration::from_secs(3), peers: Vec::new() };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| Error::Config(format!("{k} needs a value")))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| Error::Config(format!("{k} {v}: {e}")));
        match k.as_str() {
            "--index" => a.index = num(&v)? as usize,
            "--nodes" => a.nodes = num(&v)? as usize,
            "--rounds" => a.rounds = num(&v)?,
            "--offline-round" => a.offline = Some(num(&v)?),
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&v)?),
            "--peer" => a.peers.push(v),
            _ => return Err(Error::Config(format!("unknown argument {k}"))),
        }
    }
    Ok(a)
}

fn say(line: String) {
    let mut out = std::io::stdout().lock();
    // A closed stdout means the parent is gone; the node then has nobody to report to.
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn run(a: Args) -> Result<()> {
    // Every round stays held: the node re-aggregates all of them after catching up, and
    // serves them to a peer that catches up.
    let cfg = ruvllm_daf::FederationConfig { keep_rounds: a.rounds.max(1) as usize, ..demo::config(a.index, a.nodes, a.peers.clone(), a.timeout) };
    let mut node = Node::join(cfg).await?;
    say(format!("LISTEN {}", node.listen_addr()));
    node.wait_for_peers(a.nodes - 1, Duration::from_secs(60)).await?;
    for round in 1..=a.rounds {
        if a.offline == Some(round) {
            let state = node.stop().await?;
            tokio::time::sleep(a.timeout + Duration::from_millis(500)).await;
            node = Node::start(state).await?;
            node.wait_for_peers(a.peers.len().min(a.nodes - 1), Duration::from_secs(60)).await?;
            continue;
        }
        let r = node.round(round, demo::updates(a.index, round)).await?;
        say(format!("ROUND {round} {} {}", r.contributors, r.timed_out));
    }
    node.sync(a.rounds + 1).await?;
    for round in 1..=a.rounds {
        let hex: String = node.aggregate(round)?.digest().iter().map(|b| format!("{b:02x}")).collect();
        say(format!("DIGEST {round} {hex}"));
    }
    let s = node.stats();
    say(format!("STATS {} {} {}", s.accepted, s.rejected_total, s.duplicates));
    say("DONE".into());
    // Others may still catch up from this node: serve until told to stop.
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        let mut stdin = std::io::stdin().lock();
        while stdin.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    })
    .await
    .map_err(|e| Error::Transport(e.to_string()))?;
    node.stop().await?;
    Ok(())
}

fn main() {
    let result = parse().and_then(|a| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| Error::Transport(e.to_string()))?;
        rt.block_on(run(a))
    });
    if let Err(e) = result {
        eprintln!("ruvllm-daf-node: {e} ({})", e.code());
        std::process::exit(1);
    }
}
