//! `toolgate init DIR --upstream NAME=CMD…|URL`: a registry folder for MCP servers someone else
//! wrote. It connects to each upstream the way `serve` will, reads its tools (and the names of
//! its prompts and resources), proposes a declaration for each tool
//! ([`toolgate_contract::propose`]), checks the folder as `toolgate check` does, pins the
//! servers in `toolgate.lock` as `toolgate lock approve` does (recorded in the audit chain), and
//! prints the new keys once. What it cannot place safely is refused and explained in the
//! folder's README. `--add` adds upstreams to a folder it wrote, leaving edits in place.

use crate::exit::Exit;
use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use toolgate_contract::client::{Observed, Target, observe};
use toolgate_contract::propose::{Class, Proposal, ProposeOptions, propose};
use toolgate_contract::{Approval, Lockfile, ServerIdentity};
use toolgate_core::lint::lint;
use toolgate_core::registry::{Sources, api_key_hash};
use toolgate_core::{LoadError, Registry};

const ROLE: &str = "agent";
const APPROVER_ROLE: &str = "approver";
const AGENT_ID: &str = "agent";

#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Examples:
  toolgate init gw --upstream everything='npx -y @modelcontextprotocol/server-everything@2026.8.31 stdio'
  toolgate init gw --upstream fs='node /opt/mcp/server-filesystem/dist/index.js /srv/share' \\
                   --upstream time=http://127.0.0.1:8000/mcp
  toolgate init --add gw --upstream memory='npx -y @modelcontextprotocol/server-memory@2026.8.31'

Each tool is proposed from the server's annotations (readOnlyHint, destructiveHint,
idempotentHint, openWorldHint) and its name, never trusting them over a person:
  read     read-only by the server's own annotation, nothing contradicting it: listed, ungated
  gated    changes state: listed, every call waits for a person (gate: always)
  refused  not declared (no one can call it): contradicting hints, no hints, money, a free
           destination field, state changes with no inputs; the README says why
Schemas are closed (additionalProperties: false) and bounded where the server set no bound.
Every guess carries a `# review:` line in tools/NAME.yaml; the folder's README lists them.

Progress goes to stderr; the summary and the keys (shown once, stored only as hashes) to stdout.")]
pub struct Args {
    /// The registry folder to write (created when missing; must be empty unless --add or --force).
    pub dir: PathBuf,
    /// An upstream MCP server: NAME=COMMAND [ARGS…] (one quoted string, spawned over stdio) or
    /// NAME=URL (streamable HTTP). Repeatable. Relative file arguments are made absolute.
    #[arg(long = "upstream", value_name = "NAME=CMD…|URL", required = true)]
    pub upstreams: Vec<String>,
    /// Add the upstreams to an existing registry folder: each gets its own tools/NAME.yaml, an
    /// entry in toolgate.yaml and its pin; no other file is rewritten.
    #[arg(long)]
    pub add: bool,
    /// Write into a non-empty folder: toolgate.yaml, principals.yaml, tools/*.yaml,
    /// toolgate.lock and README.md are replaced (the store is kept).
    #[arg(long, conflicts_with = "add")]
    pub force: bool,
    /// The person who may approve gated calls (default: $USER).
    #[arg(long, value_name = "ID")]
    pub approver: Option<String>,
    /// The owner recorded on each tool (a CODEOWNERS handle).
    #[arg(long, default_value = "@platform", value_name = "HANDLE")]
    pub owner: String,
    /// Seconds to wait for each upstream's handshake and lists.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Also write the agent's new API key to FILE (readable by you only), for scripts and
    /// clients that read a key from a file.
    #[arg(long, value_name = "FILE", conflicts_with = "add")]
    pub key_file: Option<PathBuf>,
}

/// One `--upstream` as given.
#[derive(Debug, Clone)]
struct Spec {
    name: String,
    target: Target,
}

/// What init learned of one upstream and proposed for it.
struct Imported {
    spec: Spec,
    package: String,
    package_guessed: bool,
    observed: Observed,
    proposals: Vec<Proposal>,
}

pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<Exit> {
    let started = Instant::now();
    let dir = &args.dir;
    let specs = args
        .upstreams
        .iter()
        .map(|s| parse_spec(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    prepare_dir(args)?;
    let existing = if args.add {
        let sources = Sources::read(dir)
            .with_context(|| format!("--add: reading the registry in {}", dir.display()))?;
        sources
            .gateway
            .upstreams
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    } else {
        Vec::new()
    };
    for (i, s) in specs.iter().enumerate() {
        if existing.contains(&s.name) || specs[..i].iter().any(|o| o.name == s.name) {
            bail!(
                "an upstream named '{}' is already declared; pick another NAME",
                s.name
            );
        }
        if args.add && dir.join(format!("tools/{}.yaml", s.name)).exists() {
            bail!(
                "{} exists already; pick another NAME",
                dir.join(format!("tools/{}.yaml", s.name)).display()
            );
        }
    }
    let approver = args
        .approver
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "operator".into());
    let opts = ProposeOptions {
        owner: args.owner.clone(),
        ..ProposeOptions::default()
    };

    let rt = super::store::runtime()?;
    let mut imported = Vec::new();
    for spec in specs {
        let t0 = Instant::now();
        eprintln!(
            "toolgate init: connecting to {} ({})",
            spec.name,
            spec.target.describe()
        );
        let target = served_as(&spec.target, dir);
        let observed = rt
            .block_on(observe(&target, Duration::from_secs(args.timeout)))
            .with_context(|| format!("upstream '{}'", spec.name))?;
        let proposals: Vec<Proposal> = observed
            .tools
            .iter()
            .map(|t| propose(&spec.name, t, &opts))
            .collect();
        let (package, package_guessed) = package_of(&spec.target, &observed);
        eprintln!(
            "toolgate init: {}: {} {} — {} tools, {} prompts, {} resources ({:.1} s)",
            spec.name,
            observed.facts.name,
            observed.facts.version,
            observed.tools.len(),
            observed.prompts.len(),
            observed.resources.len(),
            t0.elapsed().as_secs_f64()
        );
        imported.push(Imported {
            spec,
            package,
            package_guessed,
            observed,
            proposals,
        });
    }

    std::fs::create_dir_all(dir.join("tools"))?;
    write_gateway_file(dir, args.add, &imported)?;
    let mut keys = None;
    if !args.add {
        let agent_key = new_key()?;
        let approver_key = new_key()?;
        write_new(
            &dir.join("principals.yaml"),
            &principals_yaml(&approver, &agent_key, &approver_key),
        )?;
        write_new(&dir.join(".gitignore"), "toolgate.db\ntoolgate.db-*\n")?;
        if let Some(file) = &args.key_file {
            write_secret(file, &format!("{agent_key}\n"))?;
        }
        keys = Some((agent_key, approver_key));
    }
    for imp in &imported {
        write_tools_file(dir, imp)?;
    }

    // The folder must pass `toolgate check`: a tool the check finds fault with is refused (with
    // the finding as its reason) and its file written again, until nothing is left.
    let findings = settle(dir, &mut imported)?;
    if !findings.is_empty() {
        for f in &findings {
            eprintln!("{f}");
        }
        bail!(
            "{} problem(s) outside the imported tools; fix them and run `toolgate check -c {}`",
            findings.len(),
            dir.display()
        );
    }
    write_readme(dir, args.add, &imported)?;

    // Pin what was read, as `toolgate lock approve` would, and record it in the audit chain.
    eprintln!("toolgate init: pinning in toolgate.lock");
    let lock_path = dir.join("toolgate.lock");
    let mut lock = if lock_path.exists() {
        Lockfile::read(&lock_path)?
    } else {
        Lockfile::default()
    };
    let sources = Sources::read(dir)?;
    let approval = Approval::now(approver.clone());
    let mut lines = Vec::new();
    for imp in &imported {
        let cfg = &sources.gateway.upstreams[&imp.spec.name];
        lines.extend(lock.approve(
            &imp.spec.name,
            &ServerIdentity::from_upstream(cfg),
            &imp.observed.facts,
            &imp.observed.tools,
            None,
            &approval,
        )?);
    }
    lock.write(&lock_path)?;
    let registry = super::ConfigArg { dir: dir.clone() }.load()?;
    let text = std::fs::read_to_string(&lock_path)?;
    // One upstream is recorded by name, several as all of them (`upstream:*`).
    let server = match imported.as_slice() {
        [only] => Some(only.spec.name.as_str()),
        _ => None,
    };
    let record =
        super::lock::approval_record(server, None, &approval, &lines, &text, "toolgate init");
    rt.block_on(async {
        let store = super::store::open(&registry, None).await?;
        let r = store.append_audit(vec![record]).await;
        store.close().await;
        r.context("recording the pins in the audit chain")
    })?;

    summary(out, dir, &imported, keys.as_ref(), &approver, started)?;
    Ok(Exit::Success)
}

/// `NAME=CMD ARGS…` or `NAME=URL`.
fn parse_spec(s: &str) -> anyhow::Result<Spec> {
    let Some((name, rest)) = s.split_once('=') else {
        bail!("--upstream '{s}': write NAME=COMMAND [ARGS…] or NAME=URL");
    };
    let name = name.trim();
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase());
    if !ok {
        bail!(
            "--upstream '{s}': NAME '{name}' must start with a lowercase letter and hold only a-z, 0-9, - and _"
        );
    }
    let words = split_words(rest)
        .with_context(|| format!("--upstream '{s}': the command has an unclosed quote"))?;
    let Some(target) = Target::from_words(&words) else {
        bail!("--upstream '{s}': give a command or a URL after '='");
    };
    let target = match target {
        Target::Command {
            program,
            args,
            dir,
            env,
        } => Target::Command {
            program: absolute_if_file(&program),
            args: args.iter().map(|a| absolute_if_file(a)).collect(),
            dir,
            env,
        },
        url => url,
    };
    Ok(Spec {
        name: name.to_string(),
        target,
    })
}

