//! `toolgate log verify|export|checkpoint|key`: the audit chain checked and exported, and its
//! head signed into checkpoints kept outside the database, which is what makes truncation and
//! rewriting evident to someone who does not trust the database (docs/audit-chain.md).

use crate::exit::Exit;
use std::io::{IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use toolgate_core::{Clock, SystemClock};
use toolgate_store::{
    CheckpointOutcome, CheckpointPublicKey, CheckpointRefusal, CheckpointReport, CheckpointSigner,
    SignedCheckpoint, Store, read_checkpoints,
};

use crate::cmd::ConfigArg;
use crate::cmd::store::{open_existing, runtime};

/// The environment variable that holds the checkpoint signing key itself.
const KEY_ENV: &str = "TOOLGATE_CHECKPOINT_KEY";
/// The environment variable with a bearer token for `--webhook`.
const WEBHOOK_TOKEN_ENV: &str = "TOOLGATE_CHECKPOINT_WEBHOOK_TOKEN";

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Walk the audit chain and name the first broken link (exit 1 if there is one); with
    /// --checkpoint, also show that the chain still reaches each signed checkpoint's record
    /// with the hash it signed (exit 1 if not: records were removed or rewritten).
    Verify(VerifyArgs),
    /// Write one principal's audit records as JSON Lines.
    Export(ExportArgs),
    /// Check the chain and sign its head (store, record number, hash, time, key id) into a
    /// checkpoint for a file, stdout or a webhook; once, or every DURATION.
    Checkpoint(CheckpointArgs),
    /// Make a checkpoint signing key, or print the public key verifiers need.
    Key(KeyArgs),
}

/// Which store: the registry's, or `--store`.
#[derive(clap::Args, Debug)]
pub struct StoreArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// The store URL, instead of the registry's `store.url`.
    #[arg(long, value_name = "URL", env = "TOOLGATE_STORE_URL")]
    pub store: Option<String>,
}

impl StoreArgs {
    /// Opens the store; never creates one (every `log` command reads a chain that exists).
    async fn open(&self) -> anyhow::Result<Store> {
        let registry = self.config.load()?;
        open_existing(&registry, self.store.as_deref()).await
    }
}

/// Where the checkpoint signing key comes from.
#[derive(clap::Args, Debug)]
pub struct KeySource {
    /// The checkpoint signing key, a PKCS#8 PEM file (`toolgate log key new --out FILE`),
    /// instead of the key itself in TOOLGATE_CHECKPOINT_KEY.
    #[arg(long, value_name = "FILE", env = "TOOLGATE_CHECKPOINT_KEY_FILE")]
    pub key_file: Option<PathBuf>,
}

impl KeySource {
    /// The configured signing key, if one is.
    fn signer(&self) -> anyhow::Result<Option<CheckpointSigner>> {
        let env = std::env::var(KEY_ENV).ok().filter(|k| !k.trim().is_empty());
        match (&self.key_file, env) {
            (Some(_), Some(_)) => bail!(
                "both {KEY_ENV} and --key-file (or TOOLGATE_CHECKPOINT_KEY_FILE) are set: give \
                 the checkpoint signing key one way only"
            ),
            (Some(path), None) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the signing key {}", path.display()))?;
                warn_if_readable_by_others(path);
                Ok(Some(CheckpointSigner::parse(
                    &text,
                    &path.display().to_string(),
                )?))
            }
            (None, Some(text)) => Ok(Some(CheckpointSigner::parse(&text, KEY_ENV)?)),
            (None, None) => Ok(None),
        }
    }

    fn require(&self) -> anyhow::Result<CheckpointSigner> {
        self.signer()?.with_context(|| {
            format!(
                "no checkpoint signing key: set {KEY_ENV} to the key or pass --key-file FILE \
                 (make one with `toolgate log key new --out FILE`)"
            )
        })
    }
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        eprintln!(
            "toolgate: warning: the signing key {} can be read by other users (mode {:o}); \
             `chmod 600` it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_: &Path) {}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// A file of signed checkpoints (JSON Lines, as `log checkpoint --out` appends them, or
    /// one JSON object); repeatable. Keep these files where the database's writers cannot.
    #[arg(long = "checkpoint", value_name = "FILE")]
    pub checkpoints: Vec<PathBuf>,
    /// A file of PEM public keys that may have signed the checkpoints (a keyring: old and new
    /// keys); repeatable. Without it, the public half of the signing key (--key-file or
    /// TOOLGATE_CHECKPOINT_KEY).
    #[arg(long = "public-key", value_name = "FILE", requires = "checkpoints")]
    pub public_keys: Vec<PathBuf>,
    #[command(flatten)]
    pub key: KeySource,
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    #[arg(long)]
    pub principal: String,
    /// Walk the whole chain first and export nothing (exit 1) if it is broken; the export
    /// selects rows by their `principal` column, which only the walk checks for every row.
    #[arg(long)]
    pub verify: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(clap::Args, Debug)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub key: KeySource,
    /// Append the checkpoint to FILE (JSON Lines, created if missing); the next checkpoint
    /// must extend the last one in it, and only the records after it are walked again.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// POST the checkpoint (JSON) to URL; plain http (this build has no TLS client: use a
    /// relay on the host, or --out). A bearer token from TOOLGATE_CHECKPOINT_WEBHOOK_TOKEN.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Sign again every DURATION (`30s`, `10m`, `1h`, `1d`) until SIGINT or SIGTERM; a
    /// failed delivery is retried at the next one, a broken chain stops it (exit 1).
    #[arg(long, value_name = "DURATION", value_parser = parse_every)]
    pub every: Option<Duration>,
}

