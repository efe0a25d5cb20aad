//! Fuzzes the cron parser and the search: any input must either be rejected
//! with an error or satisfy the checks in `dagcron_cron::fuzzing::check`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        dagcron_cron::fuzzing::check(text);
        // Long inputs too (run with `-max_len` above the parser's bound):
        // the input repeated past the length limit must be refused, never panic.
        if !text.is_empty() && text.len() < 4096 {
            dagcron_cron::fuzzing::check(&text.repeat(1 + 70_000 / text.len()));
        }
    }
});
