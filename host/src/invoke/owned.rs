//! Work the gateway owns: every invocation from its claim on, and every outcome kept because
//! its final write failed. It runs in tasks no client can cancel, and shutdown waits for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The gateway's owned tasks: how many run, and whether the gateway is stopping.
#[derive(Debug)]
pub struct Owned {
    running: Arc<AtomicUsize>,
    stopping: watch::Sender<bool>,
}

impl Default for Owned {
    fn default() -> Owned {
        Owned {
            running: Arc::new(AtomicUsize::new(0)),
            stopping: watch::channel(false).0,
        }
    }
}

/// Counts a task while it runs, however it ends (returns, panics, or is dropped).
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Owned {
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.running.fetch_add(1, Ordering::SeqCst);
        let running = Running(Arc::clone(&self.running));
        tokio::spawn(async move {
            let _running = running;
            work.await
        })
    }

    /// Tells tasks that wait (a kept outcome between tries) that the gateway is stopping.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    /// How many owned tasks are running.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// On shutdown: signals stopping, then waits up to `grace` for every owned task to end
    /// (a call in flight reaches its final write; a kept outcome gets its last try).
    pub async fn drain(&self, grace: Duration) {
        let _ = self.stopping.send(true);
        let deadline = tokio::time::Instant::now() + grace;
        while self.running() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.running() > 0 {
            tracing::error!(
                running = self.running(),
                "stopping with calls still in flight; their slots are settled when their leases end"
            );
        }
    }
}