#[derive(clap::Args, Debug)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub action: KeyAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum KeyAction {
    /// Make a new Ed25519 checkpoint signing key. With --out, the private key goes to FILE
    /// (mode 0600) and the public key to FILE.pub; without it both are printed.
    New {
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Print the key id and public key of the signing key (--key-file or
    /// TOOLGATE_CHECKPOINT_KEY), to give to whoever verifies checkpoints.
    Public {
        #[command(flatten)]
        key: KeySource,
    },
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    match &args.action {
        Action::Verify(a) => runtime()?.block_on(verify(a, out)),
        Action::Export(a) => runtime()?.block_on(export(a, out)),
        Action::Checkpoint(a) => runtime()?.block_on(checkpoint(a, out)),
        Action::Key(k) => key(&k.action, out),
    }
}

async fn verify(args: &VerifyArgs, out: &mut dyn Write) -> anyhow::Result<Exit> {
    if args.checkpoints.is_empty() {
        let store = args.store.open().await?;
        let report = store.verify_chain().await?;
        writeln!(out, "{report}")?;
        return Ok(Exit::refused_if(!report.is_intact()));
    }
    let mut checkpoints = Vec::new();
    for path in &args.checkpoints {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the checkpoint file {}", path.display()))?;
        checkpoints.extend(read_checkpoints(&text, &path.display().to_string())?);
    }
    let keys = trusted_keys(args)?;
    let store = args.store.open().await?;
    let report = store.verify_checkpoints(&checkpoints, &keys).await?;
    print_checkpoint_report(&report, out)?;
    Ok(Exit::refused_if(!report.is_intact()))
}

/// The public keys checkpoints may be signed with: the files given, or the signing key's.
fn trusted_keys(args: &VerifyArgs) -> anyhow::Result<Vec<CheckpointPublicKey>> {
    if args.public_keys.is_empty() {
        let signer = args.key.signer()?.with_context(|| {
            format!(
                "--checkpoint needs the public key of the key that signed it: pass \
                 --public-key FILE (`toolgate log key public` prints it), or set {KEY_ENV} or \
                 --key-file to the signing key"
            )
        })?;
        return Ok(vec![signer.public_key().clone()]);
    }
    let mut keys = Vec::new();
    for path in &args.public_keys {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the public key file {}", path.display()))?;
        keys.extend(CheckpointPublicKey::parse_all(
            &text,
            &path.display().to_string(),
        )?);
    }
    Ok(keys)
}

fn describe(cp: &SignedCheckpoint) -> String {
    format!(
        "record {} ({}) signed {} by key {}",
        cp.seq, cp.hash, cp.signed_at, cp.key_id
    )
}

fn print_checkpoint_report(report: &CheckpointReport, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "{}", report.chain)?;
    for check in &report.checks {
        if let Some(fault) = &check.fault {
            writeln!(
                out,
                "checkpoint FAILED: {}: {fault}",
                describe(&check.checkpoint)
            )?;
        }
    }
    let held: Vec<&SignedCheckpoint> = report
        .checks
        .iter()
        .filter(|c| c.fault.is_none())
        .map(|c| &c.checkpoint)
        .collect();
    if let Some(latest) = held.iter().max_by_key(|cp| cp.seq) {
        writeln!(
            out,
            "{} checkpoint(s) hold; the latest: {}",
            held.len(),
            describe(latest)
        )?;
    }
    if report.failed() > 0 {
        writeln!(
            out,
            "{} of {} checkpoint(s) FAILED: the chain no longer reaches what was signed \
             (records removed or rewritten, or a checkpoint edited)",
            report.failed(),
            report.checks.len()
        )?;
    }
    Ok(())
}

