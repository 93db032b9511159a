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

use std::cell::Cell;
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

    /// Flags `slot` as moving from this node to `dst`: IMPORTING there, MIGRATING
    /// here (the slot in mid-migration until `SETSLOT NODE` or `STABLE`).
    fn start_moving(&self, slot: &str, dst: &Node) {
        let _: () = dst.cmd(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &self.id()]);
        let _: () = self.cmd(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &dst.id()]);
    }
}

/// The arguments of a `MIGRATE` of `keys` to the node on loopback port `port`.
fn migrate_args<'a>(port: &'a str, keys: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut args = vec!["MIGRATE", "127.0.0.1", port, "", "0", "5000", "KEYS"];
    args.extend(keys);
    args
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

    /// Ends a move of `slot` from node `src` to node `dst`: `SETSLOT NODE` on the new
    /// owner, the old one and every node, as `redis-cli --cluster reshard` does.
    fn finish_move(&self, slot: &str, src: &Node, dst: &Node) {
        let dst_id = dst.id();
        for node in [dst, src].into_iter().chain(&self.nodes) {
            let _: () = node.cmd(&["CLUSTER", "SETSLOT", slot, "NODE", &dst_id]);
        }
    }

    /// Starts moving `slot` from node `from` to node `to` (IMPORTING / MIGRATING) and
    /// moves its keys (MIGRATE); the slot stays in mid-migration: the old owner
    /// answers `ASK` for the keys it no longer has. Returns the keys moved.
    fn migrate_keys(&self, slot: i64, from: usize, to: usize) -> Vec<String> {
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let slot = slot.to_string();
        src.start_moving(&slot, dst);
        let in_slot: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
        let port = dst.port.to_string();
        let _: String = src.cmd(&migrate_args(&port, in_slot.iter().map(String::as_str)));
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
    cluster.finish_move(&slot.to_string(), src, dst);
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

// ---------------------------------------------------------------------------
// Session 54: slots moving under traffic.
// ---------------------------------------------------------------------------

/// One command and its reply on a fresh connection to `node`, flagged `ASKING`
/// first: what the node holds in a slot it is importing.
fn asking<T: redis::FromRedisValue>(node: &Node, args: &[&str]) -> T {
    let mut conn = node.connection().expect("a connection to the node");
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").ignore().cmd(args[0]);
    for a in &args[1..] {
        pipe.arg(*a);
    }
    let (reply,): (T,) = pipe
        .query(&mut conn)
        .unwrap_or_else(|e| panic!("ASKING {args:?} on port {}: {e}", node.port));
    reply
}

/// How many error replies of each kind (`ASK`, `MOVED`, `TRYAGAIN`, …) every node
/// has sent, summed (`INFO errorstats`).
fn error_replies(cluster: &Cluster) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for node in &cluster.nodes {
        let info: String = node.cmd(&["INFO", "errorstats"]);
        for line in info.lines() {
            let Some((name, rest)) = line.trim().split_once(':') else {
                continue;
            };
            let Some(kind) = name.strip_prefix("errorstat_") else {
                continue;
            };
            let count = rest
                .split(',')
                .find_map(|f| f.strip_prefix("count="))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0);
            *sum.entry(kind.to_owned()).or_insert(0) += count;
        }
    }
    sum
}

impl Cluster {
    /// Moves `slot` from its owner `from` to node `to` the way `redis-cli --cluster
    /// reshard` does, while clients keep calling: IMPORTING / MIGRATING, then its keys
    /// one at a time (`MIGRATE`, `pause` before each: the slot stays in mid-migration
    /// meanwhile, its keys split between the nodes), then `SETSLOT NODE` on the new
    /// owner, the old one and the rest. `migrating` is true from the first SETSLOT to
    /// the last. Returns how many keys moved.
    fn move_slot_slowly(
        &self,
        slot: i64,
        from: usize,
        to: usize,
        pause: Duration,
        migrating: &std::sync::atomic::AtomicBool,
    ) -> usize {
        use std::sync::atomic::Ordering;
        let (src, dst) = (&self.nodes[from], &self.nodes[to]);
        let (slot_s, port) = (slot.to_string(), dst.port.to_string());
        src.start_moving(&slot_s, dst);
        migrating.store(true, Ordering::SeqCst);
        let mut moved = 0;
        // Bounded: the keys of a slot are few, and a migrating node creates none
        // (a missing key is asked of the importing node).
        for _ in 0..1000 {
            let keys: Vec<String> = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "1"]);
            let Some(key) = keys.first() else { break };
            std::thread::sleep(pause);
            let _: String = src.cmd(&migrate_args(&port, [key.as_str()]));
            moved += 1;
        }
        let left: i64 = src.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot_s]);
        assert_eq!(left, 0, "slot {slot} still has keys on port {}", src.port);
        std::thread::sleep(pause);
        self.finish_move(&slot_s, src, dst);
        migrating.store(false, Ordering::SeqCst);
        moved
    }
}