/// Shell-like words: whitespace separates, single and double quotes group, `\` escapes.
fn split_words(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') | (None, '\\') => {
                cur.push(chars.next()?);
                in_word = true;
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(cur);
    }
    Some(words)
}

/// A relative path that names an existing file or folder here, made absolute: the gateway
/// starts upstreams in the registry folder, where it would not resolve.
fn absolute_if_file(word: &str) -> String {
    let p = Path::new(word);
    if word.starts_with('-') || p.is_absolute() || !(word.contains('/') || word.contains('.')) {
        return word.to_string();
    }
    match p.canonicalize() {
        Ok(abs) if p.exists() => abs.display().to_string(),
        _ => word.to_string(),
    }
}

/// The target as `serve` reaches it: started in the registry folder with only PATH, HOME,
/// LANG and TMPDIR from the environment.
fn served_as(target: &Target, dir: &Path) -> Target {
    match target {
        Target::Command { program, args, .. } => Target::Command {
            program: program.clone(),
            args: args.clone(),
            dir: Some(dir.to_path_buf()),
            env: Some(Vec::new()),
        },
        url => url.clone(),
    }
}

/// The exact package an upstream comes from: an `npx` spec with a version, the package.json
/// of a file under `node_modules/`, or else what the server said its name and version are
/// (`true`: a guess for a person to confirm).
fn package_of(target: &Target, observed: &Observed) -> (String, bool) {
    if let Target::Command { program, args, .. } = target {
        for w in std::iter::once(program).chain(args) {
            let name = w.strip_prefix('@').unwrap_or(w);
            if let Some((_, version)) = name.rsplit_once('@')
                && version.starts_with(|c: char| c.is_ascii_digit())
                && !w.contains("://")
            {
                return (w.clone(), false);
            }
            if w.contains("node_modules/")
                && let Some(p) = npm_package_of(Path::new(w))
            {
                return (p, false);
            }
        }
    }
    let f = &observed.facts;
    let name = if f.name.is_empty() {
        "unknown"
    } else {
        &f.name
    };
    let version = if f.version.is_empty() {
        "0.0.0"
    } else {
        &f.version
    };
    (format!("{name}@{version}"), true)
}