async fn export(args: &ExportArgs, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let store = args.store.open().await?;
    if args.verify {
        let report = store.verify_chain().await?;
        if !report.is_intact() {
            eprintln!("{report}");
            eprintln!("nothing exported for {}", args.principal);
            return Ok(Exit::Refused);
        }
        eprintln!("{report}");
    }
    let mut buf = Vec::new();
    let n = store
        .export_principal(&args.principal.as_str().into(), &mut buf)
        .await?;
    // To a file or a pipe the records go as stored, byte for byte (their hashes are over that
    // text). To a terminal, what an agent wrote into them is shown, not obeyed.
    if std::io::stdout().is_terminal() {
        let text = String::from_utf8_lossy(&buf);
        out.write_all(toolgate_core::clip::json_printable(&text).as_bytes())?;
        eprintln!(
            "(shown for a terminal: direction overrides and control characters in the records              are written as JSON escapes; redirect to a file for the records byte for byte)"
        );
    } else {
        out.write_all(&buf)?;
    }
    out.flush()?;
    eprintln!("{n} record(s) for {}", args.principal);
    Ok(Exit::Success)
}

async fn checkpoint(args: &CheckpointArgs, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let signer = args.key.require()?;
    let sinks = Sinks::new(args)?;
    let store = args.store.open().await?;
    let mut since = match &args.out {
        Some(path) if path.exists() => last_checkpoint(path)?,
        _ => None,
    };
    let Some(every) = args.every else {
        return match store
            .checkpoint(&signer, SystemClock.now(), since.as_ref())
            .await?
        {
            CheckpointOutcome::Signed(cp) => {
                sinks.deliver(&cp, out).await?;
                Ok(Exit::Success)
            }
            CheckpointOutcome::Refused(why) => {
                eprintln!("toolgate: no checkpoint written: {why}");
                Ok(Exit::Refused)
            }
        };
    };
    let stop = shutdown();
    tokio::pin!(stop);
    loop {
        match store
            .checkpoint(&signer, SystemClock.now(), since.as_ref())
            .await
        {
            Ok(CheckpointOutcome::Signed(cp)) => {
                let delivered = sinks.deliver(&cp, out).await;
                since = Some(cp);
                match delivered {
                    Err(e) if super::broken_pipe(&e) => return Ok(Exit::Success),
                    Err(e) => {
                        eprintln!("toolgate: {e:#}; trying again in {}", show_duration(every))
                    }
                    Ok(()) => {}
                }
            }
            Ok(CheckpointOutcome::Refused(CheckpointRefusal::Empty)) => {
                eprintln!("toolgate: nothing to checkpoint yet: the audit chain is empty");
            }
            Ok(CheckpointOutcome::Refused(why)) => {
                eprintln!("toolgate: no checkpoint written, stopping: {why}");
                return Ok(Exit::Refused);
            }
            Err(e) => eprintln!(
                "toolgate: checkpoint failed: {e:#}; trying again in {}",
                show_duration(every)
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = &mut stop => return Ok(Exit::Success),
        }
    }
}

/// The last checkpoint in a file that `--out` appends to, if it holds any.
fn last_checkpoint(path: &Path) -> anyhow::Result<Option<SignedCheckpoint>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the checkpoint file {}", path.display()))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    Ok(read_checkpoints(&text, &path.display().to_string())?.pop())
}

/// Where checkpoints go: a file, a webhook, or (neither given) stdout.
struct Sinks {
    file: Option<PathBuf>,
    webhook: Option<Webhook>,
}

struct Webhook {
    url: String,
    client: reqwest::Client,
    token: Option<String>,
}

impl Sinks {
    fn new(args: &CheckpointArgs) -> anyhow::Result<Sinks> {
        let webhook = match &args.webhook {
            None => None,
            Some(url) => {
                let parsed = reqwest::Url::parse(url)
                    .with_context(|| format!("--webhook {url} is not a URL"))?;
                if parsed.scheme() != "http" {
                    bail!(
                        "--webhook {url}: only http:// URLs can be posted to by this build (it \
                         has no TLS client); post to a relay on this host, or write the \
                         checkpoints with --out and ship the file"
                    );
                }
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .context("building the webhook's HTTP client")?;
                let token = std::env::var(WEBHOOK_TOKEN_ENV)
                    .ok()
                    .filter(|t| !t.is_empty());
                Some(Webhook {
                    url: url.clone(),
                    client,
                    token,
                })
            }
        };
        Ok(Sinks {
            file: args.out.clone(),
            webhook,
        })
    }

