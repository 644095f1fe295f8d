//! Lanes: the threads that serve connections, one single-threaded runtime each.
//!
//! A connection is handed to the lane serving the fewest connections, and the tasks its
//! requests start (the invocation the gateway owns, a store commit it leads, the guest, the
//! vendor request) run on that lane's thread. Under a work-stealing runtime a call at low
//! concurrency woke the idle worker at every I/O event and moved between the two cores about
//! eight times per call (ADR-0055); on one lane it stays on one thread. Lanes still use every
//! core once there are as many connections as lanes, and a guest spinning to its deadline
//! yields to its lane's other calls at every epoch tick (ADR-0049).

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::oneshot;

/// File descriptors a lane holds: its runtime's poller, waker and signal pipe's copy, and its
/// own Redis connection (`store::redis`).
pub const DESCRIPTORS_PER_LANE: u64 = 5;

/// How many lanes [`Lanes::start`] starts: one per core this process may use (the cgroup's
/// CPU quota counts).
pub fn count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

thread_local! {
    static LANE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the lane running the caller, below [`count`]; `None` off the lanes. What a
/// lane keeps for itself (a Redis connection driven on its own runtime) is found by it.
pub fn current() -> Option<usize> {
    LANE.with(Cell::get)
}

/// The running lanes. Dropping this stops them, cancelling whatever still runs on them;
/// [`Lanes::stop`] also waits for their threads to end.
pub struct Lanes {
    lanes: Vec<Lane>,
}

struct Lane {
    runtime: tokio::runtime::Handle,
    /// Connections this lane serves now.
    serving: Arc<AtomicUsize>,
    /// Dropped to stop the lane's thread.
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Counts a connection on its lane while it is served, however its task ends.
struct Serving(Arc<AtomicUsize>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lanes {
    /// Starts one lane per core this process may use.
    pub fn start() -> std::io::Result<Lanes> {
        Lanes::with(count())
    }

    /// Stops every lane and waits until their threads have dropped what ran on them (and the
    /// blocking work their runtimes started, such as a store commit, has ended).
    pub async fn stop(self) {
        let threads: Vec<_> = self
            .lanes
            .into_iter()
            .map(|lane| {
                drop(lane.stop);
                lane.thread
            })
            .collect();
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        });
        let _ = joined.await;
    }

    pub(crate) fn with(count: usize) -> std::io::Result<Lanes> {
        let lanes = (0..count.max(1))
            .map(Lane::start)
            .collect::<std::io::Result<_>>()?;
        Ok(Lanes { lanes })
    }

    /// Runs `connection` on the lane with the fewest connections. Sockets it opens when it
    /// is first polled register with that lane's reactor.
    pub fn serve(&self, connection: impl Future<Output = ()> + Send + 'static) {
        let lane = self
            .lanes
            .iter()
            .min_by_key(|lane| lane.serving.load(Ordering::Relaxed))
            .expect("at least one lane");
        lane.serving.fetch_add(1, Ordering::Relaxed);
        let serving = Serving(Arc::clone(&lane.serving));
        lane.runtime.spawn(async move {
            let _serving = serving;
            connection.await;
        });
    }
}

impl Lane {
    fn start(index: usize) -> std::io::Result<Lane> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name(format!("obol-lane-{index}"))
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("obol-lane-{index}"))
            .spawn(move || {
                LANE.with(|lane| lane.set(Some(index)));
                // Drives every task spawned onto this lane until the lanes are dropped.
                let _ = runtime.block_on(stopped);
            })?;
        Ok(Lane {
            runtime: handle,
            serving: Arc::new(AtomicUsize::new(0)),
            stop,
            thread,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_name() -> String {
        std::thread::current().name().unwrap_or("").to_owned()
    }

    /// Serves a "connection" that reports its thread and the thread of a task it spawns, then
    /// holds its lane until `release` is dropped or sent.
    fn connection(lanes: &Lanes) -> (oneshot::Receiver<(String, String)>, oneshot::Sender<()>) {
        let (report, reported) = oneshot::channel();
        let (release, released) = oneshot::channel::<()>();
        lanes.serve(async move {
            let spawned = tokio::spawn(async { thread_name() }).await.unwrap();
            let _ = report.send((thread_name(), spawned));
            let _ = released.await;
        });
        (reported, release)
    }

    #[tokio::test]
    async fn a_connection_and_its_tasks_stay_on_one_lane_and_connections_go_to_the_least_busy() {
        let lanes = Lanes::with(2).unwrap();
        let (first, release_first) = connection(&lanes);
        let (first, spawned) = first.await.unwrap();
        assert!(first.starts_with("obol-lane-"), "{first}");
        assert_eq!(current(), None, "the test's own thread is no lane");
        assert_eq!(
            spawned, first,
            "a task the connection spawned left its lane"
        );
        let (second, _hold_second) = connection(&lanes);
        let (second, spawned) = second.await.unwrap();
        assert_ne!(
            second, first,
            "two connections on one lane while the other was free"
        );
        assert_eq!(spawned, second);
        // The first lane is free again once its connection ends.
        drop(release_first);
        while lanes
            .lanes
            .iter()
            .map(|l| l.serving.load(Ordering::Relaxed))
            .sum::<usize>()
            > 1
        {
            tokio::task::yield_now().await;
        }
        let (third, _hold_third) = connection(&lanes);
        assert_eq!(third.await.unwrap().0, first);
    }

    #[tokio::test]
    async fn stopping_the_lanes_waits_until_what_ran_on_them_is_dropped() {
        struct SlowToDrop(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for SlowToDrop {
            fn drop(&mut self) {
                std::thread::sleep(std::time::Duration::from_millis(50));
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let lanes = Lanes::with(2).unwrap();
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (running, started) = oneshot::channel();
        let guard = SlowToDrop(Arc::clone(&dropped));
        lanes.serve(async move {
            let _guard = guard;
            let _ = running.send(());
            std::future::pending::<()>().await;
        });
        started.await.unwrap();
        lanes.stop().await;
        assert!(
            dropped.load(Ordering::SeqCst),
            "stop returned before its lane dropped the task"
        );
    }
}
