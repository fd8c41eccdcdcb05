//! `FaultFs`: an in-memory file system for tests that fails chosen operations and simulates
//! power loss.
//!
//! Model. Every file keeps two images: what a reader sees now, and what is on stable storage.
//! Writes and truncations go to a per-file list of pending operations; `sync_data` moves them to
//! the durable image. Directories likewise keep their current entries and their durable entries;
//! `sync_dir` makes the current entries durable. Directories and files are inodes, so a rename
//! moves a whole subtree the way a real file system does.
//!
//! Hard links are second entries for the same file inode.
//!
//! Faults. [`FaultFs::inject`] fails the N-th future operation of a kind with EIO, ENOSPC or a
//! short write. A failed `sync_data` behaves like Linux after a writeback error: the pending
//! writes stay readable but are forgotten by the disk (they will not be written by a later
//! sync), which is why the log never retries an fsync on the same handle as if the data were
//! safe. [`Fault::LostWrite`] is the worse case ext4 produces when it cannot convert unwritten
//! extents: the `sync_data` reports success and the writes are forgotten all the same.
//!
//! The page cache. What a reader sees (`read_at`) is the cache: it keeps forgotten writes.
//! `read_exact_uncached_at` and `drop_cache` show what the device holds: the durable image
//! with the still-pending (dirty) writes on top, at the file's current length (bytes the device
//! never got read as zeros), as Linux does after a failed writeback.
//!
//! Crashes. [`FaultFs::crash_at`] makes the N-th future mutating operation and everything after
//! it fail (the process "dies" there). [`FaultFs::crash`] then builds the state a power loss
//! could leave: each pending write kept, dropped or torn, each unsynced directory entry kept or
//! lost, per the [`CrashMode`]; handles opened before the crash stop working and locks are
//! released, so a store can be reopened on the result.
//!
//! Holds. [`FaultFs::hold_next_sync`] stops the next `sync_data` of any file, before it takes
//! effect, until the test releases it: a test can line other operations up behind a sync in
//! progress (appends queueing for a group commit) without sleeping.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::fs::{DirEntry, File, FileSystem, LockGuard, Metadata, OpenMode};

/// A `sync_data` stopped by [`FaultFs::hold_next_sync`]; released by [`SyncHold::release`] or
/// on drop (so a failing test does not leave a thread stopped).
pub struct SyncHold {
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    /// (a sync is stopped here, released)
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Gate {
    fn stop_here(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 = true;
        self.changed.notify_all();
        while !s.1 {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl SyncHold {
    /// Waits until a `sync_data` is stopped at this hold; false if `timeout` passes first.
    pub fn wait_until_held(&self, timeout: Duration) -> bool {
        let s = self.gate.state.lock().unwrap_or_else(|p| p.into_inner());
        let (s, _) = self
            .gate
            .changed
            .wait_timeout_while(s, timeout, |s| !s.0)
            .unwrap_or_else(|p| p.into_inner());
        s.0
    }

    /// Lets the stopped `sync_data` (or the next one to reach this hold) go on.
    pub fn release(&self) {
        let mut s = self.gate.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 = true;
        self.gate.changed.notify_all();
    }
}

impl Drop for SyncHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// Linux `EIO`.
const EIO: i32 = 5;
/// Linux `ENOSPC`.
const ENOSPC: i32 = 28;

/// Which operations a planned fault counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    /// `File::write_at` (every call, including the continuation of a short write).
    Write,
    /// `File::sync_data`.
    SyncData,
    /// `FileSystem::sync_dir`.
    SyncDir,
    /// Any mutating operation (writes, truncations, syncs, creations, renames, links, removals).
    Any,
}

/// The failure to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The operation fails with EIO and has no effect (for `sync_data`: the pending writes are
    /// forgotten by the disk but stay readable, as on Linux).
    Eio,
    /// The operation fails with ENOSPC and has no effect (for `sync_data`: as for EIO).
    Enospc,
    /// A write stores only the first half of its buffer and reports that length; other
    /// operations treat it as EIO.
    ShortWrite,
    /// `sync_data` reports success, but its pending writes never reach the disk: they stay
    /// readable from the cache until it is dropped, and are gone after a crash (ext4's "failed
    /// to convert unwritten extents" case). Other operations treat it as EIO.
    LostWrite,
}

/// What a simulated power loss does to unsynced state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every pending write and directory change reached the disk.
    KeepAll,
    /// None did: only synced state survives.
    DropAll,
    /// Each pending write is independently kept, dropped, or torn (a prefix kept), and each
    /// unsynced directory entry kept or lost, chosen by a generator seeded with the value.
    Tear(u64),
}

impl CrashMode {
    /// The modes a crash loop tries at every crash point: both extremes and four seeded tears.
    pub const SAMPLE: [CrashMode; 6] = [
        CrashMode::DropAll,
        CrashMode::KeepAll,
        CrashMode::Tear(1),
        CrashMode::Tear(2),
        CrashMode::Tear(3),
        CrashMode::Tear(4),
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    File(u64),
    Dir(u64),
}

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct FileInode {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Clone, Debug, Default)]
struct DirInode {
    entries: BTreeMap<String, Node>,
    durable: BTreeMap<String, Node>,
}

#[derive(Debug)]
struct Planned {
    op: FaultOp,
    remaining: u64,
    fault: Fault,
}

#[derive(Debug)]
struct State {
    generation: u64,
    files: HashMap<u64, FileInode>,
    dirs: HashMap<u64, DirInode>,
    next_ino: u64,
    ops: u64,
    planned: Vec<Planned>,
    crash_at: Option<u64>,
    crashed: bool,
    locks: HashMap<PathBuf, u64>,
    next_lock: u64,
}

const ROOT: u64 = 0;

/// The in-memory fault-injecting file system. Cloning shares the same state.
#[derive(Clone)]
pub struct FaultFs {
    /// The gate the next `sync_data` stops at, when one is armed.
    hold: Arc<Mutex<Option<Arc<Gate>>>>,
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for FaultFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultFs").finish_non_exhaustive()
    }
}

