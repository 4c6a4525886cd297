//! What the replica takes from its environment: the clock stamped into log entries, the random numbers openraft
//! draws (election timeouts), and where blocking disk work runs.
//!
//! In production these are the wall clock, the OS-seeded thread RNG and tokio's blocking pool. The deterministic
//! simulation (`drover-chaos`, `sim`) runs every replica on one thread of a paused-clock tokio runtime and calls
//! [`enter_simulation`] there first: then the clock is the runtime's (simulated) time, the RNG is seeded, and
//! blocking work runs inline, because a thread pool would let the OS scheduler decide the order of events and a
//! failing seed could not replay. The switch is per thread, so nothing changes for a process that never calls it.
//! openraft's watch channel is [`OrderedWatch`] in production too: tokio's wakes its waiters in a random order.

use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use openraft::rt::watch::{RecvError as WatchRecvError, SendError as WatchSendError};
use openraft::rt::{
    AsyncRuntime, OptionalSend, OptionalSync, Select2, Select3, Select4, Watch, WatchReceiver, WatchSender,
};
use openraft_rt_tokio::TokioRuntime;
use rand::rngs::{SmallRng, ThreadRng};
use rand::{SeedableRng, TryRng};

/// The simulation's view of this thread: set by [`enter_simulation`], cleared when its guard drops.
struct Simulated {
    /// Wall-clock ms that the simulation's start stands for (entries carry plausible epoch times).
    epoch_ms: u64,
    started: tokio::time::Instant,
    /// Each `thread_rng` call takes the next seed of this sequence, so draws depend only on their order.
    next_seed: Cell<u64>,
}

thread_local! {
    static SIMULATED: RefCell<Option<Simulated>> = const { RefCell::new(None) };
}

/// Undoes [`enter_simulation`] when dropped.
pub struct SimulationGuard {
    /// The guard must drop on the thread that entered: keep it `!Send`.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for SimulationGuard {
    fn drop(&mut self) {
        SIMULATED.with(|s| s.borrow_mut().take());
    }
}

/// Makes this thread simulated: [`now_ms`] reads tokio's clock (paused in the simulation) as `epoch_ms` plus the
/// time since this call, openraft's RNG draws from `seed`, and [`run_blocking`] runs inline. Must be called
/// inside the (current-thread) runtime that runs the replicas.
pub fn enter_simulation(seed: u64, epoch_ms: u64) -> SimulationGuard {
    let simulated = Simulated { epoch_ms, started: tokio::time::Instant::now(), next_seed: Cell::new(seed) };
    SIMULATED.with(|s| *s.borrow_mut() = Some(simulated));
    SimulationGuard { _not_send: std::marker::PhantomData }
}

pub(crate) fn is_simulated() -> bool {
    SIMULATED.with(|s| s.borrow().is_some())
}

/// Milliseconds since the Unix epoch: what the leader stamps into entries and what the scheduler plans at.
pub fn now_ms() -> u64 {
    let simulated =
        SIMULATED.with(|s| s.borrow().as_ref().map(|s| s.epoch_ms + s.started.elapsed().as_millis() as u64));
    simulated.unwrap_or_else(drover_common::wall::now_ms)
}

/// Runs blocking work (fsync, a scheduling pass, a snapshot) off the async workers; inline when simulated.
pub async fn run_blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    if is_simulated() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(|e| io::Error::other(format!("blocking task failed: {e}")))
}

/// Starts blocking work without waiting for it (its result travels some other way, e.g. a callback); inline when
/// simulated.
pub fn spawn_blocking_detached(f: impl FnOnce() + Send + 'static) {
    if is_simulated() {
        f();
        return;
    }
    // Detached on purpose: the caller learns the outcome through what `f` does.
    drop(tokio::task::spawn_blocking(f));
}

/// openraft's RNG: the thread's own in production, a seeded one when simulated.
pub enum RaftRng {
    Thread(ThreadRng),
    Seeded(SmallRng),
}

impl TryRng for RaftRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        match self {
            RaftRng::Thread(r) => r.try_next_u32(),
            RaftRng::Seeded(r) => r.try_next_u32(),
        }
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        match self {
            RaftRng::Thread(r) => r.try_next_u64(),
            RaftRng::Seeded(r) => r.try_next_u64(),
        }
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        match self {
            RaftRng::Thread(r) => r.try_fill_bytes(dst),
            RaftRng::Seeded(r) => r.try_fill_bytes(dst),
        }
    }
}

