//! `dagcron cron next|explain|check`: the cron engine from the command line.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use dagcron_cron::{DstGap, DstOverlap, Options, Schedule, seed_from_key};
use jiff::Timestamp;
use jiff::tz::TimeZone;

#[derive(Subcommand)]
pub(crate) enum CronCommand {
    /// Print the next fire times strictly after an instant.
    Next {
        #[command(flatten)]
        expr: ExprArgs,
        /// Start from this instant (RFC 3339, such as 2026-03-08T00:00:00Z); default: now.
        #[arg(long)]
        from: Option<String>,
        /// How many fires to print.
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// Print one JSON array of RFC 3339 strings.
        #[arg(long)]
        json: bool,
    },
    /// Explain an expression in English and show its next 5 fires.
    Explain {
        #[command(flatten)]
        expr: ExprArgs,
    },
    /// Exit 0 if the expression is valid; otherwise show where it is wrong.
    Check {
        #[command(flatten)]
        expr: ExprArgs,
    },
}

#[derive(Args)]
pub(crate) struct ExprArgs {
    /// The cron expression (5, 6 or 7 fields, or a descriptor such as @daily),
    /// or an RFC 5545 rule (`RRULE:FREQ=...`, with optional DTSTART, EXDATE
    /// and RDATE lines or words).
    expr: String,
    /// IANA time zone the expression is evaluated in (a CRON_TZ= prefix or a
    /// rule's TZID wins).
    #[arg(long, default_value = "UTC")]
    tz: String,
    /// Key that `H` hashes (a job's identity, such as namespace/name).
    #[arg(long, default_value = "")]
    hash_key: String,
    /// Override the spring-forward policy.
    #[arg(long, value_enum)]
    dst_gap: Option<GapArg>,
    /// Override the fall-back policy.
    #[arg(long, value_enum)]
    dst_overlap: Option<OverlapArg>,
    /// Where an `@every` expression counts from, as a job's `anchor` (RFC
    /// 3339, such as 2026-01-01T00:10:00Z); default: the Unix epoch.
    #[arg(long)]
    anchor: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum GapArg {
    Shift,
    Skip,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum OverlapArg {
    First,
    Last,
    Both,
}

/// The outcome of parsing: the schedule, or an error already printed.
fn parse(args: &ExprArgs) -> Result<Option<Schedule>> {
    let time_zone = TimeZone::get(&args.tz)
        .with_context(|| format!("unknown time zone {:?} given to --tz", args.tz))?;
    let anchor = match &args.anchor {
        Some(a) => Some(a.parse::<Timestamp>().with_context(|| {
            format!("--anchor {a:?} is not an RFC 3339 instant (accepted: such as 2026-01-01T00:10:00Z or 2026-01-01T08:10:00+08:00)")
        })?),
        None => None,
    };
    let options = Options {
        time_zone,
        hash_seed: seed_from_key(&args.hash_key),
        anchor,
        dst_gap: args.dst_gap.map(|g| match g {
            GapArg::Shift => DstGap::Shift,
            GapArg::Skip => DstGap::Skip,
        }),
        dst_overlap: args.dst_overlap.map(|o| match o {
            OverlapArg::First => DstOverlap::First,
            OverlapArg::Last => DstOverlap::Last,
            OverlapArg::Both => DstOverlap::Both,
        }),
    };
    match Schedule::parse_with(&args.expr, &options) {
        Ok(s) => Ok(Some(s)),
        Err(e) => {
            eprint!("{}", e.render(&args.expr));
            Ok(None)
        }
    }
}

/// RFC 3339 with the zone's offset, such as 2026-03-08T03:00:00-04:00.
fn rfc3339(t: Timestamp, tz: &TimeZone) -> String {
    t.to_zoned_datetime(tz.clone())
        .strftime("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

fn describe_policy(s: &Schedule) -> String {
    let kind = if s.is_wall_clock() {
        "wall-clock times"
    } else {
        "a rhythm"
    };
    let gap = match s.dst_gap() {
        DstGap::Shift => "shift",
        DstGap::Skip => "skip",
    };
    let overlap = match s.dst_overlap() {
        DstOverlap::First => "first",
        DstOverlap::Last => "last",
        DstOverlap::Both => "both",
    };
    format!("{kind}; dst_gap: {gap}, dst_overlap: {overlap}")
}

fn print_table(out: &mut impl Write, s: &Schedule, from: Timestamp, count: usize) -> Result<usize> {
    let tz = s.time_zone();
    let mut n = 0;
    writeln!(out, "{:>4}  {:<26}  {:<20}  note", "#", "local time", "UTC")?;
    for (i, fire) in s.fires_after(from).take(count).enumerate() {
        let local = fire
            .at
            .to_zoned_datetime(tz.clone())
            .strftime("%Y-%m-%d %H:%M:%S %:z")
            .to_string();
        let note = fire.dst.map_or("", |d| d.describe());
        writeln!(
            out,
            "{:>4}  {:<26}  {:<20}  {note}",
            i + 1,
            local,
            fire.at.to_string()
        )?;
        n += 1;
    }
    Ok(n)
}

pub(crate) fn run(cmd: CronCommand) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match cmd {
        CronCommand::Check { expr } => {
            let Some(s) = parse(&expr)? else {
                return Ok(ExitCode::from(2));
            };
            writeln!(out, "valid: {}", s.explain())?;
            writeln!(out, "normal form: {}", s.normalized())?;
        }
        CronCommand::Explain { expr } => {
            let Some(s) = parse(&expr)? else {
                return Ok(ExitCode::from(2));
            };
            writeln!(out, "{}", s.explain())?;
            writeln!(out, "normal form: {}", s.normalized())?;
            writeln!(out, "daylight saving: {}", describe_policy(&s))?;
            writeln!(out)?;
            if print_table(&mut out, &s, Timestamp::now(), 5)? == 0 {
                writeln!(out, "(no fires after now)")?;
            }
        }
        CronCommand::Next {
            expr,
            from,
            count,
            json,
        } => {
            let Some(s) = parse(&expr)? else {
                return Ok(ExitCode::from(2));
            };
            let from = match from {
                Some(f) => f.parse::<Timestamp>().with_context(|| {
                    format!("--from {f:?} is not an RFC 3339 instant (accepted: such as 2026-03-08T00:00:00Z or 2026-03-08T00:00:00-05:00)")
                })?,
                None => Timestamp::now(),
            };
            if json {
                let fires: Vec<String> = s
                    .fires_after(from)
                    .take(count)
                    .map(|f| rfc3339(f.at, s.time_zone()))
                    .collect();
                if fires.is_empty() && count > 0 {
                    bail!("`{}` has no fire after {from}", expr.expr);
                }
                writeln!(out, "{}", serde_json::to_string(&fires)?)?;
            } else {
                writeln!(out, "{}  ({})", s.explain(), describe_policy(&s))?;
                if print_table(&mut out, &s, from, count)? == 0 && count > 0 {
                    bail!("`{}` has no fire after {from}", expr.expr);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
