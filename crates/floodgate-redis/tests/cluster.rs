//! The limiter on a Redis Cluster: three primaries on loopback, started by the test
//! (`redis-server --cluster-enabled yes` × 3, `redis-cli --cluster create`) and
//! stopped on drop. Single-key calls go to the node owning the key's slot and decide
//! exactly; multi-limit calls run on hash-tagged keys in one slot, whatever the key;
//! a slot moved to another node (`MOVED`) or in mid-migration (`ASK`) keeps its
//! state and its decisions; a node that lost the scripts (`NOSCRIPT`) gets them
//! again.
//!
//! Each test starts a cluster of its own (a cluster takes a few seconds to form).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, runtime, tools_on_path, whole_micros, Model, ALGORITHMS};
use floodgate::{Decision, Policy};
use floodgate_redis::{Algorithm, OnFailure, RedisLimiter};
use redis::cluster_async::ClusterConnection;

/// 2026-11-30 in microseconds since the epoch, plus an odd offset.
const TODAY_MICROS: u64 = 1_796_083_200_000_000 + 123_457;

struct Node {
    port: u16,
    child: Child,
}

impl Node {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// One command on a fresh blocking connection to this node alone (no redirects).
    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut conn = self.connection()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn)
    }

    fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.query(args)
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    fn id(&self) -> String {
        self.cmd(&["CLUSTER", "MYID"])
    }
}