    /// Writes the checkpoint everywhere it goes, then says where (stdout gets the checkpoint
    /// itself, and nothing else).
    async fn deliver(&self, cp: &SignedCheckpoint, out: &mut dyn Write) -> anyhow::Result<()> {
        let line = cp.to_line();
        let mut done = Vec::new();
        if let Some(path) = &self.file {
            append_line(path, &line)
                .with_context(|| format!("appending the checkpoint to {}", path.display()))?;
            done.push(format!("appended to {}", path.display()));
        }
        if let Some(hook) = &self.webhook {
            let mut request = hook
                .client
                .post(&hook.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(line.clone());
            if let Some(token) = &hook.token {
                request = request.bearer_auth(token);
            }
            let posted = match request.send().await {
                Ok(response) if response.status().is_success() => Ok(response.status()),
                Ok(response) => Err(anyhow::anyhow!(
                    "the webhook answered {}",
                    response.status()
                )),
                Err(e) => Err(anyhow::Error::new(e)),
            };
            let status = posted.with_context(|| {
                let mut what = format!(
                    "posting the checkpoint of record {} to {}",
                    cp.seq, hook.url
                );
                if !done.is_empty() {
                    what.push_str(&format!(" (it was {})", done.join("; ")));
                }
                what
            })?;
            done.push(format!("posted to {} (HTTP {})", hook.url, status.as_u16()));
        }
        if done.is_empty() {
            writeln!(out, "{line}")?;
        } else {
            writeln!(out, "checkpoint of {}: {}", describe(cp), done.join("; "))?;
        }
        out.flush()?;
        Ok(())
    }
}

/// Appends one line and waits for it to reach the disk: a checkpoint acknowledged is kept.
fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(format!("{line}\n").as_bytes())?;
    f.sync_all()
}

/// `30s`, `10m`, `1h`, `1d`: a whole number and a unit, at least a second.
fn parse_every(s: &str) -> anyhow::Result<Duration> {
    let bad = || {
        anyhow::anyhow!(
            "'{s}' is not a duration: write a whole number and a unit, as 30s, 10m, 1h or 1d"
        )
    };
    let unit_at = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(unit_at);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(bad()),
    };
    if secs == 0 {
        bail!("'{s}': the interval must be at least 1s");
    }
    Ok(Duration::from_secs(secs))
}

fn show_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown() {
    let term = async {
        #[cfg(unix)]
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

fn key(action: &KeyAction, out: &mut dyn Write) -> anyhow::Result<Exit> {
    match action {
        KeyAction::New { out: None } => {
            let signer = CheckpointSigner::generate()?;
            writeln!(out, "key id: {}", signer.public_key().id())?;
            write!(out, "{}", signer.to_pem())?;
            write!(out, "{}", signer.public_key().to_pem())?;
            writeln!(
                out,
                "Put the private key in {KEY_ENV} (or a file for --key-file) where `toolgate log \
                 checkpoint` runs, not beside the database; give the public key to whoever \
                 verifies (`toolgate log verify --checkpoint FILE --public-key PUB`)."
            )?;
        }
        KeyAction::New { out: Some(path) } => {
            let public_path = PathBuf::from(format!("{}.pub", path.display()));
            for p in [path, &public_path] {
                if p.exists() {
                    bail!(
                        "{} exists: choose another name (a key is never overwritten; an old \
                         key still verifies what it signed)",
                        p.display()
                    );
                }
            }
            let signer = CheckpointSigner::generate()?;
            write_new(path, &signer.to_pem(), 0o600)
                .with_context(|| format!("writing the signing key to {}", path.display()))?;
            write_new(&public_path, &signer.public_key().to_pem(), 0o644)
                .with_context(|| format!("writing the public key to {}", public_path.display()))?;
            writeln!(out, "key id:      {}", signer.public_key().id())?;
            writeln!(
                out,
                "signing key: {} (mode 0600): keep it where `toolgate log checkpoint` runs \
                 (--key-file), not beside the database",
                path.display()
            )?;
            writeln!(
                out,
                "public key:  {}: give it to whoever verifies (`toolgate log verify \
                 --checkpoint FILE --public-key {}`)",
                public_path.display(),
                public_path.display()
            )?;
        }
        KeyAction::Public { key } => {
            let signer = key.require()?;
            writeln!(out, "key id: {}", signer.public_key().id())?;
            write!(out, "{}", signer.public_key().to_pem())?;
        }
    }
    Ok(Exit::Success)
}

/// Creates `path` (never replacing a file) with `mode`, and writes `text` to it.
fn write_new(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = options.open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}
