//! The disk's own sync costs, measured in the bench directory before a fan-out: what an
//! offset-file advance (a 256-byte in-place write + `fdatasync`) and a child commit of about
//! one slab (a 512 KiB append + `fdatasync`) take here. From them follows the I/O ceiling of
//! one cursor: a slab of 4,096 records needs one of each, one after the other.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{BenchError, per_second};
use narad_host::fanout::SLAB_MAX_RECORDS;

/// Bytes of the in-place write: the size of an offset-file record region.
const IN_PLACE_BYTES: usize = 256;
/// Bytes of the append: about one slab of 4,096 records of 116 bytes plus framing.
const APPEND_BYTES: usize = 512 * 1024;
/// Samples of each kind; the median is reported.
const SAMPLES: usize = 40;

/// Median sync costs of this disk.
#[derive(Clone, Debug, Serialize)]
pub struct SyncCosts {
    /// 256-byte in-place `pwrite` + `fdatasync`, milliseconds (median).
    pub in_place_256b_ms: f64,
    /// 512 KiB append + `fdatasync`, milliseconds (median).
    pub append_512kib_ms: f64,
    /// 4,096 records over the sum of the two: one cursor's I/O ceiling in records per second.
    pub one_cursor_ceiling_records_per_s: f64,
}

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort_unstable();
    samples
        .get(samples.len() / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Measures both costs with files in `dir` (removed afterwards).
pub fn measure(dir: &Path) -> Result<SyncCosts, BenchError> {
    let path = dir.join("sync-costs.bin");
    let file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(BenchError::io(format!("creating {}", path.display())))?;
    let io = BenchError::io(format!("writing {}", path.display()));
    let result = (|| {
        let small = vec![0x5Au8; IN_PLACE_BYTES];
        file.write_all_at(&small, 0)?;
        file.sync_all()?;
        let mut in_place = Vec::with_capacity(SAMPLES);
        for i in 0..SAMPLES {
            let start = Instant::now();
            file.write_all_at(&small[..IN_PLACE_BYTES - (i % 2)], 0)?;
            file.sync_data()?;
            in_place.push(start.elapsed());
        }
        let big = vec![0xA5u8; APPEND_BYTES];
        let mut at = IN_PLACE_BYTES as u64;
        let mut append = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let start = Instant::now();
            file.write_all_at(&big, at)?;
            file.sync_data()?;
            append.push(start.elapsed());
            at += APPEND_BYTES as u64;
        }
        Ok::<_, std::io::Error>((median(in_place), median(append)))
    })();
    let removed = std::fs::remove_file(&path);
    let (in_place_256b_ms, append_512kib_ms) = result.map_err(io)?;
    removed.map_err(BenchError::io(format!("removing {}", path.display())))?;
    Ok(SyncCosts {
        in_place_256b_ms,
        append_512kib_ms,
        one_cursor_ceiling_records_per_s: per_second(
            SLAB_MAX_RECORDS as f64 * 1e3,
            in_place_256b_ms + append_512kib_ms,
        ),
    })
}

/// [`measure`] in `work`, on the blocking pool, with a progress line of what it found: the
/// first step of every bench that compares against the disk.
pub async fn measure_and_report(
    work: &super::workdir::WorkDir,
    progress: &mut super::progress::Progress,
) -> Result<SyncCosts, BenchError> {
    let dir = work.path_buf();
    let disk = super::blocking(move || measure(&dir)).await??;
    progress.step(&format!(
        "disk: 256-byte in-place fdatasync {:.2} ms, 512 KiB append + fdatasync {:.2} ms",
        disk.in_place_256b_ms, disk.append_512kib_ms
    ));
    Ok(disk)
}
