//! Side-by-side benchmark of dagcron's cron engine against `croner`, `cron`,
//! `saffron` and `cronexpr`, in one run, printing ratios.
//!
//! Run with `cargo bench -p dagcron-cron --bench cron`. Each figure is the
//! median of 21 timed batches (each batch at least 20 ms) after a warm-up.
//! A peer that does not support an expression is shown as `-`.

use std::hint::black_box;
use std::str::FromStr;
use std::time::{Duration, Instant};

use chrono::{TimeZone as _, Utc};

/// One expression of the mix, in the syntax each library needs: 6 or 7
/// fields (seconds first) for dagcron, croner and cron; 5 fields for saffron
/// and cronexpr when the expression has no seconds.
struct Case {
    name: &'static str,
    six: &'static str,
    five: Option<&'static str>,
}

const MIX: &[Case] = &[
    Case {
        name: "every second",
        six: "* * * * * *",
        five: None,
    },
    Case {
        name: "every 5 minutes",
        six: "0 */5 * * * *",
        five: Some("*/5 * * * *"),
    },
    Case {
        name: "weekdays 9-17",
        six: "0 0 9-17 * * MON-FRI",
        five: Some("0 9-17 * * MON-FRI"),
    },
    Case {
        name: "last weekday of month",
        six: "0 0 0 LW * *",
        five: Some("0 0 LW * *"),
    },
    Case {
        name: "Feb 29",
        six: "0 0 0 29 2 *",
        five: Some("0 0 29 2 *"),
    },
    Case {
        name: "7 fields with a year",
        six: "0 30 12 * * * 2030",
        five: None,
    },
    Case {
        name: "rare: Dec 31 23:59:59",
        six: "59 59 23 31 12 *",
        five: None,
    },
];

/// Start instants spread over a year, so that no library benefits from one
/// lucky starting point.
fn starts() -> Vec<i64> {
    (0..64).map(|i| 1_767_225_600 + i * 492_113).collect() // from 2026-01-01, every ~5.7 days
}