/// What one client saw on one key while its slot moved.
#[derive(Debug, Default)]
struct Tally {
    /// Calls Redis decided (charges and the refunds' replies aside).
    decided: u64,
    /// Of those, decided while a slot was in mid-migration.
    mid_migration: u64,
    /// Units admitted.
    admitted: u64,
    /// Admissions decided while the key's slot was in mid-migration.
    admitted_mid_migration: u64,
    /// Refunds that answered `false` (a record forgotten: a conservative loss).
    gave_nothing: u64,
    /// Units of the refunds that answered `true`.
    given_back: u64,
    /// Calls that Redis refused unrun through the client's last send (`MOVED`, `ASK`,
    /// `TRYAGAIN`, `CLUSTERDOWN`): nothing charged, nothing given back.
    refused: u64,
    /// Units of charges and refunds that timed out (they may have run).
    unsure_charged: u64,
    unsure_given: u64,
    /// Anything else: the test fails on it.
    unclear: Vec<String>,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.decided += other.decided;
        self.mid_migration += other.mid_migration;
        self.admitted += other.admitted;
        self.admitted_mid_migration += other.admitted_mid_migration;
        self.gave_nothing += other.gave_nothing;
        self.given_back += other.given_back;
        self.refused += other.refused;
        self.unsure_charged += other.unsure_charged;
        self.unsure_given += other.unsure_given;
        self.unclear.extend(other.unclear);
    }

    /// Files a failed call: refused unrun, timed out (`unsure` gets its units), or
    /// unclear.
    fn failed(&mut self, e: &floodgate_redis::RedisLimitError, units: u64, refund: bool) {
        use floodgate_redis::RedisLimitError;
        use redis::ErrorKind;
        match e {
            RedisLimitError::Redis(r)
                if matches!(
                    r.kind(),
                    ErrorKind::Moved
                        | ErrorKind::Ask
                        | ErrorKind::TryAgain
                        | ErrorKind::ClusterDown
                ) =>
            {
                self.refused += 1;
            }
            RedisLimitError::Timeout { .. } if refund => self.unsure_given += units,
            RedisLimitError::Timeout { .. } => self.unsure_charged += units,
            other => self.unclear.push(format!("refund {refund}: {other:?}")),
        }
    }
}

/// What the clients of a key share: the replay clock (one microsecond a call, all
/// keys), whether to stop, and whether the key's slot is moving.
#[derive(Clone)]
struct Traffic {
    clock: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    migrating: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Traffic {
    fn now(&self) -> u64 {
        TODAY_MICROS + self.clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }
}

/// The most calls one client makes (it stops earlier, when the slots stop moving).
const MAX_CALLS: u64 = 20_000;

/// One client: charges of 1 or 2 on `key` through `charging`, one call a
/// millisecond, until told to stop. It keeps its receipts; denied, it refunds one
/// through `refunding` (another replica) — its oldest, every fourth time its
/// latest — so the key keeps admitting at its limit.
async fn hammer(
    charging: std::sync::Arc<RedisLimiter<ClusterConnection>>,
    refunding: std::sync::Arc<RedisLimiter<ClusterConnection>>,
    key: String,
    traffic: Traffic,
    seed: u64,
) -> Tally {
    use std::sync::atomic::Ordering;
    let mut tally = Tally::default();
    let mut receipts = std::collections::VecDeque::new();
    for i in 0..MAX_CALLS {
        if traffic.stop.load(Ordering::SeqCst) {
            break;
        }
        let cost = 1 + (i + seed) % 2;
        let during = traffic.migrating.load(Ordering::SeqCst);
        let charged = charging
            .charge_n_at_micros(&key, cost as u32, traffic.now())
            .await;
        let during = during || traffic.migrating.load(Ordering::SeqCst);
        match charged {
            Ok((d, receipt)) => {
                tally.decided += 1;
                tally.mid_migration += u64::from(during);
                if d.is_allowed() {
                    tally.admitted += cost;
                    tally.admitted_mid_migration += u64::from(during);
                    match receipt {
                        Some(receipt) => receipts.push_back((receipt, cost)),
                        None => tally
                            .unclear
                            .push(format!("{key}: an admission without a receipt")),
                    }
                } else {
                    let refund = if i % 4 == 0 {
                        receipts.pop_back()
                    } else {
                        receipts.pop_front()
                    };
                    if let Some((receipt, units)) = refund {
                        match refunding.refund_at_micros(&receipt, traffic.now()).await {
                            Ok(true) => tally.given_back += units,
                            Ok(false) => tally.gave_nothing += 1,
                            Err(e) => tally.failed(&e, units, true),
                        }
                    }
                }
            }
            Err(e) => tally.failed(&e, cost, false),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tally
}

/// Slots moving under traffic (session 54): two replicas (limiters on their own
/// Cluster connections), two clients each, charge and refund a key of every
/// algorithm and a multi-limit call's hash-tagged keys on the replay clock, while
/// every one of those keys' slots moves around the three nodes, key by key, six
/// times. Every call decides or is refused unrun (`MOVED`, `ASK` or `TRYAGAIN`
/// through the client's last send: a clear, retryable-or-not error, nothing
/// charged); nothing is charged twice or lost: at the end each key, on its final
/// owner alone, holds exactly the units the clients were admitted less those given
/// back (GCRA, whose refund may give back part of a charge: between the two), so
/// no more than its limit was ever admitted net of refunds.
#[test]
fn slots_moving_under_traffic_keep_every_key_s_count() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let hour = Duration::from_secs(3600);
    let single_limit = 40;
    let (multi_fw, multi_sw) = (30, 40);

    // (limit held by the tightest limit, exact count or GCRA's bounds, the two replicas)
    let mut keys = vec![];
    for algorithm in ALGORITHMS {
        let builder = common::builder(algorithm, Policy::new(single_limit, hour).expect("policy"))
            .refunds(true)
            .prefix(format!("hot:{algorithm:?}:"));
        let replicas = [
            Arc::new(build(&rt, &cluster, builder.clone())),
            Arc::new(build(&rt, &cluster, builder)),
        ];
        keys.push((
            format!("{algorithm:?}"),
            single_limit,
            algorithm != Algorithm::Gcra,
            replicas,
        ));
    }
    let multi = common::builder(
        Algorithm::FixedWindow,
        Policy::new(multi_fw, hour).expect("policy"),
    )
    .and(
        Algorithm::SlidingWindow,
        Policy::new(multi_sw, hour).expect("policy"),
    )
    .refunds(true)
    .prefix("hot-multi:");
    let replicas = [
        Arc::new(build(&rt, &cluster, multi.clone())),
        Arc::new(build(&rt, &cluster, multi)),
    ];
    keys.push(("multi".to_owned(), multi_fw, true, replicas));
    let key = "k";

    // Each slot's flag: true while it moves.
    let mut slots: BTreeMap<i64, Arc<AtomicBool>> = BTreeMap::new();
    let clock = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = vec![];
    for (name, _, _, [a, b]) in &keys {
        let mut flag = None;
        for stored in a.redis_keys(key) {
            let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &stored]);
            flag = Some(slots.entry(slot).or_default().clone());
        }
        // (A multi-limit call's two windows, charged and refunded together, remember
        // and forget the same receipts: a refund gives back on both or neither.)
        let traffic = Traffic {
            clock: clock.clone(),
            stop: stop.clone(),
            migrating: flag.expect("a key"),
        };
        let mut each = vec![];
        for (seed, (charging, refunding)) in
            [(a, b), (a, b), (b, a), (b, a)].into_iter().enumerate()
        {
            each.push(rt.spawn(hammer(
                charging.clone(),
                refunding.clone(),
                key.to_owned(),
                traffic.clone(),
                seed as u64,
            )));
        }
        clients.push((name.clone(), each));
    }

