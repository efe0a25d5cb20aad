//! Who may do what: roles per namespace, and the one decision every route
//! and every command asks for.
//!
//! A grant is a role, either in one namespace or over the whole instance.
//! Roles are ordered: each can do what the ones below it can. A grant
//! limited to one namespace does not see the others: asking about another
//! namespace's objects is answered as if they did not exist.

use std::fmt;
use std::str::FromStr;

/// A role, from the least to the most powerful.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// A remote worker agent's join token: it may attach to the agents'
    /// stream (within its namespace and labels) and call nothing else.
    Agent,
    /// Reads jobs, runs, fires and logs.
    Viewer,
    /// Also triggers, cancels, pauses, resumes and backfills.
    Operator,
    /// Also applies, edits and deletes jobs.
    Developer,
    /// Also manages tokens (and, over the instance, the cluster).
    Admin,
}

impl Role {
    /// Every role of the API, least powerful first (not [`Role::Agent`]).
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Operator, Role::Developer, Role::Admin];

    /// The name in tokens and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Developer => "developer",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        Role::ALL
            .into_iter()
            .chain([Role::Agent])
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?}: viewer, operator, developer, admin or agent")
            })
    }
}

/// What an operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    /// Reading.
    Read,
    /// Operating runs and pauses.
    Operate,
    /// Changing job definitions.
    Develop,
    /// Managing tokens.
    Administer,
}

impl Need {
    /// The least role that has it.
    pub fn role(self) -> Role {
        match self {
            Need::Read => Role::Viewer,
            Need::Operate => Role::Operator,
            Need::Develop => Role::Developer,
            Need::Administer => Role::Admin,
        }
    }
}

/// A role in one namespace, or over the whole instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The role.
    pub role: Role,
    /// The namespace it is limited to; none: every namespace, and the
    /// instance itself (the cluster, its workers, every token).
    pub namespace: Option<String>,
}

/// The answer to "may this grant do that?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Yes.
    Allow,
    /// No: the role is too weak (`403`).
    Forbidden,
    /// No, and the object is in another namespace: answer as if it did not
    /// exist (`404`), so that a scoped token learns nothing of the others.
    Hidden,
}

impl Grant {
    /// Whether the grant covers `need` on an object of `namespace` (none:
    /// an object of the instance, such as the cluster's nodes).
    pub fn decide(&self, need: Need, namespace: Option<&str>) -> Decision {
        if self.role == Role::Agent {
            return Decision::Forbidden;
        }
        match (self.namespace.as_deref(), namespace) {
            (Some(mine), Some(theirs)) if mine != theirs => Decision::Hidden,
            (Some(_), None) => Decision::Forbidden,
            _ if self.role >= need.role() => Decision::Allow,
            _ => Decision::Forbidden,
        }
    }

    /// Whether a holder of this grant may create a token with `other`: an
    /// admin, over at least the other's namespace, with a role at least the
    /// other's.
    pub fn may_grant(&self, other: &Grant) -> bool {
        let scope = match (&self.namespace, &other.namespace) {
            (None, _) => true,
            (Some(mine), Some(theirs)) => mine == theirs,
            (Some(_), None) => false,
        };
        self.role == Role::Admin && scope && other.role <= self.role
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(role: Role, ns: Option<&str>) -> Grant {
        Grant {
            role,
            namespace: ns.map(Into::into),
        }
    }

    #[test]
    fn roles_nest_and_namespaces_are_walls() {
        let op = grant(Role::Operator, Some("a"));
        assert_eq!(op.decide(Need::Read, Some("a")), Decision::Allow);
        assert_eq!(op.decide(Need::Operate, Some("a")), Decision::Allow);
        assert_eq!(op.decide(Need::Develop, Some("a")), Decision::Forbidden);
        // Another namespace: hidden, whatever is asked.
        assert_eq!(op.decide(Need::Read, Some("b")), Decision::Hidden);
        // The instance's own objects: not for a namespace grant.
        assert_eq!(op.decide(Need::Read, None), Decision::Forbidden);
        let viewer = grant(Role::Viewer, None);
        assert_eq!(viewer.decide(Need::Read, Some("b")), Decision::Allow);
        assert_eq!(viewer.decide(Need::Read, None), Decision::Allow);
        assert_eq!(viewer.decide(Need::Operate, Some("b")), Decision::Forbidden);
    }

    #[test]
    fn a_token_is_granted_at_most_its_creators_authority() {
        let root = grant(Role::Admin, None);
        let ns_admin = grant(Role::Admin, Some("a"));
        let dev = grant(Role::Developer, Some("a"));
        assert!(root.may_grant(&grant(Role::Admin, None)));
        assert!(ns_admin.may_grant(&grant(Role::Viewer, Some("a"))));
        assert!(ns_admin.may_grant(&grant(Role::Admin, Some("a"))));
        assert!(!ns_admin.may_grant(&grant(Role::Viewer, Some("b"))));
        assert!(!ns_admin.may_grant(&grant(Role::Viewer, None)));
        assert!(!dev.may_grant(&grant(Role::Viewer, Some("a"))));
        // Join tokens for agents: made by admins, good for nothing else.
        assert!(ns_admin.may_grant(&grant(Role::Agent, Some("a"))));
        let agent = grant(Role::Agent, None);
        assert_eq!(agent.decide(Need::Read, Some("a")), Decision::Forbidden);
        assert_eq!(agent.decide(Need::Read, None), Decision::Forbidden);
    }

    #[test]
    fn role_names_round_trip() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert!("root".parse::<Role>().is_err());
    }
}