impl Default for FaultFs {
    fn default() -> Self {
        Self::new()
    }
}

fn os_err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} does not exist", path.display()),
    )
}

fn components(path: &Path) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(s) => out.push(
                s.to_str()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "non-UTF-8 path"))?
                    .to_string(),
            ),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "FaultFs needs absolute normalised paths, got {}",
                        path.display()
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// A small deterministic generator (splitmix64) so a tear is reproducible from its seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

fn apply(image: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write { offset, bytes } => {
            let start = usize::try_from(*offset).unwrap_or(usize::MAX);
            let end = start.saturating_add(bytes.len());
            if image.len() < end {
                image.resize(end, 0);
            }
            image[start..end].copy_from_slice(bytes);
        }
        Pending::SetLen(len) => image.resize(usize::try_from(*len).unwrap_or(usize::MAX), 0),
    }
}

/// What the device holds of `file`: the durable image, the pending (dirty) writes on top, at
/// the length a reader sees now (zeros where the device has nothing).
fn device_image(file: &FileInode) -> Vec<u8> {
    let mut image = file.durable.clone();
    for op in &file.pending {
        apply(&mut image, op);
    }
    image.resize(file.data.len(), 0);
    image
}

impl State {
    /// Counts a mutating operation and decides whether it fails.
    fn begin(&mut self, kind: FaultOp) -> io::Result<Option<Fault>> {
        if self.crashed {
            return Err(os_err(EIO));
        }
        self.ops += 1;
        if let Some(at) = self.crash_at
            && self.ops >= at
        {
            self.crashed = true;
            self.crash_at = None;
            return Err(os_err(EIO));
        }
        let mut hit = None;
        for p in &mut self.planned {
            if p.remaining > 0 && (p.op == FaultOp::Any || p.op == kind) {
                p.remaining -= 1;
                if p.remaining == 0 && hit.is_none() {
                    hit = Some(p.fault);
                }
            }
        }
        self.planned.retain(|p| p.remaining > 0);
        Ok(hit)
    }

    fn check_alive(&self, generation: u64) -> io::Result<()> {
        if self.crashed || generation != self.generation {
            return Err(io::Error::other(
                "FaultFs: the file system crashed; this handle is gone",
            ));
        }
        Ok(())
    }

    fn lookup(&self, path: &Path) -> io::Result<Node> {
        let mut node = Node::Dir(ROOT);
        for name in components(path)? {
            let Node::Dir(d) = node else {
                return Err(not_found(path));
            };
            node = *self
                .dirs
                .get(&d)
                .and_then(|dir| dir.entries.get(&name))
                .ok_or_else(|| not_found(path))?;
        }
        Ok(node)
    }

    fn parent_of(&self, path: &Path) -> io::Result<(u64, String)> {
        let mut parts = components(path)?;
        let name = parts
            .pop()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the root has no parent"))?;
        let mut node = Node::Dir(ROOT);
        for part in parts {
            let Node::Dir(d) = node else {
                return Err(not_found(path));
            };
            node = *self
                .dirs
                .get(&d)
                .and_then(|dir| dir.entries.get(&part))
                .ok_or_else(|| not_found(path))?;
        }
        match node {
            Node::Dir(d) => Ok((d, name)),
            Node::File(_) => Err(not_found(path)),
        }
    }

