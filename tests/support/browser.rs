//! A real headless Chromium, driven over WebDriver (Debian's `chromium` and `chromium-driver`,
//! which `.ci/run` installs).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};

pub struct Browser {
    pub client: Client,
    _driver: Driver,
    _profile: tempfile::TempDir,
}

/// chromedriver in a process group of its own, killed whole on drop: a failing test leaves
/// neither chromedriver nor the Chromium it started behind (killing chromedriver alone
/// orphans the browser).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

impl Browser {
    pub async fn start() -> Browser {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let mut driver = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is installed (.ci/run installs chromium-driver)");
        let mut line = String::new();
        let mut stdout = BufReader::new(driver.stdout.take().unwrap());
        while !line.contains("started successfully") {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "chromedriver exited before it started"
            );
        }
        let profile = tempfile::tempdir().unwrap();
        // The flags keep Chromium from reaching for the network: this machine has none, and
        // the test must only ever talk to loopback.
        let capabilities = serde_json::json!({
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-extensions",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("a WebDriver session with headless Chromium");
        Browser {
            client,
            _driver: Driver(driver),
            _profile: profile,
        }
    }

    /// Types `text` into the element `css` selects.
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.client.find(Locator::Css(css)).await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    pub async fn click(&self, css: &str) {
        let button = self.client.find(Locator::Css(css)).await.unwrap();
        button.click().await.unwrap();
    }

    /// The text of the element `css` selects, once it appears (10 s at most). A page that
    /// is being replaced (a form was just submitted) is simply asked again.
    pub async fn text_of(&self, css: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = element.text().await
            {
                return text;
            }
            assert!(std::time::Instant::now() < deadline, "{css} never appeared");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}