/// SplitMix64: each simulated `thread_rng` call gets an independent, reproducible seed.
fn next_seed(seed: u64) -> u64 {
    let z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// openraft's tokio runtime, except that its RNG is seeded on a simulated thread (see [`enter_simulation`]).
#[derive(Debug)]
pub struct DroverRuntime(TokioRuntime);

impl AsyncRuntime for DroverRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = RaftRng;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(duration: Duration, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(deadline: Self::Instant, future: F) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn select2<A, B>(a: A, b: B) -> impl Future<Output = Select2<A::Output, B::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
    {
        TokioRuntime::select2(a, b)
    }

    fn select3<A, B, C>(
        a: A,
        b: B,
        c: C,
    ) -> impl Future<Output = Select3<A::Output, B::Output, C::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
    {
        TokioRuntime::select3(a, b, c)
    }

    fn select4<A, B, C, D>(
        a: A,
        b: B,
        c: C,
        d: D,
    ) -> impl Future<Output = Select4<A::Output, B::Output, C::Output, D::Output>> + OptionalSend
    where
        A: Future + OptionalSend,
        B: Future + OptionalSend,
        C: Future + OptionalSend,
        D: Future + OptionalSend,
    {
        TokioRuntime::select4(a, b, c, d)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> RaftRng {
        let seeded = SIMULATED.with(|s| {
            s.borrow().as_ref().map(|s| {
                let seed = s.next_seed.get();
                s.next_seed.set(next_seed(seed));
                SmallRng::seed_from_u64(seed)
            })
        });
        seeded.map_or_else(|| RaftRng::Thread(rand::rng()), RaftRng::Seeded)
    }

    type Mpsc = <TokioRuntime as AsyncRuntime>::Mpsc;
    type Watch = OrderedWatch;
    type Oneshot = <TokioRuntime as AsyncRuntime>::Oneshot;
    type Mutex<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::Mutex<T>;

    fn new(threads: usize) -> Self {
        DroverRuntime(TokioRuntime::new(threads))
    }

    fn block_on<F, T>(&mut self, future: F) -> T
    where
        F: Future<Output = T>,
    {
        self.0.block_on(future)
    }

    fn spawn_blocking<F, T>(f: F) -> impl Future<Output = Result<T, io::Error>> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        TokioRuntime::spawn_blocking(f)
    }
}

/// openraft's watch channel (metrics, and its internal notifications), in place of tokio's: tokio's receivers
/// register on one of eight wake lists picked at random, so which waiting task runs first after a change would
/// differ between two runs of one simulated seed. Here waiters wake in the order they started waiting. Same
/// semantics otherwise: a receiver sees a change once, `send` without receivers fails, and receivers learn when
/// every sender is gone.
pub struct OrderedWatch;

struct WatchShared<T> {
    value: std::sync::RwLock<T>,
    /// Bumped on every change; a receiver remembers the version it saw.
    version: AtomicU64,
    senders: AtomicUsize,
    receivers: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl<T> WatchShared<T> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, T> {
        // A panic while modifying leaves the value as it was left; readers still get it, as tokio's do.
        self.value.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

pub struct OrderedWatchSender<T>(std::sync::Arc<WatchShared<T>>);

pub struct OrderedWatchReceiver<T> {
    shared: std::sync::Arc<WatchShared<T>>,
    seen: u64,
}

impl<T> Clone for OrderedWatchSender<T> {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::SeqCst);
        OrderedWatchSender(self.0.clone())
    }
}

impl<T> Drop for OrderedWatchSender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.changed.notify_waiters();
        }
    }
}

impl<T> Clone for OrderedWatchReceiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::SeqCst);
        OrderedWatchReceiver { shared: self.shared.clone(), seen: self.seen }
    }
}

impl<T> Drop for OrderedWatchReceiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Watch for OrderedWatch {
    type Sender<T: OptionalSend + OptionalSync> = OrderedWatchSender<T>;
    type Receiver<T: OptionalSend + OptionalSync> = OrderedWatchReceiver<T>;
    type Ref<'a, T: OptionalSend + 'a> = std::sync::RwLockReadGuard<'a, T>;

    fn channel<T: OptionalSend + OptionalSync>(init: T) -> (Self::Sender<T>, Self::Receiver<T>) {
        let shared = std::sync::Arc::new(WatchShared {
            value: std::sync::RwLock::new(init),
            version: AtomicU64::new(0),
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
            changed: tokio::sync::Notify::new(),
        });
        (OrderedWatchSender(shared.clone()), OrderedWatchReceiver { shared, seen: 0 })
    }
}

