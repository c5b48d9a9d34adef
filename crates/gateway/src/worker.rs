//! `toolgate worker`: a process that claims the steps of submitted plans and executes them
//! through the same governed path as the gateway (every check, reservation and audit record),
//! calling the registry's upstream servers. Any number of workers and gateways may share one
//! PostgreSQL store: claims skip rows another worker holds, and plan submissions and approvals
//! wake waiting workers through LISTEN/NOTIFY (SQLite polls). SIGINT or SIGTERM stops claiming;
//! the batch in hand finishes and is recorded, then upstreams and the store close. A second
//! signal exits at once, like a crash: leased steps are then settled by recovery.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolgate_core::{Clock, Registry, SystemClock};
use toolgate_store::{Executor, Store, WorkOptions, WorkStats};

use crate::error::GatewayError;
use crate::exit::Exit;
use crate::keys::KeySource;
use crate::pins::Pins;
use crate::serve::{resolve_keys, resolve_store_url};
use crate::server::GatewayState;
use crate::upstream::Upstreams;

/// What `toolgate worker` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    pub config_dir: PathBuf,
    /// Overrides `store.url` from toolgate.yaml.
    pub store_url: Option<String>,
    /// Pacing; `WorkOptions::default()` when unset.
    pub work: Option<WorkOptions>,
    /// Where the approval and redaction keys come from (configured ones by default: missing
    /// keys refuse the start).
    pub keys: KeySource,
}

/// Runs a worker until SIGINT or SIGTERM (or, with `until_idle`, until the queue is empty).
pub async fn worker(opts: WorkerOptions) -> Result<WorkStats, GatewayError> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        crate::serve::signal().await;
        tracing::info!("stopping: finishing the steps in hand (signal again to stop at once)");
        let _ = tx.send(true);
        crate::serve::signal().await;
        // As if the process died: leased steps are settled by recovery, never re-run blind.
        tracing::warn!("stopping at once; steps in hand are left to lease recovery");
        std::process::exit(Exit::Interrupted.code().into());
    });
    work_until_stopped(&opts, rx, true).await
}

/// Works under the registry folder's current version, as `toolgate serve` does: on SIGHUP or a
/// change of its files the worker stops claiming, finishes the batch in hand under the version
/// it was decided under, checks the folder (refused if it fails validation, recorded either
/// way) and goes on under the new version.
async fn follow_registry(
    dir: &std::path::Path,
    executor: &mut Executor,
    work: &WorkOptions,
    stop: watch::Receiver<bool>,
    live: &arc_swap::ArcSwap<Executor>,
) -> WorkStats {
    let mut changes = crate::reload::folder_signals(dir);
    let (pause_tx, pause_rx) = watch::channel(false);
    let pause_tx = Arc::new(pause_tx);
    {
        // The caller's stop pauses the loop for good.
        let (tx, mut stop) = (pause_tx.clone(), stop.clone());
        tokio::spawn(async move {
            if stop.wait_for(|s| *s).await.is_ok() {
                let _ = tx.send(true);
            }
        });
    }
    let mut total = WorkStats::default();
    loop {
        let mut trigger = None;
        let part = {
            let stretch = executor.work(work, pause_rx.clone());
            tokio::pin!(stretch);
            loop {
                tokio::select! {
                    s = &mut stretch => break s,
                    Some(t) = changes.recv(), if trigger.is_none() => {
                        trigger = Some(t);
                        let _ = pause_tx.send(true);
                    }
                }
            }
        };
        total += part;
        let Some(trigger) = trigger else { break };
        let _ = pause_tx.send(false);
        if *stop.borrow() {
            break;
        }
        *executor = crate::reload::reload_executor(dir, executor, trigger).await;
        live.store(Arc::new(executor.clone()));
    }
    total
}

/// The worker with a caller-held stop signal (tests stop it by sending `true`).
pub async fn run_worker(
    opts: &WorkerOptions,
    stop: watch::Receiver<bool>,
) -> Result<WorkStats, GatewayError> {
    work_until_stopped(opts, stop, false).await
}

