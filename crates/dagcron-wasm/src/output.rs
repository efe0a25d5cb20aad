//! The module's standard output and error: one capped buffer for both (so
//! they interleave as written, like a shell task's), copied as it comes
//! to whoever follows the attempt.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Called with each piece of output as the module writes it.
pub type OnOutput = Arc<dyn Fn(&[u8]) + Send + Sync>;

struct Buffer {
    kept: Vec<u8>,
    cap: usize,
    dropped: usize,
}

/// Where both output streams of one attempt go.
#[derive(Clone)]
pub(crate) struct Sink {
    buf: Arc<Mutex<Buffer>>,
    on_output: Option<OnOutput>,
}

impl Sink {
    pub(crate) fn new(cap: usize, on_output: Option<OnOutput>) -> Sink {
        Sink {
            buf: Arc::new(Mutex::new(Buffer {
                kept: Vec::new(),
                cap,
                dropped: 0,
            })),
            on_output,
        }
    }

    /// Everything kept, with a line saying how much was dropped past the cap.
    pub(crate) fn take(&self) -> Vec<u8> {
        let mut buf = self.buf.lock().expect("output lock");
        let mut out = std::mem::take(&mut buf.kept);
        if buf.dropped > 0 {
            out.extend_from_slice(
                format!(
                    "\n[dagcron: output truncated, {} more bytes dropped]\n",
                    buf.dropped
                )
                .as_bytes(),
            );
        }
        out
    }

    fn push(&self, bytes: &[u8]) {
        let taken = {
            let mut buf = self.buf.lock().expect("output lock");
            let room = buf.cap.saturating_sub(buf.kept.len());
            let take = room.min(bytes.len());
            buf.kept.extend_from_slice(&bytes[..take]);
            buf.dropped += bytes.len() - take;
            take
        };
        if let Some(on_output) = &self.on_output {
            if taken > 0 {
                on_output(&bytes[..taken]);
            }
        }
    }
}

impl IsTerminal for Sink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Sink {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Writes never wait: what is past the cap is counted and dropped.
#[wasmtime_wasi::async_trait]
impl Pollable for Sink {
    async fn ready(&mut self) {}
}

impl OutputStream for Sink {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

impl tokio::io::AsyncWrite for Sink {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_counted_not_kept() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let copy = seen.clone();
        let sink = Sink::new(
            4,
            Some(Arc::new(move |b: &[u8]| {
                copy.lock().unwrap().extend_from_slice(b)
            })),
        );
        sink.push(b"abc");
        sink.push(b"defg");
        assert_eq!(
            String::from_utf8(sink.take()).unwrap(),
            "abcd\n[dagcron: output truncated, 3 more bytes dropped]\n"
        );
        assert_eq!(*seen.lock().unwrap(), b"abcd");
    }
}