fn npm_package_of(file: &Path) -> Option<String> {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d.file_name().is_some_and(|n| n == "node_modules") {
            return None;
        }
        if let Ok(text) = std::fs::read_to_string(d.join("package.json"))
            && let Ok(v) = serde_json::from_str::<Value>(&text)
            && let (Some(n), Some(ver)) = (v["name"].as_str(), v["version"].as_str())
        {
            return Some(format!("{n}@{ver}"));
        }
        dir = d.parent();
    }
    None
}

fn prepare_dir(args: &Args) -> anyhow::Result<()> {
    let dir = &args.dir;
    let non_empty = dir.is_dir() && std::fs::read_dir(dir)?.next().is_some();
    if args.add {
        if !dir.join("toolgate.yaml").is_file() {
            bail!(
                "--add: {} has no toolgate.yaml; run `toolgate init {}` without --add first",
                dir.display(),
                dir.display()
            );
        }
        return Ok(());
    }
    if dir.exists() && !dir.is_dir() {
        bail!("{} exists and is not a folder", dir.display());
    }
    if non_empty && !args.force {
        bail!(
            "{} is not empty: use --add to add upstreams to the registry in it, or --force to \
             overwrite the files init writes",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if args.force {
        // What init writes, so nothing of an earlier registry is left to contradict the new
        // one (the store and its audit chain stay).
        for f in [
            "toolgate.yaml",
            "toolgate.lock",
            "principals.yaml",
            "README.md",
        ] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        if let Ok(entries) = std::fs::read_dir(dir.join("tools")) {
            for e in entries.flatten() {
                if e.path()
                    .extension()
                    .is_some_and(|x| x == "yaml" || x == "yml")
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(())
}

fn write_new(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A file only its owner can read (created so, never widened after the write).
fn write_secret(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn yaml_quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn upstream_block(imp: &Imported, indent: &str) -> String {
    let mut s = String::new();
    let i2 = format!("{indent}  ");
    let _ = writeln!(s, "{indent}{}:", imp.spec.name);
    match &imp.spec.target {
        Target::Url(u) => {
            let _ = writeln!(s, "{i2}url: {}", yaml_quote(u));
        }
        Target::Command { program, args, .. } => {
            let _ = writeln!(s, "{i2}command: {}", yaml_quote(program));
            let list: Vec<String> = args.iter().map(|a| yaml_quote(a)).collect();
            let _ = writeln!(s, "{i2}args: [{}]", list.join(", "));
        }
    }
    if imp.package_guessed {
        let _ = writeln!(
            s,
            "{i2}# review: the package is what the server calls itself; write the exact package it is installed from"
        );
    }
    let _ = writeln!(s, "{i2}package: {}", yaml_quote(&imp.package));
    let _ = writeln!(s, "{i2}timeout_secs: 30");
    let names = |v: &[String]| {
        v.iter()
            .take(20)
            .map(|p| yaml_quote(p))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !imp.observed.prompts.is_empty() {
        let _ = writeln!(
            s,
            "{i2}# review: prompts it offers, none passed through (a prompt is text the model reads):"
        );
        let _ = writeln!(s, "{i2}# prompts: [{}]", names(&imp.observed.prompts));
    }
    if !imp.observed.resources.is_empty() {
        let _ = writeln!(
            s,
            "{i2}# review: resources it offers, none passed through (list the URIs agents may read):"
        );
        let _ = writeln!(s, "{i2}# resources: [{}]", names(&imp.observed.resources));
    }
    s
}

/// toolgate.yaml: a new file, or (with --add) the new upstreams inserted under `upstreams:`
/// with the file's own indentation, everything else left as it was.
fn write_gateway_file(dir: &Path, add: bool, imported: &[Imported]) -> anyhow::Result<()> {
    let path = dir.join("toolgate.yaml");
    if !add {
        let mut s = String::from(
            "# Written by `toolgate init`; a registry folder is reviewed like code (see README.md).\n\
             label: toolgate-init\n\
             store:\n  url: \"sqlite://toolgate.db\"\n\
             server:\n  http: \"127.0.0.1:8480\"\n\
             upstreams:\n",
        );
        for imp in imported {
            s.push_str(&upstream_block(imp, "  "));
        }
        return write_new(&path, &s);
    }
    let text = std::fs::read_to_string(&path)?;
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim_end() == "upstreams:" || l.starts_with("upstreams:"));
    let new_text = match at {
        Some(i) if lines[i].trim_end() == "upstreams:" => {
            // The indentation of the first entry, so the inserted ones match it.
            let indent = lines[i + 1..]
                .iter()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .filter(|l| l.starts_with(' '))
                .map(|l| l[..l.len() - l.trim_start().len()].to_string())
                .unwrap_or_else(|| "  ".into());
            let mut out: Vec<String> = lines[..=i].iter().map(|l| l.to_string()).collect();
            for imp in imported {
                out.push(upstream_block(imp, &indent).trim_end().to_string());
            }
            out.extend(lines[i + 1..].iter().map(|l| l.to_string()));
            out.join("\n") + "\n"
        }
        Some(_) => bail!(
            "--add: toolgate.yaml writes `upstreams:` on one line; put each upstream on lines of \
             its own under `upstreams:` and run again"
        ),
        None => {
            let mut s = text.clone();
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str("upstreams:\n");
            for imp in imported {
                s.push_str(&upstream_block(imp, "  "));
            }
            s
        }
    };
    // Never leave a file that no longer parses, or that lost what it declared.
    let parsed: toolgate_core::config::GatewayFile = yaml_serde::from_str(&new_text).context(
        "--add: toolgate.yaml would not parse after adding the upstreams; add them by hand",
    )?;
    for imp in imported {
        if !parsed.upstreams.contains_key(&imp.spec.name) {
            bail!(
                "--add: could not add '{}' to toolgate.yaml's upstreams; add it by hand",
                imp.spec.name
            );
        }
    }
    write_new(&path, &new_text)
}

fn principals_yaml(approver: &str, agent_key: &str, approver_key: &str) -> String {
    let o = ProposeOptions::default();
    format!(
        "# Written by `toolgate init`. Keys are stored only as sha256 hashes; init printed them once\n\
         # (`toolgate key new` makes another; put its sha256 line under `credentials:`).\n\
         roles:\n\
         \x20 {ROLE}: {{description: \"the MCP client that calls the upstream tools\", default_purpose: {purpose}}}\n\
         \x20 {APPROVER_ROLE}: {{description: \"people who approve gated calls\", approver: true}}\n\
         principals:\n\
         \x20 - id: {AGENT_ID}\n\
         \x20   kind: agent\n\
         \x20   role: {ROLE}\n\
         \x20   description: The agent connecting over MCP.\n\
         \x20   credentials:\n\
         \x20     - {{id: init, sha256: \"{agent}\"}}\n\
         \x20   grants:\n\
         \x20     # review: one grant for every imported tool; split it per upstream or purpose as needed\n\
         \x20     - scopes: [{read}, {act}]\n\
         \x20       purposes: [{purpose}]\n\
         \x20       max_tier: act\n\
         \x20       max_sensitivity: internal\n\
         \x20   # review: how many state-changing calls a day (each also needs a person's approval)\n\
         \x20   budgets: {{act: 50}}\n\
         \x20 - id: {approver_id}\n\
         \x20   kind: human\n\
         \x20   role: {APPROVER_ROLE}\n\
         \x20   description: May approve gated calls (the /approvals page or `toolgate approvals`).\n\
         \x20   credentials:\n\
         \x20     - {{id: init, sha256: \"{approver_hash}\"}}\n",
        purpose = o.purpose,
        read = o.read_scope,
        act = o.act_scope,
        agent = api_key_hash(agent_key),
        approver_id = yaml_quote(approver),
        approver_hash = api_key_hash(approver_key),
    )
}

fn tools_yaml(imp: &Imported) -> anyhow::Result<String> {
    let mut s = format!(
        "# Tools of upstream '{}' ({} {}), proposed by `toolgate init`.\n\
         # Each `# review:` line is a decision for a person. Refused tools are at the end: they\n\
         # are not declared, so no one can call them.\n",
        imp.spec.name, imp.observed.facts.name, imp.observed.facts.version
    );
    let declared: Vec<&Proposal> = imp
        .proposals
        .iter()
        .filter(|p| p.class != Class::Refused)
        .collect();
    if declared.is_empty() {
        s.push_str("tools: []\n");
    } else {
        s.push_str("tools:\n");
    }
    for p in declared {
        let decl = p.declaration.as_ref().expect("declared");
        s.push('\n');
        let _ = writeln!(
            s,
            "  # {}: {} (server annotations: {})",
            p.upstream_tool,
            p.class.as_str(),
            if p.annotations.is_null() {
                "none".to_string()
            } else {
                p.annotations.to_string()
            }
        );
        for r in &p.review {
            let _ = writeln!(s, "  # review: {r}");
        }
        let body = yaml_serde::to_string(decl)?;
        for (i, line) in body.lines().enumerate() {
            let lead = if i == 0 { "  - " } else { "    " };
            let _ = writeln!(s, "{lead}{line}");
        }
    }
    let refused: Vec<&Proposal> = imp
        .proposals
        .iter()
        .filter(|p| p.class == Class::Refused)
        .collect();
    if !refused.is_empty() {
        s.push_str("\n# Refused (not declared):\n");
        for p in refused {
            let _ = writeln!(
                s,
                "#   {} — {}",
                p.upstream_tool,
                p.review.first().map(String::as_str).unwrap_or("refused")
            );
        }
    }
    Ok(s)
}

fn write_tools_file(dir: &Path, imp: &Imported) -> anyhow::Result<()> {
    write_new(
        &dir.join(format!("tools/{}.yaml", imp.spec.name)),
        &tools_yaml(imp)?,
    )
}

/// Checks the folder as `toolgate check` does; a finding in an imported tool refuses that tool.
/// Returns what is left that no refusal can fix (empty when the folder is clean).
fn settle(dir: &Path, imported: &mut [Imported]) -> anyhow::Result<Vec<String>> {
    for _ in 0..8 {
        let findings = match Registry::load(dir) {
            Ok(r) => lint(&r),
            Err(LoadError::Invalid(f)) => f,
            Err(e) => return Err(e).context("reading the folder back"),
        };
        if findings.is_empty() {
            return Ok(Vec::new());
        }
        let mut fixed = false;
        let mut rest = Vec::new();
        for f in findings {
            match tool_of_finding(imported, &f.file, &f.path) {
                Some((i, j)) => {
                    let p = &mut imported[i].proposals[j];
                    if p.class != Class::Refused {
                        eprintln!(
                            "toolgate init: {}: refused ({}: {})",
                            p.name, f.rule, f.message
                        );
                        p.refuse(format!(
                            "refused: the registry check says {} ({}); {}",
                            f.message, f.rule, f.fix
                        ));
                        fixed = true;
                    }
                }
                None => rest.push(f.to_string()),
            }
        }
        if !fixed {
            return Ok(rest);
        }
        for imp in imported.iter() {
            write_tools_file(dir, imp)?;
        }
    }
    bail!("the folder did not settle after refusing the tools the check found fault with")
}

/// The proposal a finding at `file`/`path` (`tools/NAME.yaml`, `tools[3]…`) is about.
fn tool_of_finding(imported: &[Imported], file: &str, path: &str) -> Option<(usize, usize)> {
    let i = imported
        .iter()
        .position(|imp| file == format!("tools/{}.yaml", imp.spec.name))?;
    let index: usize = path
        .strip_prefix("tools[")?
        .split(']')
        .next()?
        .parse()
        .ok()?;
    let j = imported[i]
        .proposals
        .iter()
        .enumerate()
        .filter(|(_, p)| p.class != Class::Refused)
        .nth(index)?
        .0;
    Some((i, j))
}

fn count(imp: &Imported, class: Class) -> usize {
    imp.proposals.iter().filter(|p| p.class == class).count()
}

fn readme_section(imp: &Imported) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "## Upstream `{}`\n", imp.spec.name);
    let _ = writeln!(
        s,
        "- reached as: `{}`\n- package: `{}`{}\n- server: {} {} (protocol {})\n- tools: {} read (listed), {} gated (listed, each call approved by a person), {} refused (not declared)\n",
        imp.spec.target.describe(),
        imp.package,
        if imp.package_guessed {
            " — **review**: what the server calls itself; write the package it is installed from"
        } else {
            ""
        },
        imp.observed.facts.name,
        imp.observed.facts.version,
        imp.observed.facts.protocol_version,
        count(imp, Class::Read),
        count(imp, Class::Gated),
        count(imp, Class::Refused),
    );
    let _ = writeln!(
        s,
        "| upstream tool | registry name | decision | what to review |\n|---|---|---|---|"
    );
    for p in &imp.proposals {
        let review = if p.review.is_empty() {
            "—".to_string()
        } else {
            p.review.join("; ").replace('|', "\\|")
        };
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            p.upstream_tool,
            if p.class == Class::Refused {
                "—".to_string()
            } else {
                format!("`{}`", p.name)
            },
            p.class.as_str(),
            review
        );
    }
    let list = |v: &[String]| {
        v.iter()
            .map(|x| format!("`{x}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !imp.observed.prompts.is_empty() {
        let _ = writeln!(
            s,
            "\nPrompts it offers ({}), none passed through — list the ones agents may use under `upstreams.{}.prompts` in toolgate.yaml: {}",
            imp.observed.prompts.len(),
            imp.spec.name,
            list(&imp.observed.prompts)
        );
    }
    if !imp.observed.resources.is_empty() {
        let _ = writeln!(
            s,
            "\nResources it offers ({}), none passed through — list the URIs agents may read under `upstreams.{}.resources`: {}",
            imp.observed.resources.len(),
            imp.spec.name,
            list(&imp.observed.resources)
        );
    }
    s.push('\n');
    s
}

fn write_readme(dir: &Path, add: bool, imported: &[Imported]) -> anyhow::Result<()> {
    let path = dir.join("README.md");
    let s = if add && path.exists() {
        let mut t = std::fs::read_to_string(&path)?;
        if !t.ends_with('\n') {
            t.push('\n');
        }
        t.push('\n');
        t
    } else {
        format!(
            "# A toolgate registry for existing MCP servers\n\n\
             Written by `toolgate init`. It serves at once what could be classified safely; every guess\n\
             is marked `# review:` in `tools/*.yaml` and listed below. Review it like code.\n\n\
             | file | what it is |\n|---|---|\n\
             | `toolgate.yaml` | the upstream servers, the store (`sqlite://toolgate.db`), the address (`127.0.0.1:8480`) |\n\
             | `tools/NAME.yaml` | one upstream's tools: effect, tier, gate, closed input schema |\n\
             | `principals.yaml` | the agent (`{AGENT_ID}`, role `{ROLE}`) and the person who approves (role `{APPROVER_ROLE}`), keys as hashes |\n\
             | `toolgate.lock` | the pinned tool definitions; a changed tool is blocked until `toolgate lock approve` |\n\n\
             ## What to review\n\n\
             1. Every `# review:` line in `tools/*.yaml` (also in the tables below), and the refused tools:\n\
             \x20  declare one yourself when a person has decided what it does.\n\
             2. Gated tools (`gate: always`) wait for a person on every call: approve in the page\n\
             \x20  (`http://127.0.0.1:8480/approvals`) or with `toolgate approvals list|show|approve -c DIR`.\n\
             \x20  A tool that can be undone (`effect: write`, `compensate:`) or reconciled (`reconcile:`) can drop the gate.\n\
             3. `owner`, `sensitivity` (all `internal`), the grant and the daily budget in `principals.yaml`.\n\
             4. Schemas: each is closed (`additionalProperties: false`); the bounds init added are named per tool.\n\
             5. Prompts and resources are not passed through; list the ones agents may use.\n\
             6. Keys: init printed the agent's and the approver's API key once. For production set\n\
             \x20  `TOOLGATE_APPROVAL_KEY` and `TOOLGATE_REDACTION_KEY` (32+ bytes each) in `serve`'s environment.\n\n\
             ## Run it\n\n\
             ```sh\n\
             toolgate check -c DIR          # the registry lint: exit 0 when clean\n\
             toolgate serve -c DIR          # MCP at http://127.0.0.1:8480/mcp (Authorization: Bearer <agent key>)\n\
             toolgate lock status -c DIR    # are the upstreams still what was pinned?\n\
             toolgate log verify -c DIR     # the audit chain\n\
             ```\n\n"
        )
    };
    let s = s.replace("-c DIR", &format!("-c {}", dir.display()));
    let mut s = s;
    for imp in imported {
        s.push_str(&readme_section(imp));
    }
    write_new(&path, &s)
}

fn new_key() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!(
        "tg_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

fn summary(
    out: &mut dyn Write,
    dir: &Path,
    imported: &[Imported],
    keys: Option<&(String, String)>,
    approver: &str,
    started: Instant,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "wrote {} ({:.1} s)",
        dir.display(),
        started.elapsed().as_secs_f64()
    )?;
    for imp in imported {
        writeln!(
            out,
            "  {}: {} tools — {} read, {} gated, {} refused; {} prompts, {} resources (not passed through)",
            imp.spec.name,
            imp.proposals.len(),
            count(imp, Class::Read),
            count(imp, Class::Gated),
            count(imp, Class::Refused),
            imp.observed.prompts.len(),
            imp.observed.resources.len(),
        )?;
    }
    if let Some((agent, person)) = keys {
        writeln!(
            out,
            "\nAPI keys, shown once (principals.yaml keeps only their sha256):"
        )?;
        writeln!(out, "  agent    {AGENT_ID}: {agent}")?;
        writeln!(out, "  approver {approver}: {person}")?;
    }
    let d = dir.display();
    writeln!(
        out,
        "\nNext: review {d}/README.md, then\n  toolgate check -c {d}\n  toolgate serve -c {d}     # MCP at http://127.0.0.1:8480/mcp, Authorization: Bearer <agent key>"
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_like_a_shell() {
        assert_eq!(
            split_words(r#"node "a b.js" 'c d' e\ f"#).unwrap(),
            ["node", "a b.js", "c d", "e f"]
        );
        assert!(split_words("node 'open").is_none());
    }

    #[test]
    fn specs_name_a_command_or_a_url() {
        let s = parse_spec("time=http://127.0.0.1:9/mcp").unwrap();
        assert_eq!(s.target, Target::Url("http://127.0.0.1:9/mcp".into()));
        let s = parse_spec("ev=npx -y @modelcontextprotocol/server-everything@2026.8.31").unwrap();
        assert!(matches!(&s.target, Target::Command { program, args, .. }
            if program == "npx" && args.len() == 2));
        let observed = Observed {
            facts: Default::default(),
            tools: vec![],
            prompts: vec![],
            resources: vec![],
        };
        assert_eq!(
            package_of(&s.target, &observed),
            (
                "@modelcontextprotocol/server-everything@2026.8.31".into(),
                false
            )
        );
        for bad in ["noequals", "Bad=x", "=x", "ok="] {
            assert!(parse_spec(bad).is_err(), "{bad}");
        }
    }
}
