//! The embedded server on a disk that fills up: a real `dagcron serve`
//! whose data directory is on a small tmpfs the test mounts (as root, as
//! CI runs) and fills with a file of its own, then frees.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use common::{Server, admin_token, setup, until};
use jiff::Timestamp;
use serde_json::Value;

/// A tmpfs mounted for the test, unmounted when it goes.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test mounts a tmpfs and must run as root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes `path` until the disk has no room left.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        if file
            .write_all(&chunk)
            .and_then(|()| file.sync_data())
            .is_err()
        {
            return;
        }
    }
}

fn ready(server: &Server) -> (u16, Value) {
    let resp = server
        .http()
        .get(format!("{}/readyz", server.url))
        .send()
        .unwrap();
    (resp.status().as_u16(), resp.json().unwrap())
}

/// A full disk stopped the embedded server's engine and killed the process
/// while `/readyz` still said ready; freeing the space did nothing. Now the
/// server degrades: nothing starts, `/readyz` answers 503 with the reason,
/// the fires made meanwhile wait in memory, and once there is room again
/// they are recorded and the server goes on by itself, every second fired
/// exactly once.
#[test]
fn regression_a_full_disk_degrades_the_server_and_it_recovers_by_itself() {
    let (dir, _) = setup();
    let disk = Tmpfs::mount(&dir.path().join("disk"), "48m");
    let data = disk.0.join("data");
    // Its own output goes elsewhere: the test is about the data's disk.
    let log = dir.path().join("server.log");
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--disk-reserve-mb",
        "1",
    ];
    let mut server = Server::spawn(&args, &log);
    server.token = Some(admin_token(&data));
    server.namespace = "d".into();
    // Runs may pile up while nothing starts: every fire makes one.
    let yaml = "namespace: d\njobs:\n  - { name: tick, schedule: '* * * * * *', concurrency: allow, max_active_runs: 1000, max_pending_runs: 1000, tasks: [{ id: t, shell: 'yes x | head -c 2048' }] }\n";
    let (status, body) = server.post("/api/v1/apply", yaml, "application/yaml");
    assert_eq!(status, 200, "{body}");
    server.wait_runs("tick", 2);
    let from = Timestamp::now();

    fill(&disk.0.join("filler"));
    until("readiness says the writes fail", || {
        let (code, body) = ready(&server);
        code == 503
            && body["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["name"] == "writes" && c["ok"] == false)
    });
    let (_, body) = ready(&server);
    let problem = body["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "writes")
        .unwrap()["problem"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(problem.contains("lack of space"), "{problem}");
    // Degraded long enough to say so twice (every 5 s), and still up.
    until("the server says twice that it is degraded", || {
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "the server exited on a full disk"
        );
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        said.matches("commits fail for lack of space (").count() >= 2
    });
    let metrics = server.metrics();
    assert!(metrics.contains("dagcron_store_degraded 1"), "{metrics}");

    std::fs::remove_file(disk.0.join("filler")).unwrap();
    until("ready again", || ready(&server).0 == 200);
    let to = Timestamp::now();
    until("the last second fired", || {
        server
            .all_runs("tick")
            .iter()
            .any(|r| r["scheduled_at"].as_str().unwrap() > to.to_string().as_str())
    });
    // Every second from before the disk filled to after it was freed has
    // one run: the fires made while degraded were recorded afterwards.
    let runs = server.all_runs("tick");
    let seconds: Vec<i64> = runs
        .iter()
        .map(|r| {
            r["scheduled_at"]
                .as_str()
                .unwrap()
                .parse::<Timestamp>()
                .unwrap()
                .as_second()
        })
        .filter(|s| *s > from.as_second() && *s <= to.as_second())
        .collect();
    let mut unique = seconds.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        seconds.len(),
        "a second fired twice: {seconds:?}"
    );
    let expected = (to.as_second() - from.as_second()) as usize;
    assert_eq!(unique.len(), expected, "a second was lost: {unique:?}");
    assert!(server.child.try_wait().unwrap().is_none());
    eprintln!(
        "disk full: {expected} seconds fired once through the outage ({} runs)",
        runs.len()
    );
}