/// Median nanoseconds per call of `f` (which performs `per_call` operations).
fn measure(mut f: impl FnMut(usize) -> usize) -> f64 {
    // Calibrate a batch size that runs for at least 20 ms.
    let mut batch = 1usize;
    loop {
        let t = Instant::now();
        black_box(f(batch));
        if t.elapsed() >= Duration::from_millis(20) || batch >= 1 << 30 {
            break;
        }
        batch *= 2;
    }
    let mut samples: Vec<f64> = (0..21)
        .map(|_| {
            let t = Instant::now();
            black_box(f(batch));
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

type Bench = Box<dyn FnMut(usize) -> usize>;

fn parse_benches(case: &Case) -> Vec<(&'static str, Option<Bench>)> {
    let six = case.six;
    let five = case.five;
    let croner_parser = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .year(croner::parser::Year::Optional)
        .build();
    vec![
        (
            "dagcron",
            Some(Box::new(move |n: usize| {
                (0..n)
                    .map(|_| dagcron_cron::Schedule::parse(black_box(six)).is_ok() as usize)
                    .sum()
            }) as Bench),
        ),
        (
            "croner",
            croner_parser.parse(six).is_ok().then(|| {
                Box::new(move |n: usize| {
                    (0..n)
                        .map(|_| croner_parser.parse(black_box(six)).is_ok() as usize)
                        .sum()
                }) as Bench
            }),
        ),
        (
            "cron",
            cron::Schedule::from_str(six).is_ok().then(|| {
                Box::new(move |n: usize| {
                    (0..n)
                        .map(|_| cron::Schedule::from_str(black_box(six)).is_ok() as usize)
                        .sum()
                }) as Bench
            }),
        ),
        (
            "saffron",
            five.filter(|f| saffron::Cron::from_str(f).is_ok())
                .map(|f| {
                    Box::new(move |n: usize| {
                        (0..n)
                            .map(|_| saffron::Cron::from_str(black_box(f)).is_ok() as usize)
                            .sum()
                    }) as Bench
                }),
        ),
        (
            "cronexpr",
            five.map(|f| format!("{f} UTC"))
                .filter(|f| cronexpr::parse_crontab(f).is_ok())
                .map(|f| {
                    Box::new(move |n: usize| {
                        (0..n)
                            .map(|_| cronexpr::parse_crontab(black_box(&f)).is_ok() as usize)
                            .sum()
                    }) as Bench
                }),
        ),
    ]
}

fn next_benches(case: &Case) -> Vec<(&'static str, Option<Bench>)> {
    let starts = starts();
    let ours = dagcron_cron::Schedule::parse(case.six).unwrap();
    let ours_starts: Vec<jiff::Timestamp> = starts
        .iter()
        .map(|s| jiff::Timestamp::from_second(*s).unwrap())
        .collect();
    let chrono_starts: Vec<chrono::DateTime<Utc>> = starts
        .iter()
        .map(|s| Utc.timestamp_opt(*s, 0).unwrap())
        .collect();
    let croner = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .year(croner::parser::Year::Optional)
        .build()
        .parse(case.six)
        .ok();
    let cron = cron::Schedule::from_str(case.six).ok();
    let saffron = case.five.and_then(|f| saffron::Cron::from_str(f).ok());
    let cronexpr = case
        .five
        .and_then(|f| cronexpr::parse_crontab(&format!("{f} UTC")).ok());
    let jiff02_starts: Vec<jiff02::Timestamp> = starts
        .iter()
        .map(|s| jiff02::Timestamp::from_second(*s).unwrap())
        .collect();
    let pick = |i: usize| i % 64;
    let (cs1, cs2, cs3) = (chrono_starts.clone(), chrono_starts.clone(), chrono_starts);
    vec![
        (
            "dagcron",
            Some(Box::new(move |n: usize| {
                (0..n)
                    .filter(|i| ours.next_after(black_box(ours_starts[pick(*i)])).is_some())
                    .count()
            }) as Bench),
        ),
        (
            "croner",
            croner.map(|c| {
                Box::new(move |n: usize| {
                    (0..n)
                        .filter(|i| {
                            c.find_next_occurrence(black_box(&cs1[pick(*i)]), false)
                                .is_ok()
                        })
                        .count()
                }) as Bench
            }),
        ),
        (
            "cron",
            cron.map(|c| {
                Box::new(move |n: usize| {
                    (0..n)
                        .filter(|i| c.after(black_box(&cs2[pick(*i)])).next().is_some())
                        .count()
                }) as Bench
            }),
        ),
        (
            "saffron",
            saffron.map(|c| {
                Box::new(move |n: usize| {
                    (0..n)
                        .filter(|i| c.next_after(black_box(cs3[pick(*i)])).is_some())
                        .count()
                }) as Bench
            }),
        ),
        (
            "cronexpr",
            cronexpr.map(|c| {
                Box::new(move |n: usize| {
                    (0..n)
                        .filter(|i| c.find_next(black_box(jiff02_starts[pick(*i)])).is_ok())
                        .count()
                }) as Bench
            }),
        ),
    ]
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1000.0 {
        format!("{:.2} µs", ns / 1000.0)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Prints one markdown table: a row per case, a column per library, and the
/// ratio of the fastest peer to dagcron.
fn table(title: &str, benches: impl Fn(&Case) -> Vec<(&'static str, Option<Bench>)>) -> Vec<f64> {
    println!("\n### {title}\n");
    println!(
        "| expression | dagcron | croner | cron | saffron | cronexpr | fastest peer / dagcron | croner / dagcron |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for case in MIX {
        let results: Vec<(&str, Option<f64>)> = benches(case)
            .into_iter()
            .map(|(name, b)| (name, b.map(|mut b| measure(&mut *b))))
            .collect();
        let ours = results[0].1.unwrap();
        let peers: Vec<f64> = results[1..].iter().filter_map(|r| r.1).collect();
        let fastest = peers.iter().copied().fold(f64::INFINITY, f64::min);
        let croner = results[1].1;
        let cells: Vec<String> = results
            .iter()
            .map(|r| r.1.map_or("-".into(), fmt_ns))
            .collect();
        ratios.push(fastest / ours);
        println!(
            "| {} ({}) | {} | {:.1}x | {} |",
            case.name,
            case.six,
            cells.join(" | "),
            fastest / ours,
            croner.map_or("-".into(), |c| format!("{:.1}x", c / ours)),
        );
    }
    let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    println!(
        "\nGeometric mean of (fastest peer / dagcron): {geo:.1}x; lowest: {:.1}x",
        ratios.iter().copied().fold(f64::INFINITY, f64::min)
    );
    ratios
}

fn iterate_million() {
    println!("\n### Iterating 1,000,000 fires of `* * * * * *` from 2026-01-01T00:00:00Z\n");
    let start = 1_767_225_600;
    let ours = dagcron_cron::Schedule::parse("* * * * * *").unwrap();
    let t0 = jiff::Timestamp::from_second(start).unwrap();
    let croner = croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .build()
        .parse("* * * * * *")
        .unwrap();
    let cron = cron::Schedule::from_str("* * * * * *").unwrap();
    let c0 = Utc.timestamp_opt(start, 0).unwrap();
    let time = |f: &mut dyn FnMut() -> i64| {
        let mut best = f64::INFINITY;
        let mut last = 0;
        for _ in 0..3 {
            let t = Instant::now();
            last = black_box(f());
            best = best.min(t.elapsed().as_secs_f64() * 1000.0);
        }
        (best, last)
    };
    let (ours_ms, a) = time(&mut || {
        ours.fires_after(t0)
            .take(1_000_000)
            .last()
            .unwrap()
            .at
            .as_second()
    });
    let (croner_ms, b) = time(&mut || {
        croner
            .iter_after(c0)
            .take(1_000_000)
            .last()
            .unwrap()
            .timestamp()
    });
    let (cron_ms, c) = time(&mut || cron.after(&c0).take(1_000_000).last().unwrap().timestamp());
    assert!(
        a == b && b == c,
        "libraries disagree on the millionth fire: {a} {b} {c}"
    );
    println!("| library | time (best of 3) | ratio to dagcron |\n|---|---|---|");
    for (name, ms) in [
        ("dagcron", ours_ms),
        ("croner", croner_ms),
        ("cron", cron_ms),
    ] {
        println!("| {name} | {ms:.1} ms | {:.1}x |", ms / ours_ms);
    }
}

fn main() {
    // `cargo test --benches` runs bench binaries with `--bench` absent; keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("run with `cargo bench -p dagcron-cron --bench cron`");
        return;
    }
    println!("## Cron engine: dagcron vs croner, cron, saffron, cronexpr (UTC)");
    table("Parse (ns per expression)", parse_benches);
    table(
        "Next fire after an instant (ns per call; 64 start instants over 2026)",
        next_benches,
    );
    iterate_million();
}
