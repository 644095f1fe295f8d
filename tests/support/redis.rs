//! A real `redis-server` per test, on an ephemeral port, durable (AOF, fsync always) so a test
//! can stop and restart it and see what survived.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    role: Role,
}

enum Role {
    Standalone,
    /// Replicates the primary on this port.
    ReplicaOf(u16),
    /// A node of a Redis Cluster.
    ClusterNode,
}

fn free_port() -> u16 {
    // Take a free port from the OS, then hand it to redis-server (it cannot bind port 0).
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A free port for a cluster node. Redis listens for its cluster bus 10,000 ports higher, so a
/// node's port must be at most 55,535 (above it redis-server exits at start, and the OS hands
/// out ports up to 60,999: about one node in five) and the bus port must be free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::with_role(Role::Standalone)
    }

    /// A replica of `primary`, durable like it.
    pub fn replica_of(primary: &RedisServer) -> RedisServer {
        RedisServer::with_role(Role::ReplicaOf(primary.port))
    }

    fn with_role(role: Role) -> RedisServer {
        // A cluster node keeps its files in memory where the OS offers it: its `appendfsync
        // always` (which the store requires) then waits on no disk, so a busy CI disk cannot
        // stall the node migrating a slot (MIGRATE is synchronous) for the seconds that leave
        // the store's cluster client refreshing its slot map with every request held.
        let dir = match &role {
            Role::ClusterNode => tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir()),
            _ => tempfile::tempdir(),
        }
        .unwrap();
        let port = match role {
            Role::ClusterNode => free_cluster_port(),
            _ => free_port(),
        };
        let mut server = RedisServer {
            port,
            dir,
            child: None,
            role,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A replica becomes a primary (`REPLICAOF NO ONE`), as a failover does.
    pub fn promote(&self) {
        let client = redis::Client::open(self.url()).unwrap();
        let mut connection = client.get_connection().unwrap();
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut connection)
            .unwrap();
    }

    /// Starts (again) on the same port and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(match self.role {
                Role::Standalone => vec![],
                Role::ReplicaOf(port) => vec![
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    port.to_string(),
                ],
                // A long node timeout keeps a node that stalls for a moment from being marked
                // failed (and the cluster from going down); see `RedisCluster`.
                Role::ClusterNode => [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "15000",
                ]
                .map(str::to_owned)
                .to_vec(),
            })
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (.ci/run installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, like a crash.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of three primaries, each durable like [`RedisServer`], on loopback ports.
/// Its nodes keep their files on tmpfs where there is one and wait 15 s before marking a node
/// failed: no test stops a node, and a test that does must shorten that first.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::with_role(Role::ClusterNode))
            .collect();
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli must be installed (.ci/run installs it)");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(0..3).all(|n| {
            cluster
                .query::<String>(n, &["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
        }) {
            assert!(Instant::now() < deadline, "the cluster did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `args` run on node `n`.
    pub fn query<T: redis::FromRedisValue>(&self, n: usize, args: &[&str]) -> T {
        let client = redis::Client::open(self.nodes[n].url()).unwrap();
        let mut connection = client.get_connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut connection).unwrap()
    }

    fn id(&self, n: usize) -> String {
        self.query(n, &["CLUSTER", "MYID"])
    }

    /// The node that owns `slot`, by its own account.
    pub fn owner(&self, slot: u16) -> usize {
        (0..3)
            .find(|&n| {
                let nodes: String = self.query(n, &["CLUSTER", "NODES"]);
                nodes
                    .lines()
                    .find(|line| line.contains("myself"))
                    .is_some_and(|line| {
                        line.split_whitespace().skip(8).any(|range| {
                            let mut ends = range.split('-').map(|end| end.parse::<u16>());
                            match (ends.next(), ends.next()) {
                                (Some(Ok(from)), Some(Ok(to))) => (from..=to).contains(&slot),
                                (Some(Ok(only)), None) => only == slot,
                                _ => false,
                            }
                        })
                    })
            })
            .expect("some node owns every slot")
    }

    /// The hash slot of the first key matching `pattern` anywhere in the cluster.
    pub fn slot_of(&self, pattern: &str) -> Option<u16> {
        (0..3).find_map(|n| {
            let keys: Vec<String> = self.query(n, &["KEYS", pattern]);
            keys.first()
                .map(|key| self.query::<u16>(n, &["CLUSTER", "KEYSLOT", key]))
        })
    }

    /// Moves `slot` to node `to` as `redis-cli --cluster reshard` does, slowly: the slot stays
    /// migrating for `pause`, and its keys move one at a time, `pause` apart, so calls land
    /// in every phase of the move.
    pub fn migrate_slot(&self, slot: u16, to: usize, pause: Duration) {
        let from = self.owner(slot);
        assert_ne!(from, to);
        let (from_id, to_id) = (self.id(from), self.id(to));
        let slot_arg = slot.to_string();
        let _: () = self.query(
            to,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        );
        let _: () = self.query(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        );
        std::thread::sleep(pause);
        loop {
            let keys: Vec<String> = self.query(from, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "1"]);
            let Some(key) = keys.first() else { break };
            let port = self.nodes[to].port.to_string();
            let _: redis::Value =
                self.query(from, &["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
            std::thread::sleep(pause);
        }
        for n in [to, from, 3 - to - from] {
            let _: () = self.query(n, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
        }
    }
}
