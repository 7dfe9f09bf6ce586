//! `EntryInfo` of filesystem answers, from the manager's file entries.

use koder_api_types::{EntryType, FileEntry};

use crate::proto::filesystem::{EntryInfo, FileType};

pub fn entry_info(e: &FileEntry) -> EntryInfo {
    let file_type = match e.kind {
        EntryType::Dir => FileType::Directory,
        EntryType::Symlink => FileType::Symlink,
        EntryType::File => FileType::File,
        EntryType::Other => FileType::Unspecified,
    };
    EntryInfo {
        name: e.name.clone(),
        r#type: file_type.into(),
        path: e.path.clone(),
        // Beyond i64 is no file size (the agent reports u64 for the type's sake).
        size: i64::try_from(e.size).unwrap_or(i64::MAX),
        mode: e.mode & 0o777,
        permissions: permissions(e.kind, e.mode),
        owner: account(e.uid),
        group: account(e.gid),
        modified_time: Some(e.modified_at.into()),
        symlink_target: e.symlink_target.clone(),
        metadata: e.metadata.clone(),
        is_symlink: e.kind == EntryType::Symlink,
    }
}

/// The account name of a sandbox uid/gid, as E2B reports owners (`root`, `user`).
fn account(id: u32) -> String {
    match id {
        0 => "root".into(),
        1000 => "user".into(),
        other => other.to_string(),
    }
}

/// Go's `FileMode.String()` as envd reports it: `drwxr-xr-x`, `-rw-r--r--`, `Lrwxrwxrwx`.
fn permissions(kind: EntryType, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryType::Dir => 'd',
        EntryType::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_info_shape() {
        let mut e = FileEntry {
            name: "a.txt".into(),
            path: "/home/user/a.txt".into(),
            kind: EntryType::File,
            size: 5_000_000_000,
            mode: 0o100644 & 0o7777,
            modified_at: chrono::DateTime::from_timestamp_millis(1_700_000_000_123)
                .unwrap_or_default(),
            symlink_target: None,
            uid: 1000,
            gid: 0,
            metadata: [("author".to_string(), "mish".to_string())].into(),
        };
        let v = serde_json::to_value(entry_info(&e)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "name": "a.txt",
                "type": "FILE_TYPE_FILE",
                "path": "/home/user/a.txt",
                "size": "5000000000",
                "mode": 0o644,
                "permissions": "-rw-r--r--",
                "owner": "user",
                "group": "root",
                "modifiedTime": "2023-11-14T22:13:20.123Z",
                "metadata": {"author": "mish"},
                "isSymlink": false,
            })
        );
        e.kind = EntryType::Symlink;
        e.symlink_target = Some("/etc".into());
        let v = serde_json::to_value(entry_info(&e)).unwrap();
        assert_eq!(v["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(v["symlinkTarget"], "/etc");
        assert_eq!(v["isSymlink"], true);
        assert_eq!(permissions(EntryType::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(EntryType::Symlink, 0o777), "Lrwxrwxrwx");
    }
}
