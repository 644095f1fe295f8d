//! A real `redis-server` per test, on an ephemeral port, durable (AOF, fsync always) so a test
//! can stop and restart it and see what survived.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The primary this server replicates, if it is a replica.
    primary: Option<u16>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        // Take a free port from the OS, then hand it to redis-server (it cannot bind port 0).
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            primary: None,
        };
        server.restart();
        server
    }

    /// A replica of `primary`, durable like it.
    pub fn replica_of(primary: &RedisServer) -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = RedisServer {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
            primary: Some(primary.port),
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
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
            .args(
                self.primary
                    .map(|port| {
                        vec![
                            "--replicaof".to_owned(),
                            "127.0.0.1".to_owned(),
                            port.to_string(),
                        ]
                    })
                    .unwrap_or_default(),
            )
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