/// `announce`: print `--dev`'s warning paragraph on stderr (the `toolgate worker` process does;
/// an embedding program reads its keys' status itself).
async fn work_until_stopped(
    opts: &WorkerOptions,
    stop: watch::Receiver<bool>,
    announce: bool,
) -> Result<WorkStats, GatewayError> {
    let dir = opts.config_dir.clone();
    let registry = Arc::new(
        Registry::load(&dir).map_err(|source| GatewayError::Registry {
            dir: dir.clone(),
            source,
        })?,
    );
    let secrets = resolve_keys(&registry, &opts.keys)?;
    if announce && let Some(warning) = secrets.status.warning() {
        eprintln!("{warning}");
    }
    // Upstream tools are called only at their pinned definitions, as in the gateway.
    let pins = Arc::new(Pins::load(&dir).map_err(GatewayError::Lockfile)?);
    let upstreams = Arc::new(Upstreams::new(
        &dir,
        &registry.gateway.upstreams,
        None,
        pins.clone(),
    ));
    let url = resolve_store_url(
        &dir,
        opts.store_url
            .as_deref()
            .unwrap_or(&registry.gateway.store.url),
    );
    let store = Store::connect(
        &url,
        crate::serve::store_config(&registry, &upstreams, secrets.redactor.clone()),
    )
    .await
    .map_err(|source| GatewayError::Store {
        url: url.clone(),
        source,
    })?;
    // One clock for the executor's decisions and the pin records alike.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    pins.attach_store(store.clone(), clock.clone());
    for (name, why) in upstreams.connect_all().await {
        tracing::warn!(upstream = %name, error = %why, "working without this upstream for now");
    }
    let mut executor = Executor::new(
        store.clone(),
        registry.clone(),
        Arc::new(secrets.approval),
        upstreams.clone(),
        clock,
    );
    let work = opts.work.clone().unwrap_or_default();
    tracing::info!(store = %url, registry = %registry.version.label, batch = work.batch, "worker started");
    // Raised requests are announced from here too, for deployments without a `serve`.
    let live = Arc::new(arc_swap::ArcSwap::from_pointee(executor.clone()));
    let notifier = tokio_util::sync::CancellationToken::new();
    {
        let live = live.clone();
        let base = crate::notify::item_base(
            registry.gateway.server.public_url.as_deref(),
            &registry.gateway.server.http,
        );
        tokio::spawn(crate::notify::run(
            move || live.load().as_ref().clone(),
            base,
            notifier.clone(),
        ));
    }
    let stats = follow_registry(&dir, &mut executor, &work, stop, &live).await;
    notifier.cancel();
    tracing::info!(
        executed = stats.executed,
        done = stats.done,
        refused = stats.refused,
        parked = stats.parked,
        "worker stopped"
    );
    upstreams.close().await;
    store.close().await;
    Ok(stats)
}

/// The plan queue worked inside `toolgate serve` (unless it runs with `--no-worker`): the same
/// loop as `toolgate worker`, under the gateway's serving registry version. When a reload puts
/// a new version in service the loop stops claiming, finishes the batch in hand under the
/// version it was decided under, and goes on under the new one; when `stop` is cancelled it
/// finishes the batch in hand and returns. Recovery and reconciliation are left to the
/// gateway's own loop, which runs them more often.
pub(crate) async fn work_in_gateway(
    state: Arc<GatewayState>,
    stop: CancellationToken,
) -> WorkStats {
    let work = WorkOptions {
        recover_every: Duration::MAX,
        ..WorkOptions::default()
    };
    let mut swaps = state.watch_swaps();
    let (pause_tx, pause_rx) = watch::channel(false);
    let mut total = WorkStats::default();
    tracing::info!(batch = work.batch, "working the plan queue in this process");
    loop {
        swaps.borrow_and_update();
        let executor = state.executor();
        let mut swapped = false;
        let part = {
            let stretch = executor.work(&work, pause_rx.clone());
            tokio::pin!(stretch);
            let mut pausing = false;
            loop {
                tokio::select! {
                    // A stop or a new version first: nothing more is claimed under the old one.
                    biased;
                    _ = stop.cancelled(), if !pausing => {
                        pausing = true;
                        let _ = pause_tx.send(true);
                    }
                    changed = swaps.changed(), if !pausing => {
                        pausing = true;
                        swapped = changed.is_ok();
                        let _ = pause_tx.send(true);
                    }
                    s = &mut stretch => break s,
                }
            }
        };
        total += part;
        if stop.is_cancelled() || !swapped {
            break;
        }
        let _ = pause_tx.send(false);
    }
    tracing::info!(
        executed = total.executed,
        done = total.done,
        refused = total.refused,
        parked = total.parked,
        "stopped working the plan queue"
    );
    total
}
