//! Memory budgets of the client port (used by `serve::connection`; here,
//! below `control`, because the broker context holds the broker-wide ones): the request bytes and the response
//! bytes all connections together may hold (`request_bytes_budget`,
//! `response_bytes_budget`), what the connections of one client address may
//! hold together (`address_request_bytes_max`, `address_response_bytes_max`)
//! and what one connection may hold of each (`connection_request_bytes_max`,
//! `connection_response_bytes_max`).
//!
//! A budget is a semaphore counted in KiB (so a budget of many GiB still
//! fits the `u32` of `acquire_many`). A connection takes its share before it
//! holds the bytes: request bytes as they arrive, a read's room at a time
//! (never a frame's declared length up front, ADR 0145), a response's
//! estimate before its request is handled. While a budget is spent the
//! connection waits, and a waiting connection does not read its socket, so
//! TCP pushes back on its client. A share is taken from three layers in
//! order: the connection's own cap, its client address's share
//! ([`AddressBudget`], shared by every connection from that address), then
//! the broker's budget; so a connection at its own cap, or an address at its
//! share, waits on its own semaphore and leaves the rest to the others.
//!
//! What is taken is a [`Held`]: it returns every layer's share when dropped (the
//! request handled, the response written or dropped, the connection gone),
//! so nothing can leak budget, not even a panicking handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use metrics::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The unit budgets are counted in.
const UNIT_BYTES: usize = 1024;

/// Units a connection's or an address's request cap holds beyond its
/// configured bytes: the reader's share of one frame can exceed the frame by
/// the rounding of its last read and by the frame's 4 length bytes, and a
/// frame of exactly `frame_bytes_max` must still fit a cap of
/// `frame_bytes_max`. (The broker-wide budget has none: what it shows in use
/// never exceeds what is configured.)
const REQUEST_SLACK_UNITS: u32 = 2;

/// KiB covering `bytes` (at least one, so every held frame counts).
fn units(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(UNIT_BYTES).max(1)).unwrap_or(u32::MAX)
}

/// One broker-wide budget and the gauge of what is in use.
#[derive(Debug)]
pub(crate) struct Budget {
    semaphore: Arc<Semaphore>,
    units_max: u32,
    in_use: Gauge,
}

impl Budget {
    pub(crate) fn new(bytes: usize, in_use: Gauge) -> Budget {
        let units_max = units(bytes);
        in_use.set(0.0);
        Budget {
            semaphore: Arc::new(Semaphore::new(units_max as usize)),
            units_max,
            in_use,
        }
    }

    /// Bytes held now (what the gauge shows).
    #[allow(dead_code)]
    pub(crate) fn in_use_bytes(&self) -> usize {
        (self.units_max as usize - self.semaphore.available_permits()) * UNIT_BYTES
    }
}

/// The broker-wide budgets, one per direction.
#[derive(Debug)]
pub(crate) struct Budgets {
    pub request: Budget,
    pub response: Budget,
}

/// What the connections of one client address share (ADR 0145): their
/// part of each broker-wide budget (`address_request_bytes_max`,
/// `address_response_bytes_max`), so the connections of one host together
/// cannot hold more than that, however many they are.
#[derive(Debug)]
pub(crate) struct AddressBudget {
    request: Arc<Semaphore>,
    response: Arc<Semaphore>,
    request_units_max: u32,
    response_units_max: u32,
}

impl AddressBudget {
    pub(crate) fn new(request_bytes_max: usize, response_bytes_max: usize) -> AddressBudget {
        let request_units_max = units(request_bytes_max).saturating_add(REQUEST_SLACK_UNITS);
        let response_units_max = units(response_bytes_max);
        AddressBudget {
            request: Arc::new(Semaphore::new(request_units_max as usize)),
            response: Arc::new(Semaphore::new(response_units_max as usize)),
            request_units_max,
            response_units_max,
        }
    }
}

/// The semaphores one share is taken from, in the order they are taken:
/// the connection's own cap, its address's, then the broker's budget.
struct Layers<'a> {
    own: &'a Arc<Semaphore>,
    address: Option<&'a Arc<Semaphore>>,
    budget: &'a Budget,
}