    // Every slot around the ring twice, one slot at a time, each key after a pause.
    let before = error_replies(&cluster);
    let mut owners: BTreeMap<i64, usize> =
        slots.keys().map(|&s| (s, cluster.slot_owner(s))).collect();
    let mut keys_moved = 0;
    for _round in 0..6 {
        for (&slot, owner) in &mut owners {
            let to = (*owner + 1) % cluster.nodes.len();
            let pause = Duration::from_millis(15);
            keys_moved += cluster.move_slot_slowly(slot, *owner, to, pause, &slots[&slot]);
            *owner = to;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let replies = error_replies(&cluster);
    let redirects = |kind: &str| replies.get(kind).unwrap_or(&0) - before.get(kind).unwrap_or(&0);

    let now = TODAY_MICROS + clock.load(Ordering::SeqCst) + 1_000;
    let mut report = vec![];
    for ((name, limit, exact, [a, b]), (_, each)) in keys.iter().zip(clients) {
        let mut tally = Tally::default();
        for client in each {
            let done = rt
                .block_on(async { tokio::time::timeout(Duration::from_secs(60), client).await })
                .unwrap_or_else(|_| panic!("{name}: a client still runs a minute after the stop"));
            tally.add(done.expect("a client panicked"));
        }
        assert!(
            tally.unclear.is_empty(),
            "{name}: unclear outcomes {:?}",
            tally.unclear
        );
        // One key's call never meets TRYAGAIN, and follows MOVED and ASK: it keeps
        // deciding while its slot moves. A multi-limit call may meet TRYAGAIN for as
        // long as its keys are split between the nodes (the client waits 10 ms
        // after each of its first 4 sends), a clear error after which nothing was
        // charged.
        assert!(
            name == "multi" || tally.refused == 0,
            "{name}: a one-key call refused while its slot moved: {tally:?}"
        );
        assert!(
            tally.mid_migration > 0 && tally.admitted_mid_migration > 0,
            "{name}: no call decided while its slot moved: {tally:?}"
        );

        // A fresh look through either replica, at a later reading: what the key holds.
        let remaining: Vec<u64> = [a, b]
            .iter()
            .map(|l| {
                let d = rt
                    .block_on(l.check_n_at_micros(key, 0, now))
                    .unwrap_or_else(|e| panic!("{name}: the final look: {e}"));
                d.remaining()
            })
            .collect();
        assert_eq!(remaining[0], remaining[1], "{name}: the replicas disagree");
        let held = limit - remaining[0];
        let net = tally.admitted - tally.given_back;
        assert!(
            tally.admitted <= limit + tally.given_back + tally.unsure_given,
            "{name}: admitted past the limit: {tally:?}"
        );
        let (low, high) = if *exact {
            (net - tally.unsure_given, net + tally.unsure_charged)
        } else {
            (
                net - tally.unsure_given,
                tally.admitted + tally.unsure_charged,
            )
        };
        assert!(
            (low..=high).contains(&held),
            "{name}: holds {held} of {limit}, the clients saw {tally:?}"
        );

        // Its state is on the slot's final owner alone.
        for stored in a.redis_keys(key) {
            let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &stored]);
            let owner = owners[&slot];
            assert_eq!(cluster.slot_owner(slot), owner, "{stored}: the map");
            let there: i64 = cluster.nodes[owner].cmd(&["EXISTS", &stored]);
            assert_eq!(there, 1, "{stored} is not on its final owner");
            for (i, node) in cluster.nodes.iter().enumerate() {
                let n: i64 = node.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
                assert!(
                    i == owner || n == 0,
                    "{stored}: slot {slot} has keys on node {i} too"
                );
            }
        }
        report.push(format!("{name}: holds {held}/{limit}, {tally:?}"));
    }
    eprintln!(
        "{keys_moved} keys moved; redirects ASK {} MOVED {} TRYAGAIN {}\n{}",
        redirects("ASK"),
        redirects("MOVED"),
        redirects("TRYAGAIN"),
        report.join("\n")
    );
    assert!(
        redirects("MOVED") > 0 && redirects("ASK") > 0,
        "{replies:?}"
    );
}

/// Whether a call failed with Redis's reply of `kind`.
fn refused_with<T: std::fmt::Debug>(
    got: &Result<T, floodgate_redis::RedisLimitError>,
    kinds: &[redis::ErrorKind],
) -> bool {
    matches!(got, Err(floodgate_redis::RedisLimitError::Redis(e)) if kinds.contains(&e.kind()))
}

