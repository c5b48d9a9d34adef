//! What toolgate's own tests share. [`browser`]: the approver's page in a real browser.

pub mod browser;

/// A TCP port free on 127.0.0.1 at the moment of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The address of the `toolgate serve` with process id `pid` serving the registry folder `dir`,
/// once its HTTP listener is bound: it writes `http://ADDR/mcp` into its status file,
/// `<dir>/.toolgate/serve.json`. Start it with `--http 127.0.0.1:0` and ask here: the port is
/// the one it bound, not one picked beforehand that another test's server may take first.
/// Panics after 60 s, with `log`'s text if given.
pub async fn served_addr(
    dir: &std::path::Path,
    pid: u32,
    log: Option<&std::path::Path>,
) -> std::net::SocketAddr {
    let (dir, log) = (dir.to_path_buf(), log.map(std::path::Path::to_path_buf));
    tokio::task::spawn_blocking(move || served_addr_blocking(&dir, pid, log.as_deref()))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// [`served_addr`] for tests without a runtime.
pub fn served_addr_blocking(
    dir: &std::path::Path,
    pid: u32,
    log: Option<&std::path::Path>,
) -> std::net::SocketAddr {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(addr) = bound(dir, pid) {
            return addr;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "toolgate serve (pid {pid}) did not bind in {WAIT:?}:\n{}",
            log.and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

fn bound(dir: &std::path::Path, pid: u32) -> Option<std::net::SocketAddr> {
    let text = std::fs::read_to_string(dir.join(".toolgate").join("serve.json")).ok()?;
    let status: serde_json::Value = serde_json::from_str(&text).ok()?;
    if status["pid"] != pid {
        return None;
    }
    let url = status["http"].as_str()?;
    let addr = url.trim_start_matches("http://").trim_end_matches("/mcp");
    Some(
        addr.parse()
            .unwrap_or_else(|e| panic!("{url} in the status file: {e}")),
    )
}
