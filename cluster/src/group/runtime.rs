//! openraft's tokio runtime with one change: its channels carry boxed
//! messages (ADR 0114).
//!
//! tokio's mpsc allocates its first block of 32 slots when a channel is
//! created, each slot as large as the message. Every `Raft` opens four such
//! channels whose messages are 160 to 368 bytes (`RaftMsg`, the install-
//! snapshot request, `Notification`, the state machine's command): about
//! 28 KB per group before it does anything, 116 MB per broker at 4,096
//! vnodes. With the message boxed a slot is one pointer, so a channel costs
//! about 300 bytes; each message sent costs one allocation instead. Capacity,
//! order, closing and the error values are tokio's, as before.
//!
//! Everything else (tasks, timers, instants, watch, oneshot, mutex) is
//! `TokioRuntime`'s, delegated unchanged.

use openraft::async_runtime::{
    Mpsc, MpscReceiver, MpscSender, MpscWeakSender, SendError, TryRecvError,
};
use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use std::future::Future;
use std::time::Duration;

type Tokio = TokioRuntime;
type TokioMpsc = <TokioRuntime as AsyncRuntime>::Mpsc;

/// `TokioRuntime` whose mpsc channels box their messages.
#[derive(Debug)]
pub(crate) struct BoxedTokioRuntime(TokioRuntime);

impl AsyncRuntime for BoxedTokioRuntime {
    type JoinError = <Tokio as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <Tokio as AsyncRuntime>::Sleep;
    type Instant = <Tokio as AsyncRuntime>::Instant;
    type TimeoutError = <Tokio as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <Tokio as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = <Tokio as AsyncRuntime>::ThreadLocalRng;

    #[inline]
    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        Tokio::spawn(future)
    }

    #[inline]
    fn sleep(duration: Duration) -> Self::Sleep {
        Tokio::sleep(duration)
    }

    #[inline]
    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        Tokio::sleep_until(deadline)
    }

    #[inline]
    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout(duration, future)
    }

    #[inline]
    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        Tokio::timeout_at(deadline, future)
    }

    #[inline]
    fn is_panic(join_error: &Self::JoinError) -> bool {
        Tokio::is_panic(join_error)
    }

    #[inline]
    fn thread_rng() -> Self::ThreadLocalRng {
        Tokio::thread_rng()
    }

    type Mpsc = BoxedMpsc;
    type Watch = <Tokio as AsyncRuntime>::Watch;
    type Oneshot = <Tokio as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <Tokio as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        BoxedTokioRuntime(Tokio::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }
}

/// tokio's mpsc with every message in a `Box`.
pub(crate) struct BoxedMpsc;

type Inner<T> = <TokioMpsc as Mpsc>::Sender<Box<T>>;
type InnerReceiver<T> = <TokioMpsc as Mpsc>::Receiver<Box<T>>;
type InnerWeak<T> = <TokioMpsc as Mpsc>::WeakSender<Box<T>>;

pub(crate) struct BoxedSender<T: OptionalSend>(Inner<T>);
pub(crate) struct BoxedReceiver<T: OptionalSend>(InnerReceiver<T>);
pub(crate) struct BoxedWeakSender<T: OptionalSend>(InnerWeak<T>);

impl<T: OptionalSend> Clone for BoxedSender<T> {
    fn clone(&self) -> Self {
        BoxedSender(self.0.clone())
    }
}

impl<T: OptionalSend> Clone for BoxedWeakSender<T> {
    fn clone(&self) -> Self {
        BoxedWeakSender(self.0.clone())
    }
}

impl Mpsc for BoxedMpsc {
    type Sender<T: OptionalSend> = BoxedSender<T>;
    type Receiver<T: OptionalSend> = BoxedReceiver<T>;
    type WeakSender<T: OptionalSend> = BoxedWeakSender<T>;

    fn channel<T: OptionalSend>(buffer: usize) -> (Self::Sender<T>, Self::Receiver<T>) {
        let (tx, rx) = TokioMpsc::channel(buffer);
        (BoxedSender(tx), BoxedReceiver(rx))
    }
}

impl<T: OptionalSend> MpscSender<BoxedMpsc, T> for BoxedSender<T> {
    #[inline]
    fn send(&self, msg: T) -> impl Future<Output = Result<(), SendError<T>>> + OptionalSend {
        let sending = self.0.send(Box::new(msg));
        async move { sending.await.map_err(|SendError(boxed)| SendError(*boxed)) }
    }

    #[inline]
    fn downgrade(&self) -> BoxedWeakSender<T> {
        BoxedWeakSender(self.0.downgrade())
    }
}

impl<T: OptionalSend> MpscReceiver<T> for BoxedReceiver<T> {
    #[inline]
    fn recv(&mut self) -> impl Future<Output = Option<T>> + OptionalSend {
        let receiving = self.0.recv();
        async move { receiving.await.map(|boxed| *boxed) }
    }

    #[inline]
    fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map(|boxed| *boxed)
    }
}

impl<T: OptionalSend> MpscWeakSender<BoxedMpsc, T> for BoxedWeakSender<T> {
    #[inline]
    fn upgrade(&self) -> Option<BoxedSender<T>> {
        self.0.upgrade().map(BoxedSender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Big = [u64; 64];

    #[tokio::test]
    async fn messages_arrive_in_order_and_the_bound_holds() {
        let (tx, mut rx) = BoxedMpsc::channel::<Big>(2);
        tx.send([1; 64]).await.unwrap();
        tx.send([2; 64]).await.unwrap();
        // Full: a third send waits until one is received.
        let third = tx.send([3; 64]);
        tokio::pin!(third);
        assert!(futures::poll!(&mut third).is_pending());
        assert_eq!(rx.recv().await.unwrap()[0], 1);
        third.await.unwrap();
        assert_eq!(rx.try_recv().unwrap()[0], 2);
        assert_eq!(rx.recv().await.unwrap()[0], 3);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
    }

    #[tokio::test]
    async fn a_closed_channel_hands_the_message_back() {
        let (tx, rx) = BoxedMpsc::channel::<Big>(4);
        let weak = tx.downgrade();
        assert!(weak.upgrade().is_some());
        drop(rx);
        let SendError(back) = tx.send([7; 64]).await.unwrap_err();
        assert_eq!(back, [7; 64]);
        drop(tx);
        assert!(weak.upgrade().is_none());
    }

    #[tokio::test]
    async fn a_receiver_sees_the_close_after_the_last_message() {
        let (tx, mut rx) = BoxedMpsc::channel::<String>(4);
        tx.send("last".to_string()).await.unwrap();
        drop(tx);
        assert_eq!(rx.recv().await.as_deref(), Some("last"));
        assert_eq!(rx.recv().await, None);
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Disconnected)));
    }
}
