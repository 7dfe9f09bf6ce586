//! Reading a layer archive: the tar crate's raw entries, with GNU long names and PAX records
//! assembled here under explicit bounds (the crate's own assembly reads an extension header
//! of any declared size into memory).

use std::borrow::Cow;
use std::io::{self, Read};

use tar::{Archive, EntryType, Header, PaxExtensions};

use crate::path::EntryPath;
use crate::xattrs::{self, Xattr};
use crate::{LayerError, MAX_PATH};

/// Room for `MAX_PER_ENTRY` maximal xattrs plus a long link target.
const MAX_PAX: u64 = 5 * 1024 * 1024;

#[derive(Debug)]
pub(crate) enum Kind {
    Dir,
    File,
    Symlink(Vec<u8>),
    HardLink(EntryPath),
    Fifo,
    Whiteout,
}

#[derive(Debug)]
pub(crate) struct Meta {
    /// Permission bits including setuid, setgid and sticky.
    pub(crate) mode: u32,
    pub(crate) uid: u64,
    pub(crate) gid: u64,
    pub(crate) mtime: u64,
    pub(crate) xattrs: Vec<Xattr>,
}

pub(crate) struct Item<'a, R: Read> {
    pub(crate) path: EntryPath,
    pub(crate) kind: Kind,
    pub(crate) meta: Meta,
    /// Declared content size (regular files only; 0 otherwise).
    pub(crate) size: u64,
    pub(crate) data: tar::Entry<'a, R>,
}

pub(crate) struct Stream<'a, R: Read> {
    entries: tar::Entries<'a, R>,
}

/// Extension records gathered for the next real entry.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

impl<'a, R: Read> Stream<'a, R> {
    pub(crate) fn new(archive: &'a mut Archive<R>) -> Result<Self, LayerError> {
        let entries = archive.entries().map_err(read_error)?.raw(true);
        Ok(Self { entries })
    }

    pub(crate) fn next_item(&mut self) -> Result<Option<Item<'a, R>>, LayerError> {
        let mut pending = Pending::default();
        loop {
            let Some(entry) = self.entries.next() else {
                if pending.long_name.is_some()
                    || pending.long_link.is_some()
                    || pending.pax.is_some()
                {
                    return Err(LayerError::Corrupt(
                        "extension header at end of archive".into(),
                    ));
                }
                return Ok(None);
            };
            let mut entry = entry.map_err(read_error)?;
            let name_max = MAX_PATH as u64 + 1;
            let (slot, max) = match entry.header().entry_type() {
                EntryType::GNULongName => (&mut pending.long_name, name_max),
                EntryType::GNULongLink => (&mut pending.long_link, name_max),
                EntryType::XHeader => (&mut pending.pax, MAX_PAX),
                _ => return item(entry, pending).map(Some),
            };
            if slot.is_some() {
                return Err(LayerError::Corrupt("repeated extension header".into()));
            }
            *slot = Some(read_bounded(&mut entry, max)?);
        }
    }
}

/// After the last entry: the tar crate stops at the first zero block *or* at a clean end of
/// input, so a stream cut at an entry boundary would pass for a whole one. A writer ends with
/// two zero blocks; the second must be there.
pub(crate) fn check_end(mut rest: impl Read) -> Result<(), LayerError> {
    let mut block = [0u8; 512];
    match rest.read_exact(&mut block) {
        Ok(()) if block.iter().all(|b| *b == 0) => Ok(()),
        Ok(()) => Err(LayerError::Corrupt(
            "data after the end of the archive".into(),
        )),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(LayerError::Corrupt(
            "archive ends without its end marker (truncated?)".into(),
        )),
        Err(e) => Err(LayerError::io("reading the archive", e)),
    }
}

/// The tar crate reports its own parse failures as `Other`/`InvalidData`/`UnexpectedEof`
/// I/O errors; any other kind came from the input itself.
pub(crate) fn read_error(e: io::Error) -> LayerError {
    match e.kind() {
        io::ErrorKind::Other | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
            LayerError::Corrupt(e.to_string())
        }
        _ => LayerError::io("reading the archive", e),
    }
}

fn read_bounded(entry: &mut impl Read, size_max: u64) -> Result<Vec<u8>, LayerError> {
    let mut buf = Vec::new();
    entry
        .take(size_max + 1)
        .read_to_end(&mut buf)
        .map_err(read_error)?;
    if buf.len() as u64 > size_max {
        return Err(LayerError::Corrupt("oversized extension header".into()));
    }
    Ok(buf)
}

