//! Exports the engine's spans over OTLP/gRPC (`opentelemetry-otlp`), set
//! up by the standard variables: on when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither
//! `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`);
//! `OTEL_SERVICE_NAME` (default `dagcron`), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` as usual.
//!
//! The engine hands each finished span to a bounded queue (never waiting:
//! a full queue drops the span and counts it); a task sends what has queued
//! up in batches, and flushes the rest when the server stops.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use dagcron_runtime::trace::{Ended, Sampler, Span, SpanSink, Tracing, Value};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Spans waiting to be sent; more are dropped (and counted).
const QUEUE: usize = 8192;

/// Spans sent in one request at most.
const BATCH: usize = 512;

/// The sink the engine writes to.
struct Queue {
    tx: mpsc::Sender<Ended>,
    dropped: Arc<AtomicU64>,
}

impl SpanSink for Queue {
    fn export(&self, ended: Ended) {
        if self.tx.try_send(ended).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The exporter's running half: ends once every sink is dropped (the
/// engine stopped) and what was queued is sent.
pub(crate) struct Exporter {
    task: JoinHandle<()>,
}

impl Exporter {
    /// Waits (bounded) until what was queued is sent.
    pub(crate) async fn flush(self) {
        if tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .is_err()
        {
            tracing::warn!("the trace exporter did not finish sending within 5 s");
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Tracing as the environment asks, for node `node`; `None` when it is off.
pub(crate) fn from_env(node: &str) -> Result<Option<(Tracing, Exporter)>> {
    let off = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
    let endpoint =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let Some(endpoint) = endpoint.filter(|_| !off) else {
        return Ok(None);
    };
    let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "grpc".into());
    if protocol != "grpc" {
        bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL is {protocol:?}: this server exports traces over OTLP/gRPC only (set it to grpc or leave it unset)"
        );
    }
    let sampler = Sampler::from_env(
        env("OTEL_TRACES_SAMPLER").as_deref(),
        env("OTEL_TRACES_SAMPLER_ARG").as_deref(),
    )
    .map_err(anyhow::Error::msg)?;
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .with_context(|| format!("the OTLP exporter to {endpoint}"))?;
    let mut resource = Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("dagcron");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.instance.id", node.to_string()))
        .with_attribute(KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION").to_string(),
        ))
        .build();
    exporter.set_resource(&resource);
    let (tx, mut rx) = mpsc::channel::<Ended>(QUEUE);
    let node = node.to_string();
    let dropped = Arc::new(AtomicU64::new(0));
    let lost = dropped.clone();
    let task = tokio::spawn(async move {
        let scope = InstrumentationScope::builder("dagcron")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let mut spans = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut spans, BATCH).await > 0 {
            let batch = spans
                .drain(..)
                .map(|ended| span_data(ended.span(&node), &scope))
                .collect();
            if let Err(e) = exporter.export(batch).await {
                tracing::warn!("sending spans to {endpoint} failed: {e}");
            }
            let n = lost.swap(0, Ordering::Relaxed);
            if n > 0 {
                tracing::warn!("{n} spans dropped: the exporter's queue was full");
            }
        }
        let _ = exporter.shutdown();
    });
    tracing::info!(
        "traces go to {} over OTLP/gRPC",
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .unwrap_or_default()
    );
    let tracing = Tracing {
        sink: Arc::new(Queue { tx, dropped }),
        sampler,
    };
    Ok(Some((tracing, Exporter { task })))
}

fn key_value(key: &'static str, value: Value) -> KeyValue {
    match value {
        Value::Text(v) => KeyValue::new(key, v),
        Value::Int(v) => KeyValue::new(key, v),
    }
}

fn system_time(at: jiff::Timestamp) -> SystemTime {
    let since = Duration::from_nanos(u64::try_from(at.as_nanosecond()).unwrap_or(0));
    SystemTime::UNIX_EPOCH + since
}

/// The OpenTelemetry form of a span.
fn span_data(span: Span, scope: &InstrumentationScope) -> SpanData {
    let state = span
        .state
        .as_deref()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let mut events = SpanEvents::default();
    for e in span.events {
        events.events.push(opentelemetry::trace::Event::new(
            e.name,
            system_time(e.at),
            e.attributes
                .into_iter()
                .map(|(k, v)| key_value(k, v))
                .collect(),
            0,
        ));
    }
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(span.trace_id),
            SpanId::from_bytes(span.span_id),
            TraceFlags::SAMPLED,
            false,
            state,
        ),
        parent_span_id: span.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: span.parent_remote,
        span_kind: SpanKind::Internal,
        name: Cow::Owned(span.name),
        start_time: system_time(span.start),
        end_time: system_time(span.end),
        attributes: span
            .attributes
            .into_iter()
            .map(|(k, v)| key_value(k, v))
            .collect(),
        dropped_attributes_count: 0,
        events,
        links: SpanLinks::default(),
        status: match span.error {
            Some(message) => Status::error(message),
            None => Status::Ok,
        },
        instrumentation_scope: scope.clone(),
    }
}