struct Cluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl Cluster {
    /// Three primaries holding every slot, or `None` (after a loud message) where
    /// `redis-server` or `redis-cli` is missing.
    fn start() -> Option<Cluster> {
        if !tools_on_path(&["redis-server", "redis-cli"]) {
            return None;
        }
        let dir = std::env::temp_dir().join(format!(
            "floodgate-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the nodes' config files");
        let mut cluster = Cluster { nodes: vec![], dir };
        for _ in 0..3 {
            let node = cluster.spawn_node();
            cluster.nodes.push(node);
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_until_ok();
        Some(cluster)
    }

    /// A cluster-enabled node on a free port (its bus on another free port).
    fn spawn_node(&self) -> Node {
        // A port can be taken between finding it free and the server binding it.
        for _ in 0..5 {
            let (port, bus) = (free_port(), free_port());
            let conf = self.dir.join(format!("nodes-{port}.conf"));
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string()])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--cluster-enabled", "yes"])
                .arg("--cluster-config-file")
                .arg(&conf)
                .arg("--dir")
                .arg(&self.dir)
                .args(["--save", ""])
                .args(["--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            // Another server may answer on the port (ours, unable to bind it, exits):
            // only our own process counts.
            let pid = format!("process_id:{}", child.id());
            let mut node = Node { port, child };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = node.child.try_wait() {
                    break; // exited: a port was taken
                }
                let info = node.query::<String>(&["INFO", "server"]);
                if info.is_ok_and(|info| info.lines().any(|l| l.trim() == pid)) {
                    return node;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        panic!("a cluster node did not start on a free loopback port");
    }

    fn wait_until_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ok = self.nodes.iter().all(|n| {
                n.query::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The index of the node that owns `key`'s slot, by the first node's map.
    fn owner(&self, key: &str) -> usize {
        let slot: i64 = self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
        self.slot_owner(slot)
    }

    fn slot_owner(&self, slot: i64) -> usize {
        let map: String = self.nodes[0].cmd(&["CLUSTER", "NODES"]);
        for line in map.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(addr) = fields.get(1) else { continue };
            let owns = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(str::parse::<i64>);
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false, // "[slot->-id]" migration markers
                }
            });
            if owns {
                let port = addr
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse::<u16>().ok());
                if let Some(i) = self.nodes.iter().position(|n| Some(n.port) == port) {
                    return i;
                }
            }
        }
        panic!("no node owns slot {slot}:\n{map}");
    }

    /// Starts moving `slot` from node `from` to node `to` (IMPORTING / MIGRATING) and
    /// moves its keys (MIGRATE); the slot stays in mid-migration: the old owner
    /// answers `ASK` for the keys it no longer has. Returns the keys moved.
    fn migrate_keys(&self, slot: i64, from: usize, to: usize) -> Vec<String> {
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (src_id, dst_id) = (src.id(), dst.id());
        let slot = slot.to_string();
        let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]);
        let _: () = src.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]);
        let in_slot: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
        let port = dst.port.to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend(in_slot.iter().map(String::as_str));
        let _: String = src.cmd(&migrate);
        in_slot
    }

    /// One key per node, of the form `format(i)`: `{node index: key}`.
    fn key_per_node(&self, redis_key: impl Fn(&str) -> String) -> BTreeMap<usize, String> {
        let mut keys = BTreeMap::new();
        for i in 0.. {
            let key = format!("k{i}");
            keys.entry(self.owner(&redis_key(&key))).or_insert(key);
            if keys.len() == self.nodes.len() {
                return keys;
            }
        }
        unreachable!()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn build(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    builder: floodgate_redis::RedisLimiterBuilder,
) -> RedisLimiter<ClusterConnection> {
    // One seed: the connection learns the other nodes from it.
    let seed = cluster.nodes[0].url();
    rt.block_on(async move {
        let conn = floodgate_redis::connect_cluster(&[&seed])
            .await
            .expect("connect to the cluster");
        builder
            .timeout(Duration::from_secs(5))
            .on_failure(OnFailure::Error)
            .build(conn)
            .expect("valid limiter")
    })
}

/// Steps (µs) and costs of a short trace that admits, denies, waits and peeks.
const TRACE: [(u64, u32, bool); 9] = [
    (0, 1, false),
    (0, 2, false),
    (0, 1, false),
    (0, 1, true),
    (150_000, 1, false),
    (400_000, 2, false),
    (0, 5, false),
    (700_000, 1, true),
    (1_000_000, 3, false),
];

/// Runs [`TRACE`] from `origin` through the replay script on `key` and through the
/// exact model, and demands equal decisions.
fn replay_matches(
    rt: &tokio::runtime::Runtime,
    limiter: &RedisLimiter<ClusterConnection>,
    model: &mut Model,
    key: &str,
    origin: u64,
    trace: &[(u64, u32, bool)],
) {
    let mut now = origin;
    for (i, &(step, cost, peek)) in trace.iter().enumerate() {
        now += step;
        let got = rt
            .block_on(async {
                if peek {
                    limiter.peek_n_at_micros(key, cost, now).await
                } else {
                    limiter.check_n_at_micros(key, cost, now).await
                }
            })
            .unwrap_or_else(|e| panic!("{key} op {i}: {e}"));
        let want = whole_micros(model.decide(now * 1_000, cost, peek));
        assert_eq!(
            got, want,
            "{key} op {i} (cost {cost}, peek {peek}) at {now} µs"
        );
    }
}

fn decided(v: Result<floodgate_redis::Verdict, floodgate_redis::RedisLimitError>) -> Decision {
    match v {
        Ok(floodgate_redis::Verdict::Decided(d)) => d,
        other => panic!("not decided by Redis: {other:?}"),
    }
}

#[test]
fn a_three_node_cluster_routes_redirects_and_reloads_scripts() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let (limit, period_us) = (4, 1_000_000);
    let policy = Policy::new(limit, Duration::from_micros(period_us)).expect("policy");

    // Single-key calls, routed by slot: a key on each node, every algorithm, exact.
    for algorithm in ALGORITHMS {
        let builder = common::builder(algorithm, policy).prefix(format!("route:{algorithm:?}:"));
        let limiter = build(&rt, &cluster, builder);
        let keys = cluster.key_per_node(|k| limiter.redis_keys(k)[0].clone());
        for (&node, key) in &keys {
            let mut model = Model::new(algorithm, limit, period_us * 1_000, limit);
            replay_matches(&rt, &limiter, &mut model, key, TODAY_MICROS, &TRACE);
            let stored = &limiter.redis_keys(key)[0];
            let there: i64 = cluster.nodes[node].cmd(&["EXISTS", stored]);
            assert_eq!(there, 1, "{stored} is not on the node owning its slot");
        }
    }

    // Several limits on hash-tagged keys, one slot per key, on each node: 3 a minute
    // (GCRA) and 2 a minute (log), all or nothing, on the server's clock.
    let minute = Duration::from_secs(60);
    let builder = common::builder(Algorithm::Gcra, Policy::new(3, minute).expect("policy"))
        .and(
            Algorithm::SlidingLog,
            Policy::new(2, minute).expect("policy"),
        )
        .prefix("multi:");
    let limiter = build(&rt, &cluster, builder);
    let keys = cluster.key_per_node(|k| limiter.redis_keys(k)[0].clone());
    for (&node, key) in &keys {
        let stored = limiter.redis_keys(key);
        let slots: Vec<i64> = stored
            .iter()
            .map(|k| cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", k]))
            .collect();
        assert_eq!(slots[0], slots[1], "{stored:?} do not share a slot");
        let remaining: Vec<(bool, u64)> = (0..3)
            .map(|_| {
                let d = decided(rt.block_on(limiter.check_n(key.as_str(), 1)));
                (d.is_allowed(), d.remaining())
            })
            .collect();
        assert_eq!(remaining, [(true, 1), (true, 0), (false, 0)], "{key}");
        for k in &stored {
            let there: i64 = cluster.nodes[node].cmd(&["EXISTS", k]);
            assert_eq!(there, 1, "{k} is not on node {node}");
        }
    }

    // MOVED: a slot holding a key in mid-trace moves to another node by hand
    // (IMPORTING / MIGRATING, MIGRATE, SETSLOT NODE everywhere); the limiter follows
    // the redirect and the state moved with the key.
    let algorithm = Algorithm::SlidingLog;
    let builder = common::builder(algorithm, policy).prefix("moved:");
    let limiter = build(&rt, &cluster, builder);
    let key = "k-moved";
    let stored = limiter.redis_keys(key)[0].clone();
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &stored]);
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    let mut model = Model::new(algorithm, limit, period_us * 1_000, limit);
    let (before, after) = TRACE.split_at(5);
    replay_matches(&rt, &limiter, &mut model, key, TODAY_MICROS, before);
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let in_slot = cluster.migrate_keys(slot, from, to);
    assert!(in_slot.contains(&stored), "{stored} not in slot {slot}");
    let (slot_s, dst_id) = (slot.to_string(), dst.id());
    for node in [dst, src].into_iter().chain(&cluster.nodes) {
        let _: () = node.cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &dst_id]);
    }
    assert_eq!(cluster.slot_owner(slot), to);
    let moved = src.query::<i64>(&["EXISTS", &stored]);
    assert!(
        moved
            .as_ref()
            .is_err_and(|e| e.kind() == redis::ErrorKind::Moved),
        "the old owner still answers for {stored}: {moved:?}"
    );
    // The limiter's slot map still names the old owner: the next call is redirected.
    let mut now = TODAY_MICROS + before.iter().map(|op| op.0).sum::<u64>();
    for (i, &(step, cost, peek)) in after.iter().enumerate() {
        now += step;
        let got = rt.block_on(async {
            if peek {
                limiter.peek_n_at_micros(key, cost, now).await
            } else {
                limiter.check_n_at_micros(key, cost, now).await
            }
        });
        let got = got.unwrap_or_else(|e| panic!("after the move, op {i}: {e}"));
        assert_eq!(
            got,
            whole_micros(model.decide(now * 1_000, cost, peek)),
            "after the move, op {i}"
        );
    }
    let there: i64 = dst.cmd(&["EXISTS", &stored]);
    assert_eq!(there, 1, "{stored} is not on its new owner");

    // NOSCRIPT: every node forgets every script; a fresh key on another node than the
    // last call's gets the script loaded again and decides as fresh.
    let builder = common::builder(Algorithm::Gcra, Policy::new(3, minute).expect("policy"))
        .prefix("noscript:");
    let limiter = build(&rt, &cluster, builder);
    let keys = cluster.key_per_node(|k| limiter.redis_keys(k)[0].clone());
    let (first, second) = (&keys[&0], &keys[&1]);
    let d = decided(rt.block_on(limiter.check_n(first.as_str(), 1)));
    assert_eq!((d.is_allowed(), d.remaining()), (true, 2));
    let sha = limiter.script_sha1().to_owned();
    for node in &cluster.nodes {
        let _: () = node.cmd(&["SCRIPT", "FLUSH"]);
        let exists: Vec<i64> = node.cmd(&["SCRIPT", "EXISTS", &sha]);
        assert_eq!(exists, [0], "port {}", node.port);
    }
    let d = decided(rt.block_on(limiter.check_n(second.as_str(), 1)));
    assert_eq!(
        (d.is_allowed(), d.remaining()),
        (true, 2),
        "a fresh key after NOSCRIPT"
    );
    let exists: Vec<i64> = cluster.nodes[1].cmd(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(exists, [1], "the script was not loaded again where it ran");
    let d = decided(rt.block_on(limiter.check_n(first.as_str(), 1)));
    assert_eq!(
        (d.is_allowed(), d.remaining()),
        (true, 1),
        "the first key kept its state"
    );
}

