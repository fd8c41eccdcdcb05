//! The file system the daemon's own bookkeeping files live on (intent records, set-aside
//! descriptions, the node identity, the lease record), and reading one whole through it.
//!
//! Those files are written through a [`FileSystem`] the caller passes in, with the storage
//! crate's one durable replacement ([`narad_storage::fs::replace_file`]: a crash leaves the
//! old contents or the new, each whole) and [`FileSystem::sync_dir`], so tests can run them
//! on `narad_storage::fault::FaultFs` and crash them at every step. Production passes
//! [`real`], chosen where a data directory is opened.

use std::io;
use std::path::Path;
use std::sync::Arc;

use narad_storage::fs::{FileSystem, OpenMode, RealFs};

/// The operating system's file system: what every production caller passes for the
/// bookkeeping files, so their writes reach the disk the store's own files are on.
pub(crate) fn real() -> Arc<dyn FileSystem> {
    Arc::new(RealFs)
}

/// The whole contents of `path` on `fs`, as a reader sees them now. `NotFound` when the file
/// does not exist, so a caller can tell an absent record from an unreadable one.
pub(crate) fn read_whole(fs: &dyn FileSystem, path: &Path) -> io::Result<Vec<u8>> {
    let file = fs.open(path, OpenMode::Read)?;
    let len = usize::try_from(file.len()?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "file too large for this platform",
        )
    })?;
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}

/// The crash loop every bookkeeping record's tests share: a run of writes crashed at each of
/// its write and sync operations, in every crash mode.
#[cfg(test)]
pub(crate) mod crash_loop {
    use std::fmt::{Debug, Display};
    use std::path::Path;

    use narad_storage::fault::{CrashMode, FaultFs};
    use narad_storage::fs::{FileSystem, REPLACE_TEMP_SUFFIX};

    /// One record file and the run of writes that changes it.
    pub(crate) struct RecordRun<'a, S, R> {
        /// The directory holding the record.
        pub dir: &'a Path,
        /// The record's file name in it.
        pub file_name: &'a str,
        /// The steps of the run, in order.
        pub steps: &'a [S],
        /// `expected[i]` is the record before step `i`, `expected[i + 1]` the one after it.
        pub expected: &'a [R],
        /// A step written after a crash, and the record it leaves.
        pub again: (S, R),
    }

    /// Runs `run` on file systems made by `fresh`, crashed at every operation of a whole run
    /// and in every mode, and checks what the next start would read: the record before the
    /// step in progress or after it, whole (every earlier step reported success, so its
    /// record survived); nothing in the directory but the record and its unfinished temp
    /// file; and a new write over whatever the crash left survives the next crash.
    pub(crate) fn crash_at_every_operation<S, R, WE: Display, RE: Display>(
        run: &RecordRun<'_, S, R>,
        fresh: impl Fn() -> FaultFs,
        step: impl Fn(&FaultFs, &S) -> Result<(), WE>,
        read: impl Fn(&FaultFs) -> Result<R, RE>,
    ) where
        R: PartialEq + Debug,
    {
        assert_eq!(run.expected.len(), run.steps.len() + 1);
        let operations = {
            let fs = fresh();
            let before = fs.op_count();
            for s in run.steps {
                step(&fs, s).unwrap_or_else(|e| panic!("a run without a crash: {e}"));
            }
            fs.op_count() - before
        };
        assert!(operations >= 10, "a run takes {operations} operations");
        let temp = format!("{}{REPLACE_TEMP_SUFFIX}", run.file_name);
        let modes = CrashMode::SAMPLE;
        for crash_point in 1..=operations {
            for mode in modes {
                let fs = fresh();
                fs.crash_at(crash_point);
                let in_progress = run
                    .steps
                    .iter()
                    .position(|s| step(&fs, s).is_err() && fs.is_crashed());
                let context = format!(
                    "crash at operation {crash_point} of {operations} ({mode:?}), step {in_progress:?}"
                );
                let Some(i) = in_progress else {
                    panic!("{context}: the run finished without reaching the crash point");
                };
                fs.crash(mode);

                let got = read(&fs).unwrap_or_else(|e| panic!("{context}: {e}"));
                assert!(
                    got == run.expected[i] || got == run.expected[i + 1],
                    "{context}: found {got:?}, expected {:?} or {:?}",
                    run.expected[i],
                    run.expected[i + 1]
                );
                // A torn record would have been read as damage (moved aside, or unreadable).
                if let Ok(entries) = fs.read_dir(run.dir) {
                    for entry in entries {
                        assert!(
                            entry.name == run.file_name || entry.name == temp,
                            "{context}: {entry:?} in {}",
                            run.dir.display()
                        );
                    }
                }
                step(&fs, &run.again.0).unwrap_or_else(|e| panic!("{context}: {e}"));
                fs.crash(mode);
                let after = read(&fs).unwrap_or_else(|e| panic!("{context}: {e}"));
                assert_eq!(
                    after, run.again.1,
                    "{context}: the record written after the crash"
                );
            }
        }
    }
}
