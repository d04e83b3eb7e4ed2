//! The service ports' names (`namespace/name:port`, one per service index), kept beside
//! the pins for `xlb list` and `xlb trace`: the datapath never reads them, so no kernel map
//! holds them (the retired `XLB_SVCNAME_V1` did: 132 B of kernel memory per service port;
//! `datapath::upgrade` moves its names here). As the failing frontends'
//! (`datapath::status_file`), the file is on a tmpfs under [`DIR`], named after the pin
//! directory: gone at reboot as the pins are, readable while the agent is stopped, removed
//! by `xlb cleanup` with the pins. The agent's metrics take the names from its own memory
//! ([`ServiceNames`]), not from here.
//!
//! **Format: an append-only log of JSON lines**, one record a line:
//! `{"id":7,"name":"ns/web:http"}` names service index 7 (replacing any earlier name),
//! `{"id":7,"name":null}` says it has none any more. A reader takes the last record of each
//! id and skips any line that does not parse (a torn tail after a crash, a garbled line).
//! Why: a change of one service appends one line (O(1)); a file rewritten whole would cost
//! O(services) per change (about 4 MB at 100,000 service ports). The file is compacted —
//! its live records written whole to a temporary file renamed over it, so a reader sees the
//! old file or the new one — when the lines it no longer needs (replaced, removed,
//! garbled) outnumber the live ones (and are at least [`COMPACT_MIN`]): it stays under
//! about twice its live records, and a compaction, O(live), follows at least as many
//! appends: O(1) amortized per change. An append that fails partway (`ENOSPC` on a full
//! /run) is cut back off, so the file stays as it was and the next append starts on a line
//! of its own; the agent also compacts a file it finds with a torn tail (a crash
//! mid-append, or a cut that failed). JSON lines: any tool reads them
//! (`jq -s 'group_by(.id) | map(last)'`), and a name needs no escaping rules of ours.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    fs::File,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use serde::{Deserialize, Serialize};

use crate::desired::Dense;

/// Where the files are (a tmpfs: gone at reboot, as the pins are).
pub const DIR: &str = "/run/xlb/names";

/// Lines no longer needed that a file keeps at least before it is compacted (a few
/// services that come and go do not rewrite it each time).
pub const COMPACT_MIN: usize = 64;

/// The file of pin directory `pins` (`/sys/fs/bpf/xlb` →
/// `/run/xlb/names/_sys_fs_bpf_xlb.jsonl`).
pub fn path(pins: &Path) -> PathBuf {
    super::status_file::beside(DIR, pins, "jsonl")
}

/// One line.
#[derive(Debug, Serialize, Deserialize)]
struct Record<'a> {
    id: u32,
    /// None: the index has no name any more.
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
}

/// What a file holds.
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed {
    /// The last name of each id that has one.
    names: BTreeMap<u32, String>,
    /// Lines (records, and lines that do not parse).
    lines: usize,
    /// It does not end with a newline (a record cut short).
    torn: bool,
}

fn parse(bytes: &[u8]) -> Parsed {
    let mut p = Parsed {
        torn: !bytes.is_empty() && !bytes.ends_with(b"\n"),
        ..Parsed::default()
    };
    for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        p.lines += 1;
        match serde_json::from_slice::<Record>(line) {
            Ok(Record { id, name: Some(n) }) => {
                p.names.insert(id, n.into_owned());
            }
            Ok(Record { id, name: None }) => {
                p.names.remove(&id);
            }
            Err(_) => {}
        }
    }
    p
}

fn read_parsed(path: &Path) -> io::Result<Option<Parsed>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(parse(&bytes))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The names `pins`' agent recorded, by service index; none when there is no file (no
/// agent of this version ran with these pins, or /run was emptied).
pub fn read(pins: &Path) -> io::Result<Option<BTreeMap<u32, String>>> {
    Ok(read_parsed(&path(pins))?.map(|p| p.names))
}

/// Appends `records`' lines to `buf`.
fn lines<'a>(buf: &mut Vec<u8>, records: impl IntoIterator<Item = (u32, Option<&'a str>)>) {
    for (id, name) in records {
        let r = Record {
            id,
            name: name.map(Cow::Borrowed),
        };
        // A struct of a number and a string: serializing it cannot fail.
        if serde_json::to_writer(&mut *buf, &r).is_ok() {
            buf.push(b'\n');
        }
    }
}

/// Writes `names` as the whole file at `path` (a temporary file renamed over it).
fn write_whole<'a>(
    path: &Path,
    names: impl IntoIterator<Item = (u32, &'a str)>,
) -> io::Result<usize> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut buf = Vec::new();
    let mut n = 0;
    lines(
        &mut buf,
        names.into_iter().map(|(id, name)| {
            n += 1;
            (id, Some(name))
        }),
    );
    let tmp = path.with_extension("jsonl.tmp");
    std::fs::write(&tmp, &buf)?;
    std::fs::rename(&tmp, path)?;
    Ok(n)
}