/// A multi-limit call whose keys a migration has split between two nodes (session
/// 54): Redis runs no script on a slot whose keys it holds only some of
/// (`TRYAGAIN`), so the call — a charge, a peek, a refund — fails whole, a clear
/// and retryable error after the client's sends, and writes nothing on either node.
/// Once its last key has moved it decides on the importing node (`ASK`, and the
/// scripts loaded again there after a `NOSCRIPT`) with the state that moved, and
/// after the move as before. A multi-limit call on keys that
/// exist on neither node (fresh, or expired) is refused the same way until the
/// slot's move ends: the importing node runs a several-key command only on keys it
/// holds.
#[test]
fn a_multi_limit_call_split_by_a_migration_is_refused_whole() {
    use redis::ErrorKind;

    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let hour = Duration::from_secs(3600);
    let builder = common::builder(
        Algorithm::FixedWindow,
        Policy::new(3, hour).expect("policy"),
    )
    .and(Algorithm::SlidingLog, Policy::new(4, hour).expect("policy"))
    .refunds(true)
    .prefix("split:");
    let limiter = build(&rt, &cluster, builder.clone());
    // Another prefix, the same hash tag: keys of the same slot that nobody wrote.
    let fresh = build(&rt, &cluster, builder.prefix("split-fresh:"));
    let key = "k";
    let (stored, unwritten) = (limiter.redis_keys(key), fresh.redis_keys(key));
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &stored[0]]);
    for k in stored.iter().chain(&unwritten) {
        assert_eq!(
            cluster.nodes[0].cmd::<i64>(&["CLUSTER", "KEYSLOT", k]),
            slot,
            "{k}"
        );
    }
    let from = cluster.slot_owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
    let t0 = TODAY_MICROS;
    let charge = |l: &RedisLimiter<ClusterConnection>, now: u64| {
        rt.block_on(l.charge_n_at_micros(key, 1, now))
    };
    let remaining = |got: Result<(Decision, Option<floodgate_redis::RedisReceipt>), _>| {
        let (d, receipt) = got.unwrap_or_else(|e| panic!("not decided: {e}"));
        (d.is_allowed(), d.remaining(), receipt)
    };

    let (allowed, left, first) = remaining(charge(&limiter, t0));
    assert_eq!((allowed, left), (true, 2));
    let first = first.expect("a receipt");
    let (allowed, left, _) = remaining(charge(&limiter, t0 + 1));
    assert_eq!((allowed, left), (true, 1));
    let window_before: String = src.cmd(&["GET", &stored[0]]);
    let log_before: Vec<String> = src.cmd(&["ZRANGE", &stored[1], "0", "-1", "WITHSCORES"]);

    // Mid-migration, the window's key moved, the log's not yet.
    let slot_s = slot.to_string();
    src.start_moving(&slot_s, dst);
    let port = dst.port.to_string();
    let migrate = |k: &str| {
        let _: String = src.cmd(&migrate_args(&port, [k]));
    };
    migrate(&stored[0]);
    let tryagain_before = error_replies(&cluster)
        .get("TRYAGAIN")
        .copied()
        .unwrap_or(0);
    let split = charge(&limiter, t0 + 2);
    assert!(
        refused_with(&split, &[ErrorKind::TryAgain]),
        "a split charge: {split:?}"
    );
    assert!(split.is_err_and(|e| e.is_retryable()));
    let peek = rt.block_on(limiter.peek_n_at_micros(key, 1, t0 + 2));
    assert!(
        refused_with(&peek, &[ErrorKind::TryAgain]),
        "a split peek: {peek:?}"
    );
    let refund = rt.block_on(limiter.refund_at_micros(&first, t0 + 2));
    assert!(
        refused_with(&refund, &[ErrorKind::TryAgain]),
        "a split refund: {refund:?}"
    );
    // Asked of the importing node, which holds none of them: refused too.
    // (Its last send, to the old owner, meets `ASK`: the sends run out on a
    // redirect, which the cluster's move will settle — retryable, as `TRYAGAIN`.)
    let unheld = charge(&fresh, t0 + 2);
    assert!(
        refused_with(&unheld, &[ErrorKind::TryAgain, ErrorKind::Ask]),
        "fresh keys mid-migration: {unheld:?}"
    );
    assert!(
        unheld.is_err_and(|e| e.is_retryable()),
        "fresh keys mid-migration"
    );
    let tryagain = error_replies(&cluster)
        .get("TRYAGAIN")
        .copied()
        .unwrap_or(0);
    assert!(
        tryagain - tryagain_before >= 3 * 5,
        "each split call is sent 5 times: {} TRYAGAIN replies",
        tryagain - tryagain_before
    );
    // Nothing written on either node.
    let window_now: String = asking(dst, &["GET", &stored[0]]);
    assert_eq!(window_now, window_before, "the window moved and unchanged");
    let log_now: Vec<String> = src.cmd(&["ZRANGE", &stored[1], "0", "-1", "WITHSCORES"]);
    assert_eq!(log_now, log_before, "the log, not moved yet, unchanged");
    for k in &unwritten {
        let there: i64 = asking(dst, &["EXISTS", k]);
        assert_eq!(there, 0, "{k} written on the importing node");
        let ask = src.query::<i64>(&["EXISTS", k]);
        assert!(
            ask.is_err_and(|e| e.kind() == ErrorKind::Ask),
            "{k} on the old owner"
        );
    }

    // Every key moved, the slot still migrating: decided on the importing node with
    // the state that moved; the unwritten keys are still refused.
    // Every node has forgotten the scripts, too: the importing node answers the
    // asked call `NOSCRIPT`, the client loads it and asks again.
    migrate(&stored[1]);
    for node in &cluster.nodes {
        let _: () = node.cmd(&["SCRIPT", "FLUSH"]);
    }
    let noscript = |replies: BTreeMap<String, u64>| replies.get("NOSCRIPT").copied();
    let noscript_before = noscript(error_replies(&cluster)).unwrap_or(0);
    let (allowed, left, _) = remaining(charge(&limiter, t0 + 3));
    let asked = (allowed, left);
    assert_eq!(asked, (true, 0), "the third unit, after ASK and NOSCRIPT");
    let noscript_after = noscript(error_replies(&cluster)).unwrap_or(0);
    assert_eq!(
        noscript_after - noscript_before,
        1,
        "one NOSCRIPT, on the asked node"
    );
    let refund = rt.block_on(limiter.refund_at_micros(&first, t0 + 4));
    assert!(
        matches!(refund, Ok(true)),
        "the first charge given back: {refund:?}"
    );
    let unheld = charge(&fresh, t0 + 4);
    assert!(
        refused_with(&unheld, &[ErrorKind::TryAgain, ErrorKind::Ask]),
        "fresh keys on the importing node: {unheld:?}"
    );
    assert!(
        unheld.is_err_and(|e| e.is_retryable()),
        "fresh keys, importing"
    );

    // The move ends: decided as before (MOVED), the refund given back once.
    cluster.finish_move(&slot_s, src, dst);
    let (allowed, left, _) = remaining(charge(&fresh, t0 + 5));
    assert_eq!((allowed, left), (true, 2), "fresh keys after the move");
    let (allowed, left, _) = remaining(charge(&limiter, t0 + 5));
    assert_eq!((allowed, left), (true, 0), "the room the refund made");
    let (allowed, left, _) = remaining(charge(&limiter, t0 + 6));
    assert_eq!((allowed, left), (false, 0), "the limit");
    let again = rt.block_on(limiter.refund_at_micros(&first, t0 + 6));
    assert!(
        matches!(again, Ok(false)),
        "a refund given twice: {again:?}"
    );
    let window: String = dst.cmd(&["GET", &stored[0]]);
    assert_eq!(
        window.split(':').nth(1),
        Some("3"),
        "the window's count: {window}"
    );
}