    fn alloc(&mut self) -> u64 {
        self.next_ino += 1;
        self.next_ino
    }

    fn dir_mut(&mut self, d: u64) -> io::Result<&mut DirInode> {
        self.dirs
            .get_mut(&d)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "directory inode vanished"))
    }

    fn file_mut(&mut self, ino: u64) -> io::Result<&mut FileInode> {
        self.files
            .get_mut(&ino)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "file inode vanished"))
    }
}

impl FaultFs {
    /// An empty file system holding only the root directory `/` (durable).
    pub fn new() -> Self {
        let mut dirs = HashMap::new();
        dirs.insert(ROOT, DirInode::default());
        FaultFs {
            hold: Arc::default(),
            state: Arc::new(Mutex::new(State {
                generation: 0,
                files: HashMap::new(),
                dirs,
                next_ino: ROOT,
                ops: 0,
                planned: Vec::new(),
                crash_at: None,
                crashed: false,
                locks: HashMap::new(),
                next_lock: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock only happens inside a failing test; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the next `sync_data` (of any file) before it takes effect, until the returned
    /// hold is released or dropped.
    pub fn hold_next_sync(&self) -> SyncHold {
        let gate = Arc::new(Gate::default());
        *self.hold.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&gate));
        SyncHold { gate }
    }

    /// Number of mutating operations performed so far (the index space of `crash_at`).
    pub fn op_count(&self) -> u64 {
        self.lock().ops
    }

    /// Fails the `nth` (1-based) future operation counted by `op` with `fault`.
    pub fn inject(&self, op: FaultOp, nth: u64, fault: Fault) {
        self.lock().planned.push(Planned {
            op,
            remaining: nth.max(1),
            fault,
        });
    }

    /// Removes every planned fault that has not fired yet.
    pub fn clear_faults(&self) {
        self.lock().planned.clear();
    }

    /// The `nth` (1-based) future mutating operation fails, and so does every operation after
    /// it until [`FaultFs::crash`]: the process died at that point.
    pub fn crash_at(&self, nth: u64) {
        let mut s = self.lock();
        s.crash_at = Some(s.ops + nth.max(1));
    }

    /// True once a `crash_at` point has been reached.
    pub fn is_crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Simulates a power loss now: builds what stable storage holds per `mode`, invalidates
    /// every open handle, releases every lock and clears planned faults. The file system is then
    /// usable again, as after a reboot.
    pub fn crash(&self, mode: CrashMode) {
        let mut s = self.lock();
        let mut rng = SplitMix(match mode {
            CrashMode::Tear(seed) => seed,
            _ => 0,
        });
        for file in s.files.values_mut() {
            let mut image = std::mem::take(&mut file.durable);
            for op in std::mem::take(&mut file.pending) {
                match mode {
                    CrashMode::KeepAll => apply(&mut image, &op),
                    CrashMode::DropAll => {}
                    CrashMode::Tear(_) => match (rng.below(3), op) {
                        (0, op) => apply(&mut image, &op),
                        (1, _) => {}
                        (_, Pending::Write { offset, bytes }) => {
                            let keep =
                                usize::try_from(rng.below(bytes.len() as u64 + 1)).unwrap_or(0);
                            apply(
                                &mut image,
                                &Pending::Write {
                                    offset,
                                    bytes: bytes[..keep].to_vec(),
                                },
                            );
                        }
                        (_, op) => apply(&mut image, &op),
                    },
                }
            }
            file.data = image.clone();
            file.durable = image;
        }
        for dir in s.dirs.values_mut() {
            let entries = match mode {
                CrashMode::KeepAll => dir.entries.clone(),
                CrashMode::DropAll => dir.durable.clone(),
                CrashMode::Tear(_) => {
                    let names: BTreeSet<String> = dir
                        .entries
                        .keys()
                        .chain(dir.durable.keys())
                        .cloned()
                        .collect();
                    let mut out = BTreeMap::new();
                    for name in names {
                        let pick = if rng.below(2) == 0 {
                            dir.entries.get(&name)
                        } else {
                            dir.durable.get(&name)
                        };
                        if let Some(node) = pick {
                            out.insert(name, *node);
                        }
                    }
                    out
                }
            };
            dir.durable = entries.clone();
            dir.entries = entries;
        }
        s.generation += 1;
        s.crashed = false;
        s.crash_at = None;
        s.planned.clear();
        s.locks.clear();
    }

    /// The bytes a reader of `path` would see now (for test assertions).
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let s = self.lock();
        match s.lookup(path)? {
            Node::File(ino) => Ok(s
                .files
                .get(&ino)
                .map(|f| f.data.clone())
                .unwrap_or_default()),
            Node::Dir(_) => Err(io::Error::new(io::ErrorKind::InvalidInput, "a directory")),
        }
    }
}

#[derive(Debug)]
struct FaultFile {
    fs: FaultFs,
    ino: u64,
    generation: u64,
    writable: bool,
}

impl FaultFile {
    fn writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "file opened read-only",
            ))
        }
    }
}

