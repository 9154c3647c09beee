//! The logins of this host's users. `locus login`, run by a person with their own
//! certificate, leaves meta's `UserToken` in a file named after their uid in a shared
//! directory (`/run/locus/logins` by default, sticky and world-writable like /tmp);
//! the client attaches it to every request it makes for that uid. At a site whose
//! users must prove themselves (`locus meta --user-auth SITE`), meta acts for a uid only
//! with its token. A file counts only if that uid owns it, nobody else may write it
//! and it is a regular file: another user cannot plant a login for someone else.

use proto::cap::UserToken;
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use util::sync::lock;

/// The logins directory and what each uid's file last held (a token, or nothing usable),
/// with what the file looked like then: a new login or a logout shows at the next
/// request, and a file that is read is read once per change.
pub(crate) struct Logins {
    dir: PathBuf,
    seen: Mutex<HashMap<u32, (Stamp, Option<UserToken>)>>,
}

/// A file's identity and last change: equal stamps, same contents.
type Stamp = (u64, i64, i64, u64);

fn stamp(meta: &std::fs::Metadata) -> Stamp {
    (meta.ino(), meta.mtime(), meta.mtime_nsec(), meta.len())
}

impl Logins {
    pub(crate) fn new(dir: PathBuf) -> Logins {
        Logins { dir, seen: Mutex::default() }
    }

    /// The login of `uid`, if it has a valid-looking one (meta judges it): one
    /// `lstat` per request, the file read only when it changed.
    pub(crate) fn token(&self, uid: u32) -> Option<UserToken> {
        let path = self.dir.join(uid.to_string());
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            lock(&self.seen).remove(&uid);
            return None;
        };
        if let Some((seen, token)) = lock(&self.seen).get(&uid)
            && *seen == stamp(&meta)
        {
            return token.clone();
        }
        let token = read_login(&path, uid);
        lock(&self.seen).insert(uid, (stamp(&meta), token.clone()));
        token
    }
}

/// The token in `path` if the file is `uid`'s own: owned by it, a regular file (not a
/// symlink), writable by nobody else.
pub(crate) fn read_login(path: &Path, uid: u32) -> Option<UserToken> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.file_type().is_file() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        tracing::warn!(path = %path.display(), uid, "ignoring a login file that is not the user's own");
        return None;
    }
    let token = UserToken::from_text(&std::fs::read_to_string(path).ok()?);
    if token.is_none() {
        tracing::warn!(path = %path.display(), "ignoring a login file that holds no token");
    }
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_login_counts_only_in_its_users_own_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::fs::metadata(dir.path()).unwrap().uid();
        let token = UserToken::sign(&[1; 32], "/CN=Alice", "a", me, 1000);
        let path = dir.path().join(me.to_string());
        std::fs::write(&path, token.to_text()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_login(&path, me), Some(token.clone()));
        assert_eq!(read_login(&path, me + 1), None, "owned by another uid");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(read_login(&path, me), None, "writable by others");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert_eq!(read_login(&link, me), None, "a symlink");
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(read_login(&path, me), None);
        let logins = Logins::new(dir.path().to_path_buf());
        assert_eq!(logins.token(me), None);
        // A login made (or replaced) later is seen at once.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, token.to_text()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(logins.token(me), Some(token));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(logins.token(me), None, "a logout");
    }
}