impl<'a> Layers<'a> {
    fn semaphores(&self) -> impl Iterator<Item = &'a Arc<Semaphore>> {
        let budget: &'a Budget = self.budget;
        [Some(self.own), self.address, Some(&budget.semaphore)]
            .into_iter()
            .flatten()
    }
}

/// One connection's caps, one per direction, and its address's share.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionBudget {
    request: Arc<Semaphore>,
    response: Arc<Semaphore>,
    request_units_max: u32,
    response_units_max: u32,
    address: Option<Arc<AddressBudget>>,
    /// The most bytes this connection held at once, both directions: a
    /// connection that held large buffers asks the allocator to give
    /// memory back when it closes.
    held_peak_bytes: Arc<AtomicUsize>,
    held_bytes: Arc<AtomicUsize>,
}

impl ConnectionBudget {
    pub(crate) fn new(
        request_bytes_max: usize,
        response_bytes_max: usize,
        address: Option<Arc<AddressBudget>>,
    ) -> ConnectionBudget {
        let mut request_units_max = units(request_bytes_max).saturating_add(REQUEST_SLACK_UNITS);
        let mut response_units_max = units(response_bytes_max);
        if let Some(address) = &address {
            request_units_max = request_units_max.min(address.request_units_max);
            response_units_max = response_units_max.min(address.response_units_max);
        }
        ConnectionBudget {
            request: Arc::new(Semaphore::new(request_units_max as usize)),
            response: Arc::new(Semaphore::new(response_units_max as usize)),
            request_units_max,
            response_units_max,
            address,
            held_peak_bytes: Arc::new(AtomicUsize::new(0)),
            held_bytes: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn held_peak_bytes(&self) -> usize {
        self.held_peak_bytes.load(Ordering::SeqCst)
    }

    fn request_layers<'a>(&'a self, budgets: &'a Budgets) -> Layers<'a> {
        Layers {
            own: &self.request,
            address: self.address.as_ref().map(|a| &a.request),
            budget: &budgets.request,
        }
    }

    fn response_layers<'a>(&'a self, budgets: &'a Budgets) -> Layers<'a> {
        Layers {
            own: &self.response,
            address: self.address.as_ref().map(|a| &a.response),
            budget: &budgets.response,
        }
    }

    /// Take `bytes` of request budget, waiting while the connection's cap,
    /// its address's share or the broker's budget is spent. Cancel-safe.
    pub(crate) async fn request(&self, budgets: &Budgets, bytes: usize) -> Held {
        let n = units(bytes).min(self.request_units_max);
        self.take(self.request_layers(budgets), n).await
    }

    /// Take `bytes` of request budget now, or nothing.
    pub(crate) fn try_request(&self, budgets: &Budgets, bytes: usize) -> Option<Held> {
        let n = units(bytes).min(self.request_units_max);
        self.try_take(self.request_layers(budgets), n)
    }

    /// Take `bytes` of response budget (see [`ConnectionBudget::request`]).
    pub(crate) async fn response(&self, budgets: &Budgets, bytes: usize) -> Held {
        let n = units(bytes).min(self.response_units_max);
        self.take(self.response_layers(budgets), n).await
    }

    /// Grow `held` (a response share) to cover `bytes`. Never waits while
    /// holding: the semaphores are fair (FIFO), so a share that waited for
    /// more could wait behind a taker that needs what it holds, for ever.
    /// When the rest is not free at once, the share is given back first and
    /// the whole size is then waited for like [`ConnectionBudget::response`].
    pub(crate) async fn grow_response(&self, budgets: &Budgets, held: &mut Held, bytes: usize) {
        let want = units(bytes).min(self.response_units_max);
        if want <= held.units {
            return;
        }
        if let Some(more) = self.try_take(self.response_layers(budgets), want - held.units) {
            held.absorb(more);
            return;
        }
        // Give the share back before waiting (dropping it returns its units).
        drop(std::mem::replace(held, self.empty(&budgets.response)));
        *held = self.take(self.response_layers(budgets), want).await;
    }

    /// A share of nothing, counted against `budget`'s gauge.
    fn empty(&self, budget: &Budget) -> Held {
        Held {
            units: 0,
            permits: Vec::new(),
            in_use: budget.in_use.clone(),
            held_bytes: Arc::clone(&self.held_bytes),
        }
    }

    /// Take `n` units of every layer now, or nothing.
    fn try_take(&self, layers: Layers<'_>, n: u32) -> Option<Held> {
        let permits = layers
            .semaphores()
            .map(|s| Arc::clone(s).try_acquire_many_owned(n).ok())
            .collect::<Option<Vec<_>>>()?;
        Some(self.held(layers.budget, n, permits))
    }

    async fn take(&self, layers: Layers<'_>, n: u32) -> Held {
        // No semaphore is ever closed, so acquiring cannot fail; if one
        // were, the share is simply not held of it.
        let mut permits = Vec::with_capacity(3);
        for semaphore in layers.semaphores() {
            if let Ok(permit) = Arc::clone(semaphore).acquire_many_owned(n).await {
                permits.push(permit);
            }
        }
        self.held(layers.budget, n, permits)
    }

    fn held(&self, budget: &Budget, n: u32, permits: Vec<OwnedSemaphorePermit>) -> Held {
        let bytes = n as usize * UNIT_BYTES;
        budget.in_use.increment(bytes as f64);
        let now = self.held_bytes.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.held_peak_bytes.fetch_max(now, Ordering::SeqCst);
        Held {
            units: n,
            permits,
            in_use: budget.in_use.clone(),
            held_bytes: Arc::clone(&self.held_bytes),
        }
    }
}

/// Budget taken: returned to the connection, its address and the broker
/// when dropped. Holds one permit per layer, each of `units`.
#[derive(Debug)]
pub(crate) struct Held {
    units: u32,
    permits: Vec<OwnedSemaphorePermit>,
    in_use: Gauge,
    held_bytes: Arc<AtomicUsize>,
}

impl Held {
    /// Bytes this share covers.
    pub(crate) fn bytes(&self) -> usize {
        self.units as usize * UNIT_BYTES
    }

    /// Takes `other` (a share of the same connection and direction) into
    /// this one.
    pub(crate) fn absorb(&mut self, mut other: Held) {
        if self.permits.len() == other.permits.len() {
            for (mine, theirs) in self.permits.iter_mut().zip(other.permits.drain(..)) {
                mine.merge(theirs);
            }
        } else {
            self.permits.append(&mut other.permits);
        }
        self.units += other.units;
        // `other` now returns nothing; its bytes are ours to return.
        other.units = 0;
    }

    /// Splits off a share covering `bytes` (rounded up to the unit, at most
    /// all this share holds); this share keeps the rest.
    pub(crate) fn split(&mut self, bytes: usize) -> Held {
        let n = units(bytes).min(self.units);
        let permits = self
            .permits
            .iter_mut()
            .filter_map(|p| p.split(n as usize))
            .collect();
        self.units -= n;
        Held {
            units: n,
            permits,
            in_use: self.in_use.clone(),
            held_bytes: Arc::clone(&self.held_bytes),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let bytes = self.units as usize * UNIT_BYTES;
        if bytes > 0 {
            self.in_use.decrement(bytes as f64);
            self.held_bytes.fetch_sub(bytes, Ordering::SeqCst);
        }
        // The permits return to their semaphores as `permits` drops.
    }
}

/// Ask glibc to return freed memory to the OS. A connection that held large
/// frames leaves its freed buffers in malloc's arenas (one per worker
/// thread), which glibc does not hand back by itself, so the broker's RSS
/// would stay at its peak after the client is gone.
pub(crate) fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Safety: malloc_trim takes no pointers; it only walks and trims
        // malloc's own arenas, under their locks.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(request: usize, response: usize) -> Budgets {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let key = |n: &'static str| metrics::Key::from_name(n);
        let meta = metrics::Metadata::new("t", metrics::Level::INFO, None);
        use metrics::Recorder;
        Budgets {
            request: Budget::new(request, recorder.register_gauge(&key("a"), &meta)),
            response: Budget::new(response, recorder.register_gauge(&key("b"), &meta)),
        }
    }

    #[tokio::test]
    async fn a_share_is_returned_when_dropped_and_the_budget_waits_when_spent() {
        let b = budgets(64 << 10, 64 << 10);
        let conn = ConnectionBudget::new(64 << 10, 64 << 10, None);
        let held = conn.request(&b, 40 << 10).await;
        assert_eq!(b.request.in_use_bytes(), 40 << 10);
        let other = ConnectionBudget::new(64 << 10, 64 << 10, None);
        let wait = other.request(&b, 40 << 10);
        tokio::pin!(wait);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut wait)
                .await
                .is_err(),
            "a spent budget must make the next taker wait"
        );
        drop(held);
        let second = wait.await;
        assert_eq!(b.request.in_use_bytes(), 40 << 10);
        drop(second);
        assert_eq!(b.request.in_use_bytes(), 0);
        assert_eq!(conn.held_peak_bytes(), 40 << 10);
    }

    #[tokio::test]
    async fn one_connection_is_held_to_its_own_cap() {
        let b = budgets(1 << 20, 1 << 20);
        let conn = ConnectionBudget::new(64 << 10, 64 << 10, None);
        let mut held = conn.response(&b, 16 << 10).await;
        conn.grow_response(&b, &mut held, 48 << 10).await;
        assert_eq!(held.bytes(), 48 << 10);
        let wait = conn.response(&b, 32 << 10);
        tokio::pin!(wait);
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), &mut wait)
                .await
                .is_err(),
            "the connection's cap must hold it even with budget left"
        );
        // Others are not held up by it.
        let other = ConnectionBudget::new(64 << 10, 64 << 10, None);
        drop(other.response(&b, 64 << 10).await);
        drop(held);
        drop(wait.await);
        assert_eq!(b.response.in_use_bytes(), 0);
    }

    /// Regression: a share that waited to grow while holding could wait
    /// behind a taker (FIFO) that needed what it held: a pipelined small
    /// answer growing past its estimate, behind a fetch asking for the whole
    /// cap, froze the connection for good.
    #[tokio::test]
    async fn growing_a_share_never_waits_while_holding_it() {
        let b = Arc::new(budgets(1 << 20, 1 << 20));
        let conn = ConnectionBudget::new(64 << 10, 64 << 10, None);
        let mut small = conn.response(&b, 16 << 10).await;
        // A fetch's share for the whole cap queues behind it, answers, and
        // lets its share go.
        let (budgets_, conn_) = (Arc::clone(&b), conn.clone());
        let whole = tokio::spawn(async move {
            let held = conn_.response(&budgets_, 64 << 10).await;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            drop(held);
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // The small answer grew to 32 KiB: it must get it (letting its share
        // go first when it has to), not wait behind the fetch for ever.
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            conn.grow_response(&b, &mut small, 32 << 10),
        )
        .await
        .expect("growing a share must not deadlock");
        assert_eq!(small.bytes(), 32 << 10);
        whole.await.unwrap();
        drop(small);
        assert_eq!(b.response.in_use_bytes(), 0);
    }

    #[tokio::test]
    async fn an_address_share_holds_all_its_connections_and_a_split_returns_its_part() {
        let b = budgets(1 << 20, 1 << 20);
        let address = Arc::new(AddressBudget::new(64 << 10, 64 << 10));
        let one = ConnectionBudget::new(64 << 10, 64 << 10, Some(Arc::clone(&address)));
        let two = ConnectionBudget::new(64 << 10, 64 << 10, Some(Arc::clone(&address)));
        let mut held = one.request(&b, 48 << 10).await;
        assert!(
            two.try_request(&b, 32 << 10).is_none(),
            "the address's share is shared by its connections"
        );
        let elsewhere = ConnectionBudget::new(
            64 << 10,
            64 << 10,
            Some(Arc::new(AddressBudget::new(64 << 10, 64 << 10))),
        );
        drop(
            elsewhere
                .try_request(&b, 64 << 10)
                .expect("another address is not held up"),
        );
        let part = held.split(16 << 10);
        assert_eq!((part.bytes(), held.bytes()), (16 << 10, 32 << 10));
        drop(part);
        assert_eq!(b.request.in_use_bytes(), 32 << 10);
        let more = one
            .try_request(&b, 32 << 10)
            .expect("the part split off and dropped came back");
        held.absorb(more);
        assert_eq!(held.bytes(), 64 << 10);
        assert!(two.try_request(&b, 4 << 10).is_none());
        drop(held);
        assert_eq!(b.request.in_use_bytes(), 0);
    }
}
