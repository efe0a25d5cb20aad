//! `dagcron audit [--verify]`: the audit log, or a check of its chain.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use dagcron_api::wire::{AuditAnswer, AuditPage};
use serde::Serialize;

use super::Client;
use super::output::{Output, Show, instant};

/// Every row asked for, all pages.
#[derive(Serialize)]
#[serde(transparent)]
struct Rows(Vec<AuditAnswer>);

impl Show for Rows {
    fn text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{:>6} {:<28} {:<18} {:>3} {:<22} ACTION",
            "SEQ", "AT", "PRINCIPAL", "OUT", "FROM"
        )?;
        for r in &self.0 {
            writeln!(
                out,
                "{:>6} {:<28} {:<18} {:>3} {:<22} {}",
                r.seq,
                instant(&r.at),
                r.principal.as_deref().unwrap_or("-"),
                r.outcome,
                r.address.as_deref().unwrap_or("-"),
                r.action
            )?;
        }
        Ok(())
    }
}

/// Prints the audit log, or checks its chain (exit 1 if it is broken).
pub(super) async fn run(
    c: &Client,
    namespace: Option<String>,
    verify: bool,
    out: &mut Output,
) -> Result<ExitCode> {
    let mut rows = Vec::new();
    let mut after = 0;
    let mut checkpoint = None;
    loop {
        let ns = namespace
            .as_ref()
            .map(|n| format!("&namespace={n}"))
            .unwrap_or_default();
        let page: AuditPage = c
            .get(&format!("/api/v1/audit?limit=1000&after={after}{ns}"))
            .await?;
        rows.extend(page.items);
        if after == 0 {
            checkpoint = page.checkpoint;
        }
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    if !verify {
        out.show(&Rows(rows))?;
        return Ok(ExitCode::SUCCESS);
    }
    anyhow::ensure!(
        namespace.is_none(),
        "the chain runs through every namespace: verify the whole log (an instance admin's token)"
    );
    let entries: Vec<_> = rows.iter().filter_map(AuditAnswer::entry).collect();
    anyhow::ensure!(
        entries.len() == rows.len(),
        "the server answered a hash that is not hex"
    );
    let checkpoint = match checkpoint {
        None => None,
        Some(c) => Some(c.stored().ok_or_else(|| {
            anyhow::anyhow!("the server answered a checkpoint hash that is not hex")
        })?),
    };
    Ok(
        match dagcron_store::verify_audit(&entries, checkpoint.as_ref()) {
            Ok(()) => {
                match &checkpoint {
                None => out.say(format_args!("{} rows, chain intact", entries.len()))?,
                Some((seq, _)) => out.say(format_args!(
                    "{} rows, chain intact from the checkpoint after row {seq} (retention cut the rows before)",
                    entries.len()
                ))?,
            }
                ExitCode::SUCCESS
            }
            Err((seq, why)) => {
                out.say(format_args!("the audit log is broken at row {seq}: {why}"))?;
                ExitCode::FAILURE
            }
        },
    )
}