impl File for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        let file = s.file_mut(self.ino)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        if start >= file.data.len() {
            return Ok(0);
        }
        let n = buf.len().min(file.data.len() - start);
        buf[..n].copy_from_slice(&file.data[start..start + n]);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        self.writable()?;
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        let n = match s.begin(FaultOp::Write)? {
            None => buf.len(),
            Some(Fault::Eio | Fault::LostWrite) => return Err(os_err(EIO)),
            Some(Fault::Enospc) => return Err(os_err(ENOSPC)),
            Some(Fault::ShortWrite) => (buf.len() / 2).max(1).min(buf.len()),
        };
        let file = s.file_mut(self.ino)?;
        let op = Pending::Write {
            offset,
            bytes: buf[..n].to_vec(),
        };
        apply(&mut file.data, &op);
        file.pending.push(op);
        Ok(n)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        if let Some(f) = s.begin(FaultOp::Any)? {
            return Err(os_err(if f == Fault::Enospc { ENOSPC } else { EIO }));
        }
        let file = s.file_mut(self.ino)?;
        let op = Pending::SetLen(len);
        apply(&mut file.data, &op);
        file.pending.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let gate = self
            .fs
            .hold
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(gate) = gate {
            gate.stop_here();
        }
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        let fault = s.begin(FaultOp::SyncData)?;
        let file = s.file_mut(self.ino)?;
        let pending = std::mem::take(&mut file.pending);
        match fault {
            None => {
                for op in &pending {
                    apply(&mut file.durable, op);
                }
                Ok(())
            }
            // Writeback failed: the disk never gets these writes, though readers still see
            // them in the "page cache" (file.data).
            Some(Fault::Enospc) => Err(os_err(ENOSPC)),
            // The same loss, reported as success.
            Some(Fault::LostWrite) => Ok(()),
            Some(_) => Err(os_err(EIO)),
        }
    }

    fn read_uncached_into<'s>(
        &self,
        scratch: &'s mut Vec<u8>,
        len: usize,
        offset: u64,
    ) -> io::Result<&'s [u8]> {
        crate::fs::read_into_prefix(scratch, len, |buf| self.read_exact_uncached_at(buf, offset))
    }

    fn read_exact_uncached_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        let image = device_image(s.file_mut(self.ino)?);
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start.checked_add(buf.len()) {
            Some(end) if end <= image.len() => {
                buf.copy_from_slice(&image[start..end]);
                Ok(())
            }
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file ended before the requested bytes",
            )),
        }
    }

    fn drop_cache(&self) -> io::Result<()> {
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        let file = s.file_mut(self.ino)?;
        file.data = device_image(file);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let mut s = self.fs.lock();
        s.check_alive(self.generation)?;
        Ok(s.file_mut(self.ino)?.data.len() as u64)
    }
}

#[derive(Debug)]
struct FaultLock {
    fs: FaultFs,
    path: PathBuf,
    id: u64,
}

impl LockGuard for FaultLock {}

impl Drop for FaultLock {
    fn drop(&mut self) {
        let mut s = self.fs.lock();
        if s.locks.get(&self.path) == Some(&self.id) {
            s.locks.remove(&self.path);
        }
    }
}

fn fault_error(f: Fault) -> io::Error {
    os_err(if f == Fault::Enospc { ENOSPC } else { EIO })
}

