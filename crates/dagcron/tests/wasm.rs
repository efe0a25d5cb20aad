//! WebAssembly tasks in a real server, through its API: modules written as
//! WAT beside the test, run by the server's own pool and by a real agent
//! process; their exits, limits, timeouts and cancels as the API reports
//! them.
#![cfg(feature = "wasm")]

mod common;

use common::{Agent, Api, InProcess, log, setup};

/// Writes `text` on standard output, then runs `rest`.
fn module(text: &str, rest: &str) -> String {
    format!(
        r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "{text}\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const {len}))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    {rest}))"#,
        len = text.len() + 1
    )
}

/// Triggers `job`, whose module prints `looping` and loops forever, and
/// cancels its run through the API once the module is in its loop.
fn cancel_while_looping(server: &Api, job: &str) {
    let id = server.trigger(job);
    let (following, _) = server.follow_log_until(id, "t", "looping");
    drop(following);
    let (status, body) = server.post(&format!("/api/v1/runs/{id}/cancel"), "", "application/json");
    assert!(status < 300, "{status} {body}");
    let run = server.wait_run(id, "cancelled");
    assert_eq!(
        run["tasks"][0]["attempts"][0]["state"], "cancelled",
        "{run}"
    );
}

#[test]
fn wasm_tasks_run_on_the_server_and_on_agents_and_stop_at_their_timeout_or_a_cancel() {
    let (dir, data) = setup();
    let mut server = InProcess::start(&data, &[]);
    server.namespace = "w".into();
    let modules = dir.path().join("modules");
    std::fs::create_dir_all(&modules).unwrap();
    let forever = "(loop $l (br $l))";
    for (name, text) in [
        ("hello.wat", module("hello from wasm", "")),
        ("three.wat", module("failing", "(call $exit (i32.const 3))")),
        ("forever.wat", module("looping", forever)),
        (
            "grow.wat",
            module("growing", "(drop (memory.grow (i32.const 64)))"),
        ),
    ] {
        std::fs::write(modules.join(name), text).unwrap();
    }
    let m = modules.display();
    let jobs = format!(
        r#"
namespace: w
jobs:
  - name: hello
    tasks: [{{ id: t, wasm: {{ module: {m}/hello.wat }} }}]
  - name: three
    tasks: [{{ id: t, wasm: {{ module: {m}/three.wat }} }}]
  - name: timeout
    tasks: [{{ id: t, timeout: 500ms, wasm: {{ module: {m}/forever.wat }} }}]
  - name: forever
    tasks: [{{ id: t, wasm: {{ module: {m}/forever.wat }} }}]
  - name: grow
    tasks: [{{ id: t, wasm: {{ module: {m}/grow.wat, memory: 1MiB }} }}]
  - name: remote
    tasks: [{{ id: t, wasm: {{ module: {m}/hello.wat, fuel: 1000000 }}, run_on: {{ labels: {{ kind: wasm }} }} }}]
  - name: remote-forever
    tasks: [{{ id: t, wasm: {{ module: {m}/forever.wat }}, run_on: {{ labels: {{ kind: wasm }} }} }}]
"#
    );
    let (status, body) = server.post("/api/v1/apply", &jobs, "application/yaml");
    assert_eq!(status, 200, "{body}");
    let attempt = |run: &serde_json::Value| run["tasks"][0]["attempts"][0].clone();

    let id = server.trigger("hello");
    let run = server.wait_run(id, "succeeded");
    assert_eq!(attempt(&run)["exit_code"], 0, "{run}");
    assert_eq!(log(&server, id, "t", 1), "hello from wasm\n");

    let id = server.trigger("three");
    let run = server.wait_run(id, "failed");
    assert_eq!(attempt(&run)["exit_code"], 3, "{run}");
    assert_eq!(attempt(&run)["error"], "exit status 3", "{run}");
    assert_eq!(log(&server, id, "t", 1), "failing\n");

    let id = server.trigger("timeout");
    let run = server.wait_run(id, "failed");
    assert_eq!(attempt(&run)["state"], "timed_out", "{run}");

    cancel_while_looping(&server, "forever");

    let id = server.trigger("grow");
    let run = server.wait_run(id, "failed");
    assert_eq!(
        attempt(&run)["error"],
        "memory limit reached: the module asked for 4160KiB of memory, its limit is 1MiB",
        "{run}"
    );

    // The same executor on an agent, with the module on the agent's disk.
    let _agent = Agent::start(
        &server,
        &dir.path().join("agents"),
        "wasm-1",
        "kind=wasm",
        2,
    );
    let id = server.trigger("remote");
    let run = server.wait_run(id, "succeeded");
    assert_eq!(attempt(&run)["exit_code"], 0, "{run}");
    assert_eq!(log(&server, id, "t", 1), "hello from wasm\n");
    // A cancel reaches a module looping on the agent.
    cancel_while_looping(&server, "remote-forever");
}

#[test]
fn the_demo_runs_its_webassembly_task() {
    let (_dir, data) = setup();
    let mut server = InProcess::start(&data, &["--demo"]);
    server.namespace = "demo".into();
    let id = server.trigger("wasm-hello");
    server.wait_run(id, "succeeded");
    assert_eq!(
        log(&server, id, "sandboxed", 1),
        "hello from a WebAssembly sandbox\n"
    );
}
