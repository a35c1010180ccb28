//! Capacity that follows a real bound: a pool of W blocking worker threads does the work, and
//! the instance keeps exactly W sessions registered, so Sluice never sends it more requests
//! than it has workers; the excess waits in Sluice's admission queue, not here. SIGUSR1 adds a
//! worker and SIGUSR2 removes one; the session count follows (a removed session retires on its
//! next response). SIGTERM/SIGINT drains and exits.
//!
//! ```sh
//! cargo run -p sluice-sdk --example worker_pool -- 127.0.0.1:7070 api 4
//! curl 'localhost:8080/?n=2000000'     # through a sluice with a reverse cluster "api"
//! ```

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use sluice_sdk::{Acceptor, Identity, Options, Sessions};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

enum Job {
    /// Hash `n` rounds and send the result back.
    Work(u64, oneshot::Sender<u64>),
    /// The worker that takes this one exits: the pool shrinks by one.
    Stop,
}

/// W threads sharing one queue; `size` is what the sessions follow.
struct Pool {
    jobs: Mutex<Sender<Job>>,
    queue: Arc<Mutex<Receiver<Job>>>,
    size: Mutex<usize>,
}

impl Pool {
    fn new(size: usize) -> Arc<Self> {
        let (tx, rx) = channel();
        let pool = Arc::new(Pool {
            jobs: Mutex::new(tx),
            queue: Arc::new(Mutex::new(rx)),
            size: Mutex::new(0),
        });
        pool.resize(size);
        pool
    }

    /// Grows or shrinks to `size` workers; returns the new size.
    fn resize(&self, size: usize) -> usize {
        let mut current = self.size.lock().unwrap_or_else(PoisonError::into_inner);
        for _ in *current..size {
            let queue = self.queue.clone();
            std::thread::spawn(move || worker(&queue));
        }
        for _ in size..*current {
            self.submit(Job::Stop);
        }
        *current = size;
        size
    }

    fn size(&self) -> usize {
        *self.size.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn submit(&self, job: Job) {
        let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = jobs.send(job);
    }
}

fn worker(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        match job {
            Ok(Job::Work(n, done)) => {
                let mut h = 0xcbf2_9ce4_8422_2325u64;
                for i in 0..n {
                    h = (h ^ i).wrapping_mul(0x0100_0000_01b3);
                }
                let _ = done.send(h);
            }
            Ok(Job::Stop) | Err(_) => return,
        }
    }
}

async fn handle(pool: Arc<Pool>, req: Request<Incoming>) -> Result<Response<String>, BoxError> {
    let n = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("n="))
        .map_or(Ok(100_000), str::parse)?;
    let (done, result) = oneshot::channel();
    pool.submit(Job::Work(n, done));
    let Ok(hash) = result.await else {
        let mut res = Response::new("worker lost\n".to_owned());
        *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(res);
    };
    Ok(Response::new(format!("{hash:016x}\n")))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let acceptor = args.next().unwrap_or_else(|| "127.0.0.1:7070".into());
    let service = args.next().unwrap_or_else(|| "api".into());
    let workers: usize = args.next().map_or(Ok(4), |w| w.parse())?;

    let pool = Pool::new(workers);
    let mut identity = Identity::new(service);
    identity.token = std::env::var("SLUICE_TOKEN").ok();
    let mut options = Options::new(Acceptor::Tcp(acceptor), identity);
    options.capacity = pool.size();
    let handler = pool.clone();
    let sessions = sluice_sdk::serve(
        options,
        tower::service_fn(move |req| handle(handler.clone(), req)),
    )?;
    follow_signals(&pool, &sessions).await?;
    sessions.shutdown().await?;
    Ok(())
}

/// Resizes the pool, then the sessions, on SIGUSR1/SIGUSR2, until SIGTERM or SIGINT.
async fn follow_signals(pool: &Pool, sessions: &Sessions) -> Result<(), BoxError> {
    let mut grow = signal(SignalKind::user_defined1())?;
    let mut shrink = signal(SignalKind::user_defined2())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    loop {
        let size = tokio::select! {
            _ = grow.recv() => pool.resize(pool.size() + 1),
            _ = shrink.recv() => pool.resize(pool.size().saturating_sub(1).max(1)),
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        sessions.set_capacity(size);
        tracing::info!(workers = size, "pool resized; sessions follow");
    }
}
