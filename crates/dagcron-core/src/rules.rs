//! The rules a job's fires are computed with: the cron semantics version
//! and, for each time zone its schedules use, the zone's rules in the time
//! zone database of the moment. Every version of a job is stored with the
//! rules it was applied under; a server whose rules differ for a stored
//! schedule says so (see [`Rules::changes`]) instead of silently moving a
//! fire.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{Job, Timing};

/// What the fires of a job are computed with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// [`dagcron_cron::SEMANTICS_VERSION`].
    pub cron: u32,
    /// The version of the time zone database ([`dagcron_cron::tzdb_version`]).
    pub tzdb: String,
    /// For each zone the job's schedules use, a digest of its rules
    /// ([`dagcron_cron::zone_digest`]).
    pub zones: BTreeMap<String, String>,
}

impl Rules {
    /// The rules of this build for schedules in `zones`.
    pub fn current<'a>(zones: impl IntoIterator<Item = &'a str>) -> Rules {
        Rules {
            cron: dagcron_cron::SEMANTICS_VERSION,
            tzdb: dagcron_cron::tzdb_version().to_string(),
            zones: zones
                .into_iter()
                .map(|z| {
                    let digest = dagcron_cron::zone_digest(z).unwrap_or_else(|| "unknown".into());
                    (z.to_string(), digest)
                })
                .collect(),
        }
    }

    /// What differs between these rules (a version's, as stored) and `now`
    /// (the same job's under this build), for its fires; `None` when its
    /// fires are computed the same way. A new database that leaves the
    /// job's zones as they were changes nothing.
    pub fn changes(&self, now: &Rules) -> Option<RulesChange> {
        let cron = (self.cron != now.cron).then_some((self.cron, now.cron));
        let zones: Vec<String> = if self.tzdb == now.tzdb {
            vec![]
        } else {
            now.zones
                .iter()
                .filter(|(zone, digest)| self.zones.get(*zone) != Some(digest))
                .map(|(zone, _)| zone.clone())
                .collect()
        };
        let tzdb = (!zones.is_empty()).then(|| (self.tzdb.clone(), now.tzdb.clone()));
        (cron.is_some() || tzdb.is_some()).then_some(RulesChange { cron, tzdb, zones })
    }

    /// The stored form (JSON).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("rules serialize")
    }

    /// Reads the stored form.
    pub fn from_json(text: &str) -> Result<Rules, String> {
        serde_json::from_str(text).map_err(|e| format!("stored rules: {e}"))
    }
}

impl Rules {
    /// The rules of this build for these timetables (their zones).
    fn of<'a>(timetables: impl Iterator<Item = &'a dagcron_cron::Timetable>) -> Rules {
        let zones: std::collections::BTreeSet<&str> = timetables
            .filter_map(|t| t.time_zone().iana_name())
            .collect();
        Rules::current(zones)
    }
}

impl Job {
    /// The rules this build computes the job's fires with.
    pub fn rules(&self) -> Rules {
        Rules::of(self.schedules.iter().map(|s| s.timetable()))
    }
}

impl Timing {
    /// The rules this build computes these fires with: those of the job
    /// they were made from ([`Job::rules`]).
    pub fn rules(&self) -> Rules {
        Rules::of(self.timetables.iter())
    }
}

/// How the rules of a stored version differ from the server's: its fires
/// may come at other instants than when it was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RulesChange {
    /// The cron semantics version, (stored, now), if it changed.
    pub cron: Option<(u32, u32)>,
    /// The time zone database, (stored, now), if the rules of a zone the
    /// job uses changed with it.
    pub tzdb: Option<(String, String)>,
    /// Those zones.
    pub zones: Vec<String>,
}

impl fmt::Display for RulesChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some((then, now)) = self.cron {
            parts.push(format!("cron semantics {then} -> {now}"));
        }
        if let Some((then, now)) = &self.tzdb {
            parts.push(format!(
                "rules of {} changed (time zone database {then} -> {now})",
                self.zones.join(", ")
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(cron: u32, tzdb: &str, zones: &[(&str, &str)]) -> Rules {
        Rules {
            cron,
            tzdb: tzdb.into(),
            zones: zones
                .iter()
                .map(|(z, d)| (z.to_string(), d.to_string()))
                .collect(),
        }
    }

    #[test]
    fn only_a_change_that_reaches_the_jobs_zones_counts() {
        let then = rules(1, "2024a", &[("Europe/Berlin", "aa"), ("UTC", "utc")]);
        assert_eq!(then.changes(&then), None);
        // A new database that leaves the zones as they were.
        let same_zones = rules(1, "2026f", &[("Europe/Berlin", "aa"), ("UTC", "utc")]);
        assert_eq!(then.changes(&same_zones), None);
        let berlin_moved = rules(1, "2026f", &[("Europe/Berlin", "bb"), ("UTC", "utc")]);
        let change = then.changes(&berlin_moved).unwrap();
        assert_eq!(change.zones, ["Europe/Berlin"]);
        assert_eq!(
            change.to_string(),
            "rules of Europe/Berlin changed (time zone database 2024a -> 2026f)"
        );
        let cron = rules(2, "2024a", &[("Europe/Berlin", "aa"), ("UTC", "utc")]);
        assert_eq!(
            then.changes(&cron).unwrap().to_string(),
            "cron semantics 1 -> 2"
        );
        let json = then.to_json();
        assert_eq!(Rules::from_json(&json).unwrap(), then);
    }

    #[test]
    fn a_jobs_rules_name_the_zones_of_its_schedules() {
        let file: crate::JobFile = serde_json::from_value(serde_json::json!({
            "namespace": "n",
            "jobs": [{
                "name": "j",
                "timezone": "Asia/Shanghai",
                "schedule": ["0 0 * * *", "CRON_TZ=Europe/Berlin 0 12 * * *"],
                "tasks": [{ "id": "t", "noop": true }]
            }, { "name": "manual", "tasks": [{ "id": "t", "noop": true }] }]
        }))
        .unwrap();
        let jobs = file.validate().unwrap();
        let r = jobs[0].rules();
        assert_eq!(r.cron, dagcron_cron::SEMANTICS_VERSION);
        assert_eq!(
            r.zones.keys().collect::<Vec<_>>(),
            ["Asia/Shanghai", "Europe/Berlin"]
        );
        assert!(jobs[1].rules().zones.is_empty(), "no schedule, no zone");
    }
}
