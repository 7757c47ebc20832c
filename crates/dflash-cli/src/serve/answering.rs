//! One job's answer on its connection: the engine's events written as one JSON answer
//! or as server-sent events, the client checked every 200 ms and its job interrupted
//! when it is gone.

use super::http::{self, client_gone, write_error, write_event, write_json};
use super::jobs::Event;
use dflash_core::generate::{Interrupt, Piece};
use dflash_engine::response::Reply;
use std::net::TcpStream;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// One job's answer on its connection, as the engine's events arrive.
pub(super) struct Answering<'a> {
    pub(super) stream: &'a TcpStream,
    pub(super) rx: &'a Receiver<Event>,
    pub(super) interrupt: &'a Interrupt,
    pub(super) reply: Reply,
}

impl Answering<'_> {
    /// Waits for the next event, checking every 200 ms (whether or not events come)
    /// that the client is still there, and interrupting the job when it is not.
    fn next(&self, checked: &mut Instant) -> Option<Event> {
        const EVERY: Duration = Duration::from_millis(200);
        loop {
            if checked.elapsed() >= EVERY {
                *checked = Instant::now();
                if client_gone(self.stream) {
                    self.interrupt.set();
                }
            }
            match self.rx.recv_timeout(EVERY) {
                Ok(e) => return Some(e),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    pub(super) fn whole(&self) -> std::io::Result<()> {
        let mut text = String::new();
        let mut checked = Instant::now();
        while let Some(e) = self.next(&mut checked) {
            match e {
                Event::Piece(p, ..) => text.push_str(&p),
                Event::Done(a) => {
                    return write_json(self.stream, 200, &self.reply.whole(&text, &a))
                }
                Event::Failed(status, code, message) => {
                    return write_error(self.stream, status, &code, &message)
                }
            }
        }
        write_error(
            self.stream,
            500,
            "Internal",
            "the engine dropped the request",
        )
    }

    pub(super) fn streamed(&self) -> std::io::Result<()> {
        let stream = self.stream;
        // Errors before the first piece keep their status; after it they end the stream.
        let mut checked = Instant::now();
        let first = match self.next(&mut checked) {
            Some(Event::Failed(status, code, message)) => {
                return write_error(stream, status, &code, &message)
            }
            Some(e) => e,
            None => return write_error(stream, 500, "Internal", "the engine dropped the request"),
        };
        http::start_events(stream)?;
        if let Some(c) = self.reply.first_chunk() {
            write_event(stream, &c.to_string())?;
        }
        let mut event = Some(first);
        while let Some(e) = event {
            match e {
                Event::Piece(text, ids, drafted, logprobs, calls) => {
                    let piece = Piece {
                        text: &text,
                        ids: &ids,
                        drafted,
                        logprobs: &logprobs,
                        tool_calls: &calls,
                    };
                    write_event(stream, &self.reply.piece_chunk(&piece).to_string())?
                }
                Event::Done(a) => {
                    for c in self.reply.last_chunks(&a) {
                        write_event(stream, &c.to_string())?;
                    }
                    return write_event(stream, "[DONE]");
                }
                Event::Failed(_, code, message) => {
                    return write_event(stream, &http::error_body(500, &code, &message).to_string())
                }
            }
            event = self.next(&mut checked);
        }
        Ok(())
    }
}
