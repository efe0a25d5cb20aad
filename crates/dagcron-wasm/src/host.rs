//! What a store holds for one attempt: the WASI context built from the
//! grants (nothing else is reachable), and the limiter of memory and
//! tables that remembers why it refused.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::sockets::SocketAddrUse;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::output::Sink;
use crate::{Invocation, WasmError};

/// Table elements a module may have: enough for any compiler's function
/// tables, not enough to use tables as a way around the memory limit.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Memory and table growth within the task's limits; a refusal traps, and
/// is remembered so that the attempt's error can name it. The memory limit
/// is on all of a module's (or component's) linear memories together.
pub(crate) struct Limiter {
    memory: usize,
    /// Bytes of linear memory granted so far, all memories together.
    used: usize,
    /// The total a refused growth asked for, in bytes.
    pub(crate) refused_memory: Option<usize>,
    /// The elements a refused table growth asked for.
    pub(crate) refused_table: Option<usize>,
}

impl Limiter {
    pub(crate) fn new(memory: u64) -> Limiter {
        Limiter {
            memory: usize::try_from(memory).unwrap_or(usize::MAX),
            used: 0,
            refused_memory: None,
            refused_table: None,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = (self.used - current.min(self.used)).saturating_add(desired);
        if total > self.memory {
            self.refused_memory = Some(total);
            wasmtime::bail!("memory limit reached");
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.refused_table = Some(desired);
            wasmtime::bail!("table limit reached");
        }
        Ok(true)
    }
}

/// The store's data for a preview 1 module.
pub(crate) struct P1 {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) limiter: Limiter,
}

/// The store's data for a preview 2 component.
pub(crate) struct P2 {
    pub(crate) ctx: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: Limiter,
}

impl WasiView for P2 {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

/// Store data that holds a [`Limiter`].
pub(crate) trait Limited {
    fn limiter(&mut self) -> &mut Limiter;
}

impl Limited for P1 {
    fn limiter(&mut self) -> &mut Limiter {
        &mut self.limiter
    }
}

impl Limited for P2 {
    fn limiter(&mut self) -> &mut Limiter {
        &mut self.limiter
    }
}

/// A WASI context with the invocation's arguments, environment, standard
/// streams and grants; sockets, other directories and the host's
/// environment stay out of reach.
pub(crate) fn wasi(
    inv: &Invocation,
    sink: &Sink,
    allowed: Arc<HashSet<SocketAddr>>,
) -> Result<WasiCtxBuilder, WasmError> {
    let mut b = WasiCtxBuilder::new();
    b.stdin(MemoryInputPipe::new(inv.stdin.clone()))
        .stdout(sink.clone())
        .stderr(sink.clone());
    let argv: Vec<&str> = std::iter::once(inv.program.as_str())
        .chain(inv.args.iter().map(String::as_str))
        .collect();
    b.args(&argv).envs(&inv.env);
    for dir in &inv.dirs {
        let perms = if dir.write {
            FsPerms::ReadWrite
        } else {
            FsPerms::ReadOnly
        };
        b.preopened_dir(&dir.host, &dir.guest, perms)
            .map_err(|e| WasmError::Grant {
                host: dir.host.clone(),
                message: format!("{e:#}"),
            })?;
    }
    if !allowed.is_empty() {
        b.allow_tcp(true)
            .allow_ip_name_lookup(true)
            .socket_addr_check(move |addr, usage| {
                let ok = may_use(&allowed, addr, usage);
                Box::pin(async move { ok })
            });
    }
    Ok(b)
}

/// Whether a module granted `allowed` may use `addr` so: connections go
/// to the granted hosts' addresses only (the implicit bind of a connect
/// asks for the wildcard address and any port); no listening, no UDP.
fn may_use(allowed: &HashSet<SocketAddr>, addr: SocketAddr, usage: SocketAddrUse) -> bool {
    match usage {
        SocketAddrUse::TcpConnect => allowed.contains(&addr),
        SocketAddrUse::TcpBind => addr.ip().is_unspecified() && addr.port() == 0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connections_to_granted_addresses_are_allowed() {
        let granted: SocketAddr = "192.0.2.7:443".parse().unwrap();
        let allowed = HashSet::from([granted]);
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(may_use(&allowed, granted, SocketAddrUse::TcpConnect));
        assert!(!may_use(
            &allowed,
            at("192.0.2.7:80"),
            SocketAddrUse::TcpConnect
        ));
        assert!(!may_use(
            &allowed,
            at("192.0.2.8:443"),
            SocketAddrUse::TcpConnect
        ));
        assert!(may_use(&allowed, at("0.0.0.0:0"), SocketAddrUse::TcpBind));
        assert!(!may_use(
            &allowed,
            at("0.0.0.0:8080"),
            SocketAddrUse::TcpBind
        ));
        assert!(!may_use(
            &allowed,
            at("0.0.0.0:0"),
            SocketAddrUse::TcpListen
        ));
        assert!(!may_use(&allowed, granted, SocketAddrUse::UdpBind));
        assert!(!may_use(&allowed, granted, SocketAddrUse::UdpSend));
    }
}
