//! Which revisions of the protocol a server speaks.

use std::fmt;

/// The revision this build speaks (`Hello.protocol_version`). Revision 2
/// adds the item of an instance of a mapped task (`Assignment.item`): a
/// server gives such attempts only to agents of revision 2 or later.
pub const PROTOCOL_VERSION: u32 = 2;

/// The revision from which agents take instances of mapped tasks.
pub const ITEMS_SINCE: u32 = 2;

/// The revisions a server of this build accepts.
pub const SUPPORTED_VERSIONS: &[u32] = &[1, 2];

/// An agent speaks a revision this server does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionError {
    /// What the agent asked for (0: it did not say).
    pub asked: u32,
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let supported: Vec<String> = SUPPORTED_VERSIONS.iter().map(u32::to_string).collect();
        if self.asked == 0 {
            write!(
                f,
                "the agent did not say which protocol revision it speaks; this server speaks {}",
                supported.join(", ")
            )
        } else if self.asked > PROTOCOL_VERSION {
            write!(
                f,
                "the agent speaks protocol revision {}, newer than this server's ({}): upgrade the server, or run an agent of the server's version",
                self.asked,
                supported.join(", ")
            )
        } else {
            write!(
                f,
                "the agent speaks protocol revision {}, which this server no longer accepts (it speaks {}): upgrade the agent",
                self.asked,
                supported.join(", ")
            )
        }
    }
}

impl std::error::Error for VersionError {}

/// Accepts a revision this server speaks, or says why not.
pub fn check_version(asked: u32) -> Result<u32, VersionError> {
    if SUPPORTED_VERSIONS.contains(&asked) {
        Ok(asked)
    } else {
        Err(VersionError { asked })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_revision_is_accepted_and_others_explained() {
        assert_eq!(check_version(PROTOCOL_VERSION), Ok(PROTOCOL_VERSION));
        assert_eq!(
            check_version(1),
            Ok(1),
            "agents of revision 1 are still taken"
        );
        let newer = check_version(PROTOCOL_VERSION + 1).unwrap_err().to_string();
        assert!(newer.contains("newer than this server's"), "{newer}");
        let missing = check_version(0).unwrap_err().to_string();
        assert!(missing.contains("did not say"), "{missing}");
    }
}