/// Writes `names` as the whole file of `pins` (an upgrade's names, taken from the retired
/// map); returns how many.
pub fn replace<'a>(
    pins: &Path,
    names: impl IntoIterator<Item = (u32, &'a str)>,
) -> io::Result<usize> {
    write_whole(&path(pins), names)
}

/// Removes the file (with the pins).
pub fn remove(pins: &Path) -> io::Result<()> {
    match std::fs::remove_file(path(pins)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The names as the agent holds them, service index → name, shared with the metrics'
/// per-service series: kept up to date by every write of the log that feeds it.
pub type ServiceNames = Arc<RwLock<BTreeMap<u32, Box<str>>>>;

/// The agent's writer of the file: opened (read, compacted when it must be) at its first
/// write, so a reader of the maps (`xlb list`) never writes it.
#[derive(Debug)]
pub struct NamesLog {
    path: PathBuf,
    open: Option<Open>,
    shared: Option<ServiceNames>,
}

#[derive(Debug)]
struct Open {
    /// Appends (`O_APPEND`: each write lands whole at the end).
    file: File,
    /// The service indices that have a name.
    live: Dense<()>,
    /// Lines in the file.
    lines: usize,
}

impl Open {
    /// Lines the file no longer needs.
    fn dead(&self) -> usize {
        self.lines.saturating_sub(self.live.len())
    }

    fn due(&self) -> bool {
        self.dead() > self.live.len().max(COMPACT_MIN)
    }
}

/// A file appended to, as [`append`] needs it (a test's fails halfway).
trait AppendFile: Write {
    /// Its length.
    fn end(&self) -> io::Result<u64>;
    /// Cuts it back to `len`.
    fn cut(&self, len: u64) -> io::Result<()>;
}

impl AppendFile for File {
    fn end(&self) -> io::Result<u64> {
        self.metadata().map(|m| m.len())
    }

    fn cut(&self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }
}

/// An append that failed: its error, and whether it left a torn record behind (the cut
/// failed too).
#[derive(Debug)]
struct AppendFailed {
    error: io::Error,
    torn: bool,
}

/// Appends `buf` whole, or leaves the file as it was: a write that fails partway (`ENOSPC`
/// on a full /run, after part of `buf` landed) has what it wrote cut off, else the torn
/// record would glue the next append's first line to it and both would be lost.
fn append(f: &mut impl AppendFile, buf: &[u8]) -> Result<(), AppendFailed> {
    let failed = |error, torn| AppendFailed { error, torn };
    let end = f.end().map_err(|e| failed(e, false))?;
    let Err(error) = f.write_all(buf) else {
        return Ok(());
    };
    let torn = match f.cut(end) {
        Ok(()) => false,
        Err(cut) => {
            tracing::warn!(
                "names file: cutting off a failed append ({error}) failed: {cut}; compacted at the next write"
            );
            true
        }
    };
    Err(failed(error, torn))
}

fn append_handle(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    File::options().append(true).create(true).open(path)
}

/// The file at `path` rewritten to hold `names` only, open for appends.
fn compacted(path: &Path, names: &BTreeMap<u32, String>) -> io::Result<Open> {
    let lines = write_whole(path, names.iter().map(|(id, n)| (*id, n.as_str())))?;
    let mut live = Dense::default();
    for id in names.keys() {
        live.insert(*id, ());
    }
    Ok(Open {
        file: append_handle(path)?,
        live,
        lines,
    })
}

impl NamesLog {
    /// The log of pin directory `pins` (nothing is read or written yet).
    pub fn new(pins: &Path) -> Self {
        Self {
            path: path(pins),
            open: None,
            shared: None,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The names in the file (as [`read`]).
    pub fn read(&self) -> io::Result<Option<BTreeMap<u32, String>>> {
        Ok(read_parsed(&self.path)?.map(|p| p.names))
    }

    /// Reads the file, compacting it when it is due or torn.
    fn open(&mut self) -> io::Result<&mut Open> {
        if self.open.is_none() {
            let parsed = read_parsed(&self.path)?.unwrap_or_default();
            let mut live = Dense::default();
            for id in parsed.names.keys() {
                live.insert(*id, ());
            }
            let open = Open {
                file: append_handle(&self.path)?,
                live,
                lines: parsed.lines,
            };
            self.open = Some(match parsed.torn || open.due() {
                true => compacted(&self.path, &parsed.names)?,
                false => open,
            });
        }
        // Set just above when it was not.
        self.open
            .as_mut()
            .ok_or_else(|| io::Error::other("names file not open"))
    }

    /// Whether service index `id` has a name in the file.
    pub fn named(&mut self, id: u32) -> io::Result<bool> {
        Ok(self.open()?.live.contains_key(&id))
    }

    /// Appends `changes` (a name, or none: removed) in one write; compacts the file when the
    /// lines it no longer needs outnumber the live ones. A write that fails leaves the file
    /// as it was (see [`append`]) and returns its error.
    pub fn write(&mut self, changes: &[(u32, Option<&str>)]) -> io::Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let open = self.open()?;
        let mut buf = Vec::new();
        lines(&mut buf, changes.iter().copied());
        if let Err(f) = append(&mut open.file, &buf) {
            if f.torn {
                // Read again at the next write, and compacted: its tail is torn.
                self.open = None;
            }
            return Err(f.error);
        }
        open.lines += changes.len();
        for (id, name) in changes {
            match name {
                Some(_) => open.live.insert(*id, ()),
                None => open.live.remove(id),
            };
        }
        let due = open.due();
        if let Some(shared) = &self.shared {
            let mut names = shared.write().unwrap_or_else(|p| p.into_inner());
            for (id, name) in changes {
                match name {
                    Some(n) => names.insert(*id, (*n).into()),
                    None => names.remove(id),
                };
            }
        }
        if due {
            self.compact()?;
        }
        Ok(())
    }

    /// Rewrites the file with its live records only.
    fn compact(&mut self) -> io::Result<()> {
        let parsed = read_parsed(&self.path)?.unwrap_or_default();
        self.open = Some(compacted(&self.path, &parsed.names)?);
        Ok(())
    }

    /// The names as written from now on, in memory, starting from `names` (what is
    /// programmed): for the metrics.
    pub fn share<'a>(&mut self, names: impl IntoIterator<Item = (u32, &'a str)>) -> ServiceNames {
        let shared: ServiceNames = Arc::new(RwLock::new(
            names.into_iter().map(|(id, n)| (id, n.into())).collect(),
        ));
        self.shared = Some(shared.clone());
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log writing under a temporary directory instead of [`DIR`].
    fn log_in(dir: &Path) -> NamesLog {
        NamesLog {
            path: dir.join("names.jsonl"),
            open: None,
            shared: None,
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xlb-names-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    fn names(log: &NamesLog) -> BTreeMap<u32, String> {
        read_parsed(&log.path).expect("read").expect("file").names
    }

    #[test]
    fn the_file_is_named_after_the_pin_directory() {
        // One per pin directory: `status_file::beside`, tested there.
        assert_eq!(
            path(Path::new("/sys/fs/bpf/xlb")),
            Path::new("/run/xlb/names/_sys_fs_bpf_xlb.jsonl")
        );
    }

    #[test]
    fn the_last_record_of_an_id_wins_and_a_removal_takes_its_name() {
        let p = parse(
            b"{\"id\":1,\"name\":\"ns/a:p\"}\n{\"id\":2,\"name\":\"ns/b:p\"}\n{\"id\":1,\"name\":\"ns/c:p\"}\n{\"id\":2,\"name\":null}\n",
        );
        assert_eq!(p.names, BTreeMap::from([(1, "ns/c:p".to_string())]));
        assert_eq!((p.lines, p.torn), (4, false));
    }

    #[test]
    fn a_garbled_line_or_a_torn_tail_is_skipped() {
        let p = parse(b"{\"id\":1,\"name\":\"ns/a:p\"}\n\x00\xffgarbage\n{\"id\":2,\"name\":\"ns/b:p\"}\n{\"id\":3,\"na");
        assert_eq!(
            p.names,
            BTreeMap::from([(1, "ns/a:p".to_string()), (2, "ns/b:p".to_string())])
        );
        assert!(p.torn);
    }

    #[test]
    fn a_change_appends_one_line_and_the_file_is_compacted_when_dead_lines_outnumber_live_ones() {
        let d = tmp("append");
        let mut log = log_in(&d);
        let many: Vec<String> = (0..200).map(|i| format!("ns/s{i}:p")).collect();
        let all: Vec<(u32, Option<&str>)> = many
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u32, Some(n.as_str())))
            .collect();
        log.write(&all).expect("write");
        let size = std::fs::metadata(&log.path).expect("file").len();
        // One service renamed: one line appended, nothing rewritten.
        log.write(&[(7, Some("ns/renamed:p"))]).expect("write");
        let grown = std::fs::metadata(&log.path).expect("file").len() - size;
        assert_eq!(grown, "{\"id\":7,\"name\":\"ns/renamed:p\"}\n".len() as u64);
        assert_eq!(names(&log)[&7], "ns/renamed:p");
        // 150 of the 200 removed: 150 tombstones + 151 replaced lines > 50 live: compacted.
        let gone: Vec<(u32, Option<&str>)> = (50..200).map(|i| (i, None)).collect();
        log.write(&gone).expect("write");
        let text = std::fs::read_to_string(&log.path).expect("file");
        assert_eq!(text.lines().count(), 50, "compacted to the live records");
        assert_eq!(names(&log).len(), 50);
        assert_eq!(names(&log)[&7], "ns/renamed:p");
        // Appends go on after the compaction.
        log.write(&[(60, Some("ns/back:p"))]).expect("write");
        assert_eq!(names(&log)[&60], "ns/back:p");
        assert!(log.named(60).expect("open") && !log.named(61).expect("open"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_agent_finding_a_torn_tail_compacts_before_it_appends() {
        let d = tmp("torn");
        let path = d.join("names.jsonl");
        std::fs::write(&path, b"{\"id\":1,\"name\":\"ns/a:p\"}\n{\"id\":2,\"na").expect("write");
        let mut log = log_in(&d);
        log.write(&[(3, Some("ns/c:p"))]).expect("write");
        assert_eq!(
            names(&log),
            BTreeMap::from([(1, "ns/a:p".to_string()), (3, "ns/c:p".to_string())])
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The log's file, appended to as [`NamesLog::write`] does, that takes `room` bytes
    /// and then fails as a full disk does (a write that lands in part, then `ENOSPC`);
    /// `cut_fails`: cutting it back fails too.
    struct Full {
        file: File,
        room: usize,
        cut_fails: bool,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = self.file.write(&buf[..buf.len().min(self.room)])?;
            self.room -= n;
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            self.file.flush()
        }
    }

    impl AppendFile for Full {
        fn end(&self) -> io::Result<u64> {
            self.file.end()
        }

        fn cut(&self, len: u64) -> io::Result<()> {
            match self.cut_fails {
                true => Err(io::Error::from_raw_os_error(libc::EIO)),
                false => self.file.cut(len),
            }
        }
    }

    #[test]
    fn an_append_a_full_disk_cuts_short_leaves_the_file_as_it_was_and_the_next_one_reads_back() {
        let d = tmp("enospc");
        let mut log = log_in(&d);
        log.write(&[(1, Some("ns/a:p"))]).expect("write");
        let before = std::fs::read(&log.path).expect("file");
        // Half a record lands, then the disk is full.
        let mut full = Full {
            file: append_handle(&log.path).expect("open"),
            room: 10,
            cut_fails: false,
        };
        let mut buf = Vec::new();
        lines(&mut buf, [(2, Some("ns/b:p"))]);
        let failed = append(&mut full, &buf).expect_err("the disk is full");
        assert_eq!(failed.error.raw_os_error(), Some(libc::ENOSPC));
        assert!(!failed.torn);
        assert_eq!(std::fs::read(&log.path).expect("file"), before, "as it was");
        // The next record starts on a line of its own: it reads back.
        log.write(&[(3, Some("ns/c:p"))]).expect("write");
        assert_eq!(
            names(&log),
            BTreeMap::from([(1, "ns/a:p".to_string()), (3, "ns/c:p".to_string())])
        );
        assert!(!parse(&std::fs::read(&log.path).expect("file")).torn);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_append_whose_cut_fails_too_is_torn_and_the_next_open_compacts_it() {
        let d = tmp("enospc-torn");
        let path = d.join("names.jsonl");
        std::fs::write(&path, b"{\"id\":1,\"name\":\"ns/a:p\"}\n").expect("write");
        let mut full = Full {
            file: append_handle(&path).expect("open"),
            room: 10,
            cut_fails: true,
        };
        let mut buf = Vec::new();
        lines(&mut buf, [(2, Some("ns/b:p"))]);
        let failed = append(&mut full, &buf).expect_err("the disk is full");
        assert!(failed.torn);
        assert!(parse(&std::fs::read(&path).expect("file")).torn);
        // What the writer does then: the log is read again, compacted, appended to.
        let mut log = log_in(&d);
        log.write(&[(3, Some("ns/c:p"))]).expect("write");
        assert_eq!(
            names(&log),
            BTreeMap::from([(1, "ns/a:p".to_string()), (3, "ns/c:p".to_string())])
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_shared_names_follow_every_write() {
        let d = tmp("shared");
        let mut log = log_in(&d);
        let shared = log.share([(1, "ns/a:p")]);
        log.write(&[(2, Some("ns/b:p")), (1, None)]).expect("write");
        let now = shared.read().expect("lock").clone();
        assert_eq!(now, BTreeMap::from([(2, "ns/b:p".into())]));
        let _ = std::fs::remove_dir_all(&d);
    }
}