// ---------------------------------------------------------------------------
// Session 54 (later): slots moving on the server's clock, and an aborted migration.
// ---------------------------------------------------------------------------

/// The server's `TIME`, in microseconds since the epoch (every node runs on this
/// machine's clock).
fn server_micros(node: &Node) -> u64 {
    let time: Vec<String> = node.cmd(&["TIME"]);
    let secs: u64 = time[0].parse().expect("TIME seconds");
    let micros: u64 = time[1].parse().expect("TIME microseconds");
    secs * 1_000_000 + micros
}

/// A period of whole seconds (10 to 20 minutes) whose window, on the epoch-aligned
/// grid the window scripts use, holds the server's now in its second quarter: a
/// test of a few seconds on the server's clock never crosses a window's end, so its
/// decisions are the same at each of its readings (GCRA and the log, at 4 a
/// period, free a unit only after minutes).
fn mid_window_period(node: &Node) -> Duration {
    let now_s = server_micros(node) / 1_000_000;
    let secs = (600..1200)
        .find(|&p| (p / 4..p / 2).contains(&(now_s % p)))
        .expect("a period of 10 to 20 minutes with now in its second quarter");
    Duration::from_secs(secs)
}

/// Where `key` lies: every node holding it in its slot, owner or not
/// (`CLUSTER GETKEYSINSLOT` lists a node's keys whatever the slot's owner).
fn holders(cluster: &Cluster, key: &str) -> Vec<usize> {
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]);
    let slot = slot.to_string();
    (0..cluster.nodes.len())
        .filter(|&i| {
            let keys: Vec<String> =
                cluster.nodes[i].cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "1000"]);
            keys.iter().any(|k| k == key)
        })
        .collect()
}

/// The absolute expiry (ms since the epoch, `PEXPIRETIME`) of `key` on `node`, asked
/// with `ASKING` (what a node importing the slot holds).
fn expiry_ms(node: &Node, key: &str) -> i64 {
    asking(node, &["PEXPIRETIME", key])
}

/// Where the expiry (ms) of a key of `algorithm` must lie: its TTL is the time until
/// its state is fresh again (crate docs, "Keys"), from its last write. `written` is
/// a server reading taken before that write, `now` one taken after it, `admitted`
/// every unit the key ever admitted (GCRA keeps it until its latest TAT). Windows
/// end on the epoch-aligned grid; a sliding window is fresh a period after its
/// current one ends; the log a period after its newest unit.
fn expiry_bounds(
    algorithm: Algorithm,
    period: Duration,
    limit: u64,
    written: u64,
    now: u64,
    admitted: u64,
) -> (i64, i64) {
    let p = u64::try_from(period.as_micros()).expect("a short period");
    let end = (now / p + 1) * p;
    let (lo, hi) = match algorithm {
        Algorithm::Gcra => (written + p / limit, now + admitted * (p / limit)),
        Algorithm::FixedWindow => (end, end),
        Algorithm::SlidingWindow => (end + p, end + p),
        Algorithm::SlidingLog => (written + p, now + p),
        other => panic!("no expiry known for {other:?}"),
    };
    // Rounded up to a millisecond, on Redis's clock of whole milliseconds.
    let ms = |us: u64| i64::try_from(us / 1_000).expect("ms");
    (ms(lo) - 2, ms(hi) + 2)
}

