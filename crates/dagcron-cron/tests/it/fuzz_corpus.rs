//! Replays the fuzz corpus (`fuzz/corpus/parse_eval`) through the same checks
//! the fuzz target runs, so that every input it ever kept stays a test.

#[test]
fn replay_fuzz_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/parse_eval");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        if let Ok(text) = std::str::from_utf8(&bytes) {
            dagcron_cron::fuzzing::check(text);
        }
        n += 1;
    }
    assert!(n >= 20, "the corpus has only {n} inputs");
}
