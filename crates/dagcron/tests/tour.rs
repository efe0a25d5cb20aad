//! The README's tour, run as a new user would: each command of its
//! "A tour" block, in order, against a server started with `--demo`, by
//! `sh` with the real command line on its `PATH`. Every command must
//! succeed; `RUN_ID` stands for a run the line can act on (one of the
//! demo's flaky pipeline, a failed export, a held settlement).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use dagcron_testkit::until;
use serde_json::Value;

/// The commands of the README's tour, comments dropped.
fn tour() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("## A tour").expect("README has a tour");
    let block = &readme[start..];
    let from = block.find("```sh\n").expect("the tour has a shell block") + 6;
    let to = from + block[from..].find("```").unwrap();
    block[from..to]
        .lines()
        .map(|line| match line.find("  #") {
            Some(at) => line[..at].trim().to_string(),
            None => line.trim().to_string(),
        })
        .filter(|line| !line.is_empty())
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The run a tour line acts on, for the lines that name `RUN_ID`.
fn run_for(line: &str, runs: &Runs) -> i64 {
    if line.contains("--failed") {
        runs.failed
    } else if line.contains(" mark ") {
        runs.held
    } else {
        runs.flaky
    }
}

struct Runs {
    flaky: i64,
    failed: i64,
    held: i64,
}

#[test]
fn the_readme_tour_runs_from_start_to_end() {
    let (dir, data) = setup();
    let mut server = Server::start(&data, &["--demo"]);
    server.namespace = "demo".into();
    // What the tour's lines act on, made now rather than waited for.
    let flaky = server.trigger("flaky-pipeline");
    let failed = server.trigger("export-ledger");
    let held = server.trigger("settle-payments");
    server.wait_run(flaky, "succeeded");
    server.wait_run(failed, "failed");
    until("the settlement is held", || {
        server.get(&format!("/api/v1/runs/{held}"))["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == "settle" && t["state"] == "held")
    });
    let runs = Runs {
        flaky,
        failed,
        held,
    };
    // `dagcron` on the PATH is the binary under test.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dagcron"), bin.join("dagcron")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let lines = tour();
    assert!(lines.len() > 20, "{lines:?}");
    for line in lines {
        let command = line.replace("RUN_ID", &run_for(&line, &runs).to_string());
        let out = Command::new("sh")
            .args(["-c", &command])
            .current_dir(repo())
            .env("PATH", &path)
            .env("DAGCRON_SERVER", &server.url)
            .env("DAGCRON_DATA_DIR", &data)
            .env_remove("DAGCRON_TOKEN")
            .env("PASSWORD", "s3cret")
            .output()
            .unwrap();
        // Seen with --nocapture: each command and the start of its answer.
        let said = String::from_utf8_lossy(&out.stdout);
        println!("$ {command}   [{}]", out.status);
        for shown in said.lines().take(3) {
            println!("    {shown}");
        }
        assert!(
            out.status.success(),
            "the tour breaks at `{line}` ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The last lines did what they say.
    let held_run: Value = server.get(&format!("/api/v1/runs/{held}"));
    assert_ne!(held_run["state"], "running", "{held_run}");
}