/// A multi-limit call touches one slot whatever the key: Redis Cluster hashes the
/// text between the first `{` and the next `}`, and an empty tag (`{}`: the key is
/// empty or starts with `}`) hashes the whole key instead, which would spread one
/// call's keys over several slots (`CROSSSLOT`). Distinct keys stay distinct.
#[test]
fn every_key_of_a_multi_limit_call_shares_one_slot() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let minute = Duration::from_secs(60);
    let builder = common::builder(Algorithm::Gcra, Policy::new(3, minute).expect("policy"))
        .and(
            Algorithm::FixedWindow,
            Policy::new(2, minute).expect("policy"),
        )
        .and(
            Algorithm::SlidingLog,
            Policy::new(5, minute).expect("policy"),
        )
        .prefix("tags:");
    let limiter = build(&rt, &cluster, builder);
    let keys = [
        "", "}", "}x", "}:0", "\\", "\\}x", "\\\\", "{", "{}", "a}b", "x{y}z", " ",
    ];
    let mut stored = std::collections::BTreeSet::new();
    for key in keys {
        let redis_keys = limiter.redis_keys(key);
        let slots: Vec<i64> = redis_keys
            .iter()
            .map(|k| cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", k]))
            .collect();
        assert!(
            slots.iter().all(|&s| s == slots[0]),
            "key {key:?}: {redis_keys:?} span the slots {slots:?}"
        );
        for k in &redis_keys {
            assert!(stored.insert(k.clone()), "{k} stores two keys' limits");
        }
        let d = rt
            .block_on(limiter.check_n(key, 1))
            .unwrap_or_else(|e| panic!("key {key:?}: {e}"));
        assert!(
            matches!(d, floodgate_redis::Verdict::Decided(d) if d.is_allowed() && d.remaining() == 1),
            "key {key:?}: {d:?}"
        );
    }
}