impl<T: OptionalSend + OptionalSync> WatchSender<OrderedWatch, T> for OrderedWatchSender<T> {
    fn send(&self, value: T) -> Result<(), WatchSendError<T>> {
        if self.0.receivers.load(Ordering::SeqCst) == 0 {
            return Err(WatchSendError(value));
        }
        self.send_if_modified(|current| {
            *current = value;
            true
        });
        Ok(())
    }

    fn send_if_modified<F>(&self, modify: F) -> bool
    where
        F: FnOnce(&mut T) -> bool,
    {
        let modified = {
            let mut value = self.0.value.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            modify(&mut value)
        };
        if modified {
            self.0.version.fetch_add(1, Ordering::SeqCst);
            self.0.changed.notify_waiters();
        }
        modified
    }

    fn borrow_watched(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.0.read()
    }

    fn subscribe(&self) -> OrderedWatchReceiver<T> {
        self.0.receivers.fetch_add(1, Ordering::SeqCst);
        OrderedWatchReceiver { shared: self.0.clone(), seen: self.0.version.load(Ordering::SeqCst) }
    }
}

impl<T: OptionalSend + OptionalSync> WatchReceiver<OrderedWatch, T> for OrderedWatchReceiver<T> {
    async fn changed(&mut self) -> Result<(), WatchRecvError> {
        loop {
            // Registered before the checks, so a change between them and the wait still wakes this receiver.
            let notified = self.shared.changed.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let version = self.shared.version.load(Ordering::SeqCst);
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.senders.load(Ordering::SeqCst) == 0 {
                return Err(WatchRecvError(()));
            }
            notified.await;
        }
    }

    fn borrow_watched(&self) -> std::sync::RwLockReadGuard<'_, T> {
        self.shared.read()
    }

    fn borrow_and_update(&mut self) -> std::sync::RwLockReadGuard<'_, T> {
        let guard = self.shared.read();
        // Under the read lock no send can land, so the version matches the value returned.
        self.seen = self.shared.version.load(Ordering::SeqCst);
        guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Tx = OrderedWatchSender<u64>;
    type Rx = OrderedWatchReceiver<u64>;

    fn channel() -> (Tx, Rx) {
        <OrderedWatch as Watch>::channel(0)
    }

    #[tokio::test]
    async fn a_receiver_sees_each_change_once_and_the_latest_value() {
        let (tx, mut rx) = channel();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_watched(), 2);
        // Seen: the next `changed` waits for a new value.
        let pending = tokio::time::timeout(Duration::from_millis(20), rx.changed()).await;
        assert!(pending.is_err(), "no change since the last one seen");
        assert!(!tx.send_if_modified(|_| false), "an unmodified value is no change");
        tx.send(3).unwrap();
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow_and_update(), 3);
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_on_send_and_learns_when_senders_are_gone() {
        let (tx, mut rx) = channel();
        let mut other = tx.subscribe();
        let waiter = tokio::spawn(async move {
            rx.changed().await.unwrap();
            let value = *rx.borrow_watched();
            (value, rx.changed().await.is_err())
        });
        tokio::task::yield_now().await;
        tx.send(7).unwrap();
        let sender_clone = tx.clone();
        drop(tx);
        assert!(other.changed().await.is_ok(), "a change made before the senders went is still seen");
        drop(sender_clone);
        assert_eq!(waiter.await.unwrap(), (7, true));
        assert!(other.changed().await.is_err());
    }

    #[tokio::test]
    async fn send_without_receivers_fails_and_keeps_the_old_value() {
        let (tx, rx) = channel();
        drop(rx);
        assert_eq!(tx.send(5).map_err(|e| e.0), Err(5));
        assert_eq!(*tx.borrow_watched(), 0);
        let rx = tx.subscribe();
        tx.send(6).unwrap();
        assert_eq!(*rx.borrow_watched(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn simulated_threads_get_seeded_draws_and_the_paused_clock() {
        use rand::RngExt;
        let draws = |seed| {
            let _guard = enter_simulation(seed, 1_000);
            (0..4).map(|_| DroverRuntime::thread_rng().random_range(0..1_000_000u64)).collect::<Vec<_>>()
        };
        assert_eq!(draws(1), draws(1), "one seed, one sequence");
        assert_ne!(draws(1), draws(2));
        let _guard = enter_simulation(1, 1_000);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(now_ms(), 1_250, "the clock is the runtime's paused one");
        assert_eq!(run_blocking(|| 42).await.unwrap(), 42);
    }
}
