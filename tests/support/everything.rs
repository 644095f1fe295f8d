//! The official reference MCP server, `@modelcontextprotocol/server-everything`, in Streamable
//! HTTP mode on an ephemeral loopback port. `.ci/test` installs it from npm; the test fails
//! (never skips) when it is missing.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Everything {
    child: Child,
    pub port: u16,
}

/// Where `.ci/test` puts the server's entry point (`OBOL_EVERYTHING` overrides it).
pub fn entry_point() -> String {
    std::env::var("OBOL_EVERYTHING").unwrap_or_else(|_| {
        format!(
            "{}/.cache/obol/everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            std::env::var("HOME").unwrap_or_default()
        )
    })
}

impl Everything {
    pub fn start() -> Everything {
        let entry = entry_point();
        assert!(
            std::path::Path::new(&entry).exists(),
            "{entry} is missing: run .ci/test (it installs @modelcontextprotocol/server-everything), or set OBOL_EVERYTHING"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("node")
            .arg(&entry)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node runs");
        let stderr = child.stderr.take().unwrap();
        let (ready, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on port") {
                    let _ = ready.send(());
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while wait.recv_timeout(Duration::from_millis(100)).is_err() {
            assert!(Instant::now() < deadline, "server-everything did not start");
            assert!(
                child.try_wait().unwrap().is_none(),
                "server-everything exited"
            );
        }
        Everything { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