/// A slot in mid-migration: its keys already moved, the old owner answers `ASK`,
/// and the limiter decides on the new owner (`ASKING`) with the state that moved —
/// a single key, and a multi-limit call's hash-tagged keys (two equal windows:
/// one model stands for both).
#[test]
fn a_slot_in_mid_migration_is_followed_with_asking() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let (limit, period_us) = (4, 1_000_000);
    let policy = Policy::new(limit, Duration::from_micros(period_us)).expect("policy");
    let algorithm = Algorithm::FixedWindow;
    let single = common::builder(algorithm, policy).prefix("ask:");
    let multi = single.clone().and(algorithm, policy).prefix("ask-multi:");
    let (before, after) = TRACE.split_at(5);
    for builder in [single, multi] {
        let limiter = build(&rt, &cluster, builder);
        let key = "k-ask";
        let stored = limiter.redis_keys(key);
        let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &stored[0]]);
        let from = cluster.slot_owner(slot);
        let to = (from + 1) % cluster.nodes.len();
        let mut model = Model::new(algorithm, limit, period_us * 1_000, limit);
        replay_matches(&rt, &limiter, &mut model, key, TODAY_MICROS, before);
        let moved = cluster.migrate_keys(slot, from, to);
        for k in &stored {
            assert!(moved.contains(k), "{k} not moved");
            let ask = cluster.nodes[from].query::<i64>(&["EXISTS", k]);
            assert!(
                ask.as_ref()
                    .is_err_and(|e| e.kind() == redis::ErrorKind::Ask),
                "the old owner does not redirect {k}: {ask:?}"
            );
        }
        let start = TODAY_MICROS + before.iter().map(|op| op.0).sum::<u64>();
        replay_matches(&rt, &limiter, &mut model, key, start, after);
    }
}