/// The Redis keys of `key` on `limiter`, each with the algorithm of its limit.
fn keys_of(
    limiter: &RedisLimiter<ClusterConnection>,
    algorithms: &[Algorithm],
    key: &str,
) -> Vec<(String, Algorithm)> {
    limiter
        .redis_keys(key)
        .into_iter()
        .zip(algorithms.iter().copied())
        .collect()
}

/// A limiter of every algorithm with refunds on, `limit` a [`mid_window_period`],
/// each under the prefix `name:Algorithm:`; and the period.
fn server_clock_limiters(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    limit: u64,
    name: &str,
) -> (Duration, Vec<(Algorithm, RedisLimiter<ClusterConnection>)>) {
    let period = mid_window_period(&cluster.nodes[0]);
    let policy = Policy::new(limit, period).expect("policy");
    let limiters = ALGORITHMS
        .into_iter()
        .map(|algorithm| {
            let builder = common::builder(algorithm, policy)
                .refunds(true)
                .prefix(format!("{name}:{algorithm:?}:"));
            (algorithm, build(rt, cluster, builder))
        })
        .collect();
    (period, limiters)
}

/// One key of every algorithm, and a multi-limit call's two keys (a fixed window
/// and a log), charged with receipts on the **server's clock** (the production
/// scripts: `charge_n`, `peek_n`, `refund`, which set each key's TTL), while each
/// one's slot moves: first into mid-migration (every key moved, the old owner
/// answers `ASK`), then to the new owner (`MOVED`). `MIGRATE` carries each key's
/// expiry: on the new owner it expires when it did on the old one (later by at most
/// the move's own milliseconds: `MIGRATE` sends the time left), within what its
/// state needs; the state decides as before the move (the same remaining, a
/// `retry_after` shorter by no more than the time between the two peeks); receipts
/// issued before the move, and during it, give back exactly once after it, on the
/// importing node and on the new owner; and the limit holds to the unit.
#[test]
fn server_clock_keys_keep_their_state_ttl_and_receipts_when_their_slot_moves() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let limit = 4;
    let (period, limiters) = server_clock_limiters(&rt, &cluster, limit, "clock");
    let policy = Policy::new(limit, period).expect("policy");
    let mut cases: Vec<(String, Vec<Algorithm>, RedisLimiter<ClusterConnection>)> = limiters
        .into_iter()
        .map(|(algorithm, l)| (format!("{algorithm:?}"), vec![algorithm], l))
        .collect();
    let multi = common::builder(Algorithm::FixedWindow, policy)
        .and(Algorithm::SlidingLog, policy)
        .refunds(true)
        .prefix("clock-multi:");
    cases.push((
        "multi".to_owned(),
        vec![Algorithm::FixedWindow, Algorithm::SlidingLog],
        build(&rt, &cluster, multi),
    ));
    let key = "k";
    let clock = &cluster.nodes[0];

    for (name, algorithms, limiter) in &cases {
        let stored = keys_of(limiter, algorithms, key);
        let slot: i64 = clock.cmd(&["CLUSTER", "KEYSLOT", &stored[0].0]);
        let from = cluster.slot_owner(slot);
        let to = (from + 1) % cluster.nodes.len();
        let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
        // Units admitted so far, and a server reading taken before the last admission.
        let (admitted, written) = (Cell::new(0), Cell::new(0));
        let charge = || {
            let before = server_micros(clock);
            let (v, receipt) = rt
                .block_on(limiter.charge_n(key, 1))
                .unwrap_or_else(|e| panic!("{name}: a charge: {e}"));
            let d = match v {
                floodgate_redis::Verdict::Decided(d) => d,
                other => panic!("{name}: not decided: {other:?}"),
            };
            if d.is_allowed() {
                admitted.set(admitted.get() + 1);
                written.set(before);
            }
            (d, receipt)
        };
        let peek = |cost: u32| decided(rt.block_on(limiter.peek_n(key, cost)));
        let refund = |r: &floodgate_redis::RedisReceipt| {
            rt.block_on(limiter.refund(r))
                .unwrap_or_else(|e| panic!("{name}: a refund: {e}"))
        };
        let bounds = |algorithm| {
            expiry_bounds(
                algorithm,
                period,
                limit,
                written.get(),
                server_micros(clock),
                admitted.get(),
            )
        };
        // The state decides as it did at `peeked`, when a peek of 3 got `waits`: one
        // more unit fits, 3 do not, and their wait has run down by no more than the
        // time since.
        let decides_as_before = |waits: &Decision, peeked: Instant, phase: &str| {
            let (fits, waits_now) = (peek(1), peek(3));
            let between = peeked.elapsed();
            assert_eq!(
                (fits.is_allowed(), fits.remaining()),
                (true, 1),
                "{name}: {phase}"
            );
            let (w0, w1) = (
                waits.retry_after().expect("a wait"),
                waits_now.retry_after().expect("a wait"),
            );
            assert!(
                !waits_now.is_allowed() && w1 <= w0 && w1 + between >= w0,
                "{name}, {phase}: waited {w0:?}, then {w1:?} after {between:?}"
            );
        };
        let (d, first) = charge();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 3), "{name}");
        let (d, second) = charge();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{name}");
        let (first, second) = (first.expect("a receipt"), second.expect("a receipt"));

        // Before the move: each key's expiry within what its state needs.
        let mut expiries = vec![];
        for (k, algorithm) in &stored {
            let (lo, hi) = bounds(*algorithm);
            let at = expiry_ms(src, k);
            assert!(
                (lo..=hi).contains(&at),
                "{name}: {k} expires at {at} ms, not in {lo}..={hi}"
            );
            expiries.push(at);
        }
        let peeked = Instant::now();
        let (fits, waits) = (peek(1), peek(3));
        assert_eq!((fits.is_allowed(), fits.remaining()), (true, 1), "{name}");
        assert!(!waits.is_allowed(), "{name}: 3 more fit in 2: {waits:?}");

        // Mid-migration (`ASK`): the keys and their expiries moved.
        let moving = Instant::now();
        let moved = cluster.migrate_keys(slot, from, to);
        let slack = i64::try_from(moving.elapsed().as_millis()).expect("ms") + 2;
        // A window write keeps a longer time to live that it finds on its key (a
        // policy of a longer period may still count its units: the crate docs,
        // "A policy change"), and the move left one: later by the move's own
        // milliseconds. GCRA and the log set theirs afresh at each write.
        let late = |algorithm| match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => slack,
            _ => 0,
        };
        for ((k, _), before) in stored.iter().zip(&expiries) {
            assert!(moved.contains(k), "{name}: {k} not moved");
            assert_eq!(holders(&cluster, k), [to], "{name}: {k}");
            let at = expiry_ms(dst, k);
            assert!(
                (*before..=before + slack).contains(&at),
                "{name}: {k} expired at {before} ms on its old owner, at {at} ms on the new"
            );
        }
        decides_as_before(&waits, peeked, "asked");

        // A receipt from before the move gives back once, on the importing node.
        assert!(refund(&first), "{name}: the first charge given back");
        assert!(!refund(&first), "{name}: the first charge given back twice");
        let d = peek(1);
        assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{name}");
        let (d, third) = charge();
        assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{name}: asked");
        let third = third.expect("a receipt");
        for (k, algorithm) in &stored {
            let (lo, hi) = bounds(*algorithm);
            let hi = hi + late(*algorithm);
            let at = expiry_ms(dst, k);
            assert!(
                (lo..=hi).contains(&at),
                "{name}: {k} written while asked expires at {at} ms, not in {lo}..={hi}"
            );
        }

        // The move ends (`MOVED`): the same state, the receipts once more.
        let peeked = Instant::now();
        let waits = peek(3);
        cluster.finish_move(&slot.to_string(), src, dst);
        decides_as_before(&waits, peeked, "moved");
        assert!(!refund(&first), "{name}: the first charge, after the move");
        assert!(refund(&second), "{name}: the second charge given back");
        assert!(
            refund(&third),
            "{name}: the charge made while asked given back"
        );
        assert!(
            !refund(&second) && !refund(&third),
            "{name}: given back twice"
        );
        let mut more = 0;
        loop {
            let (d, _) = charge();
            if !d.is_allowed() {
                break;
            }
            more += 1;
            assert!(more <= limit, "{name}: admitted past the limit");
        }
        assert_eq!(more, limit, "{name}: the room after three refunds");
        for (k, algorithm) in &stored {
            assert_eq!(holders(&cluster, k), [to], "{name}: {k}");
            let (lo, hi) = bounds(*algorithm);
            let hi = hi + late(*algorithm);
            let at = expiry_ms(dst, k);
            assert!(
                (lo..=hi).contains(&at),
                "{name}: {k} at the end expires at {at} ms, not in {lo}..={hi}"
            );
        }
    }
}

