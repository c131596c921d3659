//! Where a process stages the uploads it is receiving on local disk: `tmp/<id>/`, one directory
//! per process, owned while the process holds an exclusive `flock` on `tmp/<id>.lock`.
//!
//! Several processes open the same blob directory: replicas, and the one-shot commands an
//! operator runs beside a server (`retention`, `token create`, `stats`). Each removes, when it
//! opens the store, what a dead process left staged — and only that: a directory whose lock
//! nobody holds. (A v1 server staged straight into `tmp/`; such files go when they are a day
//! old, as on S3.) The lock file is created under another name, locked, then renamed into
//! place, so a cleaner never sees an owner's lock file before the owner holds it.

use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// Staged files older than this with no owner's lock (the v1 layout) are leftovers.
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// This process's staging directory; removed with its lock file when the last handle goes.
#[derive(Debug)]
pub(crate) struct StagingDir {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: std::fs::File,
}

impl StagingDir {
    /// Cleans what dead processes left under `tmp` and makes this process's own directory.
    pub(crate) fn create(tmp: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(tmp)?;
        clean(tmp);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let locking = tmp.join(format!("{id}.locking"));
        let lock = std::fs::OpenOptions::new().write(true).create_new(true).open(&locking)?;
        flock(&lock, FlockOperation::LockExclusive)?;
        let lock_path = tmp.join(format!("{id}.lock"));
        std::fs::rename(&locking, &lock_path)?;
        let dir = tmp.join(&id);
        std::fs::create_dir(&dir)?;
        Ok(Self { dir, lock_path, _lock: lock })
    }

    /// The directory staged files go to.
    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Removes the staging directories of processes that are gone, and old v1 leftovers.
fn clean(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    let old = |p: &Path| {
        std::fs::metadata(p).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|age| age > LEFTOVER_AGE))
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if let Some(id) = name.strip_suffix(".lock") {
            // Held: its owner is alive. Free: remove its directory, then the lock itself.
            let Ok(file) = std::fs::File::open(&path) else { continue };
            if flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok() {
                let _ = std::fs::remove_dir_all(tmp.join(id));
                let _ = std::fs::remove_file(&path);
            }
        } else if is_dir {
            // Without its lock file: left by a cleaner that stopped half-way.
            if !tmp.join(format!("{name}.lock")).exists() {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if old(&path) {
            // A `.locking` file whose owner died before renaming it, or a v1 staged file.
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_process_keeps_the_first_ones_staging_and_removes_a_dead_ones() {
        let root = tempfile::tempdir().unwrap();
        let tmp = root.path().join("tmp");
        let first = StagingDir::create(&tmp).unwrap();
        std::fs::write(first.path().join("upload"), b"in flight").unwrap();
        // A dead process's directory: its lock file exists, nobody holds it.
        std::fs::create_dir(tmp.join("dead")).unwrap();
        std::fs::write(tmp.join("dead").join("upload"), b"left behind").unwrap();
        std::fs::write(tmp.join("dead.lock"), b"").unwrap();
        // A v1 staged file, recent: it may be a running v1 server's.
        std::fs::write(tmp.join("v1-upload"), b"v1").unwrap();
        let second = StagingDir::create(&tmp).unwrap();
        assert!(first.path().join("upload").exists(), "a live process's upload is kept");
        assert!(!tmp.join("dead").exists() && !tmp.join("dead.lock").exists(), "a dead process's is removed");
        assert!(tmp.join("v1-upload").exists());
        assert_ne!(first.path(), second.path());
        let path = first.path().to_path_buf();
        drop(first);
        assert!(!path.exists(), "a process removes its own directory when it closes the store");
        drop(second);
        assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 1, "only the v1 file is left");
    }
}