impl FileSystem for FaultFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn File>> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let existing = s.lookup(path);
        let ino = match (existing, mode) {
            (Ok(Node::Dir(_)), _) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{} is a directory", path.display()),
                ));
            }
            (Ok(Node::File(_)), OpenMode::CreateNew) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists", path.display()),
                ));
            }
            (Ok(Node::File(ino)), _) => ino,
            (Err(e), OpenMode::Read | OpenMode::ReadWrite) => return Err(e),
            (Err(_), OpenMode::CreateReadWrite | OpenMode::CreateNew) => {
                let (dir, name) = s.parent_of(path)?;
                if let Some(f) = s.begin(FaultOp::Any)? {
                    return Err(fault_error(f));
                }
                let ino = s.alloc();
                s.files.insert(ino, FileInode::default());
                s.dir_mut(dir)?.entries.insert(name, Node::File(ino));
                ino
            }
        };
        Ok(Box::new(FaultFile {
            fs: self.clone(),
            ino,
            generation: s.generation,
            writable: mode != OpenMode::Read,
        }))
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let s = self.lock();
        s.check_alive(s.generation)?;
        Ok(match s.lookup(path)? {
            Node::Dir(_) => Metadata {
                len: 0,
                is_dir: true,
            },
            Node::File(ino) => Metadata {
                len: s.files.get(&ino).map_or(0, |f| f.data.len() as u64),
                is_dir: false,
            },
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let (from_dir, from_name) = s.parent_of(from)?;
        let (to_dir, to_name) = s.parent_of(to)?;
        s.lookup(from)?;
        if let Some(f) = s.begin(FaultOp::Any)? {
            return Err(fault_error(f));
        }
        let node = s
            .dir_mut(from_dir)?
            .entries
            .remove(&from_name)
            .ok_or_else(|| not_found(from))?;
        s.dir_mut(to_dir)?.entries.insert(to_name, node);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let (dir, name) = s.parent_of(path)?;
        match s.lookup(path)? {
            Node::File(_) => {}
            Node::Dir(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{} is a directory", path.display()),
                ));
            }
        }
        if let Some(f) = s.begin(FaultOp::Any)? {
            return Err(fault_error(f));
        }
        s.dir_mut(dir)?.entries.remove(&name);
        Ok(())
    }

    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let node = s.lookup(original)?;
        if let Node::Dir(_) = node {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", original.display()),
            ));
        }
        let (dir, name) = s.parent_of(link)?;
        if s.lookup(link).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", link.display()),
            ));
        }
        if let Some(f) = s.begin(FaultOp::Any)? {
            return Err(fault_error(f));
        }
        // A second entry for the same inode: both names see the same bytes, and the new entry
        // is lost by a crash until its directory is synced, as on a real file system.
        s.dir_mut(dir)?.entries.insert(name, node);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let (dir, name) = s.parent_of(path)?;
        s.lookup(path)?;
        if let Some(f) = s.begin(FaultOp::Any)? {
            return Err(fault_error(f));
        }
        // Unlinking the top entry is enough: the subtree becomes unreachable, and removing a
        // whole tree is one directory change in this model.
        s.dir_mut(dir)?.entries.remove(&name);
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        let s = self.lock();
        s.check_alive(s.generation)?;
        match s.lookup(path)? {
            Node::Dir(d) => Ok(s
                .dirs
                .get(&d)
                .map(|dir| {
                    dir.entries
                        .iter()
                        .map(|(name, node)| DirEntry {
                            name: name.clone(),
                            is_dir: matches!(node, Node::Dir(_)),
                        })
                        .collect()
                })
                .unwrap_or_default()),
            Node::File(_) => Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is a file", path.display()),
            )),
        }
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let mut current = ROOT;
        for name in components(path)? {
            let next = s
                .dirs
                .get(&current)
                .and_then(|d| d.entries.get(&name))
                .copied();
            current = match next {
                Some(Node::Dir(d)) => d,
                Some(Node::File(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{name} in {} is a file", path.display()),
                    ));
                }
                None => {
                    if let Some(f) = s.begin(FaultOp::Any)? {
                        return Err(fault_error(f));
                    }
                    let ino = s.alloc();
                    s.dirs.insert(ino, DirInode::default());
                    s.dir_mut(current)?.entries.insert(name, Node::Dir(ino));
                    ino
                }
            };
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.check_alive(s.generation)?;
        let Node::Dir(d) = s.lookup(path)? else {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is a file", path.display()),
            ));
        };
        if let Some(f) = s.begin(FaultOp::SyncDir)? {
            return Err(fault_error(f));
        }
        let dir = s.dir_mut(d)?;
        dir.durable = dir.entries.clone();
        Ok(())
    }

    fn try_lock_exclusive(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        drop(self.open(path, OpenMode::CreateReadWrite)?);
        let mut s = self.lock();
        if s.locks.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the lock is held by another open file",
            ));
        }
        s.next_lock += 1;
        let id = s.next_lock;
        s.locks.insert(path.to_path_buf(), id);
        Ok(Box::new(FaultLock {
            fs: self.clone(),
            path: path.to_path_buf(),
            id,
        }))
    }
}

#[cfg(test)]
mod tests;
