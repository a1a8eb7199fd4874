//! The state file: loaded once at start, then saved by a background writer, off the
//! request path.
//!
//! A request that changes the state only bumps a generation counter ([`StateWriter::mark`]).
//! The writer task wakes on it, waits [`COALESCE_DELAY`] so a burst of changes (a thousand
//! agents syncing) becomes one write, serialises the state as it is then, and replaces
//! the file atomically (a temporary file beside it, flushed to disk, then renamed over
//! it), so a reader or a crash never sees half a file. [`StateWriter::shutdown`] writes
//! whatever is still pending at once and stops the writer: `odoo-sim serve` calls it on
//! SIGTERM and ctrl-c, so a graceful stop loses nothing. A SIGKILL loses at most the
//! changes of the last [`COALESCE_DELAY`] and the write in flight; the file then holds the
//! previous complete state.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};

use crate::{SimError, state::SimState};

/// How long the writer lets changes accumulate before it writes them all at once.
pub const COALESCE_DELAY: Duration = Duration::from_millis(100);

/// Reads the state file; a missing file is an empty state (a first start).
pub fn load(path: &Path) -> Result<SimState, SimError> {
    if !path.exists() {
        return Ok(SimState::default());
    }
    let text = std::fs::read_to_string(path).map_err(|e| SimError::Io(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| SimError::Io(e.to_string()))
}

/// The temporary file a write goes to before it is renamed over `path`.
fn temporary_path(path: &Path) -> PathBuf {
    path.with_extension("tmp")
}

/// Replaces `path` with `bytes` atomically: the whole new content or the old one, never a
/// mix, also after a crash or a power loss (the data reaches the disk before the rename).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary_path(path);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// Serialises the state to save; called by the writer each time it writes.
pub type Snapshot = Box<dyn Fn() -> Result<Vec<u8>, serde_json::Error> + Send + Sync>;

/// What the writer reports back: the generation it last wrote (or tried to) and how.
#[derive(Clone, Debug, Default)]
struct Written {
    generation: u64,
    error: Option<String>,
}

/// The handle on the background writer of one state file. Dropping it stops the writer
/// after a last write of what is pending.
pub struct StateWriter {
    path: PathBuf,
    /// Bumped by every change; the writer catches up with it.
    changes: watch::Sender<u64>,
    written: watch::Receiver<Written>,
    stop: Arc<Notify>,
    task: Mutex<Option<JoinHandle<()>>>,
    writes: Arc<AtomicU64>,
}

impl StateWriter {
    /// Starts the writer of `path` on the current Tokio runtime; `snapshot` gives the bytes
    /// to write. Fails without a runtime (a state file needs one).
    pub fn spawn(path: PathBuf, delay: Duration, snapshot: Snapshot) -> Result<Self, SimError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| SimError::Save("the state file's writer needs a Tokio runtime".into()))?;
        let (changes, changes_rx) = watch::channel(0);
        let (written_tx, written) = watch::channel(Written::default());
        let stop = Arc::new(Notify::new());
        let writes = Arc::new(AtomicU64::new(0));
        let task = runtime.spawn(
            Writer {
                path: path.clone(),
                delay,
                snapshot: Arc::new(snapshot),
                changes: changes_rx,
                written: written_tx,
                stop: stop.clone(),
                writes: writes.clone(),
            }
            .run(),
        );
        Ok(Self {
            path,
            changes,
            written,
            stop,
            task: Mutex::new(Some(task)),
            writes,
        })
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records that the state changed: it will be written soon. Never blocks.
    pub fn mark(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// How many times the file was written (or a write was tried).
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Waits until every change marked before this call is on disk (at most about
    /// [`COALESCE_DELAY`] plus one write); the error of that write, if it failed.
    pub async fn flush(&self) -> Result<(), SimError> {
        let target = *self.changes.borrow();
        let mut written = self.written.clone();
        match written.wait_for(|w| w.generation >= target).await {
            Ok(w) => match &w.error {
                None => Ok(()),
                Some(e) => Err(SimError::Save(e.clone())),
            },
            Err(_) => Err(SimError::Save("the state file's writer has stopped".into())),
        }
    }

    /// Writes what is pending at once, without the coalescing delay, and stops the writer.
    /// Changes marked afterwards are not saved.
    pub async fn shutdown(&self) -> Result<(), SimError> {
        self.stop.notify_one();
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(task) = task {
            // Only a panic of the writer ends it otherwise; its last report says the rest.
            let _ = task.await;
        }
        let written = self.written.borrow().clone();
        if written.generation < *self.changes.borrow() {
            return Err(SimError::Save("changes made during the shutdown were not saved".into()));
        }
        match written.error {
            Some(e) => Err(SimError::Save(e)),
            None => Ok(()),
        }
    }
}

impl Drop for StateWriter {
    fn drop(&mut self) {
        // The writer sees the sender gone, writes what is pending and ends.
        self.stop.notify_one();
    }
}

/// The writer task's side.
struct Writer {
    path: PathBuf,
    delay: Duration,
    snapshot: Arc<Snapshot>,
    changes: watch::Receiver<u64>,
    written: watch::Sender<Written>,
    stop: Arc<Notify>,
    writes: Arc<AtomicU64>,
}

impl Writer {
    async fn run(mut self) {
        loop {
            let stopping = tokio::select! {
                changed = self.changes.changed() => changed.is_err(),
                () = self.stop.notified() => true,
            };
            if !stopping {
                // Coalesce: the changes of the next moments go in the same write.
                tokio::select! {
                    () = tokio::time::sleep(self.delay) => {}
                    () = self.stop.notified() => {
                        self.write_pending().await;
                        return;
                    }
                }
            }
            self.write_pending().await;
            if stopping {
                return;
            }
        }
    }

    /// Writes the state as it is now, if it changed since the last write.
    async fn write_pending(&mut self) {
        let generation = *self.changes.borrow_and_update();
        if generation == self.written.borrow().generation {
            return;
        }
        let (path, snapshot) = (self.path.clone(), self.snapshot.clone());
        // Serialising and writing block: off the runtime's worker threads.
        let result = tokio::task::spawn_blocking(move || {
            let bytes = snapshot().map_err(std::io::Error::other)?;
            write_atomically(&path, &bytes)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        self.writes.fetch_add(1, Ordering::Relaxed);
        let error = result.err().map(|e| {
            tracing::error!(path = %self.path.display(), error = %e, "cannot save the state file");
            e.to_string()
        });
        self.written.send_replace(Written { generation, error });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("odoo-sim-persist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A writer whose "state" is a counter, written as `{"value": N}`.
    fn counter_writer(path: &Path, delay: Duration) -> (StateWriter, Arc<AtomicU64>) {
        let value = Arc::new(AtomicU64::new(0));
        let read = value.clone();
        let snapshot: Snapshot =
            Box::new(move || serde_json::to_vec(&serde_json::json!({"value": read.load(Ordering::SeqCst)})));
        (StateWriter::spawn(path.to_owned(), delay, snapshot).unwrap(), value)
    }

    fn saved_value(path: &Path) -> u64 {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        v["value"].as_u64().unwrap()
    }

    #[tokio::test]
    async fn a_burst_of_changes_is_written_once_with_the_last_state() {
        let dir = temp_dir("coalesce");
        let path = dir.join("state.json");
        let (writer, value) = counter_writer(&path, Duration::from_millis(200));
        for n in 1..=100 {
            value.store(n, Ordering::SeqCst);
            writer.mark();
        }
        writer.flush().await.unwrap();
        assert_eq!(saved_value(&path), 100);
        assert_eq!(writer.writes(), 1, "100 changes within the delay, one write");

        // Nothing changed: nothing written.
        writer.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(writer.writes(), 1);

        value.store(101, Ordering::SeqCst);
        writer.mark();
        writer.flush().await.unwrap();
        assert_eq!((saved_value(&path), writer.writes()), (101, 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn shutdown_writes_what_is_pending_at_once() {
        let dir = temp_dir("shutdown");
        let path = dir.join("state.json");
        // A delay far longer than the test: only the shutdown can have written.
        let (writer, value) = counter_writer(&path, Duration::from_secs(3600));
        value.store(7, Ordering::SeqCst);
        writer.mark();
        tokio::time::timeout(Duration::from_secs(5), writer.shutdown())
            .await
            .expect("the shutdown does not wait for the delay")
            .unwrap();
        assert_eq!(saved_value(&path), 7);
        assert_eq!(writer.writes(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn dropping_the_writer_still_saves_what_is_pending() {
        let dir = temp_dir("drop");
        let path = dir.join("state.json");
        let (writer, value) = counter_writer(&path, Duration::from_secs(3600));
        value.store(3, Ordering::SeqCst);
        writer.mark();
        drop(writer);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !path.exists() {
            assert!(tokio::time::Instant::now() < deadline, "not written after the drop");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(saved_value(&path), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_write_replaces_the_whole_file_and_leaves_no_temporary_file() {
        let dir = temp_dir("atomic");
        let path = dir.join("state.json");
        write_atomically(&path, b"{\"value\": 1, \"padding\": \"a longer first version\"}").unwrap();
        write_atomically(&path, b"{\"value\": 2}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"value\": 2}");
        assert!(!temporary_path(&path).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_write_leaves_the_previous_file_whole() {
        let dir = temp_dir("failed");
        let path = dir.join("state.json");
        write_atomically(&path, b"{\"value\": 1}").unwrap();
        // The temporary file cannot be created (a directory is in its place): the write
        // fails before the rename, and the file keeps its previous content.
        std::fs::create_dir(temporary_path(&path)).unwrap();
        assert!(write_atomically(&path, b"{\"value\": 2}").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"value\": 1}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_by_flush_and_retried_on_the_next_change() {
        let dir = temp_dir("retry");
        let path = dir.join("state.json");
        std::fs::create_dir(temporary_path(&path)).unwrap();
        let (writer, value) = counter_writer(&path, Duration::from_millis(10));
        value.store(1, Ordering::SeqCst);
        writer.mark();
        assert!(matches!(writer.flush().await, Err(SimError::Save(_))));
        std::fs::remove_dir(temporary_path(&path)).unwrap();
        value.store(2, Ordering::SeqCst);
        writer.mark();
        writer.flush().await.unwrap();
        assert_eq!(saved_value(&path), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_state_file_needs_a_runtime_and_says_so() {
        let snapshot: Snapshot = Box::new(|| Ok(Vec::new()));
        let result = StateWriter::spawn(PathBuf::from("/nonexistent/state.json"), COALESCE_DELAY, snapshot);
        assert!(matches!(result, Err(SimError::Save(m)) if m.contains("Tokio runtime")));
    }
}