/// `MIGRATE` of `keys` from `node` (a node importing their slot, or holding them
/// without owning it) to port `to`, flagged `ASKING` so that `node` serves them.
fn migrate_back(node: &Node, to: u16, keys: &[&str]) {
    let port = to.to_string();
    let ok: String = asking(node, &migrate_args(&port, keys.iter().copied()));
    assert_eq!(ok, "OK", "MIGRATE {keys:?} back");
}

/// A migration aborted midway (session 54), one slot holding a key of every
/// algorithm (one-key limiters on keys with one hash tag), charged with receipts
/// on the server's clock. Half of the keys move, the slot in mid-migration, and each
/// key is charged there (`ASK` for the moved ones); then the operator gives up:
///
/// * **moved back** (`SETSLOT STABLE` on the old owner, `MIGRATE` from the
///   importing node, `SETSLOT STABLE` there): every key lies on the old owner alone, with the state
///   and the expiry it had, decides from it, its receipts (charged before the move
///   and on the importing node) give back once, and it admits exactly its limit;
/// * **`SETSLOT STABLE` on both nodes, keys left on the importing node**: the old
///   owner serves the slot again without them; the stranded copies are read by no
///   call (their node answers `MOVED`), so those keys decide as fresh ones (crate
///   docs: "a vanished key decides as a fresh one") — their units are forgotten
///   while they are stranded, as Redis Cluster loses them, and the keys left on
///   the old owner keep deciding from their state. Moved back before any write
///   (the node holding them flagged `IMPORTING` for the `MIGRATE`, as
///   `redis-cli --cluster fix` does), they decide from their state again: never
///   two states of one key read, never more than the limit admitted over the
///   whole run where no call was made on a stranded key.
/// * **stranded and written meanwhile** (a charge on the old owner makes each a
///   fresh state there): [`stranded_and_written`] — the stranded copy is never
///   read, never moved back over the newer state (`BUSYKEY`), and its receipts
///   give nothing back on the fresh one.
#[test]
fn an_aborted_migration_leaves_every_key_one_state() {
    let Some(cluster) = Cluster::start() else {
        return;
    };
    let rt = runtime();
    let limit = 4;
    let (_, limiters) = server_clock_limiters(&rt, &cluster, limit, "abort");
    let clock = &cluster.nodes[0];

    for (case, key) in [("moved back", "k{back}"), ("stable", "k{stable}")] {
        let stored: Vec<String> = limiters
            .iter()
            .map(|(_, l)| l.redis_keys(key).remove(0))
            .collect();
        let slot: i64 = clock.cmd(&["CLUSTER", "KEYSLOT", &stored[0]]);
        for k in &stored {
            assert_eq!(clock.cmd::<i64>(&["CLUSTER", "KEYSLOT", k]), slot, "{k}");
        }
        let from = cluster.slot_owner(slot);
        let to = (from + 1) % cluster.nodes.len();
        let (src, dst) = (&cluster.nodes[from], &cluster.nodes[to]);
        let (src_id, slot_s) = (src.id(), slot.to_string());
        let charge = |i: usize| {
            let (algorithm, limiter) = &limiters[i];
            let (v, receipt) = rt
                .block_on(limiter.charge_n(key, 1))
                .unwrap_or_else(|e| panic!("{case} {algorithm:?}: a charge: {e}"));
            match v {
                floodgate_redis::Verdict::Decided(d) => (d, receipt),
                other => panic!("{case} {algorithm:?}: not decided: {other:?}"),
            }
        };
        // The room left: a peek of one unit reports what would remain after it.
        let remaining = |i: usize| {
            let d = decided(rt.block_on(limiters[i].1.peek_n(key, 1)));
            if d.is_allowed() {
                d.remaining() + 1
            } else {
                0
            }
        };
        let refund = |i: usize, r: &floodgate_redis::RedisReceipt| {
            rt.block_on(limiters[i].1.refund(r))
                .unwrap_or_else(|e| panic!("{case} {:?}: a refund: {e}", limiters[i].0))
        };

        // Two units each on the old owner, then half of the keys move.
        let mut receipts = vec![];
        for i in 0..limiters.len() {
            assert!(charge(i).0.is_allowed(), "{case} {i}");
            let (d, r) = charge(i);
            assert_eq!((d.is_allowed(), d.remaining()), (true, 2), "{case} {i}");
            receipts.push(vec![r.expect("a receipt")]);
        }
        src.start_moving(&slot_s, dst);
        let (moved, stayed) = stored.split_at(2);
        let port = dst.port.to_string();
        let _: String = src.cmd(&migrate_args(&port, moved.iter().map(String::as_str)));
        // A unit each mid-migration: the moved keys on the importing node (`ASK`).
        for (i, k) in stored.iter().enumerate() {
            let (d, r) = charge(i);
            assert_eq!((d.is_allowed(), d.remaining()), (true, 1), "{case} {k}");
            receipts[i].push(r.expect("a receipt"));
            let at = if i < 2 { to } else { from };
            assert_eq!(holders(&cluster, k), [at], "{case}: {k} mid-migration");
        }
        let expiries: Vec<i64> = moved.iter().map(|k| expiry_ms(dst, k)).collect();

        if case == "moved back" {
            // The old owner first (a migrating node answers `ASK` for a key it
            // lacks, even to the `RESTORE` that brings it back, and `SETSLOT NODE`
            // clears its migration only once it holds no key of the slot), then
            // the keys, then the importing node.
            let _: () = src.cmd(&["CLUSTER", "SETSLOT", &slot_s, "STABLE"]);
            let moving = Instant::now();
            let keys: Vec<&str> = moved.iter().map(String::as_str).collect();
            migrate_back(dst, src.port, &keys);
            let slack = i64::try_from(moving.elapsed().as_millis()).expect("ms") + 2;
            let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &slot_s, "STABLE"]);
            for (k, before) in moved.iter().zip(&expiries) {
                let at: i64 = src.cmd(&["PEXPIRETIME", k]);
                assert!(
                    (*before..=before + slack).contains(&at),
                    "{k} expired at {before} ms on the importing node, at {at} ms back"
                );
            }
        } else {
            for node in [dst, src] {
                let _: () = node.cmd(&["CLUSTER", "SETSLOT", &slot_s, "STABLE"]);
            }
            assert_eq!(cluster.slot_owner(slot), from);
            for (i, k) in stored.iter().enumerate() {
                let stranded = i < 2;
                assert_eq!(
                    holders(&cluster, k),
                    [if stranded { to } else { from }],
                    "{k} after STABLE"
                );
                let read = dst.query::<i64>(&["EXISTS", k]);
                assert!(
                    read.is_err_and(|e| e.kind() == redis::ErrorKind::Moved),
                    "{k}: the importing node still serves the slot"
                );
                // Stranded: read as fresh on the old owner (a peek writes nothing).
                let want = if stranded { limit } else { 1 };
                assert_eq!(remaining(i), want, "{k} after STABLE");
            }
            // Moved back as `redis-cli --cluster fix` would, before any write.
            let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &src_id]);
            let keys: Vec<&str> = moved.iter().map(String::as_str).collect();
            migrate_back(dst, src.port, &keys);
            let _: () = dst.cmd(&["CLUSTER", "SETSLOT", &slot_s, "STABLE"]);
        }

        // Every key on the old owner alone, one state, decided from it.
        assert_eq!(cluster.slot_owner(slot), from, "{case}");
        for (i, k) in stored.iter().enumerate() {
            assert_eq!(holders(&cluster, k), [from], "{case}: {k}");
            assert_eq!(remaining(i), 1, "{case}: {k}");
        }
        assert!(stayed.iter().all(|k| holders(&cluster, k) == [from]));
        // Receipts from before the migration and from the importing node: once.
        for (i, rs) in receipts.iter().enumerate() {
            for r in rs {
                assert!(refund(i, r), "{case} {i}: a charge given back");
                assert!(!refund(i, r), "{case} {i}: a charge given back twice");
            }
            assert_eq!(remaining(i), 3, "{case} {i}: after two refunds");
            let mut more = 0;
            while charge(i).0.is_allowed() {
                more += 1;
                assert!(more <= limit, "{case} {i}: admitted past the limit");
            }
            assert_eq!(more, 3, "{case} {i}: the room two refunds made");
        }
        for k in &stored {
            assert_eq!(holders(&cluster, k), [from], "{case}: {k} at the end");
        }
    }
}
