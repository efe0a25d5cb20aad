//! Fuzzes the cron parser and the search: any input must either be rejected
//! with an error or satisfy the checks in `dagcron_cron::fuzzing::check`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        dagcron_cron::fuzzing::check(text);
    }
});
