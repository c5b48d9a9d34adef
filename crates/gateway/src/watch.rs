//! Changes to a registry folder, for `serve` and `worker` to reload on.
//!
//! On Linux the folder is watched with inotify directly, for files written and closed, created,
//! moved or deleted, and never for each write: the default store (`toolgate.db`) lives in the
//! folder, and a watch that reports modifications (the `notify` crate's always does) wakes for
//! every page SQLite appends to its WAL — under load, about 6 % of the gateway's CPU went to the
//! kernel queueing those events and a thread reading and discarding them. An editor's save
//! closes the file it wrote or moves a new one into place; both are seen. Elsewhere the `notify`
//! crate's watcher is used as it is.

use std::path::{Path, PathBuf};

use tokio::sync::mpsc::UnboundedSender;

/// Keeps a watch alive; the watch ends when this is dropped (and, on Linux, once the receiver
/// of its signals is gone).
pub(crate) struct Watch {
    _inner: Box<dyn Send>,
}

/// Sends `()` on `changed` each time a file of `dir` that `matters` (given its full path)
/// changes, for as long as the returned [`Watch`] lives and `changed` has a receiver.
pub(crate) fn watch(
    dir: &Path,
    matters: fn(&Path, &Path) -> bool,
    changed: UnboundedSender<()>,
) -> std::io::Result<Watch> {
    #[cfg(target_os = "linux")]
    {
        linux::watch(dir, matters, changed)
    }
    #[cfg(not(target_os = "linux"))]
    {
        portable::watch(dir, matters, changed)
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::ffi::OsStr;

    use futures_util::StreamExt;
    use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};

    use super::*;

    /// What is watched on each directory: no `MODIFY`, no `ACCESS`.
    fn mask() -> WatchMask {
        WatchMask::CLOSE_WRITE
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
    }

    /// Subdirectories that never hold registry files: toolgate's own state, version control.
    fn skipped(name: &OsStr) -> bool {
        let n = name.to_string_lossy();
        n == crate::reload::STATE_DIR || n.starts_with(".git")
    }

    /// Watches `dir` and every directory under it (but the skipped ones), recording each.
    fn add_tree(
        watches: &mut Watches,
        dirs: &mut HashMap<WatchDescriptor, PathBuf>,
        dir: &Path,
    ) -> std::io::Result<()> {
        let wd = watches.add(dir, mask())?;
        dirs.insert(wd, dir.to_path_buf());
        for entry in std::fs::read_dir(dir)?.flatten() {
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && !skipped(&entry.file_name()) {
                // A directory removed meanwhile is simply not watched.
                let _ = add_tree(watches, dirs, &entry.path());
            }
        }
        Ok(())
    }

    pub(super) fn watch(
        dir: &Path,
        matters: fn(&Path, &Path) -> bool,
        changed: UnboundedSender<()>,
    ) -> std::io::Result<Watch> {
        let inotify = Inotify::init()?;
        let mut watches = inotify.watches();
        let mut dirs = HashMap::new();
        add_tree(&mut watches, &mut dirs, dir)?;
        let mut events = inotify.into_event_stream([0u8; 4096])?;
        let root = dir.to_path_buf();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = changed.closed() => return,
                    e = events.next() => match e {
                        Some(Ok(e)) => e,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "registry folder watch failed: reload with SIGHUP");
                            return;
                        }
                        None => return,
                    },
                };
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    // Events were lost: something may have changed.
                    let _ = changed.send(());
                    continue;
                }
                let Some(parent) = dirs.get(&event.wd).cloned() else {
                    continue;
                };
                let Some(name) = event.name else {
                    continue;
                };
                let path = parent.join(&name);
                let new_dir = event.mask.contains(EventMask::ISDIR)
                    && event
                        .mask
                        .intersects(EventMask::CREATE | EventMask::MOVED_TO);
                if new_dir && !skipped(&name) {
                    let _ = add_tree(&mut events.watches(), &mut dirs, &path);
                    // Files may have been written into it before its watch was added.
                    let _ = changed.send(());
                } else if matters(&root, &path) {
                    let _ = changed.send(());
                }
            }
        });
        Ok(Watch {
            _inner: Box::new(()),
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod portable {
    use notify::{RecursiveMode, Watcher};

    use super::*;

    pub(super) fn watch(
        dir: &Path,
        matters: fn(&Path, &Path) -> bool,
        changed: UnboundedSender<()>,
    ) -> std::io::Result<Watch> {
        let root: PathBuf = dir.to_path_buf();
        let mut watcher =
            notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
                Ok(ev) if ev.kind.is_access() => {}
                Ok(ev) => {
                    if ev.paths.iter().any(|p| matters(&root, p)) {
                        let _ = changed.send(());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "file watch error"),
            })
            .map_err(std::io::Error::other)?;
        watcher
            .watch(dir, RecursiveMode::Recursive)
            .map_err(std::io::Error::other)?;
        Ok(Watch {
            _inner: Box::new(watcher),
        })
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use super::*;

    fn yaml(_root: &Path, p: &Path) -> bool {
        p.extension().is_some_and(|e| e == "yaml")
    }

    async fn next(rx: &mut tokio::sync::mpsc::UnboundedReceiver<()>) -> bool {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .is_ok()
    }

    /// A file written, one moved into place (an editor's atomic save) and one in a new
    /// subdirectory are each seen; appending to a file kept open (as SQLite does to its WAL) is
    /// not, however often.
    #[tokio::test]
    async fn saves_are_seen_and_writes_to_an_open_file_are_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("toolgate.yaml"), "a: 1\n").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _w = watch(dir.path(), yaml, tx).unwrap();

        std::fs::write(dir.path().join("toolgate.yaml"), "a: 2\n").unwrap();
        assert!(next(&mut rx).await, "a file written and closed");
        while rx.try_recv().is_ok() {}

        let tmp = dir.path().join(".toolgate.yaml.swp");
        std::fs::write(&tmp, "a: 3\n").unwrap();
        std::fs::rename(&tmp, dir.path().join("toolgate.yaml")).unwrap();
        assert!(next(&mut rx).await, "a file moved into place");
        while rx.try_recv().is_ok() {}

        std::fs::create_dir(dir.path().join("tools")).unwrap();
        std::fs::write(dir.path().join("tools/more.yaml"), "tools: []\n").unwrap();
        assert!(next(&mut rx).await, "a file in a new directory");
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::fs::write(dir.path().join("tools/more.yaml"), "tools: [] # again\n").unwrap();
        assert!(
            next(&mut rx).await,
            "a file in that directory written again"
        );
        while rx.try_recv().is_ok() {}

        // A store's WAL, appended to through a file kept open: no signal at all.
        // (Named .yaml, so that a signal, if one came, would count.)
        use std::io::Write as _;
        let mut wal = std::fs::File::create(dir.path().join("store.yaml")).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        while rx.try_recv().is_ok() {}
        for _ in 0..200 {
            wal.write_all(&[0u8; 4096]).unwrap();
        }
        wal.sync_data().unwrap();
        let quiet = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
        assert!(quiet.is_err(), "appends to an open file sent a signal");
    }
}
