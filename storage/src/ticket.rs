//! Runtime-agnostic completion of an append.
//!
//! An [`AppendTicket`] is both a `std::future::Future` (an actor awaits it)
//! and a blocking [`AppendTicket::wait`] (a benchmark thread blocks on it).
//! The store completes it from a sync thread after the fdatasync that covers
//! the ticket's bytes has returned, never before.

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::{Condvar, Mutex};

use crate::error::StorageError;

#[derive(Debug, Default)]
struct State {
    result: Option<Result<(), StorageError>>,
    waker: Option<Waker>,
}

/// The shared slot a sync thread fills in.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    state: Mutex<State>,
    done: Condvar,
}

impl Completion {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Completion::default())
    }

    /// Fills the slot once; later calls are ignored.
    pub(crate) fn complete(&self, result: Result<(), StorageError>) {
        let waker = {
            let mut state = self.state.lock();
            if state.result.is_some() {
                return;
            }
            state.result = Some(result);
            self.done.notify_all();
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Work a blocking waiter may do itself instead of waiting for a thread.
pub(crate) type Help = Box<dyn FnOnce() + Send>;

/// The promise of an append: which offsets the records got and, once
/// complete, whether they are durable.
#[must_use = "an append is acknowledged only when its ticket completes"]
pub struct AppendTicket {
    offsets: Range<u64>,
    completion: Arc<Completion>,
    help: Option<Help>,
}

impl std::fmt::Debug for AppendTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendTicket")
            .field("offsets", &self.offsets)
            .field("complete", &self.is_complete())
            .finish()
    }
}

impl AppendTicket {
    pub(crate) fn new(offsets: Range<u64>, completion: Arc<Completion>) -> Self {
        AppendTicket {
            offsets,
            completion,
            help: None,
        }
    }

    /// Lets `wait` run `help` (a flush) on the caller's thread first.
    pub(crate) fn with_help(mut self, help: Help) -> Self {
        self.help = Some(help);
        self
    }

    /// A ticket that is already complete (an empty batch, a sync with nothing
    /// to sync).
    pub(crate) fn ready(offsets: Range<u64>) -> Self {
        let completion = Completion::new();
        completion.complete(Ok(()));
        AppendTicket::new(offsets, completion)
    }

    /// The offsets assigned to the batch, known before it is durable.
    pub fn offsets(&self) -> Range<u64> {
        self.offsets.clone()
    }

    /// True once the outcome is known.
    pub fn is_complete(&self) -> bool {
        self.completion.state.lock().result.is_some()
    }

    /// Blocks the calling thread until the batch is durable or failed.
    pub fn wait(mut self) -> Result<Range<u64>, StorageError> {
        if let Some(help) = self.help.take()
            && !self.is_complete()
        {
            help();
        }
        let mut state = self.completion.state.lock();
        loop {
            if let Some(result) = &state.result {
                return result.clone().map(|()| self.offsets.clone());
            }
            self.completion.done.wait(&mut state);
        }
    }
}

impl Future for AppendTicket {
    type Output = Result<Range<u64>, StorageError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.completion.state.lock();
        if let Some(result) = &state.result {
            return Poll::Ready(result.clone().map(|()| self.offsets.clone()));
        }
        match &state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn future_is_pending_until_completed_then_wakes_and_resolves() {
        let completion = Completion::new();
        let mut ticket = AppendTicket::new(3..5, completion.clone());
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut ticket).poll(&mut cx).is_pending());
        completion.complete(Ok(()));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        match Pin::new(&mut ticket).poll(&mut cx) {
            Poll::Ready(Ok(range)) => assert_eq!(range, 3..5),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn wait_returns_the_error_a_flush_reported() {
        let completion = Completion::new();
        let ticket = AppendTicket::new(0..1, completion.clone());
        let handle = std::thread::spawn(move || ticket.wait());
        completion.complete(Err(StorageError::ShuttingDown));
        assert!(matches!(
            handle.join().unwrap(),
            Err(StorageError::ShuttingDown)
        ));
    }

    #[test]
    fn second_completion_is_ignored() {
        let completion = Completion::new();
        let ticket = AppendTicket::new(0..1, completion.clone());
        completion.complete(Ok(()));
        completion.complete(Err(StorageError::ShuttingDown));
        assert_eq!(ticket.wait().unwrap(), 0..1);
    }
}