fn item<R: Read>(entry: tar::Entry<'_, R>, pending: Pending) -> Result<Item<'_, R>, LayerError> {
    let header = entry.header();
    let pax = Pax::parse(pending.pax.as_deref())?;
    let raw_path = one_of(pending.long_name, pax.path, header.path_bytes(), "path")?;
    let path = EntryPath::parse(&raw_path)?;
    let p = path.as_bytes();
    let size = entry.size();
    let kind = kind(header, p, || {
        one_of(
            pending.long_link,
            pax.link,
            header.link_name_bytes().unwrap_or_default(),
            "link",
        )
    })?;
    if size != 0 && !matches!(kind, Kind::File) {
        return Err(LayerError::Corrupt(format!(
            "{} has content but is no file",
            crate::shown(p)
        )));
    }
    let field = |r: io::Result<u64>| r.map_err(|e| LayerError::Corrupt(e.to_string()));
    let meta = Meta {
        mode: field(header.mode().map(u64::from))? as u32 & 0o7777,
        uid: field(header.uid())?,
        gid: field(header.gid())?,
        mtime: field(header.mtime())?,
        xattrs: pax.xattrs,
    };
    Ok(Item {
        path,
        kind,
        meta,
        size,
        data: entry,
    })
}

fn kind(
    header: &Header,
    path: &[u8],
    link: impl FnOnce() -> Result<Vec<u8>, LayerError>,
) -> Result<Kind, LayerError> {
    Ok(match header.entry_type() {
        EntryType::Directory => Kind::Dir,
        EntryType::Regular => Kind::File,
        EntryType::Symlink => {
            let target = link()?;
            if target.is_empty() || target.contains(&0) || target.len() > MAX_PATH {
                return Err(LayerError::forbidden(path, "malformed symlink target"));
            }
            Kind::Symlink(target)
        }
        EntryType::Link => Kind::HardLink(
            EntryPath::parse(&link()?)
                .map_err(|_| LayerError::forbidden(path, "hard link target outside the layer"))?,
        ),
        EntryType::Fifo => Kind::Fifo,
        EntryType::Char => {
            let dev = (header.device_major(), header.device_minor());
            match dev {
                (Ok(Some(0)), Ok(Some(0))) => Kind::Whiteout,
                _ => return Err(LayerError::forbidden(path, "device node")),
            }
        }
        EntryType::Block => return Err(LayerError::forbidden(path, "device node")),
        _ => return Err(LayerError::forbidden(path, "unsupported entry type")),
    })
}

/// Exactly one source for a name: the header's own field only when no extension gave one.
fn one_of(
    gnu: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
    header: Cow<'_, [u8]>,
    what: &str,
) -> Result<Vec<u8>, LayerError> {
    match (gnu, pax) {
        (Some(_), Some(_)) => Err(LayerError::Corrupt(format!("two long {what} records"))),
        // GNU long names are NUL-terminated.
        (Some(mut v), None) => {
            if v.last() == Some(&0) {
                v.pop();
            }
            Ok(v)
        }
        (None, Some(v)) => Ok(v),
        (None, None) => Ok(header.into_owned()),
    }
}

#[derive(Default)]
struct Pax {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    xattrs: Vec<Xattr>,
}

impl Pax {
    /// Records the archive may carry; any other (`size`, `uid`, `GNU.sparse.*`...) would make
    /// this reader and other tar readers disagree about the entry, so it is refused.
    fn parse(raw: Option<&[u8]>) -> Result<Self, LayerError> {
        let mut pax = Self::default();
        for record in PaxExtensions::new(raw.unwrap_or_default()) {
            let record = record.map_err(|e| LayerError::Corrupt(format!("pax record: {e}")))?;
            let (key, value) = (record.key_bytes(), record.value_bytes());
            match key {
                b"path" => pax.path = Some(value.to_vec()),
                b"linkpath" => pax.link = Some(value.to_vec()),
                b"mtime" | b"atime" | b"ctime" | b"uname" | b"gname" | b"comment" | b"charset"
                | b"hdrcharset" => {}
                _ => pax.xattr(key, value)?,
            }
        }
        Ok(pax)
    }

    fn xattr(&mut self, key: &[u8], value: &[u8]) -> Result<(), LayerError> {
        let Some(name) = key.strip_prefix(xattrs::PAX_PREFIX.as_bytes()) else {
            return Err(LayerError::Corrupt(format!(
                "unsupported pax record {}",
                crate::shown(key)
            )));
        };
        let path = self.path.as_deref().unwrap_or_default();
        if xattrs::admit(path, name, value)? {
            if self.xattrs.len() == xattrs::MAX_PER_ENTRY {
                return Err(LayerError::forbidden(path, "more than 64 xattrs"));
            }
            self.xattrs.push((name.to_vec(), value.to_vec()));
        }
        Ok(())
    }
}
